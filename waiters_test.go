package redisync

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// The waiter registry on its own: no Redis, no subscriber.

// joinReg registers a new waiter set for ticket on the named channel of r.
func joinReg(t *testing.T, r *registry, name, ticket string) *waitSet {
	t.Helper()
	ws := newWaitSet()
	if w, _ := r.add(ws, name, ticket, true); w == nil {
		t.Fatal("add on an open registry returned no waiter")
	}
	return ws
}

// fired reports whether ws has a signal not consumed yet.
func fired(ws *waitSet) bool {
	for _, w := range ws.members {
		if w.pending() {
			return true
		}
	}
	return false
}

// waitAsync runs ws.wait for d in a goroutine and returns what it returns.
func waitAsync(ws *waitSet, ctx context.Context, d time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := ws.wait(ctx, d)
		done <- err
	}()
	return done
}

func TestRegistryPlainMessageWakesOneWaiterInOrder(t *testing.T) {
	r := newRegistry(nil)
	a, b, c := joinReg(t, r, "ch", "a"), joinReg(t, r, "ch", "b"), joinReg(t, r, "ch", "c")
	r.confirm("ch")
	r.deliver("ch", "")
	if !fired(a) || fired(b) || fired(c) {
		t.Fatalf("after one message: fired a %v b %v c %v, want only a", fired(a), fired(b), fired(c))
	}
	// The next message goes to the first waiter with no signal pending.
	r.deliver("ch", "")
	if !fired(b) || fired(c) {
		t.Fatalf("after two messages: fired b %v c %v, want b only", fired(b), fired(c))
	}
	if g, err := a.wait(ctx, time.Hour); g != "" || err != nil {
		t.Fatalf("a's wait: %q, %v; want no grant, nil", g, err)
	}
	if fired(a) {
		t.Fatal("a's signal not consumed by its wait")
	}
	r.deliver("other", "") // a channel without waiters: nothing happens
	if fired(c) {
		t.Fatal("a message on another channel woke c")
	}
}

func TestRegistryGrantGoesToItsTicket(t *testing.T) {
	r := newRegistry(nil)
	a, b := joinReg(t, r, "ch", "t1"), joinReg(t, r, "ch", "t2")
	r.deliver("ch", "x:1 t2:7 malformed")
	if fired(a) || !fired(b) {
		t.Fatalf("fired a %v b %v, want b only", fired(a), fired(b))
	}
	if g, err := b.wait(ctx, time.Hour); g != "t2:7" || err != nil {
		t.Fatalf("b's wait: %q, %v; want t2:7", g, err)
	}
	// A call that changes its address gets the grants sent to the new one.
	a.retarget("t3")
	r.deliver("ch", "t1:8 t3:9")
	if g, _ := a.wait(ctx, 0); g != "t3:9" {
		t.Fatalf("a's grant after retarget: %q, want t3:9", g)
	}
	// A later plain signal keeps the grant that came first.
	r.deliver("ch", "t1:10")
	r.deliver("ch", "t2:11")
	b.nudge()
	if g, _ := b.wait(ctx, 0); g != "t2:11" {
		t.Fatalf("b's grant after a nudge: %q, want t2:11", g)
	}
}

