package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The floor is what the cheapest round trips to the Redis under test take,
// measured in the same run as the libraries, so that every latency has its
// physical floor beside it: a PING, an EVALSHA of a script that does
// nothing (what any lock's one script call costs at least), and a PUBLISH
// until the message reaches a subscriber (what any wake-up by pub/sub,
// and so any hand-off, costs at least). Each is a result of scenario
// floorScenario, the round trips in op, with the Redis CPU time each took
// in cpu (the kernel's part in sys): what an isolated request, script call
// and delivery cost the server, against which a library's Redis CPU per
// acquisition is weighed (under load Redis serves several clients per
// wake-up, and a request can cost it less).
const (
	floorScenario = "floor"
	floorPing     = "PING"
	floorEvalsha  = "EVALSHA"
	floorPublish  = "PUBLISH→deliver"
)

// floorSamples is how many round trips each floor figure is measured
// over, after floorWarmup that are not.
const (
	floorSamples = 2000
	floorWarmup  = 100
)

// measureFloor measures the floor of the Redis srv with a go-redis
// client with default options, as the libraries' own: the round trips go
// one after another, nothing else running. channel names the PUBLISH's
// channel.
func measureFloor(ctx context.Context, srv *server, channel string) (_ []result, err error) {
	rdb := redis.NewClient(&redis.Options{Addr: srv.addr})
	defer func() { err = errors.Join(err, rdb.Close()) }()
	noop := redis.NewScript("return 1")
	if err := noop.Load(ctx, rdb).Err(); err != nil {
		return nil, err
	}
	delivery, stop, err := subscribeFloor(ctx, rdb, channel)
	if err != nil {
		return nil, err
	}
	defer stop()
	figures := []struct {
		name string
		trip func() (time.Duration, error)
	}{
		{floorPing, timed(func() error { return rdb.Ping(ctx).Err() })},
		{floorEvalsha, timed(func() error { return noop.EvalSha(ctx, rdb, nil).Err() })},
		{floorPublish, delivery},
	}
	var floor []result
	for _, f := range figures {
		before, err := srv.snapshot(ctx)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		d, err := roundTrips(f.trip)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
		took := time.Since(t0).Seconds()
		after, err := srv.snapshot(ctx)
		if err != nil {
			return nil, err
		}
		used, n := after.since(before, 0), float64(floorWarmup+floorSamples)
		floor = append(floor, result{scenario: floorScenario, library: f.name, seconds: took,
			acquisitions: d.total, rate: float64(d.total) / took, op: d, cpu: used.cpu * 1e6 / n, sys: used.sys * 1e6 / n,
			conns: -1, rounds: 1})
	}
	return floor, nil
}

// roundTrips makes floorSamples round trips with trip, one after another,
// and returns how long they took. trip makes one and says how long it took.
func roundTrips(trip func() (time.Duration, error)) (distribution, error) {
	var h histogram
	for i := range floorWarmup + floorSamples {
		d, err := trip()
		if err != nil {
			return distribution{}, err
		}
		if i >= floorWarmup {
			h.record(d)
		}
	}
	return h.snapshot(), nil
}

// timed returns a trip that calls call and times it.
func timed(call func() error) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		t0 := time.Now()
		err := call()
		return time.Since(t0), err
	}
}

// subscribeFloor subscribes to channel on a connection of its own, as a
// library's subscriber, and returns a trip that publishes on rdb and
// times the message from the moment its PUBLISH is sent to the moment the
// subscriber's goroutine has read it. stop unsubscribes and waits for the
// goroutine.
func subscribeFloor(ctx context.Context, rdb *redis.Client, channel string) (trip func() (time.Duration, error), stop func(), err error) {
	ps := rdb.Subscribe(ctx, channel)
	if _, err := ps.Receive(ctx); err != nil { // the confirmation
		return nil, nil, errors.Join(err, ps.Close())
	}
	arrived := make(chan time.Time)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(arrived)
		for {
			if _, err := ps.ReceiveMessage(ctx); err != nil {
				return // closed
			}
			arrived <- time.Now()
		}
	})
	trip = func() (time.Duration, error) {
		t0 := time.Now()
		if err := rdb.Publish(ctx, channel, "").Err(); err != nil {
			return 0, err
		}
		t1, ok := <-arrived
		if !ok {
			return 0, errors.New("the subscriber stopped")
		}
		return t1.Sub(t0), nil
	}
	stop = func() {
		_ = ps.Close()
		for range arrived { // a message still on its way
		}
		wg.Wait()
	}
	return trip, stop, nil
}
