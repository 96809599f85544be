package redisync

import (
	"context"
	"errors"
	"testing"
)

// Election.Do leads while fn runs, with the leadership's context, and
// resigns when fn returns: the next candidate can lead then.
func TestElectionDoResignsOnReturn(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	a, b := must(c.NewElection("do")), must(c.NewElection("do"))
	boom := errors.New("boom")
	err := a.Do(ctx, "a1", func(hctx context.Context) error {
		l, err := b.Leader(ctx)
		if err != nil || l.Value != "a1" || l.Token != a.Token() {
			t.Errorf("Leader inside Do: %+v, %v, want a1 with a's token", l, err)
		}
		if ok, err := b.TryCampaign(ctx, "b1"); ok || err != nil {
			t.Errorf("another candidate's TryCampaign inside Do: %v, %v, want false", ok, err)
		}
		if hctx.Err() != nil {
			t.Error("Do's context ended while leading")
		}
		// A Do inside the Do changes the value and does not resign.
		if err := a.Do(hctx, "a2", func(context.Context) error { return nil }); err != nil {
			t.Errorf("a nested Do: %v", err)
		}
		if l, err := b.Leader(ctx); err != nil || l.Value != "a2" {
			t.Errorf("Leader after a nested Do: %+v, %v, want a2", l, err)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Do: %v, want fn's error", err)
	}
	if a.Token() != 0 {
		t.Fatal("a still leads after Do")
	}
	if ok, err := b.TryCampaign(ctx, "b1"); !ok || err != nil {
		t.Fatalf("TryCampaign after Do: %v, %v, want true", ok, err)
	}
	_ = b.Resign(ctx)
}

// Election.Do resigns when fn panics, and the panic goes on.
func TestElectionDoResignsOnPanic(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	a, b := must(c.NewElection("dopanic")), must(c.NewElection("dopanic"))
	var hctx context.Context
	func() {
		defer func() {
			if r := recover(); r != "fn panicked" {
				t.Errorf("recovered %v, want fn's panic", r)
			}
		}()
		_ = a.Do(ctx, "a1", func(c context.Context) error {
			hctx = c
			panic("fn panicked")
		})
	}()
	if a.Token() != 0 || hctx == nil || hctx.Err() == nil {
		t.Fatalf("after a panic in Do: a's token %d, fn's context ended %v, want 0, true", a.Token(), hctx != nil && hctx.Err() != nil)
	}
	if ok, err := b.TryCampaign(ctx, "b1"); !ok || err != nil {
		t.Fatalf("TryCampaign after Do panicked: %v, %v, want true", ok, err)
	}
	_ = b.Resign(ctx)
}
