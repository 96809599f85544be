package fault

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/integration/fault/internal/fence"
	"github.com/redisync/redisync/integration/fault/internal/history"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// Environment of the cancellation storm.
const (
	// stormSeedEnv replays a storm: its subtests print the seed they ran
	// with. Goroutines are still scheduled as they come, so a replay draws
	// the same deadlines, holds and delays, not the same interleaving.
	stormSeedEnv = "REDISYNC_STORM_SEED"
	// stormDurationEnv sets how long each subtest storms (a Go duration);
	// the default is defaultStormDuration.
	stormDurationEnv     = "REDISYNC_STORM_DURATION"
	defaultStormDuration = 6 * time.Second
)

// TestStorm is the cancellation storm: 4 Clients, 24 goroutines, some
// sharing a lock value and some with one of their own, call Lock (or
// Acquire) on one name again and again with deadlines mostly drawn from
// 0-5 ms (some 50 ms and 2 s), through fault proxies that add a random
// jitter to every chunk and stall connections now and then, so that
// deadlines land while a call waits in the queue, while its script is in
// flight, and while a grant is on its way. Half the Clients' go-redis
// clients honour context deadlines on the socket (a call cut in the middle
// of a script), half do not (a call that returns late).
//
// Every hold is recorded, with its owner (for a lock, the goroutine that
// took it: goroutines that share a value exclude each other; for the
// semaphore, the value, whose permits add up) and fencing token, as the
// interval from
// just after Lock returned to just before Unlock was called, or to when
// its holder saw Lost close, if earlier: a recorded interval lies inside
// the real hold. Each subtest fails on any of:
//
//   - two holds of different owners overlap, or tokens do not increase in
//     the order the holds started (history.Mutex), or, for the semaphore,
//     the permits of the holds running at one instant exceed its size
//     (history.Semaphore);
//   - the fenced register (internal/fence, on the same Redis, written by an
//     admin client that bypasses the proxies) rejects the token of a
//     holder whose Lost had not closed; for the semaphore, an occupancy
//     counter beside it goes above the size;
//   - Unlock or Release reports ErrLockLost for a hold whose Lost had not
//     closed when it was called (the lock had gone, unannounced), unless
//     nobody had taken the lock when it was called and somebody had when
//     it returned (a release sent again after its reply was lost, see
//     holdMutex);
//   - a call fails with an error other than its context's end (or a socket
//     timeout at that deadline), ErrLockLost after a loss, and, for a
//     RedMutex, ErrQuorum (nodes still busy with an abandoned call);
//   - after every call returned and every hold was released, and the
//     Clients were closed, the lock (or the semaphore's holders) is still
//     in Redis after 3 s, its queue and waiters after 3 s (their TTL is
//     twice the 300 ms heartbeat), or any key of the name other than the
//     token counter (the semaphore's size) is left without a TTL;
//   - the storm exercised too little to prove anything: no Lock cancelled
//     while another owner held the lock, no proxy stall, no call that
//     returned after its deadline had passed (a deadline that hit a round
//     trip).
//
// The seed is printed; REDISYNC_STORM_SEED replays it. Each subtest storms
// for 6 s (REDISYNC_STORM_DURATION) and then waits for its calls to return.
func TestStorm(t *testing.T) {
	base := stormSeed(t)
	dur := defaultStormDuration
	if s := os.Getenv(stormDurationEnv); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%s=%q: %v", stormDurationEnv, s, err)
		}
		dur = d
	}
	for _, tc := range []struct {
		name string
		run  func(*storm)
	}{
		{"MutexFair", func(s *storm) { s.mutexes(func(int) bool { return true }) }},
		{"MutexPlain", func(s *storm) { s.mutexes(func(int) bool { return false }) }},
		{"MutexMixed", func(s *storm) { s.mutexes(func(v int) bool { return v%2 == 0 }) }},
		{"Semaphore", (*storm).semaphores},
		{"RWMutex", (*storm).rwMutexes},
		{"RedMutex", (*storm).redMutexes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for try := uint64(0); ; try++ {
				s := newStorm(t, base, subSeed(base, tc.name)+try, dur)
				tc.run(s)
				switch {
				case s.gentle == "" || t.Failed():
					return
				case try+1 == stormTries:
					t.Errorf("storm too gentle in each of %d storms: %s", stormTries, s.gentle)
					return
				}
				t.Logf("storm too gentle (%s): storming again, with the next seed", s.gentle)
			}
		})
	}
}

