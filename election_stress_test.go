package redisync

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/redistest"
)

// term is one leadership as its leader saw it: from just after Campaign
// returned to just before Resign was called, or to when the leader saw
// Lost close, if earlier. It lies inside the real leadership.
type term struct {
	who        string
	start, end time.Time
	token      int64
}

// fence is a resource guarded by fencing tokens: it rejects a token lower
// than the highest it has seen.
type fence struct {
	mu      sync.Mutex
	highest int64
}

// write reports whether the fence accepts a write with token.
func (f *fence) write(token int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if token < f.highest {
		return false
	}
	f.highest = token
	return true
}

// electionSeed returns REDISYNC_ELECTION_SEED, or a random seed.
func electionSeed(t *testing.T) uint64 {
	if s := os.Getenv("REDISYNC_ELECTION_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	return rand.Uint64() >> 1
}

// TestElectionNeverTwoLeaders runs candidates that campaign with deadlines
// mostly of 0-5 ms, lead for a few ms and resign, in a loop, through
// proxies that jitter every chunk, while their Clients are now and then
// partitioned past their lease (a paused leader) or closed and replaced
// (a leader gone at once). Two observers watch: a reference straight to
// Redis, and a watcher whose connections are reset and partitioned (with
// or without a reset after) at random moments; at the end one more term
// is made while the watcher is partitioned. It fails when two leaders'
// terms overlap, when the tokens do not increase in the order the terms
// started, when the fence rejects a leader whose Lost had not closed, when
// an observer sees revisions out of order or twice, or leaders' tokens
// going back, or when a term is neither observed nor followed by a state
// marked Gap (see checkEveryTerm).
func TestElectionNeverTwoLeaders(t *testing.T) {
	seed := electionSeed(t)
	t.Logf("seed %d (REDISYNC_ELECTION_SEED replays it)", seed)
	const (
		clients = 4
		perCli  = 3
		lease   = 300 * time.Millisecond
		runFor  = 3 * time.Second
	)
	name := redistest.Name(t)
	addr := redistest.Addr(t)
	opts := []Option{WithCrashTimeout(lease), WithWaiterTimeout(lease), WithRecheck(100 * time.Millisecond)}

	var (
		mu       sync.Mutex
		terms    []term
		problems []string
		fenced   fence
		won      atomic.Int64
		parts    atomic.Int64
		closes   atomic.Int64
		lostSeen atomic.Int64
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), runFor+30*time.Second)
	defer cancel()
	// Two observers: the watcher, whose connections are cut and
	// partitioned (see faultWatcher), and a reference straight to Redis.
	wproxy := redistest.NewProxy(t, addr)
	wproxy.SetChaos(redistest.Chaos{Seed: seed ^ 0x5eed, Jitter: time.Millisecond})
	wrdb := redis.NewClient(&redis.Options{Addr: wproxy.Addr, ReadTimeout: time.Second})
	t.Cleanup(func() { _ = wrdb.Close() })
	watcher := newClient(t, wrdb)
	direct := newClient(t, redistest.Client(t))
	var seen, ref []Leadership // guarded by mu
	var obsDone sync.WaitGroup
	for _, o := range []struct {
		c    *Client
		into *[]Leadership
	}{{watcher, &seen}, {direct, &ref}} {
		obs := observeChan(ctx, must(o.c.NewElection(name)))
		obsDone.Add(1)
		go func() {
			defer obsDone.Done()
			for l := range obs {
				mu.Lock()
				*o.into = append(*o.into, l)
				mu.Unlock()
			}
		}()
	}
	// Terms start once both observers sent their first state: a term
	// before it would be neither seen nor followed by a gap.
	redistest.Eventually(t, 5*time.Second, "the observers' first states", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) > 0 && len(ref) > 0
	})

	stop := time.Now().Add(runFor)
	var wg sync.WaitGroup
	var wfaults [3]atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		faultWatcher(wproxy, rand.New(rand.NewPCG(seed, 0x0b5)), stop, &wfaults)
	}()
	for ci := range clients {
		proxy := redistest.NewProxy(t, addr)
		proxy.SetChaos(redistest.Chaos{Seed: seed + uint64(ci), Jitter: time.Millisecond})
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(ci)))
			for gen := 0; time.Now().Before(stop); gen++ {
				rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: ci%2 == 0})
				c, err := New(rdb, append([]Option{withHooksOf(rdb)}, opts...)...)
				if err != nil {
					panic(err)
				}
				life := time.Now().Add(time.Duration(300+rng.IntN(700)) * time.Millisecond)
				var cw sync.WaitGroup
				for k := range perCli {
					who := fmt.Sprintf("c%d.%d/%d", ci, gen, k)
					krng := rand.New(rand.NewPCG(seed^uint64(gen), uint64(ci*perCli+k)))
					cw.Add(1)
					go func() {
						defer cw.Done()
						e := must(c.NewElection(name))
						for time.Now().Before(life) && time.Now().Before(stop) {
							d := time.Duration(krng.Int64N(int64(5 * time.Millisecond)))
							if krng.IntN(10) == 0 {
								d = time.Second
							}
							cctx, ccancel := context.WithTimeout(ctx, d)
							err := e.Campaign(cctx, who)
							ccancel()
							if err != nil {
								if broken(err) {
									fail("%s: Campaign: %v", who, err)
								}
								continue
							}
							start, token, lost := time.Now(), e.Token(), e.Lost()
							won.Add(1)
							if !fenced.write(token) && !lostWithin(lost, 100*time.Millisecond) {
								fail("%s: the fence rejected token %d of a leader whose Lost stayed open", who, token)
							}
							hold := time.Duration(krng.IntN(8000)) * time.Microsecond
							if krng.IntN(10) == 0 {
								hold = time.Duration(krng.IntN(500)) * time.Millisecond
							}
							t := time.NewTimer(hold)
							end := time.Time{}
							select {
							case <-t.C:
							case <-lost:
								end = time.Now()
								lostSeen.Add(1)
							}
							t.Stop()
							if end.IsZero() {
								if !fenced.write(token) && !lostWithin(lost, 100*time.Millisecond) {
									fail("%s: the fence rejected token %d of a leader whose Lost stayed open", who, token)
								}
								end = time.Now()
							}
							mu.Lock()
							terms = append(terms, term{who: who, start: start, end: end, token: token})
							mu.Unlock()
							wasLost := closedChan(lost)
							rctx, rcancel := context.WithTimeout(ctx, time.Second)
							err = e.Resign(rctx)
							rcancel()
							switch {
							case errors.Is(err, ErrLockLost) && !wasLost && !time.Now().After(start.Add(lease)):
								// Gone within its lease, while its
								// leader believed it led.
								fail("%s: Resign: lost, unannounced (Lost open)", who)
							case broken(err):
								fail("%s: Resign: %v", who, err)
							}
						}
					}()
				}
				// Now and then the Client is partitioned past its
				// lease: its leaders must see Lost before others lead.
				// The first Client's first is, whatever the seed.
				if rng.IntN(3) == 0 || (ci == 0 && gen == 0) {
					time.Sleep(time.Until(life) / 2) // the chaos's timing, not a wait for something
					proxy.SetBlackhole(true)
					parts.Add(1)
					time.Sleep(lease + lease/2)
					proxy.SetBlackhole(false)
					proxy.ResetAll()
				}
				time.Sleep(time.Until(life)) // the chaos's timing
				_ = c.Close()                // its leader, if any, is lost at once
				closes.Add(1)
				cw.Wait()
				_ = rdb.Close()
			}
		}()
	}
	wg.Wait()

	// Once quiet, nobody leads, and the observers' last states say so,
	// with the election's last revision.
	settle := func(what string, observers ...*[]Leadership) {
		var final Leadership
		redistest.Eventually(t, 5*time.Second, "nobody leading", func() bool {
			var err error
			final, err = must(direct.NewElection(name)).Leader(ctx)
			return errors.Is(err, ErrNoLeader)
		})
		redistest.Eventually(t, 10*time.Second, what+" seeing nobody leading", func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, seen := range observers {
				if !isFinal(*seen, final) {
					return false
				}
			}
			return true
		})
	}
	settle("the observers", &seen, &ref)
	// An epilogue: one more term while the watcher is partitioned, and
	// nobody leading again. No later change, and no lease timer (the
	// watcher last saw nobody leading), tells the watcher: only the state
	// it reads when it subscribes again.
	wproxy.SetBlackhole(true)
	e := must(direct.NewElection(name))
	if err := e.Campaign(ctx, "epilogue"); err != nil {
		t.Fatal(err)
	}
	terms = append(terms, term{who: "epilogue", start: time.Now(), end: time.Now(), token: e.Token()})
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	settle("the reference", &ref)
	wproxy.SetBlackhole(false)
	wproxy.ResetAll()
	settle("the watcher, once reconnected,", &seen)
	cancel()
	obsDone.Wait()

	for _, p := range problems {
		t.Error(p)
	}
	slices.SortFunc(terms, func(a, b term) int { return a.start.Compare(b.start) })
	for i := 1; i < len(terms); i++ {
		a, b := terms[i-1], terms[i]
		if b.start.Before(a.end) {
			t.Errorf("two leaders: %s [%v, %v] token %d and %s from %v token %d",
				a.who, a.start.Format("15:04:05.000000"), a.end.Format("15:04:05.000000"), a.token,
				b.who, b.start.Format("15:04:05.000000"), b.token)
		}
		if b.token <= a.token {
			t.Errorf("token %d of %s does not follow %d of %s", b.token, b.who, a.token, a.who)
		}
	}
	checkObserved(t, "watcher", seen)
	checkObserved(t, "reference", ref)
	revs := firstRevisions(seen, ref)
	missed := checkEveryTerm(t, "watcher", seen, terms, revs)
	refMissed := checkEveryTerm(t, "reference", ref, terms, revs)
	t.Logf("%d terms, %d leaders lost (seen), %d partitions, %d Clients closed", len(terms), lostSeen.Load(), parts.Load(), closes.Load())
	t.Logf("watcher: %d states (%d gaps), %d terms not seen; %d resets, %d partitions cut, %d silent; reference: %d states (%d gaps), %d terms not seen",
		len(seen), countGaps(seen), missed, wfaults[0].Load(), wfaults[1].Load(), wfaults[2].Load(), len(ref), countGaps(ref), refMissed)
	// The watcher misses the epilogue's term, and must miss some others.
	if len(terms) < 10 || parts.Load() == 0 || missed < 2 { // a loaded machine runs fewer terms in the time
		t.Errorf("too little exercised: %d terms, %d partitions, %d terms the watcher missed", len(terms), parts.Load(), missed)
	}
}

