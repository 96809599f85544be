package redisync

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// newMini starts an embedded Redis and returns a go-redis client to it
// that counts the commands it sends.
func newMini(t *testing.T) (*miniredis.Miniredis, *redis.Client, *counter) {
	t.Helper()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	cnt := &counter{}
	addHook(rdb, cnt)
	t.Cleanup(func() { _ = rdb.Close() })
	return mr, rdb, cnt
}

// newClient returns a redisync Client closed at the end of the test, whose
// own connections see the hooks added to rdb with addHook.
func newClient(t *testing.T, rdb redis.UniversalClient, opts ...Option) *Client {
	t.Helper()
	c, err := New(rdb, append([]Option{withHooksOf(rdb)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newSharedClient returns a Client closed at the end of the test that
// sends every call through rdb itself, as a Redlock's node clients do:
// rdb's retries may resend a call without telling it, so a copy of any
// call may still be on its way (roundtrip.Runner.MayCopy).
func newSharedClient(t *testing.T, rdb redis.UniversalClient, opts ...Option) *Client {
	t.Helper()
	cfg := with(defaultConfig(), atClient, opts)
	if cfg.err != nil {
		t.Fatal(cfg.err)
	}
	c := clientWith(rdb, nil, cfg, false)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testHooks are the hooks that tests add to clients with addHook.
var testHooks struct {
	sync.Mutex
	of map[redis.UniversalClient][]redis.Hook
}

// addHook adds h to rdb, and to the connections of their own that the
// Clients of rdb open when made with withHooksOf(rdb), however late: a
// test's hook sees every command a Client sends.
func addHook(rdb *redis.Client, h redis.Hook) {
	rdb.AddHook(h)
	testHooks.Lock()
	defer testHooks.Unlock()
	if testHooks.of == nil {
		testHooks.of = map[redis.UniversalClient][]redis.Hook{}
	}
	testHooks.of[rdb] = append(testHooks.of[rdb], h)
}

// hooksOf returns the hooks added to rdb with addHook.
func hooksOf(rdb redis.UniversalClient) []redis.Hook {
	testHooks.Lock()
	defer testHooks.Unlock()
	return slices.Clone(testHooks.of[rdb])
}

// withHooksOf returns the option that has a Client's own connections to
// the server of one of rdbs run the hooks added to it with addHook, as
// they are when each command is sent.
func withHooksOf(rdbs ...redis.UniversalClient) Option {
	return WithConnSetup(func(c *redis.Client) error {
		for _, rdb := range rdbs {
			if n, ok := rdb.(*redis.Client); ok && n.Options().Addr == c.Options().Addr {
				c.AddHook(forwardHooks{rdb})
				return nil
			}
		}
		return nil
	})
}

// forwardHooks runs the hooks added to rdb with addHook.
type forwardHooks struct{ rdb redis.UniversalClient }

func (f forwardHooks) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		hs, d := hooksOf(f.rdb), next
		for i := len(hs) - 1; i >= 0; i-- {
			d = hs[i].DialHook(d)
		}
		return d(ctx, network, addr)
	}
}

func (f forwardHooks) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		hs, p := hooksOf(f.rdb), next
		for i := len(hs) - 1; i >= 0; i-- {
			p = hs[i].ProcessHook(p)
		}
		return p(ctx, cmd)
	}
}

func (f forwardHooks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		hs, p := hooksOf(f.rdb), next
		for i := len(hs) - 1; i >= 0; i-- {
			p = hs[i].ProcessPipelineHook(p)
		}
		return p(ctx, cmds)
	}
}

// counter is a go-redis hook that counts commands (not the handshake of a
// new connection) and can replay the next
// command whose name and first argument match, as go-redis does when it
// retries after a lost reply: the command runs twice, the caller sees the
// second reply.
type counter struct {
	passDial
	n      atomic.Int64
	mu     sync.Mutex
	replay string // "evalsha" etc.; "" when disarmed
	sha    string
}

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if handshake(cmd) {
			return next(ctx, cmd)
		}
		// Counted once answered, so that a count seen by a test is of
		// commands that have run.
		err := next(ctx, cmd)
		c.n.Add(1)
		if err != nil || !c.take(cmd) {
			return err
		}
		err = next(ctx, cmd)
		c.n.Add(1)
		return err
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if !handshake(cmd) {
				c.n.Add(1)
			}
		}
		return err
	}
}

