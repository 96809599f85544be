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
// with 3 RWMutex values of a goroutine each (goroutines sharing a value
// share its levels, which history.Semaphore would add up), one write in
// four. A read is recorded as 1 permit and a write as RWMutexWrite, so
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
		for v := range 3 {
			rw := c.NewRWMutex(s.name)
			owner := fmt.Sprintf("c%d.v%d", i, v)
			rng := s.rng(uint64(len(workers)))
			workers = append(workers, func(stop time.Time) { s.rwLoop(rng, owner, register, rw, stop) })
		}
	}
	s.run(workers)
	for _, c := range clients {
		_ = c.Close()
	}
	s.mu.Lock()
	vs := history.Semaphore(s.holds, redisync.RWMutexWrite)
	var writes []history.Hold
	for _, h := range s.holds {
		if h.Permits == redisync.RWMutexWrite {
			writes = append(writes, h)
		}
	}
	vs = append(vs, history.Mutex(writes)...)
	s.mu.Unlock()
	s.violations(vs)
	if max, _ := s.admin.HGet(ctx, s.reg, "max").Int64(); max > redisync.RWMutexWrite {
		s.fail("occupancy", "the occupancy counter reached %d, above a write's %d", max, redisync.RWMutexWrite)
	}
	base := "redisync:rw:{" + s.name + "}"
	s.gone(s.admin, "the holders", base, base+":expiry")
	s.gone(s.admin, "the queue and waiters", base+":queue", base+":waiters")
	s.noPersistent(s.admin)
	s.report()
}

// rwLoop is one goroutine of a read-write lock storm: RLock, or one time
// in four Lock, with a drawn deadline; when granted, hold for up to
// maxHold (stopping when Lost closes) and release.
func (s *storm) rwLoop(rng *rand.Rand, owner, register string, rw *redisync.RWMutex, stop time.Time) {
	for time.Now().Before(stop) {
		write := rng.IntN(4) == 0
		lock, what := rw.RLock, "RLock"
		if write {
			lock, what = rw.Lock, "Lock"
		}
		d := drawDeadline(rng)
		lctx, cancel := context.WithTimeout(ctx, d)
		begun := time.Now()
		err := lock(lctx)
		end := time.Now()
		expired := expiredBy(lctx, end)
		cancel()
		s.locks.Add(1)
		switch {
		case err == nil:
			s.grants.Add(1)
			if end.After(begun.Add(d)) {
				s.lateGrants.Add(1)
			}
			s.holdRW(rng, owner, register, rw, write, end)
		case expired && deadlineErr(err):
			s.ctxErrs.Add(1)
			if end.Sub(begun.Add(d)) > tooLate {
				s.lateErrs.Add(1)
			}
			s.mu.Lock()
			s.cancelled = append(s.cancelled, call{owner, begun, end})
			s.mu.Unlock()
		default:
			s.fail("lock error", "%s: %s (deadline %v, expired %v): %v", owner, what, d, expired, err)
		}
	}
}

// holdRW runs one hold of rw, a write or a read, granted at start.
func (s *storm) holdRW(rng *rand.Rand, owner, register string, rw *redisync.RWMutex, write bool, start time.Time) {
	h := history.Hold{Owner: owner, Who: owner, Start: start, Permits: 1}
	lost := rw.Lost()
	if write {
		h.Permits, h.Token = redisync.RWMutexWrite, rw.Token()
		if h.Token <= 0 {
			s.fail("bad token", "%s: Token() = %d right after Lock returned", owner, h.Token)
		}
		ok, err := fence.Write(ctx, s.admin, register, h.Token, owner, owner)
		s.fenceWrites.Add(1)
		switch {
		case err != nil:
			s.fail("fence error", "%s: %v", owner, err)
		case !ok && !closed(lost):
			s.fail("fence rejected a live writer", "%s: token %d rejected, Lost open, held since %v", owner, h.Token, s.since(start))
		}
	} else if rw.Token() != 0 {
		s.fail("bad token", "%s: a read has token %d", owner, rw.Token())
	}
	if err := occupancy.Run(ctx, s.admin, []string{s.reg}, h.Permits).Err(); err != nil {
		s.fail("occupancy error", "%s: %v", owner, err)
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
	wasLost := closed(lost)
	if err := occupancy.Run(ctx, s.admin, []string{s.reg}, -h.Permits).Err(); err != nil {
		s.fail("occupancy error", "%s: %v", owner, err)
	}
	uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	unlock := rw.RUnlock
	if write {
		unlock = rw.Unlock
	}
	err := unlock(uctx)
	s.unlocks.Add(1)
	switch {
	case err == nil:
	case errors.Is(err, redisync.ErrLockLost):
		s.unlockLost.Add(1)
		if !wasLost {
			s.fail("hold gone before Lost", "%s: release: %v; Lost was open (held from %v)", owner, err, s.since(start))
		}
	default:
		s.fail("unlock error", "%s: release: %v", owner, err)
	}
}
