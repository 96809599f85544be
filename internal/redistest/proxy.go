package redistest

// The fault proxy is written here rather than embedded from Shopify's
// toxiproxy (github.com/Shopify/toxiproxy/v2). Weighed against it:
// toxiproxy's toxics cover latency with jitter, a stalled direction
// (timeout 0, until removed), resets (reset_peer), slicing and bandwidth,
// each per direction, which would replace SetLatency, SetBlackhole,
// SetBlackholeRequests and the reset here. They do not cover what the
// safety tests are built on: holding the next chunk that contains a given
// command (HoldNext: a SUBSCRIBE or one script call stalled while the
// rest of the connection's traffic waits behind it), learning when such
// a chunk passes (Watch), swallowing exactly the next n replies, each
// closing its connection so that go-redis retries a command that ran
// (DropReplies), and chaos drawn from a seeded source so that a failing
// stress run replays (SetChaos). Those would still be written here, on
// top of a proxy server with an HTTP API, metrics and a logger of its own
// in the tests' module graph; this file does all of it in one type.

import (
	"bytes"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy on loopback between clients and Redis that injects
// faults into every connection through it:
//
//   - latency: each chunk is delivered no earlier than latency after it was
//     read, in both directions, order kept;
//   - blackhole: connections stay open and everything sent either way is
//     swallowed (a partition that sends no RST, so only timeouts notice);
//   - reset: every open connection is closed at once;
//   - hold: the next chunk from a client that contains a given string (such
//     as a SUBSCRIBE) is held, with everything after it on that connection,
//     until the test lets it go;
//   - drop: the next replies from Redis are swallowed, each closing its
//     connection, as a network failure after a command ran would (go-redis
//     then retries the command on a new connection);
//   - chaos: each chunk is delayed by a random jitter, and now and then
//     stalls its connection (in its direction) for a random while, from a
//     seeded source (see SetChaos).
//   - half-open: what clients send is swallowed, what Redis sends goes
//     through (SetBlackholeRequests);
//   - watch: a test learns when a chunk containing a given string passes
//     (Watch).
type Proxy struct {
	Addr     string
	upstream string
	ln       net.Listener
	closed   chan struct{}
	wg       sync.WaitGroup

	mu         sync.Mutex
	conns      map[net.Conn]struct{}
	latency    time.Duration
	blackhole  bool
	drop       int           // replies still to drop
	holdPat    []byte        // hold the next client chunk containing this
	held       chan struct{} // closed when a chunk is held
	gate       chan struct{} // closed to let the held chunk go
	replyDelay time.Duration // extra delay of chunks from Redis only (DelayReplies)
	mute       bool          // swallow what clients send (see SetBlackholeRequests)
	watches    []watch       // see Watch
	lastRead   [2]time.Time  // when a chunk was last read from Redis [0] and from a client [1]
	chaos      Chaos
	rng        *rand.Rand // chaos's source; nil when chaos is off

	stats proxyCounters
}

// Chaos is a proxy's random delays: every chunk read in a direction that
// Dir selects is delivered Jitter*U[0,1) later, and with probability
// StallProb it stalls its connection, in its direction, for a further
// Stall*U[0,1): what follows it on that side waits behind it, as behind a
// slow network or a descheduled server. The zero value is no chaos.
//
// The draws come from a source seeded with Seed, but chunks of concurrent
// connections draw in the order they are read, so the same seed gives the
// same distribution of delays, not the same delay to the same command.
type Chaos struct {
	Seed      uint64
	Jitter    time.Duration
	StallProb float64
	Stall     time.Duration
	Dir       Direction
}

// Direction selects the chunks a Chaos applies to.
type Direction int

const (
	// BothWays delays commands to Redis and replies (and pub/sub
	// messages) from it.
	BothWays Direction = iota
	// RequestsOnly delays only what clients send to Redis.
	RequestsOnly
	// RepliesOnly delays only what Redis sends back.
	RepliesOnly
)

// ProxyStats counts what a proxy's chaos did.
type ProxyStats struct {
	Chunks        int64 // chunks read, both ways
	Jittered      int64 // chunks given a jitter > 0
	RequestStalls int64 // stalls of a chunk sent to Redis
	ReplyStalls   int64 // stalls of a chunk from Redis (a call in flight)
	StalledFor    time.Duration
	MaxStall      time.Duration
	ConnsAccepted int64
}

type proxyCounters struct {
	chunks, jittered, reqStalls, repStalls, stalledNs, maxStallNs, conns atomic.Int64
}

// NewProxy starts a proxy to upstream, stopped when the test ends.
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{
		Addr: ln.Addr().String(), upstream: upstream, ln: ln,
		closed: make(chan struct{}), conns: map[net.Conn]struct{}{},
	}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// SetLatency delays every chunk read from now on by d.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// SetBlackhole starts (true) or stops swallowing everything.
func (p *Proxy) SetBlackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blackhole = on
}

