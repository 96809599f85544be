package redisync

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
	"github.com/redisync/redisync/internal/waiters"
)

// forgedToken is the token of every forged grant: no Redis mints it.
const forgedToken = 1 << 60

// guessedAddresses returns every address a guesser can form for a call of
// the Client client labelled label, from what is visible (the Client id in
// a grant channel's name): its tickets, numbered 1 to 1000, in the old
// form ("label/client-n") and with a random part of zeros, and, with
// suffix (a semaphore's "#m"), its waiter ids.
func guessedAddresses(label, client string, suffixes ...string) []string {
	if len(suffixes) == 0 {
		suffixes = []string{""}
	}
	var out []string
	for n := 1; n <= 1000; n++ {
		base := label + "/" + client + "-" + strconv.Itoa(n)
		for _, t := range []string{base, base + "." + strings.Repeat("0", 24), base + "." + strings.Repeat("0", 16)} {
			for _, s := range suffixes {
				out = append(out, t+s)
				if s != "" {
					out = append(out, t+s+"."+strings.Repeat("0", 24))
				}
			}
		}
	}
	return out
}

// grantChannelOf waits until exactly one grant channel of the primitive
// whose channel is channel has a subscriber, and returns the client id in
// its name, as anyone who may run PUBSUB CHANNELS sees it.
func grantChannelOf(t *testing.T, rdb *redis.Client, channel string) (string, string) {
	t.Helper()
	var chans []string
	eventually(t, 5*time.Second, "a grant channel to be subscribed", func() bool {
		chans, _ = rdb.PubSubChannels(ctx, channel+":*").Result()
		return len(chans) == 1
	})
	return chans[0], strings.TrimPrefix(chans[0], channel+":")
}

