package integration

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// proxy is a TCP proxy on loopback between clients and Redis that can
// drop a reply: it forwards a command, swallows what Redis answers and
// closes the connection, as a network failure after the command ran
// would. go-redis then retries the command on a new connection.
type proxy struct {
	Addr     string
	upstream string
	ln       net.Listener
	drop     atomic.Int32 // replies still to drop
	wg       sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// newProxy starts a proxy to upstream, stopped when the test ends.
func newProxy(t *testing.T, upstream string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{Addr: ln.Addr().String(), upstream: upstream, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// dropReplies makes the proxy drop the next n replies, each with its
// connection.
func (p *proxy) dropReplies(n int) { p.drop.Store(int32(n)) }

// resetAll closes every open connection, as a network reset would.
func (p *proxy) resetAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

func (p *proxy) accept() {
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
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(server, client)
			_ = server.Close()
		}()
		go func() {
			defer p.wg.Done()
			p.replies(client, server)
			_ = client.Close()
			p.untrack(client, server)
		}()
	}
}

// replies copies what Redis sends to the client, unless a reply is to be
// dropped: then it closes both ends instead.
func (p *proxy) replies(client, server net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 {
			if d := p.drop.Load(); d > 0 && p.drop.CompareAndSwap(d, d-1) {
				_ = server.Close()
				return
			}
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = server.Close()
			}
			return
		}
	}
}

func (p *proxy) track(cs ...net.Conn) bool {
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

func (p *proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// close stops the proxy and waits for its goroutines.
func (p *proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