// stormSeed returns the seed of the storm: REDISYNC_STORM_SEED or a random one.
func stormSeed(t *testing.T) uint64 {
	t.Helper()
	if s := os.Getenv(stormSeedEnv); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", stormSeedEnv, s, err)
		}
		return n
	}
	return rand.Uint64() >> 1
}

// subSeed derives a subtest's seed from the storm's and its name, so that
// one subtest replays alone (-run TestStorm/Name) with the storm's seed.
func subSeed(base uint64, name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return base ^ h.Sum64()
}

// Shape of every storm.
const (
	stormClients = 4
	heartbeat    = 300 * time.Millisecond
	maxHold      = 2 * time.Millisecond
	// tooLate is how long after its deadline a call may return before it
	// counts as having been caught in a round trip by the deadline.
	tooLate = time.Millisecond
)

// stormOpts are the options of every Client of a storm.
var stormOpts = []redisync.Option{
	redisync.WithWaiterTimeout(heartbeat),
	redisync.WithCrashTimeout(3 * time.Second),
	redisync.WithRecheck(200 * time.Millisecond),
}

// stormRedlockOpts are those of every Redlock of a storm (a Redlock has no
// queue, so no heartbeat).
var stormRedlockOpts = []redisync.Option{
	redisync.WithCrashTimeout(3 * time.Second),
	redisync.WithRecheck(200 * time.Millisecond),
}

// stormChaos is the proxies' chaos: every chunk up to 1 ms late, one in 25
// stalling its connection (in its direction) for up to 8 ms.
func stormChaos(seed uint64) redistest.Chaos {
	return redistest.Chaos{Seed: seed, Jitter: time.Millisecond, StallProb: 0.04, Stall: 8 * time.Millisecond}
}

// drawDeadline is a Lock call's deadline: mostly 0-5 ms, the span of a
// few round trips through the proxy, sometimes 50 ms or 2 s.
func drawDeadline(rng *rand.Rand) time.Duration {
	switch x := rng.IntN(100); {
	case x < 5:
		return 2 * time.Second
	case x < 15:
		return 50 * time.Millisecond
	default:
		return time.Duration(rng.Int64N(int64(5 * time.Millisecond)))
	}
}

// storm is one subtest's run: its Redis, its proxies and what it saw.
type storm struct {
	t     *testing.T
	seed  uint64
	dur   time.Duration
	admin *redis.Client // direct to the Redis of the fenced register
	name  string        // of the lock or semaphore
	reg   string        // fenced register (or occupancy counter) key
	base  time.Time     // of the test's clock, for messages

	proxies []*redistest.Proxy
	gentle  string // why the storm was too gentle to prove anything, if it was (see report)

	mu        sync.Mutex
	holds     []history.Hold
	cancelled []call              // Lock calls that ended with their deadline
	problems  map[string]*problem // by kind

	locks, grants, ctxErrs, lateErrs, lateGrants, lockLost, quorum atomic.Int64
	unlocks, unlockLost, lostSeen, fenceWrites                     atomic.Int64
}

// call is a Lock call that ended with its deadline.
type call struct {
	owner      string
	begun, end time.Time
}

// problem counts one kind of failure and keeps a few examples.
type problem struct {
	n        int
	examples []string
}

// newStorm prepares a subtest's storm; base is the storm's seed, seed the
// subtest's.
func newStorm(t *testing.T, base, seed uint64, dur time.Duration) *storm {
	t.Helper()
	t.Logf("%s=%d (replays it; alone: -run 'TestStorm/%s'), subtest seed %d, storming for %v",
		stormSeedEnv, base, strings.TrimPrefix(t.Name(), "TestStorm/"), seed, dur)
	return &storm{t: t, seed: seed, dur: dur, name: redistest.Name(t), base: time.Now(),
		problems: map[string]*problem{}}
}

// rng returns the source of goroutine (or proxy) number i.
func (s *storm) rng(i uint64) *rand.Rand { return rand.New(rand.NewPCG(s.seed, i)) }

