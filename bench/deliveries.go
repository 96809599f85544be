package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"sync/atomic"
	"time"
)

// pushHeads are the first bytes of every message Redis pushes to a client
// unasked: a pub/sub message (plain, sharded or by pattern) or a
// client-side-caching invalidation, in RESP3 (a push, >) and in RESP2 (an
// array, *, on a pub/sub connection). A reply to a command never starts
// with one of them: its aggregate's first element is not one of these
// words. Each carries the frame's header, so that the same word inside a
// message's payload is not counted (a payload would have to hold a whole
// frame header, which no name or value of the benchmark does).
var pushHeads = [][]byte{
	[]byte(">3\r\n$7\r\nmessage\r\n"),
	[]byte(">3\r\n$8\r\nsmessage\r\n"),
	[]byte(">4\r\n$8\r\npmessage\r\n"),
	[]byte(">2\r\n$10\r\ninvalidate\r\n"),
	[]byte("*3\r\n$7\r\nmessage\r\n"),
	[]byte("*3\r\n$8\r\nsmessage\r\n"),
	[]byte("*4\r\n$8\r\npmessage\r\n"),
}

// longestHead is the length of the longest of pushHeads.
var longestHead = func() int {
	n := 0
	for _, h := range pushHeads {
		n = max(n, len(h))
	}
	return n
}()

// pushCounter is a client connection that counts the messages Redis
// pushes on it, as they come off the socket: the deliveries the server
// made to this client, whatever the library does with them. A connection
// is read by one goroutine at a time (go-redis and rueidis both read a
// connection from one reader), so its buffer needs no lock.
type pushCounter struct {
	net.Conn
	deliveries *atomic.Int64
	// buf holds the end of the last read (shorter than a head, which may
	// straddle two reads), then, while scanning, the new read after it.
	buf []byte
}

// Read reads from the connection and counts the pushes in what it read.
func (c *pushCounter) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.deliveries.Add(int64(c.scan(p[:n])))
	}
	return n, err
}

// scan returns how many heads end in data, read after what c.buf holds,
// and keeps the end of data in c.buf.
func (c *pushCounter) scan(data []byte) int {
	kept := len(c.buf)
	c.buf = append(c.buf, data...)
	found := 0
	for _, head := range pushHeads {
		for i := 0; ; {
			j := bytes.Index(c.buf[i:], head)
			if j < 0 {
				break
			}
			// A head that ended in the kept bytes was counted last time.
			if i+j+len(head) > kept {
				found++
			}
			i += j + 1
		}
	}
	keep := min(len(c.buf), longestHead-1)
	c.buf = c.buf[:copy(c.buf, c.buf[len(c.buf)-keep:])]
	return found
}

// dialer dials the go-redis clients' connections, with go-redis's
// default timeouts.
var dialer = net.Dialer{Timeout: 5 * time.Second, KeepAlive: 5 * time.Minute}

// goRedisDialer returns a go-redis Dialer whose connections count their
// pushes in counts.
func goRedisDialer(counts *clientCounts) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &pushCounter{Conn: conn, deliveries: &counts.deliveries}, nil
	}
}

// rueidisDialer returns a rueidis DialCtxFn whose connections count their
// pushes in counts.
func rueidisDialer(counts *clientCounts) func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
	return func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return &pushCounter{Conn: conn, deliveries: &counts.deliveries}, nil
	}
}
