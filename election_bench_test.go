package redisync

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// BenchmarkElectionCampaignResign measures an uncontended Campaign
// followed by Resign, beside a Mutex's Lock and Unlock (see
// BenchmarkMutexLockUnlock): the same two script calls, and the calls
// that announce each change to observers (read and set the revision,
// publish).
func BenchmarkElectionCampaignResign(b *testing.B) {
	rdb, cnt := benchRedis(b)
	c := benchClient(b, rdb)
	e := must(c.NewElection(benchKey(b)))
	ctx := context.Background()
	run := func() {
		if err := e.Campaign(ctx, "value"); err != nil {
			b.Fatal(err)
		}
		if err := e.Resign(ctx); err != nil {
			b.Fatal(err)
		}
	}
	run()
	benchLoop(b, rdb, cnt, run)
}

// BenchmarkElectionObserve measures how long a change takes to reach an
// observer of another Client: from the call of Proclaim to the change
// arriving on the observer's channel.
func BenchmarkElectionObserve(b *testing.B) {
	rdb, _ := benchRedis(b)
	name := benchKey(b)
	leader := must(benchClient(b, rdb).NewElection(name))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	obs := observeChan(ctx, must(benchClient(b, rdb).NewElection(name)))
	<-obs
	if err := leader.Campaign(ctx, "0"); err != nil {
		b.Fatal(err)
	}
	<-obs
	var total time.Duration
	n := 0
	for b.Loop() {
		n++
		start := time.Now()
		if err := leader.Proclaim(ctx, strconv.Itoa(n)); err != nil {
			b.Fatal(err)
		}
		if l := <-obs; l.Value != strconv.Itoa(n) || l.Gap {
			b.Fatalf("observed %+v, want %d", l, n)
		}
		total += time.Since(start)
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(n), "ns/change")
	if err := leader.Resign(ctx); err != nil {
		b.Fatal(err)
	}
}
