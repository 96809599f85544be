package watchdog

import (
	"testing"
	"time"
)

// RanBefore takes only heartbeats that ran strictly before the grant.
func TestRanBeforeSkipsHeartbeatsAfterTheGrant(t *testing.T) {
	w := &Watchdog{}
	t0 := time.Now()
	e := &Entry{ran: [4]stamp{{}, {sent: t0, ms: 100}, {sent: t0.Add(time.Second), ms: 200}, {sent: t0.Add(2 * time.Second), ms: 300}}}
	if got := w.RanBefore(e, 200); !got.Equal(t0) {
		t.Fatalf("RanBefore(200) = %v, want the heartbeat that ran at 100 (sent %v)", got, t0)
	}
	if got := w.RanBefore(e, 100); !got.IsZero() {
		t.Fatalf("RanBefore(100) = %v, want none", got)
	}
}
