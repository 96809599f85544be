package waiters

import "testing"

// Wake has one waiter of a channel look again, preferring a plain one,
// and passes nothing on to another process; WakeAll does so on every
// channel.
func TestWake(t *testing.T) {
	var passed []string
	r := New(func(name string) { passed = append(passed, name) }, nil)
	fair, plain, other := NewSet(), NewSet(), NewSet()
	r.Add(fair, "ch", "fair-ticket", false)
	r.Add(plain, "ch", "plain-ticket", true)
	r.Add(other, "ch2", "other-ticket", false)
	r.Wake("ch")
	if !woken(plain) || woken(fair) {
		t.Fatal("Wake did not wake the plain waiter first")
	}
	r.Wake("nothing") // no such channel: nothing happens
	r.WakeAll()
	if !woken(fair) || !woken(other) {
		t.Fatal("WakeAll did not wake a waiter of every channel")
	}
	if len(passed) != 0 {
		t.Fatalf("wake-ups passed on to other processes: %v", passed)
	}
}

// woken reports whether s's call was woken.
func woken(s *Set) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rung
}
