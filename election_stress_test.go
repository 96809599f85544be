package redisync

import (
	"context"
	"errors"
	"fmt"
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
// (a leader gone at once). It fails when two leaders' terms overlap, when
// the tokens do not increase in the order the terms started, when the
// fence rejects a leader whose Lost had not closed, or when an observer
// sees revisions out of order or twice, or leaders' tokens going back.
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
	opts := []ClientOption{WithWatchdogLease(lease), WithHeartbeat(lease), WithRecheck(100 * time.Millisecond)}

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
	watcher := newClient(t, redistest.Client(t))
	obs := watcher.NewElection(name).Observe(ctx)
	var seen []Leadership // guarded by mu
	obsDone := make(chan struct{})
	go func() {
		defer close(obsDone)
		for l := range obs {
			mu.Lock()
			seen = append(seen, l)
			mu.Unlock()
		}
	}()

	stop := time.Now().Add(runFor)
	var wg sync.WaitGroup
	for ci := range clients {
		proxy := redistest.NewProxy(t, addr)
		proxy.SetChaos(redistest.Chaos{Seed: seed + uint64(ci), Jitter: time.Millisecond})
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(ci)))
			for gen := 0; time.Now().Before(stop); gen++ {
				rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: ci%2 == 0})
				c, err := New(rdb, opts...)
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
						e := c.NewElection(name)
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
				if rng.IntN(3) == 0 {
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

	// Once quiet, nobody leads, and the observer's last state says so.
	redistest.Eventually(t, 5*time.Second, "nobody leading", func() bool {
		_, err := watcher.NewElection(name).Leader(ctx)
		return errors.Is(err, ErrNoLeader)
	})
	redistest.Eventually(t, 5*time.Second, "the observer seeing nobody leading", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) > 0 && !seen[len(seen)-1].Leads()
	})
	cancel()
	<-obsDone

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
	checkObserved(t, seen)
	t.Logf("%d terms, %d leaders lost (seen), %d partitions, %d Clients closed, %d states observed (%d gaps)",
		len(terms), lostSeen.Load(), parts.Load(), closes.Load(), len(seen), countGaps(seen))
	if len(terms) < 20 || parts.Load() == 0 {
		t.Errorf("too little exercised: %d terms, %d partitions", len(terms), parts.Load())
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
func checkObserved(t *testing.T, seen []Leadership) {
	t.Helper()
	var token int64
	for i, l := range seen {
		if i > 0 && !inOrder(seen[i-1], l) {
			t.Errorf("observed %+v after %+v", l, seen[i-1])
		}
		if l.Leads() {
			if l.Token < token {
				t.Errorf("observed token %d after %d", l.Token, token)
			}
			token = l.Token
		}
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
