package fault

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redisync/redisync/integration/fault/internal/fence"
	"github.com/redisync/redisync/internal/redistest"
)

// lockSetSeedEnv replays a run of TestLockSet: the nemesis's schedule
// (which faults, in which order, on which worker, how long) and every
// worker's random choices come from this seed. Timing is the machine's,
// so a replay repeats the schedule, not every interleaving.
const lockSetSeedEnv = "REDISYNC_LOCKSET_SEED"

// The lock-set workload's parameters: short leases, so that every fault
// resolves within a couple of seconds.
const (
	lsWorkers    = 4                      // worker processes at any time
	lsGoroutines = 3                      // goroutines (one Mutex each) per worker
	lsLease      = time.Second            // watchdog lease
	lsHeartbeat  = time.Second            // fair waiters' heartbeat
	lsLockWait   = 2 * time.Second        // deadline of each Lock call
	lsLongHold   = 3 * time.Second        // a hold the nemesis asked for, to span a fault
	lsLostMargin = 250 * time.Millisecond // for Lost to be seen after its deadline
	// lsLockMargin is how long after its ctx deadline a Lock call may
	// return: CleanupWait (internal/roundtrip: "every blocking call
	// returns within CleanupWait of the end of its context") and the
	// scheduling of a loaded machine.
	lsLockMargin = 100 * time.Millisecond
)

// TestLockSet is a lock-set workload across real processes, in the manner
// of Jepsen's lock analyses. Four worker processes (internal/holder work),
// three goroutines each, take one lock (plain, then fair) and under it
// read-modify-write (read, pause, write read+1) three counters in Redis:
// a fenced one (the read claims it with the hold's token; a write with a
// token below the highest seen is refused), a plain one (no tokens; the
// worker looks at Lost before it writes), and a bounded one (as plain, and
// the write's context also ends when Lost closes). Every worker reaches
// Redis through a proxy of its own for the lock, and directly for the
// counters. Redis runs with AOF, appendfsync always.
//
// A nemesis with a seeded schedule (REDISYNC_LOCKSET_SEED replays it)
// injects, one at a time and in random order: SIGKILL of a worker holding
// the lock and of any worker (each replaced by a new process), SIGSTOP of
// a holder past its lease (and a heartbeat) then SIGCONT, a Redis restart (SIGKILL, down for
// 0.2-2 s, started again on its AOF) while a hold is under way, and a
// blackhole on a holder's connection to Redis, healed after more than a
// lease. A fault aimed at a holder asks the worker for a long hold first
// and strikes between one of its reads and the write that follows.
//
// Every hold, Lost, Unlock, Lock call and counter operation is timed by
// the one clock of the machine; Redis logs every applied counter write
// with its own clock, the same one. The checker (lockset_check_test.go)
// fails the test if two holds believed at once (from Lock's return to
// Unlock's call or Lost, whichever first) other than across a pause, if
// tokens repeat or go against the order of holds, if a holder hit by a
// fault did not stop believing in time (partition or Redis restart: lease
// + 250 ms after the fault; pause: 250 ms after SIGCONT), if the lock stayed
// with a killed process for longer than its lease (plus a heartbeat and a
// third, fair), if a Lock call returned more than 100 ms after its ctx
// deadline, or after it with an error other than the ctx's, if any fenced update was lost or any acknowledged write is
// missing, if the fenced counter refused a holder that had not seen Lost
// and was not paused, or accepted a paused one once a later holder had
// claimed it, or if an unfenced update was lost other than by a writer
// paused between its read and its write. Overlaps and lost unfenced
// updates across a pause are the documented limit: they are reported.
func TestLockSet(t *testing.T) {
	seed := lockSetSeed(t)
	for i, mode := range []string{"plain", "fair"} {
		t.Run(mode, func(t *testing.T) {
			runLockSet(t, mode == "fair", rand.New(rand.NewPCG(seed, uint64(i))), seed)
		})
	}
}

// lockSetSeed returns the seed from REDISYNC_LOCKSET_SEED, or a new one.
func lockSetSeed(t *testing.T) uint64 {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv(lockSetSeedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", lockSetSeedEnv, s, err)
		}
	}
	t.Logf("seed %d (replay: %s=%d)", seed, lockSetSeedEnv, seed)
	return seed
}

