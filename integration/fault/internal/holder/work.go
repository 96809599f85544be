package main

// The lock-set workload's worker:
//
//	holder work -addr A -data D -name N -counters K -worker W -seed S
//	            -goroutines G [-fair] [-watchdog L] [-heartbeat H] [-recheck R]
//	            [-lockwait 2s] [-longhold 3s]
//
// G goroutines, each with a Mutex of its own on the lock N (through the
// Redis at A), loop: Lock with a deadline of -lockwait, then, under the
// lock, read-modify-write three counters in the Redis at D (a connection
// of their own, so that a fault on the lock's connection leaves them
// reachable), each by read, pause, write read+1:
//
//   - K:fenced checks tokens (internal/fence): the read claims it with the
//     hold's token, the write carries the token;
//   - K:plain does not: the write is sent with a timeout of its own, as an
//     application that looks at Lost before it writes would send it;
//   - K:bounded does not either, but its write's context also ends when
//     Lost closes, so that a write held up (by go-redis redialling a
//     Redis that is down, say) is given up once the hold is lost.
//
// Then Unlock, and a short pause.
//
// A hold is short (one read-modify-write of each counter) unless the test
// asked for a long one: stdin "long" makes the next hold of any goroutine
// last -longhold, doing read-modify-writes with pauses of 50-100 ms
// between read and write, so that a fault can land while it holds, between
// a read and its write. The goroutine looks at Lost before every
// read-modify-write, and before each unfenced write; it never looks
// between a fenced read and its write, which is the fenced counter's
// business. stdin "stop" (or its end) ends Lock calls at once and lets the
// holds finish; the worker then prints "done" and exits.
//
// Every event is one line on stdout, times in Unix nanoseconds by the
// local clock (the test's processes share one machine, hence one clock):
//
//	acq G H TOKEN TCALL TRET DEADLINE LONG      Lock returned the hold H
//	lockerr G TCALL TRET DEADLINE MSG           Lock failed
//	lost G H TOKEN T                            Lost of hold H was closed
//	unlocking G H TOKEN TCALL                   Unlock is about to be called
//	unlock G H TOKEN TCALL TRET ok|lost|error [MSG]
//	op G H TOKEN KIND OP T0 T1 RESULT VALUE [MSG]
//
// KIND is fr/fw (fenced read and write), ur/uw (plain) or br/bw
// (bounded); RESULT is ok, rejected (by the fenced counter), error or
// skipped (an unfenced write not sent because Lost was closed); VALUE is
// the value read (reads) or the value the write was computed from
// (writes). TCALL and T0 are
// taken before the call, TRET and T1 after it returns; "acq" is printed
// before the hold does anything, and an "unlock" line's TCALL is taken
// before anything of Unlock runs.

import (
	"bufio"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/integration/fault/internal/fence"
)

func work(c *redisync.Client) error {
	data := redis.NewClient(&redis.Options{Addr: *dataAddr, ContextTimeoutEnabled: true})
	defer data.Close()
	w := &worker{
		c:       c,
		data:    data,
		fenced:  fence.Counter{Key: *counters + ":fenced", Fenced: true},
		plain:   fence.Counter{Key: *counters + ":plain"},
		bounded: fence.Counter{Key: *counters + ":bounded"},
		pending: &atomic.Int64{},
	}
	run, stop := context.WithCancel(context.Background())
	defer stop()
	emit("ready")
	go func() { // the process exits without waiting for it
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			switch in.Text() {
			case "long":
				w.pending.Add(1)
			case "stop":
				stop()
			}
		}
		stop()
	}()
	var wg sync.WaitGroup
	for g := range *goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.loop(run, g, rand.New(rand.NewPCG(*seed, uint64(g))))
		}()
	}
	wg.Wait()
	emit("done")
	return nil
}

type worker struct {
	c             *redisync.Client
	data          *redis.Client
	fenced, plain fence.Counter
	bounded       fence.Counter
	pending       *atomic.Int64 // long holds asked for and not yet taken
	holds         atomic.Int64  // holds numbered in this worker
}

// loop is one goroutine of the worker, until run ends.
func (w *worker) loop(run context.Context, g int, rng *rand.Rand) {
	m, err := w.c.NewMutex(*name)
	if err != nil {
		emit("error %v", err)
		return
	}
	for run.Err() == nil {
		lctx, cancel := context.WithTimeout(run, *lockWait)
		deadline, _ := lctx.Deadline()
		tcall := time.Now()
		err := m.Lock(lctx)
		tret := time.Now()
		cancel()
		if err != nil {
			emit("lockerr %d %d %d %d %s", g, tcall.UnixNano(), tret.UnixNano(), deadline.UnixNano(), oneLine(err))
			if lctx.Err() == nil { // Redis unreachable: do not spin
				time.Sleep(time.Duration(20+rng.IntN(30)) * time.Millisecond)
			}
			continue
		}
		h := &section{w: w, m: m, g: g, n: w.holds.Add(1), token: m.Token(), lost: m.Lost(), rng: rng}
		h.long = w.takeLong()
		emit("acq %d %d %d %d %d %d %d", g, h.n, h.token, tcall.UnixNano(), tret.UnixNano(), deadline.UnixNano(), b2i(h.long))
		ended := make(chan struct{})
		go func() {
			select {
			case <-h.lost:
				emit("lost %d %d %d %d", g, h.n, h.token, time.Now().UnixNano())
			case <-ended:
			}
		}()
		h.run(run, tret)
		uctx, cancel := context.WithTimeout(context.Background(), time.Second)
		tu := time.Now()
		// Said before Unlock runs: a SIGKILL after the release and
		// before the "unlock" line must not leave the hold believed
		// until the kill.
		emit("unlocking %d %d %d %d", g, h.n, h.token, tu.UnixNano())
		err = m.Unlock(uctx)
		tur := time.Now()
		cancel()
		close(ended)
		res := "ok"
		switch {
		case errors.Is(err, redisync.ErrLockLost):
			res = "lost"
		case err != nil:
			res = "error " + oneLine(err)
		}
		emit("unlock %d %d %d %d %d %s", g, h.n, h.token, tu.UnixNano(), tur.UnixNano(), res)
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
	}
}

