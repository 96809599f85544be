package fault

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/integration/fault/internal/fence"
	"github.com/redisync/redisync/integration/fault/internal/history"
	"github.com/redisync/redisync/internal/redistest"
)

// rwMutexes storms one read-write lock with stormClients Clients, each
// with 2 RWMutex values, the first shared by 2 goroutines (each of whose
// holds is its own), one write in four, through Do and RDo (whose
// contexts end when a hold, a read's too, is lost). A read is recorded as
// 1 permit and a write as MaxSemaphoreSize (all of them), so
// that history.Semaphore with that size checks that no reader is inside a
// write and no two writes overlap; history.Mutex checks the writes'
// tokens; an occupancy counter beside the fenced register counts the
// same weights, and every write offers its token to the register.
func (s *storm) rwMutexes() {
	t := s.t
	addr := redistest.Addr(t)
	s.admin = redistest.NewClient(t, addr)
	s.reg = "storm:{" + s.name + "}:occupancy"
	register := "storm:{" + s.name + "}:register"
	t.Cleanup(func() { s.admin.Del(ctx, s.reg, register) })
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
		for v, n := range []int{2, 1} {
			rw := must(c.NewRWMutex(s.name))
			for g := range n {
				who := fmt.Sprintf("c%d.v%d.g%d", i, v, g)
				rng := s.rng(uint64(len(workers)))
				workers = append(workers, func(stop time.Time) { s.rwLoop(rng, who, register, rw, stop) })
			}
		}
	}
	s.run(workers)
	for _, c := range clients {
		_ = c.Close()
	}
	s.mu.Lock()
	vs := history.Semaphore(s.holds, redisync.MaxSemaphoreSize)
	var writes []history.Hold
	for _, h := range s.holds {
		if h.Permits == redisync.MaxSemaphoreSize {
			writes = append(writes, h)
		}
	}
	vs = append(vs, history.Mutex(writes)...)
	s.mu.Unlock()
	s.violations(vs)
	if max, _ := s.admin.HGet(ctx, s.reg, "max").Int64(); max > redisync.MaxSemaphoreSize {
		s.fail("occupancy", "the occupancy counter reached %d, above a write's %d", max, redisync.MaxSemaphoreSize)
	}
	base := "redisync:rw:{" + s.name + "}"
	s.noHolders(s.admin, base)
	s.gone(s.admin, "the leases", base+":expiry")
	s.gone(s.admin, "the queue", base+":queue")
	s.noPersistent(s.admin)
	s.report()
}

// rwLoop is one goroutine of a read-write lock storm: RDo, or one time
// in four Do, with a drawn deadline for the wait (not the hold); when
// granted, hold for up to maxHold (stopping when the hold's context ends:
// it was lost) and release.
func (s *storm) rwLoop(rng *rand.Rand, who, register string, rw *redisync.RWMutex, stop time.Time) {
	for time.Now().Before(stop) {
		write := rng.IntN(4) == 0
		do, what := rw.RDo, "RDo"
		if write {
			do, what = rw.Do, "Do"
		}
		d := drawDeadline(rng)
		actx, cancel := context.WithCancel(ctx)
		timer := time.AfterFunc(d, cancel)
		begun := time.Now()
		var end time.Time
		granted, wasLost := false, false
		err := do(actx, func(hctx context.Context) error {
			end = time.Now()
			if !timer.Stop() { // its deadline came with the grant
				return context.Canceled
			}
			granted = true
			wasLost = s.holdRW(rng, who, register, rw, write, end, hctx)
			return nil
		})
		cancel()
		if !granted {
			end = time.Now()
		}
		s.locks.Add(1)
		switch {
		case granted:
			s.grants.Add(1)
			s.unlocks.Add(1)
			switch {
			case err == nil:
			case errors.Is(err, redisync.ErrLockLost):
				s.unlockLost.Add(1)
				if !wasLost {
					s.fail("hold gone before Lost", "%s: %s's release: %v; its context was live (held from %v)", who, what, err, s.since(end))
				}
			default:
				s.fail("unlock error", "%s: %s: %v", who, what, err)
			}
		case errors.Is(err, context.Canceled):
			s.ctxErrs.Add(1)
			if end.Sub(begun.Add(d)) > tooLate {
				s.lateErrs.Add(1)
			}
			s.mu.Lock()
			s.cancelled = append(s.cancelled, call{who, begun, end})
			s.mu.Unlock()
		default:
			s.fail("lock error", "%s: %s (deadline %v): %v", who, what, d, err)
		}
	}
}

// holdRW runs one hold of rw, a write or a read, granted at start, whose
// context is hctx, and reports whether it was lost (hctx ended) before
// its release.
func (s *storm) holdRW(rng *rand.Rand, who, register string, rw *redisync.RWMutex, write bool, start time.Time, hctx context.Context) bool {
	h := history.Hold{Owner: who, Who: who, Start: start, Permits: 1}
	lost := hctx.Done()
	if write {
		h.Permits, h.Token = redisync.MaxSemaphoreSize, rw.Token()
		if h.Token <= 0 {
			s.fail("bad token", "%s: Token() = %d right after Do granted the write", who, h.Token)
		}
		ok, err := fence.Write(ctx, s.admin, register, h.Token, who, who)
		s.fenceWrites.Add(1)
		switch {
		case err != nil:
			s.fail("fence error", "%s: %v", who, err)
		case !ok && !closed(lost):
			s.fail("fence rejected a live writer", "%s: token %d rejected, context live, held since %v", who, h.Token, s.since(start))
		}
	}
	if err := occupancy.Run(ctx, s.admin, []string{s.reg}, h.Permits).Err(); err != nil {
		s.fail("occupancy error", "%s: %v", who, err)
	}
	tm := time.NewTimer(time.Duration(rng.Int64N(int64(maxHold))))
	select {
	case <-tm.C:
		h.End = time.Now()
	case <-lost:
		h.End, h.Lost = time.Now(), true
		tm.Stop()
		s.lostSeen.Add(1)
	}
	s.record(h)
	if err := occupancy.Run(ctx, s.admin, []string{s.reg}, -h.Permits).Err(); err != nil {
		s.fail("occupancy error", "%s: %v", who, err)
	}
	return closed(lost)
}