// lsRun is one run of the workload: the Redis, the proxies, the worker
// processes and what they report.
type lsRun struct {
	t        *testing.T
	rng      *rand.Rand
	fair     bool
	srv      *redistest.Server
	proxies  []*redistest.Proxy // one per worker slot
	name     string             // the lock
	counters string             // the counters' key prefix
	start    time.Time

	mu       sync.Mutex
	slots    []*lsWorker // the live worker of each slot
	nextID   int
	holds    map[[2]int64]*lsHold // by worker id and hold number
	hist     lsHistory
	raw      []string                  // every line, for the record of a failed run
	longWait map[int]chan *lsHold      // worker id -> the nemesis waits for its long hold
	opWait   map[lsOpKey]chan struct{} // the nemesis waits for a hold's read
	acqAt    time.Time                 // the latest hold's acq
	acqCh    chan struct{}             // closed, and replaced, at every acq
	killedAt map[int]time.Time         // worker id -> SIGKILL
}

func runLockSet(t *testing.T, fair bool, rng *rand.Rand, seed uint64) {
	r := newLockSetRun(t, fair, rng)
	// Let the workers run unharmed first (a deliberate pause: the
	// schedule's first quiet period).
	time.Sleep(time.Second)
	plan := []string{"kill-holder", "kill-any", "pause", "restart", "partition"}
	rng.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	t.Logf("nemesis plan: %v", plan)
	for _, kind := range plan {
		r.fault(kind)
		// A quiet period between faults (deliberate), so that each
		// fault's effects are its own.
		time.Sleep(time.Duration(500+rng.IntN(500)) * time.Millisecond)
	}
	r.stopAll()
	h := r.history(time.Now())
	r.report(h, h.check(), seed)
}

// newLockSetRun starts a Redis with AOF (appendfsync always), a proxy per
// worker slot and the workers.
func newLockSetRun(t *testing.T, fair bool, rng *rand.Rand) *lsRun {
	t.Helper()
	srv := redistest.Spawn(t, "--appendonly", "yes", "--appendfsync", "always")
	name := redistest.Name(t)
	r := &lsRun{
		t: t, rng: rng, fair: fair, srv: srv, name: name, counters: "lockset:{" + name + "}",
		holds: map[[2]int64]*lsHold{}, longWait: map[int]chan *lsHold{}, opWait: map[lsOpKey]chan struct{}{},
		acqCh: make(chan struct{}), killedAt: map[int]time.Time{},
	}
	for range lsWorkers {
		r.proxies = append(r.proxies, redistest.NewProxy(t, srv.Addr))
	}
	r.slots = make([]*lsWorker, lsWorkers)
	r.start = time.Now()
	for slot := range lsWorkers {
		r.slots[slot] = r.startWorker(slot)
	}
	return r
}

// report logs the checker's notes and a summary, and fails the test with
// each violation, the seed and where the run's events were written.
func (r *lsRun) report(h *lsHistory, rep *lsReport, seed uint64) {
	t := r.t
	t.Helper()
	for _, n := range rep.notes {
		t.Log(n)
	}
	var lockErrs int
	for _, c := range h.calls {
		if c.err != "" {
			lockErrs++
		}
	}
	t.Logf("%d holds, %d counter ops, %d Lock calls ended without the lock, in %v",
		len(h.holds), len(h.ops), lockErrs, h.end.Sub(h.start).Round(time.Millisecond))
	if len(h.holds) < 100 {
		rep.violation("only %d holds in the run: the workload did not run", len(h.holds))
	}
	if len(rep.violations) == 0 {
		return
	}
	const show = 30
	for i, v := range rep.violations {
		if i == show {
			t.Errorf("... and %d more violations", len(rep.violations)-show)
			break
		}
		t.Errorf("violation: %s", v)
	}
	t.Errorf("seed %d: replay with %s=%d; events in %s", seed, lockSetSeedEnv, seed, r.record(seed, h))
}

// lsWorker is one worker process.
type lsWorker struct {
	id, slot int
	cmd      *exec.Cmd
	stdin    *os.File
	ready    chan struct{}
	eof      chan struct{} // its stdout reached EOF: it exited
	reap     sync.Once
}

