package redisync

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/redistest"
)

// observeEnd ranges over seq and returns the error that ends it, failing
// the test when it yields no error within 5 s or anything after one.
func observeEnd(t *testing.T, seq func(func(Leadership, error) bool)) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		var end error
		for _, err := range seq {
			if end != nil {
				end = fmt.Errorf("a value after the error %v", end)
				break
			}
			end = err
		}
		done <- end
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("the observation did not end within 5 s")
	}
	return nil
}

func TestObserveInvalidElection(t *testing.T) {
	err := observeEnd(t, (&Election{}).Observe(context.Background()))
	var oe *OpError
	if !errors.Is(err, ErrInvalid) || !errors.As(err, &oe) || oe.Op != string(OpObserve) {
		t.Fatalf("Observe of a zero Election ended with %v, want an OpError of OpObserve wrapping ErrInvalid", err)
	}
}

func TestObserveClosedClient(t *testing.T) {
	rdb := redistest.Client(t)
	c := newClient(t, rdb)
	e := must(c.NewElection(redistest.Name(t)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	started := make(chan struct{})
	ended := make(chan error, 1)
	go func() {
		for _, err := range e.Observe(ctx) {
			if err != nil {
				ended <- err
				return
			}
			select {
			case <-started:
			default:
				close(started)
			}
		}
		ended <- nil
	}()
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("no first state")
	}
	c.Close()
	select {
	case err := <-ended:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("the observation ended with %v, want ErrClosed", err)
		}
	case <-ctx.Done():
		t.Fatal("the observation did not end when the Client closed")
	}
	if err := observeEnd(t, e.Observe(ctx)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Observe on a closed Client ended with %v, want ErrClosed", err)
	}
}

func TestObserveContextEnds(t *testing.T) {
	rdb := redistest.Client(t)
	e := must(newClient(t, rdb).NewElection(redistest.Name(t)))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := observeEnd(t, e.Observe(ctx))
	var oe *OpError
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &oe) || oe.Op != string(OpObserve) {
		t.Fatalf("the observation ended with %v, want an OpError of OpObserve wrapping DeadlineExceeded", err)
	}
}

// watchers counts the goroutines running in an observation: the ranging
// goroutine and the one holding the subscription.
func watchers() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "(*Election).Observe") {
			n++
		}
	}
	return n
}

func TestObserveBreakStopsAtOnce(t *testing.T) {
	rdb := redistest.Client(t)
	c := newClient(t, rdb)
	e := must(c.NewElection(redistest.Name(t)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 3 {
		n := 0
		for _, err := range e.Observe(ctx) {
			if err != nil {
				t.Fatal(err)
			}
			n++
			// The goroutine that holds the subscription may not have
			// been scheduled yet: two at most, and two in the end.
			waitFor(t, "the observation's two goroutines", func() bool {
				w := watchers()
				if w > 2 {
					t.Fatalf("%d observations run during one range", w)
				}
				return w == 2
			})
			break
		}
		if n != 1 {
			t.Fatalf("%d states before the break", n)
		}
		// The break has returned: nothing of the observation runs.
		if w := watchers(); w != 0 {
			t.Fatalf("%d observations still run after the break", w)
		}
		if all, _, _, _ := c.sub.reg.Waiters(e.m.keys.Changes); all != 0 {
			t.Fatalf("%d waiters on the channel after the break", all)
		}
	}
}

// TestObservePanicInTheLoopUnsubscribes: a loop body that panics ends the
// observation as a break does.
func TestObservePanicInTheLoopUnsubscribes(t *testing.T) {
	rdb := redistest.Client(t)
	c := newClient(t, rdb)
	e := must(c.NewElection(redistest.Name(t)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	func() {
		defer func() {
			if r := recover(); r != "reader" {
				t.Fatalf("recovered %v, want the reader's panic", r)
			}
		}()
		for range e.Observe(ctx) {
			panic("reader")
		}
	}()
	if w := watchers(); w != 0 {
		t.Fatalf("%d observations still run after the panic", w)
	}
	if all, _, _, _ := c.sub.reg.Waiters(e.m.keys.Changes); all != 0 {
		t.Fatalf("%d waiters on the channel after the panic", all)
	}
}

func TestObserveSeesEveryChangeInOrder(t *testing.T) {
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	c := newClient(t, rdb)
	a := must(c.NewElection(name))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const changes = 20
	var got []string
	for l, err := range must(c.NewElection(name)).Observe(ctx) {
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		if l.Gap {
			t.Fatalf("Gap set on %+v, the reader keeping up", l)
		}
		got = append(got, l.Value)
		switch n := len(got); {
		case n == 1:
			if err := a.Campaign(ctx, "v1"); err != nil {
				t.Fatal(err)
			}
		case n <= changes:
			if err := a.Proclaim(ctx, fmt.Sprintf("v%d", n)); err != nil {
				t.Fatal(err)
			}
		}
		if len(got) == changes+1 {
			break
		}
	}
	for i, v := range got[1:] {
		if want := fmt.Sprintf("v%d", i+1); v != want {
			t.Fatalf("observed %q, want v1 to v%d in order", got, changes)
		}
	}
}
