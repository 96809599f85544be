package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redisync/redisync/internal/fairness"
)

// sampleEvery is how often a run samples the server's client connections
// and redraws the progress line.
const sampleEvery = 100 * time.Millisecond

// errorPause is how long a contender waits after a failed Lock before it
// tries again, so that a broken library cannot spin.
const errorPause = 10 * time.Millisecond

// A result is what one library did in one shape of one scenario.
type result struct {
	scenario string
	library  string
	shape

	seconds      float64 // length of the window
	acquisitions int64   // completed in the window
	rate         float64 // acquisitions per second

	// Per acquisition; NaN when there were none.
	cmds     float64 // commands clients sent to Redis (an EVAL counts one)
	calls    float64 // commands Redis executed, those run by scripts included
	requests float64 // requests the clients waited for (a pipeline counts one)
	cpu      float64 // Redis CPU time, user + system, in µs
	sys      float64 // the system (kernel) part of cpu, in µs
	lua      float64 // the scripts' run time in Redis (FCALL, EVALSHA, EVAL), in µs
	ccpu     float64 // the benchmark process's CPU time (every client, the harness too), in µs
	delivers float64 // messages Redis pushed to the clients (pub/sub, invalidations)
	subs     float64 // (S|P)SUBSCRIBE and (S|P)UNSUBSCRIBE calls Redis ran

	background float64 // requests per second the libraries sent outside Lock and Unlock

	wait distribution // from calling Lock to holding
	op   distribution // from calling Lock to Unlock's return
	gap  distribution // from a release to the next acquisition (mutexes only)
	held distribution // from an acquisition to its release: the hold as it lasted
	jain float64      // over the contenders' acquisition counts

	violations int64    // times more contenders were inside than allowed
	errors     int64    // failed Lock or Unlock calls
	firstError string   // the first of them
	conns      int      // most client connections seen, the benchmark's own excluded; -1: none seen
	left       int64    // keys of the run left in Redis, with a TTL, once its clients closed
	persistent []string // keys of the run left in Redis without a TTL (a bug)

	counts   []int64  // every contender's acquisitions in the window
	round    int      // the round it ran in (from 0)
	rounds   int      // runs pooled into this result
	perRound []result // the pooled runs, in round order (see pool)
}

// lockState is the bookkeeping of one lock, shared by its contenders.
type lockState struct {
	inside      atomic.Int64 // contenders inside the critical section
	lastRelease atomic.Int64 // when the last holder left it, on the run clock
}

// run is the state of one measured run, shared by its goroutines.
type run struct {
	shape
	clock    time.Time    // the run clock's origin; its readings are monotonic
	winStart atomic.Int64 // the window, on the run clock
	winEnd   atomic.Int64
	allowed  int64 // contenders allowed inside at once

	locks []lockState
	// counts[i] is contender i's acquisitions in the window; only
	// contender i writes it, and only after it stopped is it read.
	counts []int64

	wait, op, gap, held histogram

	acquired   atomic.Int64 // all acquisitions, window or not, for the progress line
	violations atomic.Int64
	errors     atomic.Int64
	errOnce    sync.Once
	firstError string
}

// now reads the run clock.
func (r *run) now() int64 { return int64(time.Since(r.clock)) }

// inWindow reports whether the run-clock time t is inside the window.
func (r *run) inWindow(t int64) bool { return t >= r.winStart.Load() && t < r.winEnd.Load() }

// fail records a failed call.
func (r *run) fail(err error) {
	r.errors.Add(1)
	r.errOnce.Do(func() { r.firstError = err.Error() })
}