// takeLong reports whether a long hold was asked for, taking the request.
func (w *worker) takeLong() bool {
	for {
		n := w.pending.Load()
		if n == 0 {
			return false
		}
		if w.pending.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// section is one hold's critical section.
type section struct {
	w     *worker
	m     *redisync.Mutex
	g     int
	n     int64
	token int64
	lost  <-chan struct{}
	long  bool
	rng   *rand.Rand
}

// run does one read-modify-write of each counter, or, for a long hold,
// as many as fit in -longhold, stopping when the hold is lost (or, for a
// long hold, when the worker is told to stop).
func (s *section) run(run context.Context, from time.Time) {
	until := from.Add(*longHold)
	for step := 0; !closed(s.lost); step++ {
		if s.long {
			if step > 0 && (time.Now().After(until) || run.Err() != nil) {
				return
			}
			s.step(step, time.Duration(50+s.rng.IntN(50))*time.Millisecond)
			time.Sleep(time.Duration(5+s.rng.IntN(5)) * time.Millisecond)
			continue
		}
		if step > 0 {
			return
		}
		s.step(step, time.Duration(s.rng.IntN(2000))*time.Microsecond)
	}
}

// step reads, pauses and writes the fenced counter, then the unfenced
// one, then the bounded one. Each call has a timeout of its own, set when
// it is made: a call held up by a pause of the process is still sent when
// the process resumes, as a stale write would be.
func (s *section) step(step int, pause time.Duration) {
	op := itoa(int64(*workerID)) + "." + itoa(s.n) + "." + itoa(int64(step))
	call := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), time.Second)
	}

	ctx, cancel := call()
	t0 := time.Now()
	v, ok, err := s.w.fenced.Read(ctx, s.w.data, s.token)
	cancel()
	s.op("fr", op, t0, ok, err, v)
	if err == nil && ok {
		time.Sleep(pause)
		ctx, cancel = call()
		t0 = time.Now()
		ok, err = s.w.fenced.Write(ctx, s.w.data, s.token, v, op)
		cancel()
		s.op("fw", op, t0, ok, err, v)
	}

	for _, u := range []struct {
		c           fence.Counter
		read, write string
		bounded     bool // the write's context ends when Lost closes
	}{{s.w.plain, "ur", "uw", false}, {s.w.bounded, "br", "bw", true}} {
		if closed(s.lost) {
			return
		}
		ctx, cancel = call()
		t0 = time.Now()
		v, _, err = u.c.Read(ctx, s.w.data, 0)
		cancel()
		s.op(u.read, op, t0, true, err, v)
		if err != nil {
			return
		}
		time.Sleep(pause)
		if closed(s.lost) {
			now := time.Now().UnixNano()
			emit("op %d %d %d %s %s %d %d skipped %d", s.g, s.n, s.token, u.write, op, now, now, v)
			return
		}
		ctx, cancel = call()
		if u.bounded {
			ctx, cancel = untilLost(ctx, cancel, s.lost)
		}
		t0 = time.Now()
		_, err = u.c.Write(ctx, s.w.data, 0, v, op)
		cancel()
		s.op(u.write, op, t0, true, err, v)
	}
}

// untilLost returns ctx, ended also when lost closes.
func untilLost(ctx context.Context, cancel context.CancelFunc, lost <-chan struct{}) (context.Context, context.CancelFunc) {
	go func() {
		select {
		case <-lost:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// op prints an op event.
func (s *section) op(kind, op string, t0 time.Time, ok bool, err error, v int64) {
	t1 := time.Now().UnixNano()
	switch {
	case err != nil:
		emit("op %d %d %d %s %s %d %d error %d %s", s.g, s.n, s.token, kind, op, t0.UnixNano(), t1, v, oneLine(err))
	case !ok:
		emit("op %d %d %d %s %s %d %d rejected %d", s.g, s.n, s.token, kind, op, t0.UnixNano(), t1, v)
	default:
		emit("op %d %d %d %s %s %d %d ok %d", s.g, s.n, s.token, kind, op, t0.UnixNano(), t1, v)
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