// fail records a failure of a kind, with a message.
func (s *storm) fail(kind, format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.problems[kind]
	if p == nil {
		p = &problem{}
		s.problems[kind] = p
	}
	p.n++
	if len(p.examples) < 5 {
		p.examples = append(p.examples, fmt.Sprintf(format, args...))
	}
}

// proxy returns a proxy with the storm's chaos to upstream.
func (s *storm) proxy(upstream string) *redistest.Proxy {
	s.t.Helper()
	px := redistest.NewProxy(s.t, upstream)
	px.SetChaos(stormChaos(s.seed ^ uint64(1000+len(s.proxies))))
	s.proxies = append(s.proxies, px)
	return px
}

// goRedis returns a go-redis client to addr; client number i honours
// context deadlines on the socket when i is even.
func (s *storm) goRedis(addr string, i int) *redis.Client {
	s.t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: i%2 == 0})
	s.t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// locker is what a storm needs of a Mutex or a RedMutex.
type locker interface {
	Lock(context.Context) error
	Unlock(context.Context) error
	Token() int64
	Lost() <-chan struct{}
}

// shares says how many goroutines share each lock value of a Client: one
// value of 3 goroutines, one of 2 and one of their own. A lock value's
// goroutines exclude each other as different values' do.
var shares = []int{3, 2, 1}