// forge publishes on channel a grant of value to every address, in
// messages of batch grants each (a semaphore's message holds many).
func forge(t *testing.T, rdb *redis.Client, channel string, addresses []string, value int64, batch int) {
	t.Helper()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	ms := now.UnixMilli()
	pipe := rdb.Pipeline()
	for i := 0; i < len(addresses); i += batch {
		var msg []string
		for _, a := range addresses[i:min(i+batch, len(addresses))] {
			msg = append(msg, fmt.Sprintf("%s:%d:%d", a, value, ms))
		}
		pipe.Publish(ctx, channel, strings.Join(msg, " "))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}

// Issue 39: a grant published by anyone who may publish on a fair
// waiter's grant channel, addressed to any ticket that can be formed from
// what the channel's name shows, is not believed: Lock returns only once
// the holder unlocks, with the token Redis minted.
func TestForgedGrantIsNotBelieved(t *testing.T) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	k := schema.LockKeys(schema.DefaultPrefix, name)
	holder := must(newClient(t, rdb).NewMutex(name))
	waiter := must(newClient(t, rdb, WithLabel("app")).NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- waiter.Lock(wctx) }()
	eventually(t, 5*time.Second, "the waiter to queue", func() bool { return rdb.LLen(ctx, k.Queue).Val() == 1 })
	channel, client := grantChannelOf(t, rdb, k.Channel)
	forge(t, rdb, channel, guessedAddresses("app", client), forgedToken, 1)

	select {
	case err := <-done:
		t.Fatalf("Lock returned %v while the holder holds (Token %d)", err, waiter.Token())
	case <-time.After(time.Second):
	}
	if st, _ := serverLockState(t, rdb, k); st.Owner != holder.holdID() {
		t.Fatalf("the lock's owner is %q, want the holder %q", st.Owner, holder.holdID())
	}
	held := holder.Token()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	st, _ := serverLockState(t, rdb, k)
	if got := waiter.Token(); got == forgedToken || got <= held || got != st.Token || st.Owner != waiter.holdID() {
		t.Fatalf("waiter's Token() = %d, holder's %d, the lock's {token} %d and owner %q (waiter's %q)",
			got, held, st.Token, st.Owner, waiter.holdID())
	}
	if err := waiter.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Issue 39, a Semaphore's waiter: a forged grant to any waiter id that can
// be formed from what the grant channel's name shows is not believed, nor
// is a fenced RWMutex write's.
func TestForgedSemaphoreGrantIsNotBelieved(t *testing.T) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	k := schema.SemaphoreKeys(schema.DefaultPrefix, name)
	holder := must(newClient(t, rdb).NewSemaphore(name, 1))
	waiter := must(newClient(t, rdb, WithLabel("app")).NewSemaphore(name, 1))
	if err := holder.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done := acquireAsync(wctx, waiter, 1)
	eventually(t, 5*time.Second, "the waiter to queue", func() bool { return rdb.ZCard(ctx, k.Queue).Val() == 1 })
	channel, client := grantChannelOf(t, rdb, k.Channel)
	var suffixes []string
	for m := 1; m <= 3; m++ {
		suffixes = append(suffixes, "#"+strconv.Itoa(m))
	}
	forge(t, rdb, channel, guessedAddresses("app", client, suffixes...), 1, 200)

	select {
	case err := <-done:
		t.Fatalf("Acquire returned %v while the holder holds the only permit", err)
	case <-time.After(time.Second):
	}
	st, err := waiter.c.InspectSemaphore(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Holders) != 1 || st.Holders[0].ID != holder.holdID() || len(st.Queue) != 1 {
		t.Fatalf("holders %+v, queue %+v; want the holder alone, the waiter queued", st.Holders, st.Queue)
	}
	if err := holder.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if st, err = waiter.c.InspectSemaphore(ctx, name); err != nil || len(st.Holders) != 1 || st.Holders[0].ID != waiter.holdID() {
		t.Fatalf("holders %+v (%v), want the waiter's %q alone", st, err, waiter.holdID())
	}
	if err := waiter.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

// The tickets of one Client differ in a random part (hex, after the
// number, so that the scripts and schema.Client still find the Client in
// them, and waiters.ParseGrant the address in a grant), and so do the
// waiter ids of one Semaphore's calls on one holding.
func TestTicketsHaveARandomPart(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithLabel("a/b-3#4:x"))
	seen := map[string]bool{}
	for i := 1; i <= 100; i++ {
		ticket := c.ticket("a/b-3#4:x")
		num, random, ok := strings.Cut(strings.TrimPrefix(ticket, "a/b-3#4:x/"+c.id+"-"), ".")
		if !ok || num != strconv.Itoa(i) || len(random) < 16 || strings.Trim(random, "0123456789abcdef") != "" || seen[random] {
			t.Fatalf("ticket %d is %q: want %q, the number, '.' and a new random part in hex", i, ticket, "a/b-3#4:x/"+c.id+"-")
		}
		seen[random] = true
		s := must(c.NewSemaphore("s", 2))
		w1, w2 := s.nextWaiter(ticket), s.nextWaiter(ticket)
		d1, _ := strings.CutPrefix(w1, ticket+"#")
		d2, _ := strings.CutPrefix(w2, ticket+"#")
		if w1 == w2 || len(d1) != 31 || len(d2) != 31 || strings.Trim(d1+d2, "0123456789") != "" ||
			!strings.HasSuffix(d1, "1") || !strings.HasSuffix(d2, "2") || d1[:30] == d2[:30] {
			t.Fatalf("waiter ids %q and %q of holder %q: want holder, '#', 30 random digits, the call's number", w1, w2, ticket)
		}
		for _, id := range []string{ticket, w1, schema.HandoffPrefix + ticket} {
			if got := schema.Client(id); got != c.id {
				t.Errorf("schema.Client(%q) = %q, want %q", id, got, c.id)
			}
			if got := schema.Label(id); got != "a/b-3#4:x" {
				t.Errorf("schema.Label(%q) = %q", id, got)
			}
			lua := luaLib + luaLockLib + luaSemLib + "\nreturn {grant_channel('ch', ARGV[1]), sem_holder(ARGV[1])}"
			got, err := rdb.Eval(context.Background(), lua, nil, id).StringSlice()
			wantHolder := id
			if id == w1 {
				wantHolder = ticket
			}
			if err != nil || len(got) != 2 || got[0] != "ch:"+c.id || got[1] != wantHolder {
				t.Errorf("grant_channel('ch', %q), sem_holder = %q, %v; want %q, %q", id, got, err, "ch:"+c.id, wantHolder)
			}
			grant := id + ":17:1234"
			if a, v, ms, ok := waiters.ParseGrant(grant); !ok || a != id || v != 17 || ms != 1234 {
				t.Errorf("waiters.ParseGrant(%q) = %q, %d, %d, %v", grant, a, v, ms, ok)
			}
		}
	}
}
