package layout2

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// Client is one process's layout-2 redisync Client: a client id (in its
// tickets, "label/client-n", and its grant channels), one pub/sub
// connection for the grant channels of the locks it waits on, and one
// goroutine that heartbeats its fair waiters and unsubscribes the channels
// idle for 2 s. It is safe for concurrent use. Close it when done.
type Client struct {
	rdb    redis.UniversalClient
	prefix string
	id     string // the client id of its tickets
	label  string // the start of its tickets: "host/pid"
	seq    atomic.Uint64

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	poke   chan struct{} // wakes run early; never blocks
	wg     sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	ps       *redis.PubSub       // nil until the first waiter subscribes
	channels map[string]*channel // the grant channels subscribed, by name
	waiting  map[string]*waiter  // the waiters, by ticket
	entries  map[string]*entry   // the heartbeats, by lock hash
}

// channel is one grant channel subscribed.
type channel struct {
	ready     chan struct{} // closed when Redis confirmed the subscription
	confirmed bool
	n         int       // waiters on it
	idle      time.Time // when its last waiter left
}

// waiter is one Lock call waiting on a grant channel.
type waiter struct {
	ticket string
	ch     *channel
	grant  chan string   // a grant message to ticket
	nudge  chan struct{} // attempt again: a heartbeat says the call may have been dropped
	hb     *entry        // its heartbeat, while queued
}

// entry is the heartbeat of the Client's fair waiters on one lock.
type entry struct {
	k        keys
	waiters  map[*waiter]time.Time // until when each one's own deadline in Redis surely lasts
	due      time.Time
	beat     bool // a heartbeat was sent: it may have written the Client's deadline
	farewell bool // every waiter left: the next call removes the Client's deadline
}

// NewClient returns a Client on rdb (which it never closes) whose keys
// start with prefix (DefaultPrefix is the library's; it must hold no
// brace).
func NewClient(rdb redis.UniversalClient, prefix string) *Client {
	loadScripts()
	c := &Client{rdb: rdb, prefix: prefix, id: uuid.NewString(), label: defaultLabel(),
		poke: make(chan struct{}, 1), channels: map[string]*channel{}, waiting: map[string]*waiter{},
		entries: map[string]*entry{}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.wg.Add(1)
	go c.run()
	return c
}

// defaultLabel is the library's default label, "host/pid", with what a
// label may not hold replaced.
func defaultLabel() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	label := []byte(host + "/" + strconv.Itoa(os.Getpid()))
	for i, b := range label {
		if b <= ' ' || b > '~' || b == '{' || b == '}' {
			label[i] = '_'
		}
	}
	if len(label) > maxLabelLen {
		label = label[len(label)-maxLabelLen:]
	}
	return string(label)
}

// ticket mints a Lock or TryLock call's ticket, "label/client-n".
func (c *Client) ticket() string {
	return c.label + "/" + c.id + "-" + strconv.FormatUint(c.seq.Add(1), 10)
}

// usable reports why a call cannot start now, if it cannot.
func (c *Client) usable(ctx context.Context) error {
	if c.ctx.Err() != nil {
		return ErrClosed
	}
	return ctx.Err()
}

// Close stops the Client's goroutines and closes its pub/sub connection;
// waiting Lock calls withdraw and return ErrClosed. It then sends the
// farewells of the locks whose waiters it heartbeated. It does not
// release holds (they run out with their leases) nor wait for Lock calls
// to return.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	ps := c.ps
	c.mu.Unlock()
	c.cancel()
	var err error
	if ps != nil {
		err = ps.Close()
	}
	c.wg.Wait()
	var bye []*entry
	c.mu.Lock()
	for _, e := range c.entries {
		if e.beat {
			bye = append(bye, e)
		}
	}
	c.mu.Unlock()
	if len(bye) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, _ = c.renew(ctx, bye, make([]time.Duration, len(bye)))
	}
	return err
}