// startWorker starts a worker in slot (whose proxy it uses for the lock)
// and waits for it to be ready. It is killed, if still running, when the
// test ends.
func (r *lsRun) startWorker(slot int) *lsWorker {
	r.t.Helper()
	r.mu.Lock()
	id := r.nextID
	r.nextID++
	r.mu.Unlock()
	args := []string{"work", "-addr", r.proxies[slot].Addr, "-data", r.srv.Addr,
		"-name", r.name, "-counters", r.counters,
		"-worker", strconv.Itoa(id), "-seed", strconv.FormatUint(r.rng.Uint64(), 10),
		"-goroutines", strconv.Itoa(lsGoroutines), "-watchdog", lsLease.String(), "-recheck", "2s",
		"-lockwait", lsLockWait.String(), "-longhold", lsLongHold.String()}
	if r.fair {
		args = append(args, "-fair", "-heartbeat", lsHeartbeat.String())
	}
	cmd := exec.Command(holderBin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		r.t.Fatal(err)
	}
	cmd.Stdin = stdinR
	out, err := cmd.StdoutPipe()
	if err != nil {
		r.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	_ = stdinR.Close()
	w := &lsWorker{id: id, slot: slot, cmd: cmd, stdin: stdinW, ready: make(chan struct{}), eof: make(chan struct{})}
	go func() {
		defer close(w.eof)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			r.event(w, sc.Text())
		}
	}()
	r.t.Cleanup(func() { w.kill() })
	select {
	case <-w.ready:
	case <-time.After(10 * time.Second):
		r.t.Fatalf("worker %d not ready after 10s", id)
	}
	return w
}

// send writes a command line to the worker.
func (w *lsWorker) send(cmd string) {
	_, _ = w.stdin.WriteString(cmd + "\n") // a dead worker reads nothing
}

// kill ends the worker with SIGKILL, if it still runs, and reaps it.
func (w *lsWorker) kill() {
	w.reap.Do(func() {
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		_ = w.cmd.Process.Kill()
		_ = w.stdin.Close()
		<-w.eof
		_ = w.cmd.Wait()
	})
}

// event records one line of worker w.
func (r *lsRun) event(w *lsWorker, text string) {
	f := strings.Fields(text)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.raw = append(r.raw, fmt.Sprintf("w%d %s", w.id, text))
	bad := func(why string) { r.hist.errors = append(r.hist.errors, fmt.Sprintf("w%d: %s: %q", w.id, why, text)) }
	if len(f) == 0 {
		bad("empty line")
		return
	}
	num := func(i int) int64 {
		if i >= len(f) {
			bad("short line")
			return 0
		}
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			bad(err.Error())
		}
		return n
	}
	ts := func(i int) time.Time { return time.Unix(0, num(i)) }
	hold := func() *lsHold {
		x := r.holds[[2]int64{int64(w.id), num(2)}]
		if x == nil {
			bad("no such hold")
		}
		return x
	}
	switch f[0] {
	case "ready":
		close(w.ready)
	case "acq":
		x := &lsHold{worker: w.id, g: int(num(1)), n: num(2), token: num(3), acq: ts(5), long: num(7) == 1}
		r.holds[[2]int64{int64(w.id), x.n}] = x
		r.hist.holds = append(r.hist.holds, x)
		r.hist.calls = append(r.hist.calls, lsCall{worker: w.id, g: x.g, call: ts(4), ret: x.acq, deadline: ts(6)})
		if ch := r.longWait[w.id]; ch != nil && x.long {
			delete(r.longWait, w.id)
			ch <- x
		}
		r.acqAt = x.acq
		close(r.acqCh)
		r.acqCh = make(chan struct{})
	case "lockerr":
		r.hist.calls = append(r.hist.calls, lsCall{worker: w.id, g: int(num(1)), call: ts(2), ret: ts(3), deadline: ts(4),
			err: strings.Join(f[min(5, len(f)):], " ")})
	case "lost":
		if x := hold(); x != nil {
			x.lost = ts(4)
		}
	case "unlocking":
		if x := hold(); x != nil {
			x.unlock = ts(4)
		}
	case "unlock":
		if x := hold(); x != nil {
			x.unlock, x.unlockRes = ts(4), strings.Join(f[min(6, len(f)):], " ")
		}
	case "op":
		if x := hold(); x != nil {
			o := &lsOp{hold: x, kind: f[4], op: f[5], t0: ts(6), t1: ts(7),
				result: f[min(8, len(f)-1)], value: num(9), msg: strings.Join(f[min(10, len(f)):], " ")}
			r.hist.ops = append(r.hist.ops, o)
			k := lsOpKey{x, o.kind}
			if ch := r.opWait[k]; ch != nil && o.result == "ok" && !strings.HasSuffix(o.op, ".0") {
				delete(r.opWait, k)
				close(ch)
			}
		}
	case "done":
	default:
		bad("unexpected line")
	}
}