// broken reports whether err is an error that no fault of the storm
// explains: not the end of the call's ctx, a closed Client, a loss, nor
// an error reaching Redis.
func broken(err error) bool {
	return errors.Is(err, ErrWrongType) || errors.Is(err, ErrLayout) || errors.Is(err, ErrNotLeader) ||
		errors.Is(err, ErrInvalidOption) || errors.Is(err, ErrInvalidValue) || errors.Is(err, ErrNotHeld)
}

// checkObserved fails the test when an observer's states are not in
// revision order, repeat one, or show leaders' tokens going back. A
// revision repeats only when a leader's lease ran out unannounced: the
// state after it is nobody leading.
func checkObserved(t *testing.T, who string, seen []Leadership) {
	t.Helper()
	var token int64
	for i, l := range seen {
		if i > 0 && !inOrder(seen[i-1], l) {
			t.Errorf("%s observed %+v after %+v", who, l, seen[i-1])
		}
		if l.Leads() {
			if l.Token < token {
				t.Errorf("%s observed token %d after %d", who, l.Token, token)
			}
			token = l.Token
		}
	}
}

// firstRevisions maps each leader's token that an observer saw to the
// lowest revision it was seen under: the change that made it leader.
func firstRevisions(observers ...[]Leadership) map[int64]int64 {
	revs := make(map[int64]int64)
	for _, seen := range observers {
		for _, l := range seen {
			if r, ok := revs[l.Token]; l.Leads() && (!ok || l.Revision < r) {
				revs[l.Token] = l.Revision
			}
		}
	}
	return revs
}