// contend is contender id's loop: take a lock, hold it, give it back,
// until ctx ends. next says which lock, and with which owner. Once ctx has
// ended, a holder no longer holds, so that the waiters of locks that
// cannot be cancelled drain fast. Lock and Unlock get a context that
// marks them as in progress (callMarker).
func (r *run) contend(ctx context.Context, id int, next func() (locker, *lockState)) {
	ctx, call := marked(ctx)
	unlockCtx := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		l, st := next()
		t0 := r.now()
		call.active.Store(true)
		err := l.Lock(ctx)
		call.active.Store(false)
		if err != nil {
			if ctx.Err() == nil {
				r.fail(err)
				time.Sleep(errorPause)
			}
			continue
		}
		t1 := r.now()
		prev := st.lastRelease.Load()
		weight, violated := r.enter(l, st)
		if violated {
			r.violations.Add(1)
		}
		r.acquired.Add(1)
		if r.hold > 0 && ctx.Err() == nil {
			holdFor(r.hold)
		}
		st.inside.Add(-weight)
		t2 := r.now()
		st.lastRelease.Store(t2)
		call.active.Store(true)
		err = l.Unlock(unlockCtx)
		call.active.Store(false)
		t3 := r.now()
		if err != nil {
			r.fail(err)
		}
		if r.inWindow(t1) {
			r.counts[id]++
			r.wait.record(time.Duration(t1 - t0))
			r.op.record(time.Duration(t3 - t0))
			r.held.record(time.Duration(t2 - t1))
			if r.size == 0 && !r.perEntity && !r.rw && prev > 0 {
				r.gap.record(time.Duration(t1 - prev))
			}
		}
	}
}