// longHold asks worker w for a long hold and waits until it has it.
func (r *lsRun) longHold(w *lsWorker) *lsHold {
	ch := make(chan *lsHold, 1)
	r.mu.Lock()
	r.longWait[w.id] = ch
	r.mu.Unlock()
	w.send("long")
	select {
	case x := <-ch:
		return x
	case <-time.After(10 * time.Second):
		r.mu.Lock()
		delete(r.longWait, w.id)
		r.mu.Unlock()
		r.t.Errorf("nemesis: worker %d did not take a long hold within 10s", w.id)
		return nil
	}
}

// lsOpKey names the reads of one kind (fr or ur) of one hold.
type lsOpKey struct {
	hold *lsHold
	kind string
}

// strikePoint waits until the hold x, a long one, is between a read of
// the given kind (fr: fenced, ur: plain, br: bounded) and its write, in a step after
// its first, so that a fault lands in the middle of a read-modify-write.
// After 3 s it gives up and lets the fault land wherever the hold is.
func (r *lsRun) strikePoint(x *lsHold, kind string) {
	ch := make(chan struct{})
	k := lsOpKey{x, kind}
	r.mu.Lock()
	r.opWait[k] = ch
	r.mu.Unlock()
	select {
	case <-ch:
	case <-time.After(3 * time.Second):
		r.mu.Lock()
		delete(r.opWait, k)
		r.mu.Unlock()
		r.t.Logf("nemesis: %s never read %s in a later step; striking now", x, kind)
	}
}

// awaitAcq waits up to d for a hold taken after t0, and reports whether
// one was.
func (r *lsRun) awaitAcq(t0 time.Time, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok, ch := r.acqAt.After(t0), r.acqCh
		r.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return false
		}
	}
}

// fault injects one fault of the plan, records it, and waits until the
// lock is taken again.
func (r *lsRun) fault(kind string) {
	t, rng := r.t, r.rng
	slot := rng.IntN(lsWorkers)
	w := r.slots[slot]
	// A fault aimed at a holder strikes between a read and its write, of
	// any counter; a pause always between a fenced read and its write, so
	// that the paused holder's write is stale when it resumes (the case
	// fencing is for).
	mid := []string{"fr", "ur", "br"}[rng.IntN(3)]
	if kind == "pause" {
		mid = "fr"
	}
	f := lsFault{kind: kind, worker: w.id}
	if kind != "kill-any" {
		if f.target = r.longHold(w); f.target != nil {
			r.strikePoint(f.target, mid)
		}
	}
	switch kind {
	case "kill-holder", "kill-any":
		f.kind = "kill"
		r.kill(slot, &f)
	case "pause":
		r.pause(w, &f)
	case "restart":
		f.worker = -1
		r.restart(&f)
	case "partition":
		r.partition(slot, &f)
	}
	r.mu.Lock()
	r.hist.faults = append(r.hist.faults, f)
	r.mu.Unlock()
	where := ""
	if f.target != nil {
		where = ", between a " + map[string]string{"fr": "fenced", "ur": "plain", "br": "bounded"}[mid] + " read and its write"
	}
	t.Logf("nemesis: %s at %s%s, lasting %v", f, (&lsHistory{start: r.start}).at(f.start), where, f.end.Sub(f.start).Round(time.Millisecond))
	if !r.awaitAcq(f.end, 10*time.Second) {
		t.Errorf("nemesis: nobody took the lock within 10s after %s ended", f)
	}
}

// kill SIGKILLs the worker in slot and starts a new one there.
func (r *lsRun) kill(slot int, f *lsFault) {
	w := r.slots[slot]
	_ = w.cmd.Process.Kill()
	f.start = time.Now()
	f.end = f.start
	r.mu.Lock()
	r.killedAt[w.id] = f.start
	r.mu.Unlock()
	w.kill()
	// The replacement comes a little later (deliberate).
	time.Sleep(time.Duration(100+r.rng.IntN(400)) * time.Millisecond)
	r.slots[slot] = r.startWorker(slot)
}

