package redisync

import (
	"cmp"
	"context"
	"time"

	"github.com/redisync/redisync/internal/roundtrip"
	"github.com/redisync/redisync/internal/schema"
	"github.com/redisync/redisync/internal/waiters"
	"github.com/redisync/redisync/internal/watchdog"
)

// contender is one blocking call (Mutex.Lock, Semaphore.Acquire or
// RedMutex.Lock) as seen by the wait loop that they share (block).
type contender interface {
	// attempt asks Redis once, joining the queue if the primitive has
	// one. It reports whether the call is done and, if not, the longest
	// the caller may sleep before asking again.
	attempt(ctx context.Context) (done bool, sleep time.Duration, err error)
	// outlasts reports whether the call, once waiting, outlasts an
	// attempt that failed with err, looking again after a pause (Redis
	// restarting or failing over), rather than returning err.
	outlasts(err error) bool
	// sleeping is called before every sleep: it keeps the call's place
	// in the queue alive (a heartbeat, shared with the process's other
	// waiters there, that nudges ws when it must look again).
	sleeping(ws *waiters.Set)
	// adopt takes what a message addressed to the call handed to it. It
	// reports false when the call must attempt again.
	adopt(ctx context.Context, grant string) (bool, error)
	// address returns the call's address in grant messages; it may
	// change after an attempt.
	address() string
	// finish ends the call with its outcome: it stops the heartbeat and,
	// after a failure, withdraws the call from the queue, giving back
	// whatever was handed to it meanwhile.
	finish(ctx context.Context, err error)
}

// post is a channel that a blocking call waits on, with the subscriber
// that hears it: one for a Mutex or a Semaphore, one per node for a
// RedMutex. A plain waiter (a barging lock's) is woken by empty messages
// (see internal/waiters).
type post struct {
	sub     *subscriber
	channel string
	plain   bool
}

// block runs the wait loop of a blocking call on posts: attempt; if not
// done, register a waiter on every post, have the channels subscribed and
// attempt again (a message published in between would be missed); then
// sleep until a message on any post, the sleep bound or the end of ctx,
// and attempt again or adopt what the message handed over. It leaves
// nothing behind: no heartbeat, no waiter, and, through finish, no place
// in the queue; a wake-up it took and could not use is passed on to the
// next waiter of the process. Once waiting, it outlives what the call
// outlasts (see contender.outlasts). Once ctx's deadline has passed, it
// fails with ctx's error, whatever else failed meanwhile.
func block(ctx context.Context, posts []post, x contender) (err error) {
	var ws *waiters.Set // registered on every post
	defer func() {
		if err != nil {
			// Once ctx's deadline has passed, the call fails with it,
			// whatever else failed in between (see roundtrip.Ended).
			err = cmp.Or(roundtrip.Ended(ctx), err)
		}
		x.finish(ctx, err)
		if ws != nil {
			ws.Leave(err != nil)
		}
	}()

	// When other waiters of this process keep the channels subscribed,
	// joining is free and no message can be missed from here on.
	ws = joinConfirmed(posts, x.address())
	waiting := false // an attempt found the primitive taken
	backoff := time.Duration(0)
	for {
		done, sleep, err := x.attempt(ctx)
		switch {
		case err != nil && waiting && roundtrip.Ended(ctx) == nil && x.outlasts(err):
			// Redis went away (a restart, a failover) while the call
			// waited: keep waiting, and look again after a pause that
			// grows while it stays away. A first attempt that fails
			// returns the error instead, so that a wrong address or a
			// server that is down fails fast.
			backoff = min(max(2*backoff, 50*time.Millisecond), maxBackoff)
			sleep = backoff
		case err != nil || done:
			return err
		default:
			waiting, backoff = true, 0
			if ws != nil {
				ws.Used()
			}
		}
		if ws == nil {
			// Subscribe, then look again: a release between the
			// attempt above and the subscription would be missed.
			if ws, err = join(ctx, posts, x.address()); err != nil {
				return err
			}
			continue
		}
		ws.Retarget(x.address())
		x.sleeping(ws)
		grant, err := ws.Wait(ctx, sleep)
		if err != nil {
			return err
		}
		if grant != "" {
			if ok, err := x.adopt(ctx, grant); ok || err != nil {
				return err
			}
		}
	}
}

// joinConfirmed registers a waiter set for ticket on every post if every
// post's channel is subscribed and confirmed already, which costs no round
// trip; otherwise it returns nil.
func joinConfirmed(posts []post, ticket string) *waiters.Set {
	ws := waiters.NewSet()
	for _, p := range posts {
		if !p.sub.reg.AddConfirmed(ws, p.channel, ticket, p.plain) {
			ws.Leave(false)
			return nil
		}
	}
	return ws
}