// DropReplies makes the proxy drop the next n replies from Redis, each
// with its connection.
func (p *Proxy) DropReplies(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drop = n
}

// SetChaos sets the random delays of every chunk read from now on (see
// Chaos); the zero Chaos turns them off. The source is seeded anew.
func (p *Proxy) SetChaos(c Chaos) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.chaos = c
	p.rng = nil
	if c.Jitter > 0 || (c.StallProb > 0 && c.Stall > 0) {
		p.rng = rand.New(rand.NewPCG(c.Seed, c.Seed^0x9e3779b97f4a7c15))
	}
}

// Stats returns what the proxy's chaos has done so far.
func (p *Proxy) Stats() ProxyStats {
	c := &p.stats
	return ProxyStats{
		Chunks:        c.chunks.Load(),
		Jittered:      c.jittered.Load(),
		RequestStalls: c.reqStalls.Load(),
		ReplyStalls:   c.repStalls.Load(),
		StalledFor:    time.Duration(c.stalledNs.Load()),
		MaxStall:      time.Duration(c.maxStallNs.Load()),
		ConnsAccepted: c.conns.Load(),
	}
}

// delay draws the chaos delay of a chunk read now. p.mu must be held.
func (p *Proxy) delay(fromClient bool) time.Duration {
	p.stats.chunks.Add(1)
	c := p.chaos
	if p.rng == nil || (c.Dir == RequestsOnly && !fromClient) || (c.Dir == RepliesOnly && fromClient) {
		return 0
	}
	var d time.Duration
	if c.Jitter > 0 {
		if d = time.Duration(p.rng.Int64N(int64(c.Jitter))); d > 0 {
			p.stats.jittered.Add(1)
		}
	}
	if c.StallProb > 0 && c.Stall > 0 && p.rng.Float64() < c.StallProb {
		s := time.Duration(p.rng.Int64N(int64(c.Stall)))
		d += s
		if fromClient {
			p.stats.reqStalls.Add(1)
		} else {
			p.stats.repStalls.Add(1)
		}
		p.stats.stalledNs.Add(int64(s))
		if int64(s) > p.stats.maxStallNs.Load() {
			p.stats.maxStallNs.Store(int64(s)) // p.mu serializes the stores
		}
	}
	return d
}

// ResetAll closes every open connection, as a network reset would.
func (p *Proxy) ResetAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

// HoldNext arms the proxy to hold the next client chunk containing pat. It
// returns a channel closed once such a chunk is held, and a function that
// lets it (and what follows it) go.
func (p *Proxy) HoldNext(pat string) (held <-chan struct{}, release func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdPat = []byte(pat)
	p.held = make(chan struct{})
	p.gate = make(chan struct{})
	gate := p.gate
	var once sync.Once
	return p.held, func() { once.Do(func() { close(gate) }) }
}

// SetBlackholeRequests starts (true) or stops swallowing what clients
// send, while what Redis sends (replies, pub/sub messages) still goes
// through: a half-open partition in which a client hears from Redis but
// cannot talk to it.
func (p *Proxy) SetBlackholeRequests(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mute = on
}

// watch is one pending Watch.
type watch struct {
	pat        []byte
	fromClient bool
	seen       chan struct{}
}