// checkEveryTerm fails the test when a term was neither observed (a state
// with its token) nor followed by a gap: the first state observed at or
// after the term's revision (revs, from any observer) must have Gap set.
// A term that no observer saw lies between the revisions of the nearest
// tokens seen below and above its own; some state observed in that span,
// or the first after it, must have Gap set. It returns how many terms
// the observer did not see.
func checkEveryTerm(t *testing.T, who string, seen []Leadership, terms []term, revs map[int64]int64) int {
	t.Helper()
	tokens := make(map[int64]bool, len(seen))
	for _, l := range seen {
		tokens[l.Token] = true
	}
	missed := 0
	for _, tm := range terms {
		if tokens[tm.token] {
			continue
		}
		missed++
		// The first state observed at or after the term's revision is
		// among those above lo up to the first at or above hi.
		lo, hi := int64(0), int64(math.MaxInt64)
		if r, ok := revs[tm.token]; ok {
			lo, hi = r-1, r
		} else {
			for token, r := range revs {
				if token < tm.token {
					lo = max(lo, r)
				} else {
					hi = min(hi, r)
				}
			}
		}
		if !gapAfter(seen, lo, hi) {
			t.Errorf("%s: the term of %s (token %d, revision in (%d, %d]) was neither observed nor followed by a gap",
				who, tm.who, tm.token, lo, hi)
		}
	}
	return missed
}

