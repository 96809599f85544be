package main

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/redistest"
)

// pushStream is what a client connection may read: replies, pushes of
// every kind, and a message whose payload holds a push's word.
var pushStream = strings.Join([]string{
	"+OK\r\n",
	">3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n",          // a confirmation: not a delivery
	">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$7\r\nmessage\r\n", // 1 (its payload is the word, not a head)
	":42\r\n",
	">3\r\n$8\r\nsmessage\r\n$2\r\nch\r\n$0\r\n\r\n",             // 2
	">4\r\n$8\r\npmessage\r\n$1\r\n*\r\n$2\r\nch\r\n$1\r\nx\r\n", // 3
	">2\r\n$10\r\ninvalidate\r\n*1\r\n$3\r\nkey\r\n",             // 4
	"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\ny\r\n",             // 5 (RESP2)
	"*2\r\n$7\r\nmessage\r\n$2\r\nch\r\n",                        // an array reply that starts with the word
}, "")

// countPushes feeds stream to a pushCounter in reads of size bytes.
func countPushes(stream string, size int) int {
	c := &pushCounter{deliveries: new(atomic.Int64)}
	found := 0
	for b := []byte(stream); len(b) > 0; {
		n := min(size, len(b))
		found += c.scan(b[:n])
		b = b[n:]
	}
	return found
}

func TestPushCounterCountsPushesAcrossReads(t *testing.T) {
	for _, size := range []int{1, 2, 3, 7, 17, 18, 21, 22, 23, 64, len(pushStream)} {
		if got := countPushes(pushStream, size); got != 5 {
			t.Errorf("reads of %d bytes: counted %d pushes, want 5", size, got)
		}
	}
}

func TestPushCounterOnRealConnections(t *testing.T) {
	addr := redistest.Addr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var counts clientCounts
	rdb := newGoRedis(addr, &counts)
	defer rdb.Close()
	ch := redistest.Name(t)
	ps := rdb.Subscribe(ctx, ch)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	publisher := redistest.Client(t)
	const messages = 50
	for range messages {
		if err := publisher.Publish(ctx, ch, "message").Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := ps.ReceiveMessage(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := counts.deliveries.Load(); got != messages {
		t.Errorf("counted %d deliveries on the subscriber's connection, want %d", got, messages)
	}
}

func TestOfLock(t *testing.T) {
	name := "rsbench-x:hot:32:redisync:1"
	for key, want := range map[string]bool{
		name:                                  true,
		name + ":17":                          true,
		"redisync:lock:{" + name + "}":        true,
		"redisync:lock:{" + name + "}:token":  true,
		"rueidislock:0:" + name:               true,
		"rsbench-x:hot:32:redisync:10":        false,
		"rsbench-x:hot:32:redisync-barging:1": false,
		"other":                               false,
	} {
		if got := ofLock(key, name); got != want {
			t.Errorf("ofLock(%q) = %v, want %v", key, got, want)
		}
	}
}