// Watch returns a channel closed once the proxy reads a chunk containing
// pat (compared in lower case, like HoldNext) from a client (fromClient)
// or from Redis. It looks at chunks as they are read, before any fault
// applies: a chunk held behind a HoldNext, delayed or swallowed counts.
func (p *Proxy) Watch(pat string, fromClient bool) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := watch{bytes.ToLower([]byte(pat)), fromClient, make(chan struct{})}
	p.watches = append(p.watches, w)
	return w.seen
}

// LastRead returns when the proxy last read a chunk from a client
// (fromClient) or from Redis; the zero time if it never did.
func (p *Proxy) LastRead(fromClient bool) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastRead[side(fromClient)]
}

func side(fromClient bool) int {
	if fromClient {
		return 1
	}
	return 0
}

// watched records that chunk b was read from a client (fromClient) or
// from Redis, and closes (and forgets) the watches it matches.
func (p *Proxy) watched(b []byte, fromClient bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastRead[side(fromClient)] = time.Now()
	if len(p.watches) == 0 {
		return
	}
	lower := bytes.ToLower(b)
	kept := p.watches[:0]
	for _, w := range p.watches {
		if w.fromClient == fromClient && bytes.Contains(lower, w.pat) {
			close(w.seen)
			continue
		}
		kept = append(kept, w)
	}
	p.watches = kept
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = client.Close()
			continue
		}
		if !p.track(client, server) {
			return
		}
		p.stats.conns.Add(1)
		p.pipe(client, server, true)
		p.pipe(server, client, false)
	}
}

type chunk struct {
	b  []byte
	at time.Time // when it may be delivered
}

// pipe copies from src to dst through a queue, applying the faults; a
// failure on either side closes both.
func (p *Proxy) pipe(src, dst net.Conn, fromClient bool) {
	q := make(chan chunk, 4096)
	p.wg.Add(2)
	go func() { // reader
		defer p.wg.Done()
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				p.watched(buf[:n], fromClient)
				p.mu.Lock()
				drop, lat := p.blackhole || (fromClient && p.mute), p.latency+p.delay(fromClient)
				if !fromClient {
					lat += p.replyDelay
				}
				p.mu.Unlock()
				if !drop {
					select {
					case q <- chunk{buf[:n], time.Now().Add(lat)}:
					case <-p.closed:
						return
					}
				}
			}
			if err != nil {
				return
			}
		}
	}()
	go func() { // writer
		defer p.wg.Done()
		defer func() {
			_ = src.Close()
			_ = dst.Close()
			p.untrack(src, dst)
			for range q { // let the reader finish
			}
		}()
		for c := range q {
			if d := time.Until(c.at); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-p.closed:
					t.Stop()
					return
				}
			}
			if fromClient && !p.pass(c.b) {
				return
			}
			if !fromClient && p.dropped() {
				return // closes both ends: the reply is lost
			}
			p.mu.Lock()
			drop := p.blackhole || (fromClient && p.mute)
			p.mu.Unlock()
			if drop {
				continue
			}
			if _, err := dst.Write(c.b); err != nil {
				return
			}
		}
	}()
}

// pass holds a client chunk that matches the armed pattern until the test
// lets it go. It reports false when the proxy is closed meanwhile.
func (p *Proxy) pass(b []byte) bool {
	p.mu.Lock()
	if p.holdPat == nil || !bytes.Contains(bytes.ToLower(b), p.holdPat) {
		p.mu.Unlock()
		return true
	}
	p.holdPat = nil
	held, gate := p.held, p.gate
	p.mu.Unlock()
	close(held)
	select {
	case <-gate:
		return true
	case <-p.closed:
		return false
	}
}

// dropped reports whether a reply is to be dropped, counting it.
func (p *Proxy) dropped() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drop == 0 {
		return false
	}
	p.drop--
	return true
}

func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// close stops the proxy and waits for its goroutines.
func (p *Proxy) close() {
	_ = p.ln.Close()
	close(p.closed)
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// DelayReplies delays every chunk read from Redis from now on (replies and
// pub/sub messages) by d more than the latency, leaving what clients send
// undelayed: commands reach Redis and run at once, and their callers hear
// of it d later.
func (p *Proxy) DelayReplies(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.replyDelay = d
}