func TestRegistryLeavePassesOnUnusedWakeups(t *testing.T) {
	r := newRegistry(nil)
	next := joinReg(t, r, "ch", "n")
	check := func(what string, want bool) {
		t.Helper()
		if got := fired(next); got != want {
			t.Fatalf("%s: next waiter signalled %v, want %v", what, got, want)
		}
		_, _ = next.wait(ctx, 0)
	}
	// The first waiters registered are signalled first: register the
	// leaver ahead of next for each case.
	lead := func() *waitSet {
		t.Helper()
		r.leave(next.members[0], false)
		ws := joinReg(t, r, "ch", "l")
		next = joinReg(t, r, "ch", "n")
		return ws
	}

	ws := lead()
	r.deliver("ch", "")
	ws.leave(false)
	check("a signal not consumed", true)

	ws = lead()
	r.deliver("ch", "")
	_, _ = ws.wait(ctx, 0)
	ws.leave(true)
	check("a signal consumed and not used, leaving after a failure", true)

	ws = lead()
	r.deliver("ch", "")
	_, _ = ws.wait(ctx, 0)
	ws.leave(false)
	check("a signal consumed, leaving after a success", false)

	ws = lead()
	r.deliver("ch", "")
	_, _ = ws.wait(ctx, 0)
	ws.used()
	ws.leave(true)
	check("a signal used by an attempt", false)

	ws = lead()
	r.deliver("ch", "l:5")
	ws.leave(true)
	check("a grant", false)
}

func TestRegistryConfirmation(t *testing.T) {
	r := newRegistry(nil)
	if ws := newWaitSet(); r.addConfirmed(ws, "ch", "a", true) != nil {
		t.Fatal("addConfirmed registered on a channel not confirmed")
	}
	a := newWaitSet()
	_, ready := r.add(a, "ch", "a", true)
	if !a.members[0].r.unconfirmed(a.members[0]) {
		t.Fatal("a new channel is confirmed")
	}
	a.proceed() // a goes on before the confirmation
	b := joinReg(t, r, "ch", "b")
	r.confirm("ch")
	select {
	case <-ready:
	default:
		t.Fatal("ready not closed by the confirmation")
	}
	if !fired(a) || !fired(b) {
		t.Fatal("the confirmation did not wake every waiter of a channel a waiter went on without")
	}
	_, _ = a.wait(ctx, 0)
	_, _ = b.wait(ctx, 0)
	if ws := newWaitSet(); r.addConfirmed(ws, "ch", "c", true) == nil {
		t.Fatal("addConfirmed did not register on a confirmed channel")
	}

	// A confirmation not asked for (a resubscription after a reconnect)
	// wakes every waiter: messages may have been lost.
	r.confirm("ch")
	if !fired(a) || !fired(b) {
		t.Fatal("a second confirmation did not wake every waiter")
	}
	_, _ = a.wait(ctx, 0)
	_, _ = b.wait(ctx, 0)

	// A lapse makes the channel unconfirmed until confirmed anew, which
	// wakes every waiter.
	r.lapse("ch")
	_, ready = r.add(newWaitSet(), "ch", "d", true)
	select {
	case <-ready:
		t.Fatal("ready closed after a lapse")
	default:
	}
	if fired(a) {
		t.Fatal("the lapse woke a waiter")
	}
	r.confirm("ch")
	if !fired(a) || !fired(b) {
		t.Fatal("the confirmation after a lapse did not wake every waiter")
	}
}