// gapAfter reports whether one of the states of seen (in revision order)
// above lo, up to the first at or above hi, has Gap set.
func gapAfter(seen []Leadership, lo, hi int64) bool {
	for _, l := range seen {
		if l.Revision <= lo {
			continue
		}
		if l.Gap {
			return true
		}
		if l.Revision >= hi {
			return false
		}
	}
	return false
}

// isFinal reports whether seen ends with final, nobody leading.
func isFinal(seen []Leadership, final Leadership) bool {
	return len(seen) > 0 && !seen[len(seen)-1].Leads() && seen[len(seen)-1].Revision == final.Revision
}

// faultWatcher cuts, until stop, the connections through p of the
// watcher (an observer) at random moments drawn from rng, in one of three
// ways, counted in n: a reset (the subscriber dials again and reads the
// state), a partition of up to 300 ms ended by a reset, or a short
// partition with no reset, whose messages are lost without the
// connection knowing (the next change shows the gap). The last fault, at
// stop, is a reset: a change lost just before is reported too.
func faultWatcher(p *redistest.Proxy, rng *rand.Rand, stop time.Time, n *[3]atomic.Int64) {
	for {
		time.Sleep(time.Duration(20+rng.IntN(200)) * time.Millisecond) // the chaos's timing
		if time.Now().After(stop) {
			p.ResetAll()
			n[0].Add(1)
			return
		}
		k := rng.IntN(3)
		switch k {
		case 0:
			p.ResetAll()
		case 1:
			p.SetBlackhole(true)
			time.Sleep(time.Duration(20+rng.IntN(280)) * time.Millisecond)
			p.SetBlackhole(false)
			p.ResetAll()
		default:
			p.SetBlackhole(true)
			time.Sleep(time.Duration(5+rng.IntN(45)) * time.Millisecond)
			p.SetBlackhole(false)
		}
		n[k].Add(1)
	}
}

// inOrder reports whether an observer may send b after a: a later
// revision, or the same one when a's leader's lease ran out (b: nobody).
func inOrder(a, b Leadership) bool {
	return b.Revision > a.Revision || (b.Revision == a.Revision && a.Leads() && !b.Leads() && !b.Gap)
}

// countGaps counts the states observed after a gap.
func countGaps(seen []Leadership) int {
	n := 0
	for _, l := range seen {
		if l.Gap {
			n++
		}
	}
	return n
}

// closedChan reports whether ch is closed.
func closedChan(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// lostWithin reports whether ch closes within d: a leader whose write the
// fence rejected must hear within d (its watchdog's timer, which a busy
// machine may delay) that it lost leadership; if it does not, it led
// while another leader wrote.
func lostWithin(ch <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}
