package integration

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// lockKey is the key of a lock's hash under the default prefix.
func lockKey(name string) string { return "redisync:lock:{" + name + "}" }

// subscribed returns how many Clients are subscribed to a lock's
// channels: its grant channels (one per Client with waiters, fair or
// barging, which alone subscribes to it), and its channel (where an older
// version's barging waiters wait).
func subscribed(t *testing.T, rdb redis.UniversalClient, name string) int64 {
	t.Helper()
	channel := lockKey(name) + ":ch"
	plain, err := rdb.PubSubNumSub(ctx, channel).Result()
	if err != nil {
		t.Fatal(err)
	}
	grants, err := rdb.PubSubChannels(ctx, channel+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return plain[channel] + int64(len(grants))
}

func TestMutexExclusionAndTokensUnderContention(t *testing.T) {
	cs := newClients(t, 4)
	res := contend(t, mutexes(cs, redistest.Name(t), 32), 0, rounds(20))
	if len(res.tokens) != 32*20 {
		t.Fatalf("%d acquisitions, want %d", len(res.tokens), 32*20)
	}
	increasing(t, res.tokens)
}

func TestMutexReentrantOnRealRedis(t *testing.T) {
	cs := newClients(t, 2)
	name := redistest.Name(t)
	a, b := must(cs[0].NewMutex(name)), must(cs[1].NewMutex(name))
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, cancel := a.HoldContext(ctx)
	defer cancel()
	for range 2 {
		if err := a.Lock(hctx); err != nil { // re-entered
			t.Fatal(err)
		}
	}
	token := a.Token()
	for i := 3; i > 0; i-- {
		if ok, err := b.TryLock(ctx); ok || err != nil {
			t.Fatalf("b took the lock while a held %d levels: %v, %v", i, ok, err)
		}
		if a.Token() != token {
			t.Fatal("re-entry changed the token")
		}
		if err := a.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := b.TryLock(ctx); !ok || err != nil {
		t.Fatalf("b could not take the lock after a's last Unlock: %v, %v", ok, err)
	}
	if b.Token() <= token {
		t.Fatalf("b's token %d, want more than a's %d", b.Token(), token)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestMutexHolderCrashFreesLockWithinLease(t *testing.T) {
	const lease = time.Second
	addr := redistest.Addr(t)
	name := redistest.Name(t)
	crashed, err := redisync.New(redistest.NewClient(t, addr), redisync.WithFixedLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	holder := must(crashed.NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	locked := time.Now()
	_ = crashed.Close() // dies without Unlock

	waiter := must(newClients(t, 1)[0].NewMutex(name))
	if err := waiter.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(locked); d > lease+300*time.Millisecond {
		t.Fatalf("waiter got the lock %v after the crash, want <= lease + 300ms", d)
	}
	if err := waiter.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestMutexLostWhenKeyDeletedBehindHolder(t *testing.T) {
	c := newClients(t, 1, redisync.WithCrashTimeout(300*time.Millisecond))[0]
	name := redistest.Name(t)
	m := must(c.NewMutex(name))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lost := m.Lost()
	if err := admin(t).Del(ctx, lockKey(name)).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed within 5s of the key's removal (renewal every 100ms)")
	}
	if err := m.Unlock(ctx); !errors.Is(err, redisync.ErrLockLost) {
		t.Fatalf("Unlock after loss: %v, want ErrLockLost", err)
	}
}

func TestMutexWaitersSurviveSubscriberKill(t *testing.T) {
	cs := newClients(t, 3, redisync.WithRecheck(30*time.Second))
	name := redistest.Name(t)
	holder := must(cs[0].NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 9
	done := make(chan error, n)
	for i := range n {
		m := must(cs[i%3].NewMutex(name))
		go func() {
			err := m.Lock(ctx)
			if err == nil {
				err = m.Unlock(ctx)
			}
			done <- err
		}()
	}
	rdb := admin(t)
	eventually(t, 5*time.Second, "3 Clients subscribed to the lock's grant channels", func() bool {
		return subscribed(t, rdb, name) == 3
	})
	if err := rdb.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The release's message may have been published while no subscriber
	// was connected; the reconnect makes every waiter look again, long
	// before the 30 s recheck.
	timeout := time.After(10 * time.Second)
	for range n {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-timeout:
			t.Fatal("waiters still blocked 10s after their subscriber was killed")
		}
	}
}

// Blocked waiters do not poll. A barging waiter sends nothing while it
// sleeps; a fair one is kept queued by its Client's heartbeat, a batch a
// second per Client (one script call for the heartbeats of its waiters),
// and nothing else. (Measured: 1.8 requests a second per Client, as
// waiters that joined at other times fall into two batches; the bound
// allows two.)
func TestMutexBlockedWaitersDoNotPoll(t *testing.T) {
	for _, barging := range []bool{true, false} {
		t.Run(fmt.Sprintf("barging=%v", barging), func(t *testing.T) { blockedWaitersDoNotPoll(t, barging) })
	}
}

// blockedWaitersDoNotPoll is one case of TestMutexBlockedWaitersDoNotPoll.
func blockedWaitersDoNotPoll(t *testing.T, barging bool) {
	const clients, n = 4, 20
	var opts []redisync.Option
	if barging {
		opts = append(opts, redisync.Barging())
	}
	cs := newClients(t, clients)
	name := redistest.Name(t)
	holder := must(cs[0].NewMutex(name, opts...))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range n {
		m := must(cs[i%clients].NewMutex(name, opts...))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.Lock(wctx); err == nil {
				t.Error("a waiter took a held lock")
			}
		}()
	}
	rdb := admin(t)
	eventually(t, 5*time.Second, "4 subscribers", func() bool {
		return subscribed(t, rdb, name) == clients
	})
	// Counted: every command but INFO (ours) and PING (the subscribers'
	// keep-alive of a silent pub/sub connection, every 3 s); for fair
	// waiters, the requests (scripts run), not the calls inside them.
	counter := cmdCounter{rdb}
	busy := func() int64 {
		if !barging {
			return callsOf(t, counter, "fcall") + callsOf(t, counter, "evalsha") + callsOf(t, counter, "eval")
		}
		return counter.total(t) - callsOf(t, counter, "info") - callsOf(t, counter, "ping")
	}
	if !barging {
		// Fair waiters are kept alive per Client: the first heartbeat of
		// each Client finds no deadline of it yet, reports a lapse twice
		// (two heartbeats), and its waiters look again each time, once
		// per wait. Count from when every Client's heartbeat is steady.
		eventually(t, 10*time.Second, "every Client's heartbeat to be steady", func() bool {
			fields, err := rdb.HGetAll(ctx, lockKey(name)).Result()
			if err != nil {
				t.Fatal(err)
			}
			steady := 0
			for f, v := range fields {
				if strings.HasPrefix(f, "{client}") && !strings.HasSuffix(v, ":L") {
					steady++
				}
			}
			return steady == clients
		})
	}
	// Let every waiter make its attempts and go to sleep: wait until
	// Redis is quiet (an INFO per look) over 100 ms windows.
	last := busy()
	eventually(t, 5*time.Second, "the waiters to stop sending commands (are they polling?)", func() bool {
		time.Sleep(100 * time.Millisecond) // a sampling window
		now := busy()
		quiet := now-last <= 1
		last = now
		return quiet
	})
	const window = 5 * time.Second
	before := busy()
	time.Sleep(window) // the observation window
	executed := busy() - before
	cancel()
	wg.Wait()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	want := int64(n) // barging: fewer commands than waiters in the window
	if !barging {
		want = clients * (2*int64(window/time.Second) + 2) // two heartbeat batches a second per Client, and slack
	}
	t.Logf("Redis executed %d in %v with %d blocked waiters (barging %v)", executed, window, n, barging)
	if executed >= want {
		t.Fatalf("Redis executed %d in %v with %d blocked waiters, want fewer than %d", executed, window, n, want)
	}
}

func TestMutexRetriedScriptsAfterDroppedReplies(t *testing.T) {
	p := redistest.NewProxy(t, redistest.Addr(t))
	rdb := redistest.NewClient(t, p.Addr)
	c, err := redisync.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	name := redistest.Name(t)
	m := must(c.NewMutex(name))
	if err := m.Lock(ctx); err != nil { // loads the scripts
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// Layout 3 keeps no hold count in Redis (re-entry is counted by m):
	// every step must leave the lock held by the one hold the first Lock
	// took, under the token that Lock was given, whatever the retries.
	var owner string
	var token int64
	hctx := ctx // the hold's context, once held
	for i, op := range []func() error{
		func() error {
			err := m.Lock(ctx)
			var cancel context.CancelFunc
			hctx, cancel = m.HoldContext(ctx)
			t.Cleanup(cancel)
			return err
		},
		func() error { return m.Lock(hctx) }, // re-entry is counted by m, not in Redis
		func() error { return m.Unlock(ctx) },
	} {
		p.DropReplies(1)
		if err := op(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		st, now := lockStateOn(t, admin(t), lockKey(name))
		if !st.Held(now) {
			t.Fatalf("step %d: the lock is not held after a dropped and retried reply: %+v", i, st)
		}
		if i == 0 {
			owner, token = st.Owner, st.Token
			if token != m.Token() {
				t.Fatalf("step 0: last token issued %d, the hold's %d: the retried acquire minted another", token, m.Token())
			}
		}
		if st.Owner != owner || st.Token != token {
			t.Fatalf("step %d: held by %q with last token %d after a dropped and retried reply, want %q, %d", i, st.Owner, st.Token, owner, token)
		}
	}
	p.DropReplies(1)
	if err := m.Unlock(ctx); err != nil {
		t.Fatalf("final Unlock with its reply dropped: %v", err)
	}
	if heldOn(t, admin(t), lockKey(name)) {
		t.Fatal("the lock is still held after the final Unlock")
	}
}

// TestMutexUnlockAfterItsLeaseRanOutIsLost: a hold whose lease ran out in
// Redis (as in a pause longer than the lease), and which another Client
// took since, is reported lost by Unlock (ErrLockLost), also when the
// release's reply is lost and it is retried, and before its Lost closed.
func TestMutexUnlockAfterItsLeaseRanOutIsLost(t *testing.T) {
	for _, drop := range []bool{false, true} {
		addr := redistest.Addr(t)
		p := redistest.NewProxy(t, addr)
		a := must(redisync.New(redistest.NewClient(t, p.Addr)))
		t.Cleanup(func() { _ = a.Close() })
		b := must(redisync.New(redistest.NewClient(t, addr)))
		t.Cleanup(func() { _ = b.Close() })
		name := fmt.Sprintf("%s-drop-%v", redistest.Name(t), drop)
		holder, other := must(a.NewMutex(name)), must(b.NewMutex(name))
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		jumpClock(t, admin(t), name) // its lease runs out
		if ok, err := other.TryLock(ctx); !ok || err != nil {
			t.Fatalf("the other Client's TryLock: %v, %v", ok, err)
		}
		if drop {
			p.DropReplies(1)
		}
		if err := holder.Unlock(ctx); !errors.Is(err, redisync.ErrLockLost) {
			t.Errorf("reply dropped: %v: Unlock = %v, want ErrLockLost", drop, err)
		}
		if err := other.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// ownerOf returns the holder of a lock.
func ownerOf(t *testing.T, name string) string {
	t.Helper()
	owners := holdIDs(t, name)
	if len(owners) != 1 {
		t.Fatalf("lock hash has hold ids %v, want one owner", owners)
	}
	return owners[0]
}

// holdIDs returns the hold ids of the lock name: its owner while it is
// held (per its hash and the server's clock), none when it is free.
func holdIDs(t *testing.T, name string) []string {
	t.Helper()
	st, now := lockStateOn(t, admin(t), lockKey(name))
	if !st.Held(now) {
		return nil
	}
	return []string{st.Owner}
}

func TestMutexWrongTypeOnRealRedis(t *testing.T) {
	c := newClients(t, 1)[0]
	rdb := admin(t)
	for _, kind := range []string{"list", "token"} {
		name := redistest.Name(t) + kind
		key := lockKey(name)
		if kind == "list" {
			rdb.RPush(ctx, key, "x")
		} else {
			key += ":token"
			rdb.Set(ctx, key, "not a number", 0)
		}
		m := must(c.NewMutex(name))
		err := m.Lock(ctx)
		if !errors.Is(err, redisync.ErrWrongType) {
			t.Fatalf("%s: Lock: %v, want ErrWrongType", kind, err)
		}
		// One clean line naming the lock: no Lua stack, no script SHA.
		if msg := err.Error(); strings.ContainsAny(msg, "\r\n") || strings.Contains(msg, "script") || !strings.Contains(msg, name) {
			t.Fatalf("%s: Lock's error %q is not one clean line naming the lock", kind, msg)
		}
		t.Logf("%s: %v", kind, err)
		if kind == "token" && rdb.Exists(ctx, lockKey(name)).Val() != 0 {
			t.Fatalf("%s: the lock was written", kind)
		}
		rdb.Del(ctx, key)
	}
}

// On a real Redis too (whose pcall hands the script an error table, not
// a string), a release that meets a queue of the wrong type (the lock's
// hash counting queued waiters, so that the release looks at it) fails
// with ErrWrongType and writes nothing: the hold, the lock's state and the
// queue key stay as they were.
func TestMutexReleaseMeetingWrongTypeLeavesTheQueueOnRealRedis(t *testing.T) {
	c := newClients(t, 1)[0]
	rdb := admin(t)
	name := redistest.Name(t)
	m := must(c.NewMutex(name))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	key, queue := lockKey(name), lockKey(name)+":waiting"
	rdb.HSet(ctx, key, schema.QueueField, "2") // waiters, the lock says
	rdb.Set(ctx, queue, "x", time.Minute)
	before := rdb.HGetAll(ctx, key).Val()
	err := m.Unlock(ctx)
	if !errors.Is(err, redisync.ErrWrongType) {
		t.Fatalf("Unlock: %v, want ErrWrongType", err)
	}
	t.Logf("Unlock: %v", err)
	if after := rdb.HGetAll(ctx, key).Val(); !maps.Equal(after, before) {
		t.Fatalf("the failed release wrote the lock's hash:\n%q\nthen\n%q", before, after)
	}
	if st, now := lockStateOn(t, rdb, key); !st.Held(now) {
		t.Fatalf("the failed release freed the lock: %+v", st)
	}
	if got := rdb.Get(ctx, queue).Val(); got != "x" {
		t.Fatalf("queue after the failed release: %q", got)
	}
	if ttl := rdb.PTTL(ctx, queue).Val(); ttl <= 0 {
		t.Fatalf("the queue came back with PTTL %v", ttl)
	}
	rdb.Del(ctx, queue, key)
}

func TestMutexCancelledLockLeavesNothing(t *testing.T) {
	cs := newClients(t, 2)
	name := redistest.Name(t)
	holder := must(cs[0].NewMutex(name))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, fair := range []bool{false, true} {
		var opts []redisync.Option
		if !fair {
			opts = append(opts, redisync.Barging())
		}
		m := must(cs[1].NewMutex(name, opts...))
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := m.Lock(wctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("fair=%v: Lock on a held lock: %v, want DeadlineExceeded", fair, err)
		}
	}
	rdb := admin(t)
	if owners := holdIDs(t, name); len(owners) != 1 {
		t.Fatalf("lock owners %v, want only the holder", owners)
	}
	// The barging waiter's Client may stay recorded in the lock's
	// bargers zset until its record runs out (schema.Lock.Bargers): that
	// key must have a TTL; nothing else may be left.
	bargers := schema.LockKeys(schema.DefaultPrefix, name).Bargers
	if ttl := rdb.PTTL(ctx, bargers).Val(); ttl == -1 {
		t.Fatalf("%s left without a TTL", bargers)
	}
	var left []string
	for _, k := range otherLockKeys(t, rdb, lockKey(name)) {
		if !strings.HasPrefix(k, bargers+" ") {
			left = append(left, k)
		}
	}
	if len(left) != 0 {
		t.Fatalf("left behind by a cancelled Lock: %q", left)
	}
	if st, _ := lockStateOn(t, rdb, lockKey(name)); st.Queue != 0 || len(st.Clients) != 0 {
		t.Fatalf("a cancelled Lock left %d queued records and liveness deadlines %v in the lock's hash", st.Queue, st.Clients)
	}
	eventually(t, 10*time.Second, "the idle channel to be unsubscribed", func() bool {
		return subscribed(t, rdb, name) == 0
	})
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