// join registers a waiter set for ticket on every post, has their channels
// subscribed, and waits until every subscription is confirmed by Redis, so
// that the caller's next attempt cannot miss a message. The wait is
// bounded by joinWait (after which the caller proceeds anyway: it sleeps
// at most deafPoll while a channel is not confirmed, and is woken when it
// is), ctx and Close.
func join(ctx context.Context, posts []post, ticket string) (*waiters.Set, error) {
	ws := waiters.NewSet()
	ready := make([]<-chan struct{}, len(posts))
	for i, p := range posts {
		var err error
		if ready[i], err = p.sub.add(ws, p.channel, ticket, p.plain); err != nil {
			ws.Leave(false)
			return nil, err
		}
	}
	t := time.NewTimer(joinWait)
	defer t.Stop()
	for i, p := range posts {
		select {
		case <-ready[i]:
		case <-t.C:
			ws.Proceed()
			return ws, nil
		case <-ctx.Done():
			ws.Leave(false)
			return nil, ctx.Err()
		case <-p.sub.closed:
			ws.Leave(false)
			return nil, ErrClosed
		}
	}
	return ws, nil
}

// place is what a waiting call knows of its place in a fair queue: whether
// an attempt queued it, when Redis last confirmed it was still queued (a
// hand-off to it came later: the hold's deadline counts from then), and
// the heartbeat that keeps it there while the call sleeps.
type place struct {
	wd        *watchdog.Watchdog
	queued    bool            // an attempt queued the call
	since     time.Time       // when the last call that found it queued was sent
	unsure    bool            // an attempt may have run without its reply arriving
	abandoned bool            // an attempt was given up on; its late reply cleans up
	hb        *watchdog.Entry // the heartbeat of the process's waiters, while joined
	ws        *waiters.Set    // the call's waiter set in hb
}

// joined records an attempt, sent at sent, that queued the call.
func (p *place) joined(sent time.Time) { p.queued, p.since = true, sent }

// failed records an attempt that failed with err (abandoned: given up on).
func (p *place) failed(err error, abandoned bool) {
	p.abandoned = p.abandoned || abandoned
	p.unsure = p.unsure || (!abandoned && roundtrip.MayHaveRun(err))
}

// mustWithdraw reports whether a call that ends with err must withdraw:
// it failed after sending something that may have queued it or granted it
// something, and no abandoned attempt's late reply does it instead.
func (p *place) mustWithdraw(err error) bool {
	return err != nil && !p.abandoned && (p.queued || p.unsure)
}

// confirmed returns a time before a grant made at the server time ms (0:
// unknown) to the call: when the last call that Redis ran before it, and
// that found the call queued, was sent. That is the attempt that queued
// the call, or a later heartbeat of the process's waiters that ran before
// the grant (the call was queued until the grant).
func (p *place) confirmed(ms int64) time.Time {
	if p.hb != nil && ms > 0 {
		return later(p.since, p.wd.RanBefore(p.hb, ms))
	}
	return p.since
}

// keepAlive keeps a queued call alive while it sleeps (kind: "wait" for a
// fair lock's waiter, "swait" for a semaphore's; address: its ticket or
// waiter id; name: of what it waits for, for events; keys: its queue, its
// waiters' records, and what it waits for; ttl: its heartbeat; grant: the
// lease of what is handed to it), unless it does already. One heartbeat
// serves all the process's waiters of one queue (watchdog.join), at a
// third of the shorter of ttl and grant: a grant's lease counts from the
// last heartbeat before it (see confirmed). It nudges ws when the call
// must look again: a release may have dropped it as dead, or what it waits
// for is free with nobody to announce it.
func (p *place) keepAlive(kind, address, name string, keys []string, ttl, grant time.Duration, ws *waiters.Set) {
	if !p.queued || p.hb != nil {
		return
	}
	if hb := p.wd.Join(kind, schema.Client(address), name, keys, ttl, min(ttl, grant)/3, p.since, ws); hb != nil {
		p.hb, p.ws = hb, ws
	}
}

// left records that the call is no longer queued: it took what it waited
// for, or withdrew.
func (p *place) left() {
	p.queued, p.unsure = false, false
	p.stop()
}

// stop stops keeping the call alive, if it was.
func (p *place) stop() {
	if p.hb != nil {
		p.wd.Leave(p.hb, p.ws)
		p.hb, p.ws = nil, nil
	}
}

// parseGrant returns the value and server time of a grant message, and
// reports whether it is addressed to address.
func parseGrant(grant, address string) (value, ms int64, ok bool) {
	a, v, ms, ok := waiters.ParseGrant(grant)
	return v, ms, ok && a == address
}

// flag is a boolean as a script argument: "1" or "0".
func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