// handshake reports whether cmd is part of a new connection's set-up: the
// handshake, or the PING with which a Client connects a lane it keeps in
// reserve.
func handshake(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "client", "auth", "select", "ping":
		return true
	}
	return false
}

// armReplay makes the next EVALSHA of script run twice.
func (c *counter) armReplay(s *luaScript) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.replay, c.sha = "evalsha", s.Hash()
}

func (c *counter) take(cmd redis.Cmder) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	args := cmd.Args()
	if c.replay == "" || strings.ToLower(cmd.Name()) != c.replay || len(args) < 2 || args[1] != c.sha {
		return false
	}
	c.replay = ""
	return true
}

// confirmedWaiters returns how many waiters of c wait on channel once its
// subscription is confirmed, and 0 until then.
func confirmedWaiters(c *Client, channel string) int {
	all, _, confirmed, _ := c.sub.reg.Waiters(channel)
	if !confirmed {
		return 0
	}
	return all
}

// eventually fails the test unless cond becomes true within d.
var eventually = redistest.Eventually

// holdIDs returns the hold ids in a lock's hash (its holder's, while its
// lease has not ended: none, or one), or in a semaphore's holders hash (its
// fields).
func holdIDs(t *testing.T, mr *miniredis.Miniredis, key string) []string {
	t.Helper()
	if strings.Contains(key, ":lock:") || strings.Contains(key, ":elect:") {
		st := lockState(t, mr, key)
		if st.Held(serverMS(t, mr)) {
			return []string{st.Owner}
		}
		return nil
	}
	fields, err := mr.HKeys(key)
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(fields, func(f string) bool { return slices.Contains(schema.SemFields, f) })
}

// lockHeld reports whether the lock whose hash is key is held.
func lockHeld(t *testing.T, mr *miniredis.Miniredis, key string) bool {
	t.Helper()
	return lockState(t, mr, key).Held(serverMS(t, mr))
}

// lockState returns what the lock's hash key says, failing the test when
// it is not a lock's of this layout.
func lockState(t *testing.T, mr *miniredis.Miniredis, key string) schema.LockState {
	t.Helper()
	h := map[string]string{}
	if mr.Exists(key) {
		fields, err := mr.HKeys(key)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fields {
			h[f] = mr.HGet(key, f)
		}
	}
	st, ok := schema.ParseLockState(h)
	if !ok {
		t.Fatalf("%s is not a lock of layout %d: %q", key, schema.Layout, h)
	}
	return st
}

