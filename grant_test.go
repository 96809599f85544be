package redisync

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/schema"
)

// message is one pub/sub message heard by a test's own subscriber.
type message struct{ channel, payload string }

// listen subscribes to every channel matching pattern, and returns the
// messages heard as they come.
func listen(t *testing.T, rdb *redis.Client, pattern string) <-chan message {
	t.Helper()
	ps := rdb.PSubscribe(ctx, pattern)
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	out := make(chan message, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ps.Channel() {
			out <- message{m.Channel, m.Payload}
		}
	}()
	t.Cleanup(func() {
		_ = ps.Close()
		<-done
	})
	return out
}

// next returns the next message heard, failing the test after 5 s.
func next(t *testing.T, msgs <-chan message) message {
	t.Helper()
	select {
	case m := <-msgs:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("no message within 5s")
		return message{}
	}
}

// quiet fails the test if a message is heard within d.
func quiet(t *testing.T, msgs <-chan message, d time.Duration) {
	t.Helper()
	select {
	case m := <-msgs:
		t.Fatalf("heard %q on %s, want nothing more", m.payload, m.channel)
	case <-time.After(d):
	}
}

// Issue 16: a hand-off is published on the grant channel of the grantee's
// Client alone, so that only its process is woken; nothing goes to the
// lock's channel or to another Client's.
func TestFairGrantReachesOnlyTheGranteesClient(t *testing.T) {
	mr, rdb, _ := newMini(t)
	a, b := newClient(t, rdb), newClient(t, rdb)
	k := schema.LockKeys(schema.DefaultPrefix, "g")
	msgs := listen(t, rdb, k.Channel+"*")

	holder, wa, wb := must(a.NewMutex("g")), must(a.NewMutex("g")), must(b.NewMutex("g"))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	da := make(chan error, 1)
	go func() { da <- wa.Lock(ctx) }()
	eventually(t, 5*time.Second, "wa to queue", func() bool { return len(queuedTickets(t, mr, k)) == 1 })
	db := make(chan error, 1)
	go func() { db <- wb.Lock(ctx) }()
	eventually(t, 5*time.Second, "wb to queue", func() bool { return len(queuedTickets(t, mr, k)) == 2 })

	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(t, da); err != nil {
		t.Fatal(err)
	}
	m := next(t, msgs)
	if m.channel != k.GrantChannel(a.id) || !strings.HasPrefix(m.payload, wa.holdID()+":"+strconv.FormatInt(wa.Token(), 10)+":") {
		t.Fatalf("hand-off to wa heard as %q on %s, want it on %s", m.payload, m.channel, k.GrantChannel(a.id))
	}
	if err := wa.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(t, db); err != nil {
		t.Fatal(err)
	}
	if m := next(t, msgs); m.channel != k.GrantChannel(b.id) {
		t.Fatalf("hand-off to wb heard on %s, want %s", m.channel, k.GrantChannel(b.id))
	}
	if err := wb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The last release hands the lock to nobody, and no Client is
	// recorded as having a plain waiter: it publishes nothing.
	quiet(t, msgs, 50*time.Millisecond)
}

// The same for a semaphore: permits freed for waiters of two Clients are
// announced in one message per Client, on its grant channel.
func TestSemaphoreGrantsReachOnlyTheGranteesClients(t *testing.T) {
	mr, rdb, _ := newMini(t)
	a, b := newClient(t, rdb), newClient(t, rdb)
	k := schema.SemaphoreKeys(schema.DefaultPrefix, "s")
	msgs := listen(t, rdb, k.Channel+"*")

	holder := must(a.NewSemaphore("s", 3))
	if err := holder.Acquire(ctx, 3); err != nil {
		t.Fatal(err)
	}
	wa1, wa2, wb := must(a.NewSemaphore("s", 3)), must(a.NewSemaphore("s", 3)), must(b.NewSemaphore("s", 3))
	var done []<-chan error
	for i, w := range []*Semaphore{wa1, wb, wa2} {
		done = append(done, acquireAsync(ctx, w, 1))
		eventually(t, 5*time.Second, "a waiter to queue", func() bool { return zcard(mr, k.Queue) == i+1 })
	}
	if err := holder.Release(ctx, 3); err != nil {
		t.Fatal(err)
	}
	for _, d := range done {
		if err := result(t, d); err != nil {
			t.Fatal(err)
		}
	}
	heard := map[string]int{}
	for range 2 {
		m := next(t, msgs)
		heard[m.channel]++
	}
	if heard[k.GrantChannel(a.id)] != 1 || heard[k.GrantChannel(b.id)] != 1 {
		t.Fatalf("grants heard on %v, want one message on each Client's grant channel", heard)
	}
	quiet(t, msgs, 50*time.Millisecond)
	for _, w := range []*Semaphore{wa1, wa2, wb} {
		if err := w.Release(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
}

// schema.Client finds the client id in every form of id that the Lua
// scripts find it in (scripts/lib.lua, grant_channel), labels with '/',
// '-' and '#' included.
func TestClientOfID(t *testing.T) {
	_, rdb, _ := newMini(t)
	const client = "0b9f3c1e-58c4-4d2a-9e0f-1234567890ab"
	for _, id := range []string{
		"/" + client + "-1",
		"web-1/" + client + "-22",
		"a/b-3#4/" + client + "-5",
		"x/" + client + "-6#7",
	} {
		if got := schema.Client(id); got != client {
			t.Errorf("schema.Client(%q) = %q, want %q", id, got, client)
		}
		lua := luaLib + "\nreturn grant_channel('ch', ARGV[1])"
		got, err := rdb.Eval(context.Background(), lua, nil, id).Text()
		if err != nil || got != "ch:"+client {
			t.Errorf("grant_channel('ch', %q) = %q, %v; want %q", id, got, err, "ch:"+client)
		}
	}
}

// InspectLock counts a lock's own grant channels, not the channels of a
// lock whose name starts with its name and "}:ch:", which its pattern
// also matches.
func TestInspectCountsOnlyItsOwnGrantChannels(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithRecheck(time.Hour))
	const other = "n}:ch:evil"
	holder, waiter := must(c.NewMutex(other, Barging())), must(c.NewMutex(other, Barging()))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- waiter.Lock(wctx) }()
	eventually(t, 5*time.Second, "the waiter to subscribe", func() bool { return confirmedWaiters(c, waiter.post().channel) == 1 })
	for name, want := range map[string]int64{"n": 0, other: 1} {
		st, err := c.InspectLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Subscribers != want {
			t.Errorf("InspectLock(%q).Subscribers = %d, want %d", name, st.Subscribers, want)
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter: %v", err)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// zcard returns the number of members of the zset at key.
func zcard(mr *miniredis.Miniredis, key string) int {
	m, _ := mr.ZMembers(key)
	return len(m)
}
