package redistest

import (
	"bytes"
	"net"
	"sync"
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
//     then retries the command on a new connection).
type Proxy struct {
	Addr     string
	upstream string
	ln       net.Listener
	closed   chan struct{}
	wg       sync.WaitGroup

	mu        sync.Mutex
	conns     map[net.Conn]struct{}
	latency   time.Duration
	blackhole bool
	drop      int           // replies still to drop
	holdPat   []byte        // hold the next client chunk containing this
	held      chan struct{} // closed when a chunk is held
	gate      chan struct{} // closed to let the held chunk go

	replyDelay time.Duration // extra delay of chunks from Redis only (DelayReplies)
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
				p.mu.Lock()
				drop, lat := p.blackhole, p.latency
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
			drop := p.blackhole
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
