package waiters

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// The waiter registry on its own: no Redis, no subscriber.

// joinReg registers a new waiter set for ticket on the named channel of r.
func joinReg(t *testing.T, r *Registry, name, ticket string) *Set {
	t.Helper()
	ws := NewSet()
	if _, ok := r.Add(ws, name, ticket, true); !ok {
		t.Fatal("add on an open registry returned no waiter")
	}
	return ws
}

// fired reports whether ws has a signal not consumed yet.
func fired(ws *Set) bool {
	for _, w := range ws.members {
		if w.pending() {
			return true
		}
	}
	return false
}

// waitAsync runs ws.wait for d in a goroutine and returns what it returns.
func waitAsync(ws *Set, ctx context.Context, d time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := ws.Wait(ctx, d)
		done <- err
	}()
	return done
}

func TestRegistryPlainMessageWakesOneWaiterInOrder(t *testing.T) {
	r := New(nil, errClosed)
	a, b, c := joinReg(t, r, "ch", "a"), joinReg(t, r, "ch", "b"), joinReg(t, r, "ch", "c")
	r.Confirm("ch")
	r.Deliver("ch", "")
	if !fired(a) || fired(b) || fired(c) {
		t.Fatalf("after one message: fired a %v b %v c %v, want only a", fired(a), fired(b), fired(c))
	}
	// The next message goes to the first waiter with no signal pending.
	r.Deliver("ch", "")
	if !fired(b) || fired(c) {
		t.Fatalf("after two messages: fired b %v c %v, want b only", fired(b), fired(c))
	}
	if g, err := a.Wait(ctx, time.Hour); g != "" || err != nil {
		t.Fatalf("a's wait: %q, %v; want no grant, nil", g, err)
	}
	if fired(a) {
		t.Fatal("a's signal not consumed by its wait")
	}
	r.Deliver("other", "") // a channel without waiters: nothing happens
	if fired(c) {
		t.Fatal("a message on another channel woke c")
	}
}

func TestRegistryGrantGoesToItsTicket(t *testing.T) {
	r := New(nil, errClosed)
	a, b := joinReg(t, r, "ch", "t1"), joinReg(t, r, "ch", "t2")
	r.Deliver("ch", "x:1 t2:7 malformed")
	if fired(a) || !fired(b) {
		t.Fatalf("fired a %v b %v, want b only", fired(a), fired(b))
	}
	if g, err := b.Wait(ctx, time.Hour); g != "t2:7" || err != nil {
		t.Fatalf("b's wait: %q, %v; want t2:7", g, err)
	}
	// A call that changes its address gets the grants sent to the new one.
	a.Retarget("t3")
	r.Deliver("ch", "t1:8 t3:9")
	if g, _ := a.Wait(ctx, 0); g != "t3:9" {
		t.Fatalf("a's grant after retarget: %q, want t3:9", g)
	}
	// A later plain signal keeps the grant that came first.
	r.Deliver("ch", "t1:10")
	r.Deliver("ch", "t2:11")
	b.Nudge()
	if g, _ := b.Wait(ctx, 0); g != "t2:11" {
		t.Fatalf("b's grant after a nudge: %q, want t2:11", g)
	}
}

func TestRegistryLeavePassesOnUnusedWakeups(t *testing.T) {
	r := New(nil, errClosed)
	next := joinReg(t, r, "ch", "n")
	check := func(what string, want bool) {
		t.Helper()
		if got := fired(next); got != want {
			t.Fatalf("%s: next waiter signalled %v, want %v", what, got, want)
		}
		_, _ = next.Wait(ctx, 0)
	}
	// The first waiters registered are signalled first: register the
	// leaver ahead of next for each case.
	lead := func() *Set {
		t.Helper()
		r.leave(next.members[0], false)
		ws := joinReg(t, r, "ch", "l")
		next = joinReg(t, r, "ch", "n")
		return ws
	}

	ws := lead()
	r.Deliver("ch", "")
	ws.Leave(false)
	check("a signal not consumed", true)

	ws = lead()
	r.Deliver("ch", "")
	_, _ = ws.Wait(ctx, 0)
	ws.Leave(true)
	check("a signal consumed and not used, leaving after a failure", true)

	ws = lead()
	r.Deliver("ch", "")
	_, _ = ws.Wait(ctx, 0)
	ws.Leave(false)
	check("a signal consumed, leaving after a success", false)

	ws = lead()
	r.Deliver("ch", "")
	_, _ = ws.Wait(ctx, 0)
	ws.Used()
	ws.Leave(true)
	check("a signal used by an attempt", false)

	ws = lead()
	r.Deliver("ch", "l:5")
	ws.Leave(true)
	check("a grant", false)
}