// measure runs lib in shape s on t and measures it. Keys are named
// after key, fresh for each run. report is called every sampleEvery with
// the time spent and the acquisitions made so far.
func measure(ctx context.Context, t *target, lib library, s shape, key string, report func(elapsed time.Duration, acquired int64)) (res result, err error) {
	var counts clientCounts
	instances := make([]instance, 0, s.clients)
	defer func() {
		for _, in := range instances {
			err = errors.Join(err, in.Close())
		}
	}()
	for range s.clients {
		in, err := lib.connect(t, &counts)
		if err != nil {
			return result{}, fmt.Errorf("%s: open: %w", lib.name, err)
		}
		instances = append(instances, in)
	}
	r := &run{shape: s, clock: time.Now(), allowed: max(s.size, 1), locks: make([]lockState, s.keys), counts: make([]int64, s.goroutines)}
	r.winStart.Store(math.MaxInt64)
	r.winEnd.Store(math.MaxInt64)
	pickers, err := r.pickers(instances, lockNames(t, lib, s, key))
	if err != nil {
		return result{}, fmt.Errorf("%s: %w", lib.name, err)
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i, next := range pickers {
		wg.Go(func() { r.contend(runCtx, i, next) })
	}

	res, err = r.observe(ctx, t, &counts, report)
	stop()
	wg.Wait()
	if err != nil {
		return result{}, err
	}
	r.summarize(&res)
	return res, nil
}

// lockNames returns the names of s's locks: key for one lock, else
// key:k... (see target.lockName: on a cluster, the locks are dealt to the
// primaries in turn).
func lockNames(t *target, lib library, s shape, key string) []string {
	if s.keys == 1 {
		return []string{key}
	}
	names := make([]string, s.keys)
	for k := range names {
		names[k] = t.lockName(key, k, lib.redisKey)
	}
	return names
}

// pickers returns what every contender takes, on client i%clients: its
// own owner of lock i/(goroutines/keys), called names[that lock]; or, per
// entity, a new owner of a lock picked at random for every acquisition.
func (r *run) pickers(instances []instance, names []string) ([]func() (locker, *lockState), error) {
	pickers := make([]func() (locker, *lockState), r.goroutines)
	perKey := r.goroutines / r.keys
	for i := range pickers {
		in := instances[i%len(instances)]
		if r.perEntity {
			pickers[i] = func() (locker, *lockState) {
				k := rand.IntN(r.keys)
				return in.Mutex(names[k]), &r.locks[k]
			}
			continue
		}
		k := min(i/perKey, r.keys-1)
		l := locker(nil)
		switch si, ok := in.(semaphoreInstance); {
		case r.rw:
			ri, ok := in.(rwInstance)
			if !ok {
				return nil, errors.New("no read-write lock")
			}
			read, write := ri.RWMutex(names[k])
			pickers[i] = rwPicker(read, write, &r.locks[k])
			continue
		case r.size == 0:
			l = in.Mutex(names[k])
		case !ok:
			return nil, errors.New("no semaphore")
		default:
			l = si.Semaphore(names[k], r.size)
		}
		pickers[i] = func() (locker, *lockState) { return l, &r.locks[k] }
	}
	return pickers, nil
}

// observe lets the contenders warm up, then opens the window between two
// snapshots of the server's counters, sampling its connections meanwhile.
// It fills in the result's server-side and client-side figures.
func (r *run) observe(ctx context.Context, t *target, counts *clientCounts, report func(time.Duration, int64)) (result, error) {
	began := time.Now()
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	wait := func(d time.Duration, sample func() error) error {
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
			report(time.Since(began), r.acquired.Load())
			if sample != nil {
				if err := sample(); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := wait(r.warmup, nil); err != nil {
		return result{}, err
	}

	before, err := t.snapshot(ctx)
	if err != nil {
		return result{}, err
	}
	c0 := counts.snapshot()
	ccpu0 := processCPU()
	r.winStart.Store(r.now())
	conns, samples := -1, 0
	err = wait(r.measure, func() error {
		n, err := t.clients(ctx)
		conns, samples = max(conns, n), samples+1
		return err
	})
	r.winEnd.Store(r.now())
	ccpu1 := processCPU()
	c1 := counts.snapshot()
	if err != nil {
		return result{}, err
	}
	after, err := t.snapshot(ctx)
	if err != nil {
		return result{}, err
	}
	d := after.since(before, samples)
	seconds := float64(r.winEnd.Load()-r.winStart.Load()) / 1e9
	return result{
		seconds:    seconds,
		cmds:       float64(c1.commands - c0.commands + d.subs),
		calls:      float64(d.calls),
		cpu:        d.cpu * 1e6,
		sys:        d.sys * 1e6,
		lua:        d.lua,
		ccpu:       cpuMicros(ccpu0, ccpu1),
		requests:   float64(c1.requests - c0.requests),
		delivers:   float64(c1.deliveries - c0.deliveries),
		subs:       float64(d.subs),
		background: float64(c1.background-c0.background) / seconds,
		conns:      conns,
	}, nil
}

// summarize completes res from the contenders' records, once they stopped.
func (r *run) summarize(res *result) {
	for _, n := range r.counts {
		res.acquisitions += n
	}
	res.shape = r.shape
	res.rate = float64(res.acquisitions) / res.seconds
	res.cmds = perAcquisition(res.cmds, res.acquisitions)
	res.calls = perAcquisition(res.calls, res.acquisitions)
	res.requests = perAcquisition(res.requests, res.acquisitions)
	res.cpu = perAcquisition(res.cpu, res.acquisitions)
	res.sys = perAcquisition(res.sys, res.acquisitions)
	res.lua = perAcquisition(res.lua, res.acquisitions)
	res.ccpu = perAcquisition(res.ccpu, res.acquisitions)
	res.delivers = perAcquisition(res.delivers, res.acquisitions)
	res.subs = perAcquisition(res.subs, res.acquisitions)
	res.wait, res.op, res.gap, res.held = r.wait.snapshot(), r.op.snapshot(), r.gap.snapshot(), r.held.snapshot()
	res.jain = fairness.Jain(r.counts)
	res.counts, res.rounds = r.counts, 1
	res.violations, res.errors, res.firstError = r.violations.Load(), r.errors.Load(), r.firstError
}

// cpuMicros returns the CPU time from before to after in µs; NaN when
// either is unknown.
func cpuMicros(before, after time.Duration) float64 {
	if before < 0 || after < 0 {
		return math.NaN()
	}
	return float64(after-before) / 1e3
}

// processCPU returns the CPU time, user + system, the process has used so
// far; -1 when it cannot tell. Every client of a run lives in this
// process, so its growth is what the clients and the harness cost.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