func TestWaitSetBounds(t *testing.T) {
	r := newRegistry(nil)
	ws := joinReg(t, r, "ch", "a")

	// Not confirmed: no message can come, so the sleep is at most deafPoll.
	start := time.Now()
	if err := result(t, waitAsync(ws, ctx, time.Hour)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < deafPoll {
		t.Fatalf("unconfirmed wait returned after %v, before deafPoll %v", d, deafPoll)
	}

	r.confirm("ch")
	cctx, cancel := context.WithCancel(ctx)
	done := waitAsync(ws, cctx, time.Hour)
	cancel()
	if err := result(t, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with its ctx cancelled: %v, want context.Canceled", err)
	}

	done = waitAsync(ws, ctx, time.Hour)
	r.close()
	if err := result(t, done); !errors.Is(err, ErrClosed) {
		t.Fatalf("wait when the registry closed: %v, want ErrClosed", err)
	}
	if w, _ := r.add(newWaitSet(), "ch", "b", true); w != nil {
		t.Fatal("add registered a waiter on a closed registry")
	}
}

// twoRegistries returns two registries and a set with a waiter on the
// confirmed channel "ch" of each, as a RedMutex on two nodes has.
func twoRegistries() (*registry, *registry, *waitSet) {
	r1, r2 := newRegistry(nil), newRegistry(nil)
	ws := newWaitSet()
	for _, r := range []*registry{r1, r2} {
		r.add(ws, "ch", "", true)
		r.confirm("ch")
	}
	return r1, r2, ws
}

// A RedMutex waits on several subscribers: a message on any of them wakes
// it, and leaving passes each unused wake-up on in its own registry.
func TestWaitSetOverSeveralRegistries(t *testing.T) {
	r1, r2, ws := twoRegistries()
	other := joinReg(t, r2, "ch", "")

	done := waitAsync(ws, ctx, time.Hour)
	r2.deliver("ch", "")
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if fired(other) {
		t.Fatal("the message woke the second waiter of r2 too")
	}
	ws.leave(true) // the call failed without using the wake-up
	if !fired(other) {
		t.Fatal("the wake-up consumed from r2 was not passed on")
	}
	if r1.hasWaiters("ch") {
		t.Fatal("r1 still has the set's waiter after leave")
	}
}

// No wake-up is lost between a wait consuming its signals and the next
// message: every message sent while the call sleeps wakes it.
func TestWaitSetNoLostWakeup(t *testing.T) {
	r1, r2, ws := twoRegistries()
	for i := range 500 {
		r := []*registry{r1, r2}[i%2]
		go r.deliver("ch", "")
		if err := result(t, waitAsync(ws, ctx, time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	ws.leave(false)
}

func TestRegistrySweep(t *testing.T) {
	r := newRegistry(nil)
	busy := joinReg(t, r, "busy", "")
	joinReg(t, r, "idle", "").leave(false)
	joinReg(t, r, "gone", "").leave(false)
	if r.idleSince().IsZero() {
		t.Fatal("no idle mark after a channel's last waiter left")
	}
	var asked []string
	wanted := r.sweep(func(name string, idleSince time.Time) bool {
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
	if _, ok := r.channels["idle"]; !ok || r.idleSince().IsZero() {
		t.Fatal("a kept idle channel was forgotten, or left no idle mark")
	}
	r.sweep(func(string, time.Time) bool { return true })
	if !r.idleSince().IsZero() || !r.hasWaiters("busy") {
		t.Fatal("after dropping every idle channel: an idle mark is left, or busy lost its waiter")
	}
	busy.leave(false)
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
	r := newRegistry(func(name string) { unheard = append(unheard, name) })
	told := func(want ...string) {
		t.Helper()
		if !slices.Equal(unheard, want) {
			t.Fatalf("unheard told %q, want %q", unheard, want)
		}
		unheard = nil
	}

	r.deliver("gone", "")
	told("gone")

	fair := newWaitSet()
	r.add(fair, "mixed", "f", false)
	r.confirm("mixed")
	plain := newWaitSet()
	r.add(plain, "mixed", "p", true)
	r.deliver("mixed", "")
	told()
	if !fired(plain) || fired(fair) {
		t.Fatal("a wake-up did not go to the plain waiter alone")
	}
	plain.leave(true) // it did not use its wake-up: passed on, to nobody here
	told("mixed")
	if !fired(fair) {
		t.Fatal("a wake-up that no plain waiter took did not wake the fair waiter")
	}

	r.lapse("mixed")
	r.confirm("mixed") // a reconnect: plain waiters had waited here
	told("mixed")
	fair.leave(false)
	r.lapse("mixed") // no waiter left: not subscribed anew, so told now
	told("mixed")

	only := newWaitSet()
	r.add(only, "fair", "f", false)
	r.confirm("fair")
	r.lapse("fair")
	r.confirm("fair")
	told()
	only.leave(true) // with the reconnect's signal, unused: a hint, not a barging wake-up
	told()
	r.lapse("fair")
	told()
}
