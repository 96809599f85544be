package redisync

import (
	"cmp"
	"context"
	"iter"
	"sync"
	"time"

	"github.com/redisync/redisync/internal/schema"
	"github.com/redisync/redisync/internal/waiters"
)

// watchInbox bounds the changes an observer keeps while its reader is
// slower than the election: past it, they are dropped, and the observer
// reads the current leader instead (reported with Gap set).
const watchInbox = 256

// Observe returns the election's changes of leader, and of the leader's
// value, as a sequence: each range over it is one observation, which
// subscribes when the range starts and yields the changes in the order they
// were made and each once. The first state yielded is the current one
// (Leads false when nobody leads), read once the observation is subscribed:
// every change made after it is yielded. Changes are pushed by the scripts
// that make them, through the Client's shared subscriber: an observation
// costs no connection and no polling.
//
// Pub/sub may lose a message (a reconnect, a failover). Each change
// names the revision it follows, so a lost one shows as a gap: the
// observation then reads the current state at once and yields it with Gap
// set. So does it after its subscription is renewed, and when its reader
// fell more than 256 changes behind. The changes in between are skipped,
// and Gap says so.
//
// A leader whose lease runs out unrenewed (its process died or paused, and
// no candidate took over) is announced by nothing in Redis: the observation
// reads the state again when the leader's lease was due to end, and yields
// nobody leading, under the revision of the leader's change (the one case
// where a revision repeats). So an observation reads Redis once per lease
// while a leader leads (every 10 to 15 s by default), never more often than
// the leader renews it.
//
// An error reading Redis is retried after a pause. The sequence ends after
// yielding one non-nil error, an *OpError with Op OpObserve, when it cannot
// go on: the Election is invalid (ErrInvalid), the Client is closed
// (ErrClosed), or ctx ended (ctx's error). Breaking out of the range ends
// the observation at once: it unsubscribes and stops its goroutine before
// the range statement returns. Observe is safe for concurrent use, and so
// is ranging over the sequence more than once.
func (e *Election) Observe(ctx context.Context) iter.Seq2[Leadership, error] {
	return func(yield func(Leadership, error) bool) {
		if err := cmp.Or(e.c.usable(), ctx.Err()); err != nil {
			yield(Leadership{}, wrapOp(string(OpObserve), e.name, err))
			return
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(e.c.ctx, cancel)
		defer stop()
		// The first state is read once the channel is subscribed (see
		// waiters.Listener): no change made after it can be missed then.
		// The listening goroutine only holds the subscription: the states
		// are read and yielded here, as the reader asks for them.
		w := &watch{e: e, yield: yield, kick: make(chan struct{}, 1)}
		l := &waiters.Listener{Hear: w.hear, Resync: w.again}
		done := make(chan struct{})
		err := e.c.sub.listen(e.m.keys.Changes, l, func() {
			defer close(done)
			<-ctx.Done()
		})
		if err != nil {
			yield(Leadership{}, wrapOp(string(OpObserve), e.name, err))
			return
		}
		// end unsubscribes, when the range ends and if the reader's loop
		// body panics.
		end := sync.OnceFunc(func() {
			cancel()
			<-done
			e.c.sub.reg.Unlisten(e.m.keys.Changes, l)
		})
		defer end()
		w.run(ctx)
		end()
		if w.broke {
			return
		}
		err = ctx.Err()
		if e.c.ctx.Err() != nil {
			err = ErrClosed
		}
		yield(Leadership{}, wrapOp(string(OpObserve), e.name, err))
	}
}

// watch is one observation: it receives the changes heard on the
// election's channel and yields them in order to its reader.
type watch struct {
	e     *Election
	yield func(Leadership, error) bool
	broke bool          // the reader stopped asking: yield returned false
	kick  chan struct{} // holds a token when there is something to do

	mu     sync.Mutex
	inbox  []schema.ElectionChange // heard, not handled yet
	resync bool                    // read the current state: changes may have been missed

	// Owned by run.
	expiry  *time.Timer // fires when the leader's lease may have run out
	started bool        // a state was sent
	sent    Leadership  // the last state sent
	last    int64       // the revision of the last state sent or read
}

// hear takes a change heard on the channel (called with the registry's
// mutex held: it does not block).
func (w *watch) hear(payload string) {
	c, ok := schema.ParseElectionChange(payload)
	if !ok {
		return
	}
	w.mu.Lock()
	if len(w.inbox) < watchInbox {
		w.inbox = append(w.inbox, c)
	} else {
		w.inbox, w.resync = nil, true
	}
	w.mu.Unlock()
	w.poke()
}

// again asks for the current state to be read: the subscription was
// confirmed, and changes may have been missed before.
func (w *watch) again() {
	w.mu.Lock()
	w.inbox, w.resync = nil, true
	w.mu.Unlock()
	w.poke()
}

// poke wakes run.
func (w *watch) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// run yields the changes until ctx ends or the reader stops asking.
func (w *watch) run(ctx context.Context) {
	w.expiry = time.NewTimer(time.Hour)
	w.expiry.Stop()
	defer w.expiry.Stop()
	for {
		select {
		case <-w.kick:
		case <-w.expiry.C:
			// The leader's lease may have run out unrenewed, which no
			// script announces: look.
			if !w.sync(ctx) {
				return
			}
			continue
		case <-ctx.Done():
			return
		}
		w.mu.Lock()
		resync, inbox := w.resync, w.inbox
		w.resync, w.inbox = false, nil
		w.mu.Unlock()
		if resync && !w.sync(ctx) {
			return
		}
		for _, c := range inbox {
			switch {
			case c.Revision <= w.last:
				// Seen already, or older than a state read since.
			case c.Previous != w.last:
				// A change was missed: the current state tells.
				if !w.sync(ctx) {
					return
				}
			default:
				l := Leadership{Value: c.Value, Token: c.Token, Revision: c.Revision}
				if !w.send(ctx, l, time.Duration(c.Lease)*time.Millisecond) {
					return
				}
				w.last = c.Revision
			}
		}
	}
}

// sync reads the current state and sends it unless it is the state sent
// last. It is marked as following a gap when changes may have been missed
// since the last state sent: its revision is not the last one's. A state
// of the last revision that differs from the last sent is a leader whose
// lease ran out (or whose hold was removed) unannounced: nothing was
// missed. A revision lower than the last means that Redis forgot the
// election's state: its revision key expired an hour after the last
// change (the state is the one sent last, and is not sent again), or
// Redis restarted without persistence (the state may differ, and is
// sent). sync retries after a growing pause while Redis fails, and
// reports false when ctx ended.
func (w *watch) sync(ctx context.Context) bool {
	backoff := 10 * time.Millisecond
	for {
		l, lease, err := w.e.read(ctx)
		if err == nil {
			same := w.started && l.Token == w.sent.Token && l.Value == w.sent.Value
			l.Gap = w.started && (l.Revision != w.last || l.Revision == 0)
			if same && l.Revision <= w.last {
				w.last = l.Revision
				w.arm(lease)
				return true
			}
			w.last = l.Revision
			return w.send(ctx, l, lease)
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// arm has run look again when the leader's lease, of lease from now, runs
// out, unless a change comes first; nobody leading (lease 0 or less: none,
// or no expiry), it stops looking.
func (w *watch) arm(lease time.Duration) {
	w.expiry.Stop()
	if lease > 0 {
		w.expiry.Reset(lease + expirySlack)
	}
}

// expirySlack is how long after a leader's lease was due to run out an
// observer looks whether it did: a renewal that Redis ran just before then
// has extended it.
const expirySlack = 50 * time.Millisecond

// send yields l, whose leader's lease runs lease from now, to the reader,
// and reports false when ctx ended or the reader stopped asking.
func (w *watch) send(ctx context.Context, l Leadership, lease time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	if !w.yield(l, nil) {
		w.broke = true
		return false
	}
	w.started, w.sent = true, l
	w.arm(lease)
	return true
}
