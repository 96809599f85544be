package fault

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/redistest"
)

// checkMutexHistory checks a linearized history of critical sections (see
// fence.Enter): entries and exits must alternate, each exit must match the
// entry before it, and tokens must strictly increase from one section to
// the next. It returns the number of sections, or an error naming the
// first violation.
func checkMutexHistory(h []string) (int, error) {
	var inside bool
	var cur, last int64
	n := 0
	for i, ev := range h {
		if len(ev) < 2 {
			return n, fmt.Errorf("event %d: malformed %q", i, ev)
		}
		tok, err := strconv.ParseInt(ev[1:], 10, 64)
		if err != nil {
			return n, fmt.Errorf("event %d: %v", i, err)
		}
		switch ev[0] {
		case '+':
			if inside {
				return n, fmt.Errorf("event %d: token %d entered while token %d was inside", i, tok, cur)
			}
			if tok <= last {
				return n, fmt.Errorf("event %d: token %d entered after token %d", i, tok, last)
			}
			inside, cur, last = true, tok, tok
		case '-':
			if !inside || tok != cur {
				return n, fmt.Errorf("event %d: token %d left, but %d was inside (inside=%v)", i, tok, cur, inside)
			}
			inside = false
			n++
		default:
			return n, fmt.Errorf("event %d: malformed %q", i, ev)
		}
	}
	if inside {
		return n, fmt.Errorf("token %d never left", cur)
	}
	return n, nil
}

func TestCheckMutexHistoryRejectsViolations(t *testing.T) {
	// The checker itself must be able to fail.
	for _, h := range [][]string{
		{"+1", "+2", "-1", "-2"}, // overlap
		{"+2", "-2", "+1", "-1"}, // token went back
		{"+1", "-1", "+1", "-1"}, // token reused
		{"+1", "-2"},             // wrong exit
		{"+1"},                   // never left
	} {
		if _, err := checkMutexHistory(h); err == nil {
			t.Errorf("history %q accepted", h)
		}
	}
	if n, err := checkMutexHistory([]string{"+1", "-1", "+3", "-3"}); err != nil || n != 2 {
		t.Errorf("valid history: n=%d err=%v", n, err)
	}
}

// TestContentionHistory runs 3 holder processes x 4 goroutines x 250
// cycles (3000 critical sections) on one lock. Under the lock each appends
// its entry and exit to a history list in Redis (RPUSH is atomic, so the
// list is a linearization), offers its token to a fenced register in Redis
// (internal/fence: rejects tokens below the highest seen), and increments a
// counter by GET, pause, SET.
//
// It fails if two sections overlap or a token does not strictly increase in
// the history (checkMutexHistory), if the fenced register rejects a live
// holder's token, if an increment is lost (counter != 3000), or if the run
// takes longer than a minute (a lost wake-up that nothing bounds).
func TestContentionHistory(t *testing.T) {
	const procs, goroutines, cycles = 3, 4, 250
	addr := redistest.Addr(t)
	rdb := redistest.NewClient(t, addr)
	name := redistest.Name(t)
	counter, history, register := "fault:"+name+":counter", "fault:"+name+":history", "fault:"+name+":register"
	t.Cleanup(func() { rdb.Del(ctx, counter, history, register) })

	ps := make([]*proc, procs)
	for i := range ps {
		ps[i] = startHolder(t, "contend", "-addr", addr, "-name", name,
			"-goroutines", strconv.Itoa(goroutines), "-cycles", strconv.Itoa(cycles),
			"-counter", counter, "-history", history, "-register", register,
			"-recheck", "2s")
	}
	start := time.Now()
	for _, p := range ps {
		p.send("go")
	}
	for i, p := range ps {
		l, _ := p.expect("done", time.Minute)
		t.Logf("process %d: %s", i, l)
	}
	elapsed := time.Since(start)

	h, err := rdb.LRange(ctx, history, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	n, err := checkMutexHistory(h)
	if err != nil {
		t.Fatalf("history of %d events rejected: %v", len(h), err)
	}
	if want := procs * goroutines * cycles; n != want {
		t.Fatalf("history has %d critical sections, want %d", n, want)
	}
	got, err := rdb.Get(ctx, counter).Int()
	if err != nil {
		t.Fatal(err)
	}
	if got != n {
		t.Fatalf("counter is %d after %d increments: lost updates", got, n)
	}
	rej, _ := rdb.HGet(ctx, register, "rejected").Int()
	if rej != 0 {
		t.Fatalf("fenced register rejected %d writes of live holders", rej)
	}
	t.Logf("%d critical sections in %v (%.0f/s), history and counter check out",
		n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds())
}
