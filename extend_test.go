package redisync

import (
	"testing"
	"time"
)

// entry returns the watchdog entry of m's hold and a copy of its schedule,
// read under the watchdog's lock.
func entry(t *testing.T, m *Mutex) (e *keepalive, deadline, confirmed time.Time) {
	t.Helper()
	m.mu.Lock()
	h := m.cur
	m.mu.Unlock()
	if h == nil {
		t.Fatal("m holds nothing")
	}
	w := m.c.wd
	w.mu.Lock()
	defer w.mu.Unlock()
	return h.ka, h.ka.deadline, h.ka.confirmed
}

// renewed waits until the watchdog has renewed m's hold twice after since.
func renewed(t *testing.T, m *Mutex, since time.Time) {
	t.Helper()
	var seen time.Time
	n := 0
	eventually(t, 5*time.Second, "two renewals of the hold", func() bool {
		_, _, confirmed := entry(t, m)
		if confirmed.After(since) && confirmed.After(seen) {
			seen = confirmed
			n++
		}
		return n >= 2
	})
}

// A renewal never shortens a lease that is longer than the watchdog's (as
// one set by Extend): the local deadline counts from the send time of the
// calls that set the lease, so a renewal that ran after a longer lease was
// set, and cut it, would leave the key to expire before the deadline.
func TestWatchdogRenewalNeverShortensALease(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb, WithWatchdogLease(60*time.Millisecond))
	m := c.NewMutex("long")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	key := "redisync:lock:{long}"
	mr.SetTTL(key, time.Minute)
	now := time.Now()
	renewed(t, m, now)
	if ttl := mr.TTL(key); ttl != time.Minute {
		t.Fatalf("the lease is %v after renewals, want the longer 1m kept", ttl)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
