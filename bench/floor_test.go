package main

import (
	"context"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/redistest"
)

func TestMeasureFloor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := connectServer(ctx, redistest.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close(ctx, "")
	floor, err := measureFloor(ctx, srv, redistest.Name(t))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range floor {
		names = append(names, r.library)
		if r.scenario != floorScenario || r.op.total != floorSamples || r.op.quantile(0.5) <= 0 {
			t.Errorf("%s: scenario %q, %d samples, p50 %v; want %q, %d, > 0",
				r.library, r.scenario, r.op.total, r.op.quantile(0.5), floorScenario, floorSamples)
		}
		// A round trip costs the server a read and a write: more than a
		// microsecond and less than the round trip itself.
		if r.cpu < 1 || r.cpu > float64(r.op.quantile(0.5).Microseconds()) {
			t.Errorf("%s: Redis CPU %.1f µs per round trip, want between 1 µs and its p50 %v", r.library, r.cpu, r.op.quantile(0.5))
		}
	}
	if len(names) != 3 || names[0] != floorPing || names[1] != floorEvalsha || names[2] != floorPublish {
		t.Errorf("floor figures %v, want %s, %s, %s", names, floorPing, floorEvalsha, floorPublish)
	}
}

func TestLeftovers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv, err := connectServer(ctx, redistest.Addr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close(ctx, "")
	rdb := redistest.Client(t)
	name := redistest.Name(t)
	kept, leased := "lib:{"+name+"}", name+":7"
	other := name + "-other" // another run's lock
	for _, k := range []string{kept, leased, other} {
		if err := rdb.Set(ctx, k, "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { rdb.Del(context.Background(), kept, leased, other) })
	if err := rdb.PExpire(ctx, leased, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	withTTL, persistent, err := single(srv).leftovers(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if withTTL != 1 || len(persistent) != 1 || persistent[0] != kept {
		t.Errorf("leftovers: %d with a TTL, %v without; want 1 and [%s]", withTTL, persistent, kept)
	}
}
