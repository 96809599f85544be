package redisync

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"time"
)

// contender is one blocking call, Mutex.Lock or Semaphore.Acquire, as seen
// by the wait loop that they share (Client.block).
type contender interface {
	// attempt asks Redis once, joining the queue if the primitive has
	// one. It reports whether the call is done and, if not, the longest
	// the caller may sleep before asking again.
	attempt(ctx context.Context) (done bool, sleep time.Duration, err error)
	// queued is called before a sleep while it returns nil: it may
	// register the heartbeat that keeps the caller's place in the queue.
	queued(w *waiter) *keepalive
	// adopt takes what a message received at received handed to the
	// caller. It reports false when the caller must attempt again.
	adopt(ctx context.Context, grant string, received time.Time) (bool, error)
	// withdraw leaves the queue after the wait ended without success,
	// passing on whatever was handed to the caller meanwhile.
	withdraw(ctx context.Context)
}

// block runs the wait loop of a blocking call on channel: attempt; if not
// done, register the waiter, have the channel subscribed and attempt again
// (a message published in between would be missed); then sleep until a
// message, the sleep bound or the end of ctx, and attempt again or adopt
// what the message handed over. It leaves nothing behind: no heartbeat,
// no waiter, and, through withdraw, no place in the queue. Once waiting, it
// outlives Redis being unreachable for a while (see transient).
func (c *Client) block(ctx context.Context, channel, owner string, recheck time.Duration, x contender) error {
	var w *waiter // registered on the channel
	var hb *keepalive
	defer func() {
		if hb != nil {
			c.wd.remove(hb)
		}
		if w != nil {
			w.leave()
		}
	}()

	// When other waiters of this process keep the channel subscribed,
	// joining is free and no message can be missed from here on.
	w = c.sub.joinConfirmed(channel, owner)
	waiting := false // an attempt found the primitive taken
	backoff := time.Duration(0)
	for {
		done, sleep, err := x.attempt(ctx)
		switch {
		case err != nil && waiting && transient(err) && ctx.Err() == nil:
			// Redis went away (a restart, a failover) while the call
			// waited: keep waiting, and look again after a pause that
			// grows while it stays away. A first attempt that fails
			// returns the error instead, so that a wrong address or a
			// server that is down fails fast.
			backoff = min(max(2*backoff, 50*time.Millisecond), maxBackoff)
			sleep = backoff
			c.relocate()
		case err != nil || done:
			return err
		default:
			waiting, backoff = true, 0
		}
		if w == nil {
			// Subscribe, then look again: a release between the
			// attempt above and the subscription would be missed.
			if w, err = c.sub.join(ctx, channel, owner, recheck); err != nil {
				x.withdraw(ctx)
				return err
			}
			continue
		}
		if hb != nil && !c.wd.registered(hb) {
			// Found dequeued by the watchdog (dropped after stalled
			// heartbeats); the attempt above queued the caller again.
			hb = nil
		}
		if hb == nil {
			hb = x.queued(w)
		}
		grant, err := w.wait(ctx, sleep)
		if err != nil {
			x.withdraw(ctx)
			return err
		}
		if grant != "" {
			if ok, err := x.adopt(ctx, grant, time.Now()); ok || err != nil {
				return err
			}
		}
	}
}

// lockCall is a Mutex.Lock call as a contender.
type lockCall struct{ *Mutex }

func (m lockCall) attempt(ctx context.Context) (bool, time.Duration, error) {
	acquired, pttl, err := m.Mutex.attempt(ctx, true)
	return acquired, m.sleepFor(pttl), err
}

func (m lockCall) queued(w *waiter) *keepalive {
	if !m.cfg.fair {
		return nil
	}
	return m.heartbeat(w)
}

// transient reports whether err says Redis could not be reached or could
// not serve the call for now (a network error, a timeout, a server loading
// its data or a cluster failing over), rather than a final answer.
func transient(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	for _, prefix := range []string{"LOADING", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "READONLY"} {
		if strings.HasPrefix(err.Error(), prefix) {
			return true
		}
	}
	return false
}