func TestRegistryConfirmation(t *testing.T) {
	r := New(nil, errClosed)
	if ws := NewSet(); r.AddConfirmed(ws, "ch", "a", true) {
		t.Fatal("AddConfirmed registered on a channel not confirmed")
	}
	a := NewSet()
	ready, _ := r.Add(a, "ch", "a", true)
	if !a.members[0].r.unconfirmed(a.members[0]) {
		t.Fatal("a new channel is confirmed")
	}
	a.Proceed() // a goes on before the confirmation
	b := joinReg(t, r, "ch", "b")
	r.Confirm("ch")
	select {
	case <-ready:
	default:
		t.Fatal("ready not closed by the confirmation")
	}
	if !fired(a) || !fired(b) {
		t.Fatal("the confirmation did not wake every waiter of a channel a waiter went on without")
	}
	_, _ = a.Wait(ctx, 0)
	_, _ = b.Wait(ctx, 0)
	if ws := NewSet(); !r.AddConfirmed(ws, "ch", "c", true) {
		t.Fatal("AddConfirmed did not register on a confirmed channel")
	}

	// A confirmation not asked for (a resubscription after a reconnect)
	// wakes every waiter: messages may have been lost.
	r.Confirm("ch")
	if !fired(a) || !fired(b) {
		t.Fatal("a second confirmation did not wake every waiter")
	}
	_, _ = a.Wait(ctx, 0)
	_, _ = b.Wait(ctx, 0)

	// A lapse makes the channel unconfirmed until confirmed anew, which
	// wakes every waiter.
	r.Lapse("ch")
	ready, _ = r.Add(NewSet(), "ch", "d", true)
	select {
	case <-ready:
		t.Fatal("ready closed after a lapse")
	default:
	}
	if fired(a) {
		t.Fatal("the lapse woke a waiter")
	}
	r.Confirm("ch")
	if !fired(a) || !fired(b) {
		t.Fatal("the confirmation after a lapse did not wake every waiter")
	}
}

