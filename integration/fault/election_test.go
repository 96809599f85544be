package fault

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/integration/fault/internal/fence"
	"github.com/redisync/redisync/internal/redistest"
)

// campaign makes the helper p campaign with value and returns the token of
// its leadership.
func (p *proc) campaign(value string, d time.Duration) int64 {
	p.t.Helper()
	p.send("campaign " + value)
	l, _ := p.expect("leading ", d)
	tok, err := strconv.ParseInt(strings.TrimPrefix(l, "leading "), 10, 64)
	if err != nil {
		p.t.Fatalf("holder: %q", l)
	}
	return tok
}

// observe collects what an observer of the election name on a Client of
// its own sends, until the test ends.
func observe(t *testing.T, addr, name string) <-chan redisync.Leadership {
	t.Helper()
	octx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	return observeChan(octx, must(newClient(t, addr).NewElection(name)))
}

// nextState returns the observer's next state, failing after d.
func nextState(t *testing.T, obs <-chan redisync.Leadership, d time.Duration) redisync.Leadership {
	t.Helper()
	select {
	case l := <-obs:
		return l
	case <-time.After(d):
		t.Fatalf("no change observed within %v", d)
	}
	return redisync.Leadership{}
}

// TestElectionLeaderSIGKILL kills a leader process (watchdog lease 1 s)
// while a candidate in this process waits, and fails unless the candidate
// leads within lease + 300 ms of the SIGKILL, with a larger token, and an
// observer sees the new leader as the change that follows the dead one's.
func TestElectionLeaderSIGKILL(t *testing.T) {
	const lease = time.Second
	addr := redistest.Addr(t)
	name := redistest.Name(t)
	obs := observe(t, addr, name)
	nextState(t, obs, 5*time.Second) // nobody
	leader := startHolder(t, "serve", "-addr", addr, "-name", name, "-watchdog", lease.String())
	ta := leader.campaign("a", 5*time.Second)
	if l := nextState(t, obs, 5*time.Second); l.Value != "a" || l.Token != ta {
		t.Fatalf("observed %+v, want a with token %d", l, ta)
	}

	b := must(newClient(t, addr, redisync.WithCrashTimeout(lease)).NewElection(name))
	won := make(chan time.Time, 1)
	go func() {
		if err := b.Campaign(ctx, "b"); err != nil {
			t.Error(err)
		}
		won <- time.Now()
	}()
	rdb := redistest.NewClient(t, addr)
	eventually(t, 5*time.Second, "b to queue", func() bool {
		return rdb.LLen(ctx, lockQueueKey("redisync:elect:{"+name+"}")).Val() == 1
	})
	time.Sleep(lease / 2) // the kill lands at a random point of the lease (a deliberate pause)

	killed := time.Now()
	leader.kill()
	var at time.Time
	select {
	case at = <-won:
	case <-time.After(lease + 5*time.Second):
		t.Fatal("b does not lead after the leader was killed")
	}
	t.Logf("SIGKILL to the next leader: %v (lease %v)", at.Sub(killed).Round(time.Millisecond), lease)
	if gap := at.Sub(killed); gap > lease+300*time.Millisecond {
		t.Errorf("next leader %v after SIGKILL, want <= lease + 300ms", gap)
	}
	if l := nextState(t, obs, 5*time.Second); l.Value != "b" || l.Token != b.Token() || l.Token <= ta || l.Gap {
		t.Fatalf("observed %+v, want b with token %d > %d, no gap", l, b.Token(), ta)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestElectionLeaderSIGSTOPFencing pauses a leader process past its lease
// until a candidate of this process leads and writes to the fenced
// register, queues writes on the paused leader's stdin, and resumes it. It
// fails unless the paused leader hears it lost leadership, every write it
// makes with its old token is rejected, its Resign reports the loss, and
// the new leader is untouched.
func TestElectionLeaderSIGSTOPFencing(t *testing.T) {
	const lease = time.Second
	const staleWrites = 10
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	name := redistest.Name(t)
	register := "fault:" + name + ":register"
	t.Cleanup(func() { rdb.Del(ctx, register) })

	a := startHolder(t, "serve", "-addr", addr, "-name", name, "-watchdog", lease.String(), "-register", register)
	ta := a.campaign("a", 5*time.Second)
	a.send("write a-before-pause")
	a.expect("write ok", 5*time.Second)

	a.pause()
	paused := time.Now()
	b := must(newClient(t, addr, redisync.WithCrashTimeout(lease)).NewElection(name))
	cctx, cancel := context.WithTimeout(ctx, lease+5*time.Second)
	defer cancel()
	if err := b.Campaign(cctx, "b"); err != nil {
		t.Fatal(err)
	}
	tb := b.Token()
	t.Logf("paused leader (token %d) replaced by token %d after %v", ta, tb, time.Since(paused).Round(time.Millisecond))
	if tb <= ta {
		t.Fatalf("new token %d is not above the paused leader's %d", tb, ta)
	}
	if ok, err := fence.Write(ctx, rdb, register, tb, "b", "b"); err != nil || !ok {
		t.Fatalf("new leader's write: ok=%v err=%v", ok, err)
	}
	for range staleWrites {
		a.send("write a-stale") // read by the leader only after it resumes
	}
	a.signal(syscall.SIGCONT)
	for range staleWrites {
		if l, _ := a.expect("write ", 5*time.Second); l != "write rejected "+itoa(ta) {
			t.Errorf("stale write: %q", l)
		}
	}
	a.expect("lost", 5*time.Second)
	a.send("resign")
	if l, _ := a.expect("error", 5*time.Second); !contains(l, "lock lost") {
		t.Fatalf("paused leader's resign: %q, want lock lost", l)
	}
	select {
	case <-b.Lost():
		t.Fatal("the new leader's leadership was lost")
	default:
	}
	if l, err := b.Leader(ctx); err != nil || l.Value != "b" || l.Token != tb {
		t.Fatalf("Leader = %+v, %v; want b with token %d", l, err, tb)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestElectionChaos runs four leader processes that campaign, lead 0-200
// ms and resign in a loop (holder elect: each term writes its token to a
// fenced register when it starts and ends), while the test SIGKILLs one
// now and then (replacing it) and SIGSTOPs one past its lease. It fails
// when a leader's write is rejected while it still believed it led (the
// register saw a newer leader's token first: two leaders), when an
// observer sees revisions out of order or twice or tokens going back, or
// when too little happened.
func TestElectionChaos(t *testing.T) {
	const lease = 600 * time.Millisecond
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	name := redistest.Name(t)
	register := "fault:" + name + ":register"
	t.Cleanup(func() { rdb.Del(ctx, register) })
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	octx, ocancel := context.WithCancel(ctx)
	defer ocancel()
	watcher := must(newClient(t, addr).NewElection(name))
	obs := observeChan(octx, watcher)
	var seen []redisync.Leadership
	observed := make(chan struct{})
	go func() {
		defer close(observed)
		for l := range obs {
			seen = append(seen, l)
		}
	}()
	spawn := func() *proc {
		return startHolder(t, "elect", "-addr", addr, "-name", name, "-register", register,
			"-watchdog", lease.String(), "-heartbeat", lease.String())
	}
	procs := []*proc{spawn(), spawn(), spawn(), spawn()}
	var lines []string
	drain := func(p *proc) {
		for {
			select {
			case l := <-p.lines:
				lines = append(lines, l.text)
			default:
				lines = append(lines, p.saw()...)
				return
			}
		}
	}
	// The chaos runs for 6 s, and on (up to 30 s) until 6 faults hit a
	// leader, whatever the seed's mix of faults and pauses.
	kills, stops, onLeader := 0, 0, 0
	start := time.Now()
	for time.Since(start) < 6*time.Second || (onLeader < 6 && time.Since(start) < 30*time.Second) {
		// The fault hits the leader, when one leads: the process whose pid
		// is its value.
		i, leader := rng.IntN(len(procs)), false
		if l, err := watcher.Leader(ctx); err == nil {
			for j, p := range procs {
				if l.Value == "pid "+strconv.Itoa(p.cmd.Process.Pid) {
					i, leader = j, true
				}
			}
		}
		fault := rng.IntN(3)
		switch {
		case kills == 0: // each fault at least once, whatever the seed
			fault = 0
		case stops == 0:
			fault = 1
		}
		switch fault {
		case 0:
			drain(procs[i])
			procs[i].kill()
			procs[i] = spawn()
			kills++
		case 1:
			procs[i].pause()
			time.Sleep(lease + lease/2) // paused past its lease (the fault's length)
			procs[i].signal(syscall.SIGCONT)
			stops++
		}
		if leader && fault < 2 {
			onLeader++
		}
		time.Sleep(300 * time.Millisecond) // the chaos's pace
	}
	for _, p := range procs {
		p.send("stop")
	}
	for _, p := range procs {
		p.expect("done", 10*time.Second)
		drain(p)
	}
	terms, violations, lost := 0, 0, 0
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "term "):
			terms++
		case strings.HasPrefix(l, "violation "):
			violations++
			t.Errorf("two leaders: %s", l)
		case strings.HasPrefix(l, "lost "):
			lost++
		}
	}
	eventually(t, 5*time.Second, "nobody leading", func() bool {
		_, err := watcher.Leader(ctx)
		return err != nil
	})
	ocancel()
	<-observed
	var token int64
	for i, l := range seen {
		// A revision repeats only when a leader's lease ran out
		// unannounced: the state after it is nobody leading.
		if p := seen[max(i-1, 0)]; i > 0 && l.Revision <= p.Revision && !(l.Revision == p.Revision && p.Leads() && !l.Leads()) {
			t.Errorf("observed %+v after %+v", l, p)
		}
		if l.Leads() && l.Token < token {
			t.Errorf("observed token %d after %d", l.Token, token)
		}
		if l.Leads() {
			token = l.Token
		}
	}
	rejected, _ := rdb.HGet(ctx, register, "rejected").Int()
	t.Logf("%d terms, %d kills, %d pauses past the lease (%d of them on a leader), %d leaders told they lost, %d stale writes fenced off, %d states observed",
		terms, kills, stops, onLeader, lost, rejected, len(seen))
	// Each fault on a leader ends its term: there is one term more than
	// such faults at least.
	if onLeader < 6 || terms <= onLeader || kills == 0 || stops == 0 {
		t.Errorf("too little exercised: %d terms, %d kills, %d pauses, %d faults on a leader, %d leaders told they lost", terms, kills, stops, onLeader, lost)
	}
}

// observeChan ranges over e.Observe(ctx) in a goroutine and sends the
// states to the returned channel, which is closed when the sequence ends.
func observeChan(ctx context.Context, e *redisync.Election) <-chan redisync.Leadership {
	out := make(chan redisync.Leadership)
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