// join registers a waiter for ticket on the grant channel name, and
// returns it with a channel closed once the subscription is confirmed.
// With onlyConfirmed it registers one only when the channel is confirmed
// already (which costs no round trip), and returns nil otherwise.
func (c *Client) join(name, ticket string, onlyConfirmed bool) (*waiter, <-chan struct{}, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, nil, ErrClosed
	}
	ch := c.channels[name]
	switch {
	case onlyConfirmed && (ch == nil || !ch.confirmed):
		return nil, nil, nil
	case ch == nil:
		var err error
		if c.ps == nil {
			c.ps = c.rdb.Subscribe(c.ctx)
			c.wg.Add(1)
			go c.receive(c.ps)
		}
		if err = c.ps.Subscribe(c.ctx, name); err != nil {
			return nil, nil, err
		}
		ch = &channel{ready: make(chan struct{})}
		c.channels[name] = ch
	}
	ch.n++
	w := &waiter{ticket: ticket, ch: ch, grant: make(chan string, 1), nudge: make(chan struct{}, 1)}
	c.waiting[ticket] = w
	return w, ch.ready, nil
}

// retarget moves w to the ticket ticket.
func (c *Client) retarget(w *waiter, ticket string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.waiting, w.ticket)
	w.ticket = ticket
	c.waiting[ticket] = w
}

// leave unregisters w and stops its heartbeat.
func (c *Client) leave(w *waiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopLocked(w)
	delete(c.waiting, w.ticket)
	if w.ch.n--; w.ch.n == 0 {
		w.ch.idle = time.Now()
		c.pokeLocked()
	}
}

// receive reads the pub/sub connection until Close: it marks channels
// confirmed and hands grant messages to their waiters. go-redis
// reconnects and subscribes again after an error; a channel confirmed
// again has its waiters attempt again, since a grant may have been lost.
func (c *Client) receive(ps *redis.PubSub) {
	defer c.wg.Done()
	for {
		msg, err := ps.Receive(c.ctx)
		if err != nil {
			if c.ctx.Err() != nil {
				return
			}
			t := time.NewTimer(50 * time.Millisecond)
			select {
			case <-c.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		c.mu.Lock()
		switch m := msg.(type) {
		case *redis.Subscription:
			if ch := c.channels[m.Channel]; ch != nil && m.Kind == "subscribe" {
				if !ch.confirmed {
					ch.confirmed = true
					close(ch.ready)
				} else {
					for _, w := range c.waiting {
						if w.ch == ch {
							w.poke()
						}
					}
				}
			}
		case *redis.Message:
			if ticket, _, ok := parseGrant(m.Payload); ok && c.waiting[ticket] != nil {
				select {
				case c.waiting[ticket].grant <- m.Payload:
				default:
				}
			}
		}
		c.mu.Unlock()
	}
}

// parseGrant decodes a grant message, "ticket:token:ms".
func parseGrant(msg string) (ticket string, token int64, ok bool) {
	i := strings.LastIndexByte(msg, ':')
	if i < 0 {
		return "", 0, false
	}
	j := strings.LastIndexByte(msg[:i], ':')
	if j < 0 {
		return "", 0, false
	}
	token, err := strconv.ParseInt(msg[j+1:i], 10, 64)
	return msg[:j], token, err == nil
}

// poke has w attempt again.
func (w *waiter) poke() {
	select {
	case w.nudge <- struct{}{}:
	default:
	}
}

// keepAlive heartbeats w, queued on the lock k by an attempt sent at
// sent, with the Client's other waiters there, unless it is already.
func (c *Client) keepAlive(w *waiter, k keys, sent time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || w.hb != nil {
		return
	}
	e := c.entries[k.hash]
	if e == nil {
		e = &entry{k: k, waiters: map[*waiter]time.Time{}, due: sent.Add(every)}
		c.entries[k.hash] = e
	} else if due := sent.Add(every); due.Before(e.due) {
		e.due = due
	}
	e.farewell = false
	e.waiters[w] = sent.Add(heartbeat - drift(heartbeat))
	w.hb = e
	c.pokeLocked()
}

// drift is the margin taken off a deadline for clock drift (1% plus 2 ms).
func drift(d time.Duration) time.Duration { return d/100 + 2*time.Millisecond }

// stopKeepAlive stops heartbeating w.
func (c *Client) stopKeepAlive(w *waiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopLocked(w)
}

// stopLocked stops heartbeating w; the entry goes with its last waiter,
// after a farewell if a heartbeat was sent. c.mu must be held.
func (c *Client) stopLocked(w *waiter) {
	e := w.hb
	if e == nil {
		return
	}
	w.hb = nil
	delete(e.waiters, w)
	switch {
	case len(e.waiters) > 0:
	case !e.beat:
		delete(c.entries, e.k.hash)
	default:
		e.farewell, e.due = true, time.Now()
		c.pokeLocked()
	}
}

// pokeLocked wakes run. c.mu must be held.
func (c *Client) pokeLocked() {
	select {
	case c.poke <- struct{}{}:
	default:
	}
}

// run sends the heartbeats when due and unsubscribes idle channels, until
// Close.
func (c *Client) run() {
	defer c.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		c.heartbeat()
		t.Reset(c.sweep(time.Now()))
		select {
		case <-c.ctx.Done():
			return
		case <-c.poke:
		case <-t.C:
		}
	}
}

// heartbeat sends, in one call, the heartbeats due (or about to be,
// within a sixth of their interval) and the farewells, and has the
// waiters attempt again when the reply says a release may have dropped
// them.
func (c *Client) heartbeat() {
	now := time.Now()
	var batch []*entry
	var ttls []time.Duration
	c.mu.Lock()
	for _, e := range c.entries {
		if len(batch) < renewBatch && !now.Before(e.due.Add(-every/6)) {
			ttl := heartbeat
			if e.farewell {
				ttl = 0
			}
			e.beat = true
			batch, ttls = append(batch, e), append(ttls, ttl)
		}
	}
	c.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, heartbeat)
	defer cancel()
	sent := time.Now()
	res, err := c.renew(ctx, batch, ttls)
	now = time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range batch {
		switch {
		case c.entries[e.k.hash] != e:
		case ttls[i] == 0 && e.farewell:
			delete(c.entries, e.k.hash)
		case ttls[i] == 0 || e.farewell:
			e.due = now // waiters came back after the farewell, or left after the heartbeat
		case err != nil:
			e.due = now.Add(retryAfter)
			for w := range e.waiters {
				w.poke()
			}
		default:
			e.due = sent.Add(every)
			for w, safe := range e.waiters {
				if res[i] == 2 || res[i] == 0 || (res[i] == 3 && !now.Before(safe)) {
					w.poke()
				}
			}
		}
	}
}

