package fault

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/integration/fault/internal/history"
	"github.com/redisync/redisync/internal/redistest"
)

// TestMultiStorm is the cancellation storm of TestStorm for multi-locks:
// 4 Clients through a proxy that jitters every chunk and stalls
// connections at random (half the go-redis clients honouring ctx
// deadlines on the socket), 4 names, and on each Client a fair Mutex of
// one name and three MultiMutexes of 2 to 4 names (in a random order),
// each used by one goroutine but the first MultiMutex, shared by two
// (which exclude each other as any two holders do); deadlines drawn as
// TestStorm's (mostly 0-5 ms). Each name's history (every hold of a name, by a Mutex or a
// MultiMutex) is checked as TestStorm checks one lock: no two owners'
// holds overlap, tokens follow the grant order. After the Clients close,
// no name is held or queued for, and nothing is left without a TTL. It
// fails if the storm took too few multi holds, cancelled too few calls or
// stalled no connection. REDISYNC_STORM_SEED replays it.
func TestMultiStorm(t *testing.T) {
	base := stormSeed(t)
	dur := 3 * time.Second
	s := &storm{t: t, seed: subSeed(base, "Multi"), dur: dur, name: redistest.Name(t), base: time.Now(),
		problems: map[string]*problem{}}
	t.Logf("%s=%d replays it, storming for %v", stormSeedEnv, base, dur)
	addr := redistest.Addr(t)
	admin := redistest.NewClient(t, addr)
	px := s.proxy(addr)
	parts := map[string]*storm{} // one per name, for its history
	var names []string
	for _, x := range []string{"a", "b", "c", "d"} {
		n := s.name + "-" + x
		names = append(names, n)
		parts[n] = &storm{t: t, name: n, base: s.base, problems: map[string]*problem{}}
	}
	var multis, cancelled atomic.Int64
	var clients []*redisync.Client
	var workers []func(stop time.Time)
	for i := range stormClients {
		c, err := redisync.New(s.goRedis(px.Addr, i), stormOpts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
		for v := range 4 {
			rng := s.rng(uint64(100 + 10*i + v))
			owner := fmt.Sprintf("c%d.v%d", i, v)
			var lk multiLocker
			if v == 0 {
				lk = single{must(c.NewMutex(names[rng.IntN(len(names))]))}
			} else {
				set := rng.Perm(len(names))[:2+rng.IntN(3)]
				var ns []string
				for _, k := range set {
					ns = append(ns, names[k])
				}
				lk = must(c.NewMultiMutex(ns))
			}
			goroutines := 1
			if v == 1 {
				goroutines = 2
			}
			for g := range goroutines {
				rng := s.rng(uint64(len(workers)))
				who := fmt.Sprintf("%s.g%d", owner, g)
				workers = append(workers, func(stop time.Time) {
					for time.Now().Before(stop) {
						lctx, cancel := context.WithTimeout(ctx, drawDeadline(rng))
						err := lk.Lock(lctx)
						expired := expiredBy(lctx, time.Now())
						cancel()
						switch {
						case err == nil:
							if multiHold(s, parts, rng, who, lk) > 1 {
								multis.Add(1)
							}
						case expired && deadlineErr(err):
							cancelled.Add(1)
						default:
							s.fail("lock error", "%s: Lock: %v", who, err)
						}
					}
				})
			}
		}
	}
	s.run(workers)
	for _, c := range clients {
		_ = c.Close()
	}
	// Close released every hold it knew of, and waited for the calls
	// still running (an abandoned call's undo among them): a name still
	// held now was left behind, to run out with its 3 s lease.
	for _, n := range names {
		if l3bHeld(t, admin, n) {
			s.fail("left behind", "%s is still held after every Client closed", n)
		}
	}
	for _, n := range names {
		p := parts[n]
		p.checkMutex()
		p.checkLockKeys(admin)
		p.mu.Lock()
		t.Logf("%s: %d holds", strings.TrimPrefix(n, s.name), len(p.holds))
		for k, pr := range p.problems {
			s.fail(k, "%s: %d times, e.g.\n  %s", n, pr.n, strings.Join(pr.examples, "\n  "))
		}
		p.mu.Unlock()
	}
	st := px.Stats()
	t.Logf("%d multi holds, %d calls ended by their deadline; proxy: %d request stalls, %d reply stalls",
		multis.Load(), cancelled.Load(), st.RequestStalls, st.ReplyStalls)
	for k, pr := range s.problems {
		t.Errorf("%s: %d times, e.g.\n  %s", k, pr.n, strings.Join(pr.examples, "\n  "))
	}
	// A storm proves something with a score of multi-name holds among its
	// cancellations and stalls; a loaded CI machine runs 35-45 of them.
	if multis.Load() < 20 || cancelled.Load() < 50 || st.RequestStalls+st.ReplyStalls == 0 {
		t.Errorf("storm too gentle: %d multi holds, %d calls cancelled, %d stalls",
			multis.Load(), cancelled.Load(), st.RequestStalls+st.ReplyStalls)
	}
}

// multiLocker is what TestMultiStorm needs of a MultiMutex, or of a Mutex
// (single) seen as a set of one name.
type multiLocker interface {
	Lock(context.Context) error
	Unlock(context.Context) error
	Tokens() map[string]int64
	Lost() <-chan struct{}
}

// single is a Mutex as a multiLocker.
type single struct{ *redisync.Mutex }

func (m single) Tokens() map[string]int64 { return map[string]int64{m.Name(): m.Token()} }

// multiHold runs one hold of lk, granted just now: it records it in the
// history of each of its names, and returns how many names it held.
func multiHold(s *storm, parts map[string]*storm, rng *rand.Rand, who string, lk multiLocker) int {
	start := time.Now()
	tokens, lost := lk.Tokens(), lk.Lost()
	t := time.NewTimer(time.Duration(rng.Int64N(int64(maxHold))))
	end, wasLost := time.Time{}, false
	select {
	case <-t.C:
		end = time.Now()
	case <-lost:
		end, wasLost = time.Now(), true
		t.Stop()
	}
	names := make([]string, 0, len(tokens))
	for n, tok := range tokens {
		if tok <= 0 {
			s.fail("bad token", "%s: %s token %d right after Lock returned", who, n, tok)
		}
		parts[n].record(history.Hold{Owner: who, Who: who, Start: start, End: end, Token: tok, Lost: wasLost})
		names = append(names, n)
	}
	uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch err := lk.Unlock(uctx); {
	case err == nil:
	case errors.Is(err, redisync.ErrLockLost) && closed(lost):
	default:
		slices.Sort(names)
		s.fail("unlock error", "%s: Unlock of %v: %v", who, names, err)
	}
	return len(tokens)
}