func TestWaitSetBounds(t *testing.T) {
	r := New(nil, errClosed)
	ws := joinReg(t, r, "ch", "a")

	// Not confirmed: no message can come, so the sleep is at most DeafPoll.
	start := time.Now()
	if err := result(t, waitAsync(ws, ctx, time.Hour)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < DeafPoll {
		t.Fatalf("unconfirmed wait returned after %v, before DeafPoll %v", d, DeafPoll)
	}

	r.Confirm("ch")
	cctx, cancel := context.WithCancel(ctx)
	done := waitAsync(ws, cctx, time.Hour)
	cancel()
	if err := result(t, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with its ctx cancelled: %v, want context.Canceled", err)
	}

	done = waitAsync(ws, ctx, time.Hour)
	r.Close()
	if err := result(t, done); !errors.Is(err, errClosed) {
		t.Fatalf("wait when the registry closed: %v, want errClosed", err)
	}
	if w, _ := r.Add(NewSet(), "ch", "b", true); w != nil {
		t.Fatal("add registered a waiter on a closed registry")
	}
}

// twoRegistries returns two registries and a set with a waiter on the
// confirmed channel "ch" of each, as a RedMutex on two nodes has.
func twoRegistries() (*Registry, *Registry, *Set) {
	r1, r2 := New(nil, errClosed), New(nil, errClosed)
	ws := NewSet()
	for _, r := range []*Registry{r1, r2} {
		r.Add(ws, "ch", "", true)
		r.Confirm("ch")
	}
	return r1, r2, ws
}

// A RedMutex waits on several subscribers: a message on any of them wakes
// it, and leaving passes each unused wake-up on in its own registry.
func TestWaitSetOverSeveralRegistries(t *testing.T) {
	r1, r2, ws := twoRegistries()
	other := joinReg(t, r2, "ch", "")

	done := waitAsync(ws, ctx, time.Hour)
	r2.Deliver("ch", "")
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if fired(other) {
		t.Fatal("the message woke the second waiter of r2 too")
	}
	ws.Leave(true) // the call failed without using the wake-up
	if !fired(other) {
		t.Fatal("the wake-up consumed from r2 was not passed on")
	}
	if r1.HasWaiters("ch") {
		t.Fatal("r1 still has the set's waiter after leave")
	}
}

// No wake-up is lost between a wait consuming its signals and the next
// message: every message sent while the call sleeps wakes it.
func TestWaitSetNoLostWakeup(t *testing.T) {
	r1, r2, ws := twoRegistries()
	for i := range 500 {
		r := []*Registry{r1, r2}[i%2]
		go r.Deliver("ch", "")
		if err := result(t, waitAsync(ws, ctx, time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	ws.Leave(false)
}

func TestRegistrySweep(t *testing.T) {
	r := New(nil, errClosed)
	busy := joinReg(t, r, "busy", "")
	joinReg(t, r, "idle", "").Leave(false)
	joinReg(t, r, "gone", "").Leave(false)
	if r.IdleSince().IsZero() {
		t.Fatal("no idle mark after a channel's last waiter left")
	}
	var asked []string
	wanted := r.Sweep(func(name string, idleSince time.Time) bool {
		asked = append(asked, name)
		if idleSince.IsZero() {
			t.Errorf("%s: no idleSince", name)
		}
		return name == "gone"
	})
	if len(wanted) != 1 || wanted[0] != "busy" {
		t.Fatalf("sweep wanted %v, want [busy]", wanted)
	}
	if len(asked) != 2 {
		t.Fatalf("drop asked about %v, want the two channels without waiters", asked)
	}
	if _, ok := r.channels["gone"]; ok {
		t.Fatal("a dropped channel is still registered")
	}
	if _, ok := r.channels["idle"]; !ok || r.IdleSince().IsZero() {
		t.Fatal("a kept idle channel was forgotten, or left no idle mark")
	}
	r.Sweep(func(string, time.Time) bool { return true })
	if !r.IdleSince().IsZero() || !r.HasWaiters("busy") {
		t.Fatal("after dropping every idle channel: an idle mark is left, or busy lost its waiter")
	}
	busy.Leave(false)
}

// An empty message is a wake-up of plain (barging) waiters: it wakes one
// plain waiter; when the channel has none, or is gone (swept, its
// UNSUBSCRIBE on its way), the registry tells unheard, which passes it on
// to another process, and a fair waiter, if any, looks again all the
// same. After a reconnect, or when its connection fails with no waiter
// left (it is not subscribed anew), a channel whose plain waiters have all
// gone passes on the wake-up it may have missed; a channel that never had
// one does not (its Client is not recorded), nor does a fair waiter's
// unused hint.
func TestRegistryTellsUnheardWakeups(t *testing.T) {
	var unheard []string
	r := New(func(name string) { unheard = append(unheard, name) }, errClosed)
	told := func(want ...string) {
		t.Helper()
		if !slices.Equal(unheard, want) {
			t.Fatalf("unheard told %q, want %q", unheard, want)
		}
		unheard = nil
	}

	r.Deliver("gone", "")
	told("gone")

	fair := NewSet()
	r.Add(fair, "mixed", "f", false)
	r.Confirm("mixed")
	plain := NewSet()
	r.Add(plain, "mixed", "p", true)
	r.Deliver("mixed", "")
	told()
	if !fired(plain) || fired(fair) {
		t.Fatal("a wake-up did not go to the plain waiter alone")
	}
	plain.Leave(true) // it did not use its wake-up: passed on, to nobody here
	told("mixed")
	if !fired(fair) {
		t.Fatal("a wake-up that no plain waiter took did not wake the fair waiter")
	}

	r.Lapse("mixed")
	r.Confirm("mixed") // a reconnect: plain waiters had waited here
	told("mixed")
	fair.Leave(false)
	r.Lapse("mixed") // no waiter left: not subscribed anew, so told now
	told("mixed")

	only := NewSet()
	r.Add(only, "fair", "f", false)
	r.Confirm("fair")
	r.Lapse("fair")
	r.Confirm("fair")
	told()
	only.Leave(true) // with the reconnect's signal, unused: a hint, not a barging wake-up
	told()
	r.Lapse("fair")
	told()
}

// A fair-only channel (no plain waiter ever waited on it): a reconnect
// (confirm of a confirmed channel) wakes its fair waiter and tells unheard
// nothing; nor does the fair waiter when it leaves without using the
// signal (its ctx ended, or the attempt in flight took the lock): no
// wake.lua in a Client that never had a barging waiter.
func TestBargingFairLeaveTellsUnheard(t *testing.T) {
	var unheard []string
	r := New(func(name string) { unheard = append(unheard, name) }, errClosed)
	fair := NewSet()
	r.Add(fair, "fair", "f", false)
	r.Confirm("fair")
	r.Lapse("fair")
	r.Confirm("fair") // a reconnect: wakes the fair waiter, tells nobody
	if len(unheard) != 0 {
		t.Fatalf("reconnect told %q", unheard)
	}
	fair.Leave(true) // e.g. its ctx ended with the signal unused
	if len(unheard) != 0 {
		t.Errorf("a fair waiter leaving with a reconnect's signal told unheard %q: a wake.lua in a fair-only Client", unheard)
	}
}

// One empty message is passed on once: the plain waiter leaves with it
// (unheard told, the fair waiter woken as a hint), then the fair waiter
// leaves without using it (on f755d84 unheard was told again: two
// wake.lua, two Clients woken, for one release).
func TestBargingOneWakeupPassedOnTwice(t *testing.T) {
	var unheard []string
	r := New(func(name string) { unheard = append(unheard, name) }, errClosed)
	fair, plain := NewSet(), NewSet()
	r.Add(fair, "mixed", "f", false)
	r.Add(plain, "mixed", "p", true)
	r.Confirm("mixed")
	r.Deliver("mixed", "")
	plain.Leave(true)
	fair.Leave(false) // its attempt in flight took the lock: signal unused
	if !slices.Equal(unheard, []string{"mixed"}) {
		t.Errorf("one wake-up told unheard %q, want once", unheard)
	}
}

// A plain wake-up that a call took, and that no
// attempt used (the attempt failed: Redis away for a moment), is forgotten
// by the next wait that brings no signal, so that the call, ending with an
// error afterwards, does not pass it on: the other waiter of the process
// sleeps to its bound although the lock is free.
func TestBargingUnusedWakeupSurvivesAnEmptyWait(t *testing.T) {
	r := New(nil, errClosed)
	r.channels["ch"] = &channel{name: "ch", ready: make(chan struct{}), confirmed: true}
	a, b := NewSet(), NewSet()
	r.AddConfirmed(a, "ch", "a", true)
	r.AddConfirmed(b, "ch", "b", true)
	r.Deliver("ch", "") // a release: wakes a
	if _, err := a.Wait(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	// a's attempt fails transiently (no used()), it backs off: a wait
	// with no signal.
	if _, err := a.Wait(ctx, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// Then its ctx ends: it leaves, passing on what it did not use.
	a.Leave(true)
	select {
	case <-b.bell:
	default:
		t.Fatal("the wake-up a took and never used was not passed on to b")
	}
}

// errClosed is what the waits of the tests' registries return once closed.
var errClosed = errors.New("closed")

var ctx = context.Background()

// result returns what done delivers, failing the test after 5 s.
func result(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("timed out waiting for the wait to return")
		return nil
	}
}