// serverMS returns the embedded Redis's clock, in ms.
func serverMS(t *testing.T, mr *miniredis.Miniredis) int64 {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// withdrawnTickets returns the keys of the lock k's tombstones that record
// a withdrawal (scripts/lib.lua, withdraw_ticket), failing the test unless
// each has a TTL of at most an hour.
func withdrawnTickets(t *testing.T, mr *miniredis.Miniredis, k schema.Lock) []string {
	t.Helper()
	var keys []string
	for _, key := range mr.Keys() {
		if !strings.HasPrefix(key, k.Tombstone("")) || mr.Type(key) != "string" {
			continue
		}
		if v, _ := mr.Get(key); v != "withdrawn" {
			continue
		}
		if ttl := mr.TTL(key); ttl <= 0 || ttl > time.Hour {
			t.Errorf("%s: TTL %v, want at most an hour", key, ttl)
		}
		keys = append(keys, key)
	}
	return keys
}

// passDial passes dials through untouched, for a hook (redis.Hook) that
// embeds it.
type passDial struct{}

func (passDial) DialHook(next redis.DialHook) redis.DialHook { return next }

// passHooks passes dials and pipelines through untouched: a hook
// (redis.Hook) that embeds it writes only its ProcessHook.
type passHooks struct{ passDial }

func (passHooks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// queuedTickets returns the tickets in the fair queue of the lock k, in
// order.
func queuedTickets(t *testing.T, mr *miniredis.Miniredis, k schema.Lock) []string {
	t.Helper()
	if !mr.Exists(k.Queue) {
		return nil
	}
	recs, err := mr.List(k.Queue)
	if err != nil {
		t.Fatal(err)
	}
	var tickets []string
	for _, r := range recs {
		rec, ok := schema.ParseQueueRecord(r)
		if !ok {
			t.Fatalf("queue record %q", r)
		}
		tickets = append(tickets, rec.Ticket)
	}
	return tickets
}

// mustGet returns the string at key.
func mustGet(t *testing.T, mr interface{ Get(string) (string, error) }, key string) string {
	t.Helper()
	v, err := mr.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// lockStateOf returns what the hash of the lock k says (lockState).
func lockStateOf(t *testing.T, mr *miniredis.Miniredis, k schema.Lock) schema.LockState {
	t.Helper()
	return lockState(t, mr, k.Hash)
}

// lockHeldAt reports whether the lock k is held at now (the server's
// clock: time.Now() for a miniredis whose time was not set).
func lockHeldAt(t *testing.T, mr *miniredis.Miniredis, k schema.Lock, now time.Time) bool {
	t.Helper()
	return lockStateOf(t, mr, k).Held(now.UnixMilli())
}

// queueRecords returns the records in the fair queue of the lock k, in
// order.
func queueRecords(t *testing.T, mr *miniredis.Miniredis, k schema.Lock) []schema.QueueRecord {
	t.Helper()
	if !mr.Exists(k.Queue) {
		return nil
	}
	recs, err := mr.List(k.Queue)
	if err != nil {
		t.Fatal(err)
	}
	var out []schema.QueueRecord
	for _, r := range recs {
		rec, ok := schema.ParseQueueRecord(r)
		if !ok {
			t.Fatalf("queue record %q", r)
		}
		out = append(out, rec)
	}
	return out
}

// queueSize returns how many records the queue at key holds: a lock's list
// or a semaphore's zset.
func queueSize(mr *miniredis.Miniredis, key string) int {
	switch mr.Type(key) {
	case "list":
		l, _ := mr.List(key)
		return len(l)
	case "zset":
		m, _ := mr.ZMembers(key)
		return len(m)
	}
	return 0
}

// serverLockHeld reports whether the lock k is held on the server of rdb.
func serverLockHeld(t *testing.T, rdb redis.Cmdable, k schema.Lock) bool {
	t.Helper()
	s, now := serverLockState(t, rdb, k)
	return s.Held(now)
}

// serverLockState returns what the hash of the lock k says on the server
// of rdb, and that server's time in ms.
func serverLockState(t *testing.T, rdb redis.Cmdable, k schema.Lock) (schema.LockState, int64) {
	t.Helper()
	h, err := rdb.HGetAll(context.Background(), k.Hash).Result()
	if err != nil {
		t.Fatal(err)
	}
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	s, ok := schema.ParseLockState(h)
	if !ok {
		t.Fatalf("%s is no lock hash of layout %d: %q", k.Hash, schema.Layout, h)
	}
	return s, now.UnixMilli()
}

// must returns v, a value that a constructor made, and panics with err,
// the constructor's error: a test whose arguments are valid by design
// fails at once (and loudly) if they are not.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// errOf returns the error of a constructor's call.
func errOf[T any](_ T, err error) error { return err }

// checkInvalid fails t unless err, a constructor's error, is an *OpError
// whose cause is want, and ErrInvalid.
func checkInvalid(t *testing.T, err, want error) {
	t.Helper()
	var oe *OpError
	if !errors.As(err, &oe) || !errors.Is(err, want) || !errors.Is(err, ErrInvalid) {
		t.Errorf("got %v, want an *OpError of %v and ErrInvalid", err, want)
	}
}

// observeChan ranges over e.Observe(ctx) in a goroutine and sends the
// states to the returned channel, which is closed when the sequence ends.
func observeChan(ctx context.Context, e *Election) <-chan Leadership {
	out := make(chan Leadership)
	go func() {
		defer close(out)
		for l, err := range e.Observe(ctx) {
			if err != nil {
				return
			}
			select {
			case out <- l:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}