// renew runs renew.lua with the entries of batch, kind "wait", each with
// its ttl (0: a farewell).
func (c *Client) renew(ctx context.Context, batch []*entry, ttls []time.Duration) ([]int64, error) {
	ks := make([]string, 0, 3*len(batch))
	args := make([]any, 0, 3*len(batch))
	for i, e := range batch {
		ks = append(ks, e.k.queue, e.k.waiters, e.k.hash)
		args = append(args, "wait", c.id, ttls[i].Milliseconds())
	}
	res, err := scripts.renew.Run(ctx, c.rdb, ks, args...).Int64Slice()
	if err == nil && len(res) != len(batch)+1 {
		err = fmt.Errorf("layout2: %d replies from renew.lua for %d entries", len(res), len(batch))
	}
	return res, err
}

// sweep unsubscribes the channels idle for linger, and returns how long
// run may sleep: until the next heartbeat or sweep is due.
func (c *Client) sweep(now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := now.Add(time.Hour)
	for name, ch := range c.channels {
		switch {
		case ch.n > 0 || !ch.confirmed:
		case !now.Before(ch.idle.Add(linger)):
			delete(c.channels, name)
			_ = c.ps.Unsubscribe(c.ctx, name)
		case ch.idle.Add(linger).Before(next):
			next = ch.idle.Add(linger)
		}
	}
	for _, e := range c.entries {
		if due := e.due.Add(-every / 6); due.Before(next) {
			next = due
		}
	}
	return max(next.Sub(now), 0)
}