// pause SIGSTOPs w past the lease, then SIGCONTs it.
func (r *lsRun) pause(w *lsWorker, f *lsFault) {
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		r.t.Fatal(err)
	}
	f.start = time.Now()
	// Past the lease and a heartbeat (deliberate): a fair lock may
	// first be handed to one of the paused process's queued calls, and
	// stays with it for a heartbeat.
	time.Sleep(lsLease + lsHeartbeat + time.Duration(200+r.rng.IntN(600))*time.Millisecond)
	f.end = time.Now()
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		r.t.Fatal(err)
	}
}

// restart SIGKILLs Redis and starts it again on its AOF after 0.2-2 s.
func (r *lsRun) restart(f *lsFault) {
	f.start = time.Now()
	r.srv.Kill(r.t)
	time.Sleep(time.Duration(200+r.rng.IntN(1800)) * time.Millisecond) // Redis down (deliberate)
	r.srv.Restart(r.t)
	f.end = time.Now()
}

// partition blackholes the connections of the worker in slot to Redis
// for longer than the lease, then heals them.
func (r *lsRun) partition(slot int, f *lsFault) {
	f.start = time.Now()
	r.proxies[slot].SetBlackhole(true)
	time.Sleep(lsLease + time.Duration(300+r.rng.IntN(900))*time.Millisecond) // past the lease (deliberate)
	r.proxies[slot].SetBlackhole(false)
	f.end = time.Now()
}

// stopAll tells every live worker to stop and waits for it to exit.
func (r *lsRun) stopAll() {
	for _, w := range r.slots {
		w.send("stop")
	}
	for _, w := range r.slots {
		select {
		case <-w.eof:
		case <-time.After(15 * time.Second):
			r.t.Errorf("worker %d did not exit within 15s of stop", w.id)
		}
		w.kill()
	}
}

// history returns what the run recorded, with the holds of killed
// workers ended at their SIGKILL, and the counters' logs.
func (r *lsRun) history(end time.Time) *lsHistory {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.hist
	h.fenced = lsCounter{name: "fenced", read: "fr", write: "fw"}
	h.unfenced = []lsCounter{{name: "plain", read: "ur", write: "uw"}, {name: "bounded", read: "br", write: "bw"}}
	admin := redistest.NewClient(r.t, r.srv.Addr)
	for _, c := range []*lsCounter{&h.fenced, &h.unfenced[0], &h.unfenced[1]} {
		var err error
		fc := fence.Counter{Key: r.counters + ":" + c.name, Fenced: c == &h.fenced}
		if c.log, c.value, err = fc.Log(ctx, admin); err != nil {
			r.t.Fatal(err)
		}
	}
	h.lease, h.heartbeat, h.fair = lsLease, lsHeartbeat, r.fair
	h.lostMargin, h.lockMargin = lsLostMargin, lsLockMargin
	h.start, h.end = r.start, end
	for _, x := range h.holds {
		if k, ok := r.killedAt[x.worker]; ok && (x.unlock.IsZero() || x.unlock.After(k)) {
			x.killed = k
		}
	}
	return &h
}

// record writes the run's events, faults and counter logs to a file for
// the analysis of a failed run, and returns its path.
func (r *lsRun) record(seed uint64, h *lsHistory) string {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("redisync-lockset-%d-%s.txt", seed, strings.ReplaceAll(r.t.Name(), "/", "-")))
	var b strings.Builder
	fmt.Fprintf(&b, "start %d (Unix ns); times below are Unix ns\n", r.start.UnixNano())
	for _, f := range h.faults {
		fmt.Fprintf(&b, "fault %s worker %d %d %d\n", f.kind, f.worker, f.start.UnixNano(), f.end.UnixNano())
	}
	for _, l := range r.raw {
		fmt.Fprintln(&b, l)
	}
	for _, c := range append([]lsCounter{h.fenced}, h.unfenced...) {
		for _, e := range c.log {
			fmt.Fprintf(&b, "%s-log %s %d %d %d %d\n", c.name, e.Op, e.Token, e.Read, e.Wrote, e.At.UnixNano())
		}
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return "(not written: " + err.Error() + ")"
	}
	return path
}
