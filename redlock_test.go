package redisync

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// newMiniNodes starts n embedded Redis servers and returns them, go-redis
// clients to them, and their command counters.
func newMiniNodes(t *testing.T, n int) ([]*miniredis.Miniredis, []redis.UniversalClient, []*counter) {
	t.Helper()
	mrs := make([]*miniredis.Miniredis, n)
	rdbs := make([]redis.UniversalClient, n)
	cnts := make([]*counter, n)
	for i := range n {
		var rdb *redis.Client
		mrs[i], rdb, cnts[i] = newMini(t)
		rdbs[i] = rdb
	}
	return mrs, rdbs, cnts
}

// newRedlock returns a Redlock closed at the end of the test.
func newRedlock(t *testing.T, rdbs []redis.UniversalClient, opts ...Option) *Redlock {
	t.Helper()
	r, err := NewRedlock(rdbs, append([]Option{withHooksOf(rdbs...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func TestRedlockBadInputFailsBeforeRedis(t *testing.T) {
	_, rdbs, cnts := newMiniNodes(t, 3)
	same := redis.NewClient(&redis.Options{Addr: rdbs[0].(*redis.Client).Options().Addr})
	t.Cleanup(func() { _ = same.Close() })
	var typedNil *redis.Client
	cases := []struct {
		what string
		rdbs []redis.UniversalClient
		opts []Option
		name string
		want error
	}{
		{"nil list", nil, nil, "a", ErrNoNodes},
		{"empty list", []redis.UniversalClient{}, nil, "a", ErrNoNodes},
		{"nil node", []redis.UniversalClient{rdbs[0], nil, rdbs[2]}, nil, "a", ErrNilClient},
		{"typed nil node", []redis.UniversalClient{rdbs[0], typedNil}, nil, "a", ErrNilClient},
		{"same client twice", []redis.UniversalClient{rdbs[0], rdbs[1], rdbs[0]}, nil, "a", ErrDuplicateNode},
		{"same address twice", []redis.UniversalClient{rdbs[0], rdbs[1], same}, nil, "a", ErrDuplicateNode},
		{"bad lease", rdbs, []Option{WithFixedLease(0)}, "a", ErrInvalidOption},
		{"bad node timeout", rdbs, []Option{WithNodeTimeout(0)}, "a", ErrInvalidOption},
		{"empty name", rdbs, nil, "", ErrInvalidName},
		{"bad lock option", rdbs, nil, "a", ErrInvalidOption},
	}
	for _, tc := range cases {
		t.Run(tc.what, func(t *testing.T) {
			// NewRedlock refuses bad nodes and options; NewMutex a
			// lock's own bad name or option.
			r, err := NewRedlock(tc.rdbs, tc.opts...)
			if r == nil {
				if !errors.Is(err, tc.want) {
					t.Errorf("NewRedlock: %v, want %v", err, tc.want)
				}
				return
			}
			t.Cleanup(func() { _ = r.Close() })
			var opts []Option
			if tc.what == "bad lock option" {
				opts = append(opts, WithFixedLease(-1))
			}
			checkInvalid(t, errOf(r.NewMutex(tc.name, opts...)), tc.want)
		})
	}
	for i, c := range cnts {
		if n := c.n.Load(); n != 0 {
			t.Errorf("node %d got %d commands, want none", i, n)
		}
	}
	// Fair is not a Option: giving it to a Redlock does not
	// compile (TestOptionMisuseDoesNotCompile).
}

func TestRedlockQuorumSizes(t *testing.T) {
	for n, want := range map[int]int{1: 1, 2: 2, 3: 2, 4: 3, 5: 3} {
		_, rdbs, _ := newMiniNodes(t, n)
		r := newRedlock(t, rdbs)
		if got := r.Quorum(); got != want {
			t.Errorf("%d nodes: quorum %d, want %d", n, got, want)
		}
		m := must(r.NewMutex("even-is-fine"))
		if err := m.Lock(context.Background()); err != nil {
			t.Fatalf("%d nodes: %v", n, err)
		}
		if err := m.Unlock(context.Background()); err != nil {
			t.Fatalf("%d nodes: %v", n, err)
		}
	}
}

// redMembers reports, for each node, whether m's hold holds it.
func redMembers(m *RedMutex) []bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	member := make([]bool, len(m.r.clients))
	if m.cur != nil {
		for i, n := range m.cur.parts {
			member[i] = n != nil
		}
	}
	return member
}

// lockOnAll takes m with every node in the hold. Under the race detector
// a node can answer a round too late and be left out of it (its grant is
// undone), which a test of what each node holds cannot use: it tries
// again, a bounded number of times.
func lockOnAll(t *testing.T, m *RedMutex) {
	t.Helper()
	for range 20 {
		if err := m.Lock(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(redMembers(m), false) {
			return
		}
		if err := m.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatal("no round of 20 included every node")
}

func TestRedlockLockUnlockReentrant(t *testing.T) {
	ctx := context.Background()
	mrs, rdbs, _ := newMiniNodes(t, 3)
	r := newRedlock(t, rdbs)
	a, b := must(r.NewMutex("x")), must(r.NewMutex("x"))
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
	key := "redisync:lock:{x}"
	// held reports how many nodes hold the lock. A node that answered
	// a round too late (under the race detector, say) has its grant undone
	// in the background, so a hold is a quorum of nodes, not always all.
	held := func() int {
		n := 0
		for _, mr := range mrs {
			if lockHeld(t, mr, key) {
				n++
			}
		}
		return n
	}
	if n := held(); n < r.Quorum() {
		t.Fatalf("%d nodes hold the lock, want a quorum (%d)", n, r.Quorum())
	}
	if ok, err := b.TryLock(ctx); ok || err != nil {
		t.Fatalf("TryLock of another owner = %v, %v; want false, nil", ok, err)
	}
	if a.Token() == 0 || a.Lost() == notHeld {
		t.Fatalf("Token %d, Lost %v while held", a.Token(), a.Lost())
	}
	for range 2 {
		if err := a.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if n := held(); n < r.Quorum() {
			t.Fatalf("an inner Unlock released the lock: %d nodes have the key", n)
		}
		if ok, err := b.TryLock(ctx); ok || err != nil {
			t.Fatalf("after an inner Unlock, TryLock of another owner = %v, %v; want false, nil", ok, err)
		}
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "no node to hold the lock after the last Unlock", func() bool { return held() == 0 })
	if err := a.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Unlock of nothing: %v, want ErrNotHeld", err)
	}
	if a.Token() != 0 || a.Lost() != notHeld {
		t.Fatal("Token or Lost not reset after the last Unlock")
	}
	if ok, err := b.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock after release = %v, %v; want true, nil", ok, err)
	}
	_ = b.Unlock(ctx)
}

// The token is the largest of the quorum's, and every node of the hold is
// raised to it, so that a later hold on any of them gets a larger one.
func TestRedlockTokenIsRaisedOnEveryNode(t *testing.T) {
	ctx := context.Background()
	mrs, rdbs, _ := newMiniNodes(t, 3)
	// A layout 2 token counter, which the lock's state starts from.
	tokenKey := "redisync:lock:{t}:token"
	const high = 9_000_000_000_000_000 // far above any clock-derived token
	if err := mrs[1].Set(tokenKey, strconv.FormatInt(high, 10)); err != nil {
		t.Fatal(err)
	}
	r := newRedlock(t, rdbs)
	m := must(r.NewMutex("t"))
	lockOnAll(t, m)
	// high+1 unless a round that left a node out came first (lockOnAll).
	want := m.Token()
	if want <= high {
		t.Fatalf("token %d, want more than %d (the largest node token)", want, int64(high))
	}
	for i, mr := range mrs {
		if n := lockState(t, mr, "redisync:lock:{t}").Token; n != want {
			t.Errorf("node %d last token %d, want %d", i, n, want)
		}
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Without node 1, the next hold still gets a larger token.
	mrs[1].Close()
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := m.Token(); got != want+1 {
		t.Fatalf("token %d, want %d", got, want+1)
	}
	_ = m.Unlock(ctx)
}

func TestRedlockNoQuorum(t *testing.T) {
	ctx := context.Background()
	mrs, rdbs, _ := newMiniNodes(t, 3)
	r := newRedlock(t, rdbs, WithNodeTimeout(200*time.Millisecond))
	m := must(r.NewMutex("q"))
	mrs[0].Close()
	mrs[2].Close()
	start := time.Now()
	err := m.Lock(ctx)
	if !errors.Is(err, ErrQuorum) {
		t.Fatalf("Lock with 2 of 3 nodes down: %v, want ErrQuorum", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("ErrQuorum took %v", d)
	}
	// The error lists the failed nodes, each with its cause.
	var failed *NodeErrors
	if !errors.As(err, &failed) || len(failed.Nodes) != 2 || failed.Nodes[0].Node != 0 || failed.Nodes[1].Node != 2 {
		t.Fatalf("Lock's error %v: NodeErrors %+v, want nodes 0 and 2", err, failed)
	}
	for _, n := range failed.Nodes {
		if n.Err == nil || !strings.Contains(err.Error(), n.Error()) {
			t.Fatalf("node %d: cause %v, not in the error %q", n.Node, n.Err, err)
		}
	}
	if ok, err := m.TryLock(ctx); ok || !errors.Is(err, ErrQuorum) {
		t.Fatalf("TryLock: %v, %v; want false, ErrQuorum", ok, err)
	}
	for _, k := range mrs[1].Keys() {
		// The lock's state stays, free (it remembers the last token), and
		// the refusal of a withdrawn call (a Redlock's node calls go
		// through go-redis, whose retries may leave a copy on its way);
		// nothing else does.
		if strings.Contains(k, ":released:") && mustGet(t, mrs[1], k) == "withdrawn" && mrs[1].TTL(k) > 0 {
			continue
		}
		if !strings.HasSuffix(k, "}") || lockHeld(t, mrs[1], k) {
			t.Fatalf("key %q left on the live node", k)
		}
	}
}

// A node's hold lost (found gone by its watchdog) does not lose the
// Redlock hold while a quorum remains; the next one does.
func TestRedlockLostWhenQuorumGone(t *testing.T) {
	ctx := context.Background()
	mrs, rdbs, _ := newMiniNodes(t, 3)
	r := newRedlock(t, rdbs, WithCrashTimeout(600*time.Millisecond), WithNodeTimeout(200*time.Millisecond)) // a node timeout that a busy machine meets
	m := must(r.NewMutex("l"))
	lockOnAll(t, m)
	key := "redisync:lock:{l}"
	mrs[0].Del(key)
	eventually(t, 5*time.Second, "node 0's hold reported lost", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.cur.alive == 2
	})
	select {
	case <-m.Lost():
		t.Fatal("Lost closed with a quorum of node holds left")
	default:
	}
	mrs[1].Del(key)
	select {
	case <-m.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed after a quorum of node holds was lost")
	}
	// The lost hold is the value's until its Unlock; then a Lock takes
	// the lock anew; the old Lost channel stays closed.
	lost, token := m.Lost(), m.Token()
	if err := m.Unlock(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock of the lost hold: %v, want ErrLockLost", err)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatalf("Lock after the hold was lost: %v", err)
	}
	select {
	case <-lost:
	default:
		t.Fatal("the lost hold's Lost channel reopened")
	}
	if m.Lost() == lost || m.Token() <= token {
		t.Fatalf("the new hold has the old Lost channel or token %d (old %d)", m.Token(), token)
	}
	m.mu.Lock()
	count := m.cur.n
	m.mu.Unlock()
	if count != 1 {
		t.Fatalf("the new hold has %d levels, want 1", count)
	}
	// Lost again: Unlock says so, and releases what is left.
	mrs[0].Del(key)
	mrs[1].Del(key)
	select {
	case <-m.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed after a quorum of node holds was lost")
	}
	if err := m.Unlock(ctx); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock of a lost hold: %v, want ErrLockLost", err)
	}
	if lockHeld(t, mrs[2], key) {
		t.Fatal("Unlock of a lost hold left its last node hold")
	}
}

// delayAcquire is a go-redis hook that, while armed, holds up each call of
// the acquire script by d before sending it.
type delayAcquire struct {
	passHooks
	armed atomic.Bool
	d     time.Duration
}

func (h *delayAcquire) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if h.armed.Load() && len(args) > 1 && (args[1] == acquireScript.Hash() || args[1] == acquireScript.src) {
			time.Sleep(h.d)
		}
		return next(ctx, cmd)
	}
}

// A RedMutex round returns once a quorum answered; the slow node's attempt
// goes on with the call's ctx, which carries what Do learns its hold from.
// When that node grants late, Do still runs fn under the RedMutex's hold
// and releases it, not the node's hold (which the late grant's undo
// releases).
func TestRedMutexDoKeepsItsHoldWhenANodeGrantsLate(t *testing.T) {
	_, rdbs, _ := newMiniNodes(t, 3)
	slow := &delayAcquire{d: 150 * time.Millisecond}
	addHook(rdbs[2].(*redis.Client), slow)
	var pause atomic.Bool
	obs := &hookObserver{onEnd: func(c CallInfo) {
		if c.Op == OpLock && pause.Load() {
			time.Sleep(250 * time.Millisecond) // a slow Observer (a log sink)
		}
	}}
	r := newRedlock(t, rdbs, WithObserver(obs), WithNodeTimeout(400*time.Millisecond))
	m := must(r.NewMutex("l"))
	slow.armed.Store(true)
	pause.Store(true)
	var cause error
	err := m.Do(context.Background(), func(hctx context.Context) error {
		cause = context.Cause(hctx)
		return nil
	})
	pause.Store(false)
	slow.armed.Store(false)
	if cause != nil {
		t.Errorf("fn ran under a context already ended: %v", cause)
	}
	if err != nil {
		t.Errorf("Do: %v", err)
	}
	if m.Token() != 0 {
		t.Errorf("after Do the value still holds (token %d)", m.Token())
		_ = m.Unlock(context.Background())
	}
	// And the next Lock of the value does not wait forever.
	lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := m.Lock(lctx); err != nil {
		t.Errorf("Lock after Do: %v", err)
	} else if err := m.Unlock(context.Background()); err != nil && !errors.Is(err, ErrLockLost) {
		t.Error(err)
	}
}
