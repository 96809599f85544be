package fault

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// TestLostBeforeOthersAcquire cuts the holder's connection to Redis while
// another Client waits for the lock: blackhole (everything swallowed, no
// reset) or 2 s of latency each way (renewals arrive, but too late). The
// holder's watchdog lease is 1.5 s. At the moment the other Client's Lock
// returns, the holder's Lost channel must already be closed; the test also
// records both times and reports the margin. It would fail if the watchdog
// reported the loss by the lease as seen by Redis rather than by the local
// deadline (send time + lease - drift), or if a renewal that timed out were
// counted as a success.
func TestLostBeforeOthersAcquire(t *testing.T) {
	const lease = 1500 * time.Millisecond
	blackhole := func(p *redistest.Proxy) { p.SetBlackhole(true) }
	latency := func(p *redistest.Proxy) { p.SetLatency(2 * time.Second) }
	for _, tc := range []struct {
		name       string
		fault      func(*redistest.Proxy)
		ctxTimeout bool // go-redis Options.ContextTimeoutEnabled on the holder
	}{
		{"blackhole", blackhole, false},
		{"latency", latency, false},
		{"blackhole-ctx-timeouts", blackhole, true},
		{"latency-ctx-timeouts", latency, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := redistest.Addr(t)
			rdb := redistest.NewClient(t, addr)
			px := redistest.NewProxy(t, addr)
			name := redistest.Name(t)
			hrdb := redis.NewClient(&redis.Options{Addr: px.Addr, ContextTimeoutEnabled: tc.ctxTimeout})
			t.Cleanup(func() { _ = hrdb.Close() })
			hc, err := redisync.New(hrdb, redisync.WithCrashTimeout(lease))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = hc.Close() })
			holder := must(hc.NewMutex(name))
			if err := holder.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			lost := holder.Lost()
			lostAt := make(chan time.Time, 1)
			go func() { <-lost; lostAt <- time.Now() }()

			other := must(newClient(t, addr).NewMutex(name))
			done := lockAsync(other, ctx)
			eventually(t, 5*time.Second, "the other Client to wait", func() bool { return subscribers(t, rdb, name) == 1 })
			// Let the holder renew a couple of times first (a deliberate
			// pause of one lease).
			time.Sleep(lease)
			faulted := time.Now()
			tc.fault(px)

			r := await(t, done, lease+10*time.Second, "the other Client")
			lostFirst := false
			select {
			case <-lost:
				lostFirst = true
			default:
			}
			la := <-lostAt
			if !lostFirst {
				t.Fatalf("another Client holds the lock while the holder's Lost is still open: fault to other's acquire %v, fault to Lost %v",
					r.at.Sub(faulted).Round(time.Millisecond), la.Sub(faulted).Round(time.Millisecond))
			}
			t.Logf("fault to Lost %v, fault to other's acquire %v: Lost first by %v",
				la.Sub(faulted).Round(time.Millisecond), r.at.Sub(faulted).Round(time.Millisecond), r.at.Sub(la).Round(time.Millisecond))
			if !la.Before(r.at) {
				t.Fatalf("Lost at %v, other acquired at %v", la, r.at)
			}
			if err := other.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			// The holder's Unlock reports the loss; its clean-up call
			// cannot get through the fault: keep it short.
			uctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			_ = holder.Unlock(uctx)
		})
	}
}