// mutexes storms one lock name with stormClients Clients on the package's
// Redis; fair(v) says whether a Client's value number v is fair.
func (s *storm) mutexes(fair func(v int) bool) {
	t := s.t
	addr := redistest.Addr(t)
	s.admin = redistest.NewClient(t, addr)
	s.reg = "storm:{" + s.name + "}:register"
	t.Cleanup(func() { s.admin.Del(ctx, s.reg) })
	px := s.proxy(addr)
	var clients []*redisync.Client
	var workers []func(stop time.Time)
	for i := range stormClients {
		c, err := redisync.New(s.goRedis(px.Addr, i), stormOpts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
		for v, n := range shares {
			var opts []redisync.Option
			kind := "fair"
			if !fair(v) {
				opts, kind = append(opts, redisync.Barging()), "plain"
			}
			m := must(c.NewMutex(s.name, opts...))
			owner := fmt.Sprintf("c%d.%s%d", i, kind, v)
			for g := range n {
				rng := s.rng(uint64(len(workers)))
				who := fmt.Sprintf("%s.g%d", owner, g)
				workers = append(workers, func(stop time.Time) { s.lockLoop(rng, who, m, stop) })
			}
		}
	}
	s.run(workers)
	for _, c := range clients {
		_ = c.Close()
	}
	s.checkMutex()
	s.checkLockKeys(s.admin)
	s.report()
}

// redMutexes storms one lock name with stormClients Redlocks on three
// redis-server nodes of the test's own, each behind a proxy.
func (s *storm) redMutexes() {
	t := s.t
	var admins []*redis.Client
	var pxs []*redistest.Proxy
	for range 3 {
		srv := redistest.Spawn(t)
		admins = append(admins, redistest.NewClient(t, srv.Addr))
		pxs = append(pxs, s.proxy(srv.Addr))
	}
	s.admin = admins[0]
	s.reg = "storm:{" + s.name + "}:register"
	var rls []*redisync.Redlock
	var workers []func(stop time.Time)
	for i := range stormClients {
		var nodes []redis.UniversalClient
		for _, px := range pxs {
			nodes = append(nodes, s.goRedis(px.Addr, i))
		}
		r, err := redisync.NewRedlock(nodes, stormRedlockOpts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		rls = append(rls, r)
		for v, n := range shares {
			m := must(r.NewMutex(s.name))
			owner := fmt.Sprintf("r%d.v%d", i, v)
			for g := range n {
				rng := s.rng(uint64(len(workers)))
				who := fmt.Sprintf("%s.g%d", owner, g)
				workers = append(workers, func(stop time.Time) { s.lockLoop(rng, who, m, stop) })
			}
		}
	}
	s.run(workers)
	for _, r := range rls {
		_ = r.Close()
	}
	s.checkMutex()
	for _, a := range admins {
		s.checkLockKeys(a)
	}
	s.report()
}

// run starts the workers, lets them storm for s.dur and waits for them to
// stop: each finishes its call under way, which its deadline bounds.
func (s *storm) run(workers []func(stop time.Time)) {
	s.t.Helper()
	s.t.Logf("%d goroutines", len(workers))
	stop := time.Now().Add(s.dur)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { w(stop) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	const grace = 30 * time.Second
	select {
	case <-done:
	case <-time.After(s.dur + grace):
		// A call that outlives its deadline by this much is a hang;
		// the goroutines still running will show in goleak's report.
		s.t.Fatalf("workers still running %v after the storm ended", grace)
	}
	s.t.Logf("stormed %v, workers done %v after", s.dur, time.Since(stop).Round(time.Millisecond))
}

// lockLoop is one goroutine of a mutex storm: Lock with a drawn deadline,
// and when granted, write the token to the fenced register, hold for up
// to maxHold (stopping when Lost closes) and Unlock.
func (s *storm) lockLoop(rng *rand.Rand, who string, m locker, stop time.Time) {
	for time.Now().Before(stop) {
		d := drawDeadline(rng)
		lctx, cancel := context.WithTimeout(ctx, d)
		begun := time.Now()
		err := m.Lock(lctx)
		end := time.Now()
		expired := expiredBy(lctx, end)
		cancel()
		s.locks.Add(1)
		late := end.Sub(begun.Add(d)) > tooLate
		switch {
		case err == nil:
			s.grants.Add(1)
			if end.After(begun.Add(d)) {
				s.lateGrants.Add(1)
			}
			s.holdMutex(rng, who, m, end)
		case expired && deadlineErr(err):
			s.ctxErrs.Add(1)
			if late {
				s.lateErrs.Add(1)
			}
			s.mu.Lock()
			s.cancelled = append(s.cancelled, call{who, begun, end})
			s.mu.Unlock()
		case errors.Is(err, redisync.ErrQuorum):
			// A RedMutex gives up at once when nodes do not answer, or
			// are still busy with an earlier call of the value that
			// its deadline abandoned: documented, and no hold.
			s.quorum.Add(1)
		default:
			s.fail("lock error", "%s: Lock (deadline %v, expired %v): %v", who, d, expired, err)
		}
	}
}

// expiredBy reports whether ctx had ended, or its deadline had passed, by
// end: a blocking call fails with the deadline's error once the deadline
// has passed, even before the context's timer fires and ctx.Err() says so
// (redisync's ended), which a deadline of a few microseconds often shows.
func expiredBy(ctx context.Context, end time.Time) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !end.Before(dl)
}

// deadlineErr reports whether err is a call's end by its deadline: the
// context's error, or a socket timeout set from the deadline by go-redis.
func deadlineErr(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// holdMutex runs one hold of m, granted at start.
func (s *storm) holdMutex(rng *rand.Rand, who string, m locker, start time.Time) {
	h := history.Hold{Owner: who, Who: who, Start: start, Token: m.Token()}
	lost := m.Lost()
	if h.Token <= 0 {
		s.fail("bad token", "%s: Token() = %d right after Lock returned", who, h.Token)
	}
	ok, err := fence.Write(ctx, s.admin, s.reg, h.Token, who, who)
	s.fenceWrites.Add(1)
	switch {
	case err != nil:
		s.fail("fence error", "%s: %v", who, err)
	case !ok && !closed(lost):
		max, _ := s.admin.HGet(ctx, s.reg, "max").Result()
		s.fail("fence rejected a live holder", "%s: token %d rejected (register at %s), Lost open, held since %v",
			who, h.Token, max, s.since(start))
	}
	t := time.NewTimer(time.Duration(rng.Int64N(int64(maxHold))))
	select {
	case <-t.C:
		h.End = time.Now()
	case <-lost:
		h.End, h.Lost = time.Now(), true
		t.Stop()
		s.lostSeen.Add(1)
	}
	s.record(h)
	wasLost := closed(lost)
	// The last token issued when Unlock is called (on the first node, for
	// a RedMutex): while it is the hold's, nobody had taken the lock. Unlock
	// may then still report the hold lost (never a false success) when its
	// release went through, its reply was lost, and the next holders came
	// and went before the retry: then a later token was issued by the time
	// Unlock returned.
	last, _ := s.admin.HGet(ctx, lockKey(s.name), schema.TokenField).Int64()
	uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = m.Unlock(uctx)
	s.unlocks.Add(1)
	switch {
	case err == nil:
	case errors.Is(err, redisync.ErrLockLost):
		s.unlockLost.Add(1)
		after, _ := s.admin.HGet(ctx, lockKey(s.name), schema.TokenField).Int64()
		if !wasLost && (last != h.Token || after == h.Token) {
			s.fail("hold gone before Lost", "%s: Unlock: %v; Lost was open (token %d, the lock's last %d before Unlock and %d after, held %v from %v)",
				who, err, h.Token, last, after, h.End.Sub(h.Start).Round(time.Microsecond), s.since(start))
		}
	default:
		s.fail("unlock error", "%s: Unlock: %v", who, err)
	}
}

// semaphores storms one semaphore of 3 permits with stormClients Clients:
// Acquire of 1-3 permits, and a release in two parts now and then.
func (s *storm) semaphores() {
	const size = 3
	t := s.t
	addr := redistest.Addr(t)
	s.admin = redistest.NewClient(t, addr)
	s.reg = "storm:{" + s.name + "}:occupancy"
	t.Cleanup(func() { s.admin.Del(ctx, s.reg) })
	px := s.proxy(addr)
	var clients []*redisync.Client
	var workers []func(stop time.Time)
	for i := range stormClients {
		c, err := redisync.New(s.goRedis(px.Addr, i), stormOpts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
		for v, n := range shares {
			sem := must(c.NewSemaphore(s.name, size))
			owner := fmt.Sprintf("c%d.v%d", i, v)
			for g := range n {
				rng := s.rng(uint64(len(workers)))
				who := fmt.Sprintf("%s.g%d", owner, g)
				workers = append(workers, func(stop time.Time) { s.acquireLoop(rng, owner, who, sem, stop) })
			}
		}
	}
	s.run(workers)
	for _, c := range clients {
		_ = c.Close()
	}
	s.mu.Lock()
	vs := history.Semaphore(s.holds, size)
	s.mu.Unlock()
	s.violations(vs)
	if max, _ := s.admin.HGet(ctx, s.reg, "max").Int64(); max > size {
		s.fail("occupancy", "the occupancy counter reached %d of %d permits", max, size)
	}
	s.checkSemKeys(s.admin)
	s.report()
}

// occupancy adds delta to the occupancy counter and keeps its maximum.
var occupancy = redis.NewScript(`
local n = redis.call('HINCRBY', KEYS[1], 'now', ARGV[1])
if n > tonumber(redis.call('HGET', KEYS[1], 'max') or '0') then
  redis.call('HSET', KEYS[1], 'max', n)
end
return n
`)

// acquireLoop is one goroutine of a semaphore storm.
func (s *storm) acquireLoop(rng *rand.Rand, owner, who string, sem *redisync.Semaphore, stop time.Time) {
	for time.Now().Before(stop) {
		n := []int64{1, 1, 2, 3}[rng.IntN(4)]
		d := drawDeadline(rng)
		actx, cancel := context.WithTimeout(ctx, d)
		begun := time.Now()
		err := sem.Acquire(actx, n)
		end := time.Now()
		expired := expiredBy(actx, end)
		cancel()
		s.locks.Add(1)
		switch {
		case err == nil:
			s.grants.Add(1)
			if end.After(begun.Add(d)) {
				s.lateGrants.Add(1)
			}
			s.holdPermits(rng, owner, who, sem, n, end)
		case expired && deadlineErr(err):
			s.ctxErrs.Add(1)
			if end.Sub(begun.Add(d)) > tooLate {
				s.lateErrs.Add(1)
			}
			s.mu.Lock()
			s.cancelled = append(s.cancelled, call{owner, begun, end})
			s.mu.Unlock()
		case errors.Is(err, redisync.ErrLockLost):
			s.lockLost.Add(1)
		default:
			s.fail("acquire error", "%s: Acquire(%d) (deadline %v, expired %v): %v", who, n, d, expired, err)
		}
	}
}

// holdPermits holds n permits granted at start, for up to maxHold in all,
// giving back part of them first half of the time; it stops when Lost
// closes. The occupancy counter counts the permits from the grant to the
// release (or to Lost).
func (s *storm) holdPermits(rng *rand.Rand, owner, who string, sem *redisync.Semaphore, n int64, start time.Time) {
	lost := sem.Lost()
	if err := occupancy.Run(ctx, s.admin, []string{s.reg}, n).Err(); err != nil {
		s.fail("occupancy error", "%s: %v", who, err)
	}
	s.fenceWrites.Add(1)
	parts := []int64{n}
	if n > 1 && rng.IntN(2) == 0 {
		k := 1 + rng.Int64N(n-1)
		parts = []int64{k, n - k}
	}
	lostAt := time.Time{}
	for _, k := range parts {
		h := history.Hold{Owner: owner, Who: who, Start: start, Permits: k}
		if lostAt.IsZero() {
			t := time.NewTimer(time.Duration(rng.Int64N(int64(maxHold / 2))))
			select {
			case <-t.C:
				h.End = time.Now()
			case <-lost:
				t.Stop()
				lostAt = time.Now()
				s.lostSeen.Add(1)
			}
		}
		if !lostAt.IsZero() {
			h.End, h.Lost = lostAt, true
		}
		s.record(h)
		wasLost := closed(lost)
		if err := occupancy.Run(ctx, s.admin, []string{s.reg}, -k).Err(); err != nil {
			s.fail("occupancy error", "%s: %v", who, err)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := sem.Release(rctx, k)
		cancel()
		s.unlocks.Add(1)
		switch {
		case err == nil:
		case errors.Is(err, redisync.ErrLockLost):
			s.unlockLost.Add(1)
			if !wasLost {
				s.fail("hold gone before Lost", "%s: Release(%d): %v; Lost was open (held from %v)",
					who, k, err, s.since(start))
			}
		default:
			s.fail("release error", "%s: Release(%d): %v", who, k, err)
		}
	}
}

func (s *storm) record(h history.Hold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holds = append(s.holds, h)
}

// since says when t was on the storm's clock.
func (s *storm) since(t time.Time) string {
	return "+" + t.Sub(s.base).Round(time.Microsecond).String()
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// checkMutex checks the holds of a lock.
func (s *storm) checkMutex() {
	s.mu.Lock()
	vs := history.Mutex(s.holds)
	s.mu.Unlock()
	s.violations(vs)
}

// violations records the checker's findings.
func (s *storm) violations(vs []history.Violation) {
	for _, v := range vs {
		s.fail(v.Kind, "at %s: %s", s.since(v.At), v.Format(s.base))
	}
}

// checkLockKeys waits for the lock to be free with nobody queued in rdb's
// Redis and checks that nothing of the name is left without a TTL.
func (s *storm) checkLockKeys(rdb *redis.Client) {
	s.t.Helper()
	// Layout 3: the lock's hash stays, free; its queue goes, and only
	// "withdrawn" tombstones with at most an hour to live may be left.
	if left := l3bSettled(s.t, rdb, s.name, 3*time.Second); len(left) > 0 {
		s.fail("left in Redis", "3 s after the storm: %s", strings.Join(left, ", "))
	}
	s.noPersistent(rdb)
}

// checkSemKeys does for a semaphore what checkLockKeys does for a lock.
func (s *storm) checkSemKeys(rdb *redis.Client) {
	s.t.Helper()
	base := "redisync:sem:{" + s.name + "}"
	s.noHolders(rdb, base)
	s.gone(rdb, "the leases", base+":expiry")
	s.gone(rdb, "the queue", base+":queue")
	s.noPersistent(rdb)
}

// noHolders waits up to 3 s for the semaphore's holders hash (holders) to
// keep no holder's record: the hash itself stays, with the semaphore's own
// fields (schema.SemFields), an hour past its last use.
func (s *storm) noHolders(rdb *redis.Client, holders string) {
	s.t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		h, err := rdb.HGetAll(ctx, holders).Result()
		if err != nil {
			s.t.Fatal(err)
		}
		for _, f := range schema.SemFields {
			delete(h, f)
		}
		if len(h) == 0 {
			return
		}
		if time.Now().After(deadline) {
			s.fail("left in Redis", "records still there 3 s after the storm: %v", h)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// gone waits up to 3 s for keys to disappear.
func (s *storm) gone(rdb *redis.Client, what string, keys ...string) {
	s.t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		n, err := rdb.Exists(ctx, keys...).Result()
		if err != nil {
			s.t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			var left []string
			for _, k := range keys {
				if rdb.Exists(ctx, k).Val() == 1 {
					left = append(left, fmt.Sprintf("%s (%s, pttl %v)", k, rdb.Type(ctx, k).Val(), rdb.PTTL(ctx, k).Val()))
				}
			}
			s.fail("left in Redis", "%s still there 3 s after the storm: %s", what, strings.Join(left, ", "))
			return
		}
		time.Sleep(10 * time.Millisecond) // poll interval of the condition
	}
}

// noPersistent fails for any key of the name without a TTL.
func (s *storm) noPersistent(rdb *redis.Client) {
	s.t.Helper()
	iter := rdb.Scan(ctx, 0, "redisync:*{"+s.name+"}*", 100).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		if ttl := rdb.PTTL(ctx, k).Val(); ttl == -1 {
			s.fail("left in Redis", "%s has no TTL", k)
		}
	}
	if err := iter.Err(); err != nil {
		s.t.Fatal(err)
	}
}

// stormTries is how many storms a subtest runs while each is too gentle to
// prove anything (on a loaded machine, a RedMutex under 0-5 ms deadlines
// may get no hold at all): a storm that proves nothing is run again with
// the next seed, not passed.
const stormTries = 3

// report logs what the storm exercised and fails the subtest for every
// problem found; it sets s.gentle when the storm was too gentle to prove
// anything.
func (s *storm) report() {
	t := s.t
	t.Helper()
	s.mu.Lock()
	holds := slices.Clone(s.holds)
	cancelled := slices.Clone(s.cancelled)
	s.mu.Unlock()
	slices.SortFunc(holds, func(a, b history.Hold) int { return a.Start.Compare(b.Start) })
	// Calls cancelled while another owner held: they found the lock
	// taken, and waited (a fair one in the queue) until their deadline.
	waiting := 0
	for _, c := range cancelled {
		if history.Overlaps(holds, c.owner, c.begun, c.end, 16) {
			waiting++
		}
	}
	var ps redistest.ProxyStats
	for _, px := range s.proxies {
		st := px.Stats()
		ps.Chunks += st.Chunks
		ps.RequestStalls += st.RequestStalls
		ps.ReplyStalls += st.ReplyStalls
		ps.StalledFor += st.StalledFor
		ps.ConnsAccepted += st.ConnsAccepted
	}
	t.Logf("calls %d: granted %d (%d after their deadline), ended by their deadline %d (%d while another owner held, %d over %v late), ErrLockLost %d, ErrQuorum %d",
		s.locks.Load(), s.grants.Load(), s.lateGrants.Load(), s.ctxErrs.Load(), waiting,
		s.lateErrs.Load(), tooLate, s.lockLost.Load(), s.quorum.Load())
	t.Logf("holds %d recorded, %d ended by Lost; releases %d (%d ErrLockLost); writes to the fenced register (occupancy counter) %d",
		len(holds), s.lostSeen.Load(), s.unlocks.Load(), s.unlockLost.Load(), s.fenceWrites.Load())
	t.Logf("proxies: %d chunks, %d request stalls, %d reply stalls (%v in all), %d connections",
		ps.Chunks, ps.RequestStalls, ps.ReplyStalls, ps.StalledFor.Round(time.Millisecond), ps.ConnsAccepted)

	s.mu.Lock()
	defer s.mu.Unlock()
	kinds := make([]string, 0, len(s.problems))
	for k := range s.problems {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		p := s.problems[k]
		t.Errorf("%s: %d times, e.g.\n  %s", k, p.n, strings.Join(p.examples, "\n  "))
	}
	switch {
	case len(holds) == 0:
		s.gentle = "no hold at all"
	case waiting == 0:
		s.gentle = "no call was cancelled while another owner held"
	case ps.RequestStalls+ps.ReplyStalls == 0:
		s.gentle = "no proxy stall"
	case s.lateErrs.Load()+s.lateGrants.Load() == 0:
		s.gentle = "no call returned after its deadline (none caught in a round trip)"
	}
}
