package roundtrip

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/redistest"
)

var script = redis.NewScript("return 1")

func run(ctx context.Context, s redis.UniversalClient) ([]int64, error) {
	n, err := script.Run(ctx, s, []string{"k"}).Int64()
	return []int64{n}, err
}

// silentServer accepts connections and reads them, and never answers: a
// stalled server, or a connection whose replies are lost.
func silentServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	return ln.Addr().String()
}

// A round trip on a lane runs in the caller's goroutine and answers as
// the server does; the lane is kept for the next.
func TestLaneRoundTrip(t *testing.T) {
	mr := miniredis.RunT(t)
	ls := NewLanes(&redis.Options{Addr: mr.Addr(), PoolSize: 4}, nil)
	defer ls.Close()
	for range 3 {
		res, cut, err := ls.Do(context.Background(), false, nil, run)
		if err != nil || cut || res[0] != 1 {
			t.Fatalf("%v, %v, %v", res, cut, err)
		}
	}
	ls.spares.Wait()
	if n := ls.idleLanes(); n != 2 {
		t.Fatalf("%d idle lanes after three round trips one after another, want 2: the one they used and one in reserve", n)
	}
}

// A round trip on a server that never answers returns CleanupWait after
// its context ends, whatever the client's read timeout, on a connection
// dialled for it or on one dialled before.
func TestLaneCutShortWhenTheContextEnds(t *testing.T) {
	addr := silentServer(t)
	ls := NewLanes(&redis.Options{Addr: addr, ReadTimeout: time.Minute, WriteTimeout: time.Minute, PoolSize: 4}, nil)
	defer ls.Close()
	for i := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		start := time.Now()
		_, cut, err := ls.Do(ctx, true, nil, run)
		took := time.Since(start)
		cancel()
		if err == nil || !cut {
			t.Fatalf("round trip %d on a silent server: cut %v, %v", i+1, cut, err)
		}
		if took > 50*time.Millisecond+CleanupWait+200*time.Millisecond {
			t.Fatalf("round trip %d returned %v after it began, its context ending after 50 ms", i+1, took)
		}
	}
}

// A dial that hangs is cut short too.
func TestLaneDialCutShort(t *testing.T) {
	ls := NewLanes(&redis.Options{Addr: "192.0.2.1:6379", DialTimeout: time.Minute, Dialer: func(ctx context.Context, _, _ string) (net.Conn, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}, PoolSize: 4}, nil)
	defer ls.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := ls.Do(ctx, false, nil, run)
	if !errors.Is(err, context.Canceled) && err == nil {
		t.Fatalf("a dial that never ends: %v", err)
	}
	if took := time.Since(start); took > 50*time.Millisecond+CleanupWait+200*time.Millisecond {
		t.Fatalf("returned %v after it began", took)
	}
}

// A round trip is cut short at once when stop ends, without the grace that
// the end of its context gives.
func TestLaneCutShortWhenStopEnds(t *testing.T) {
	addr := silentServer(t)
	ls := NewLanes(&redis.Options{Addr: addr, ReadTimeout: time.Minute, PoolSize: 4}, nil)
	defer ls.Close()
	stop, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, cut, err := ls.Do(context.Background(), true, stop, run)
	if err == nil || !cut {
		t.Fatalf("cut %v, %v", cut, err)
	}
	if took := time.Since(start); took > 50*time.Millisecond+200*time.Millisecond {
		t.Fatalf("returned %v after it began, stop ending after 50 ms", took)
	}
}

// No more lanes are in use at once than the user's pool holds: a round
// trip that finds none free waits for one, and gives up, unsent, when its
// context ends first.
func TestLanesAtMostThePoolSize(t *testing.T) {
	mr := miniredis.RunT(t)
	ls := NewLanes(&redis.Options{Addr: mr.Addr(), PoolSize: 1}, nil)
	defer ls.Close()
	inside, leave := make(chan struct{}), make(chan struct{})
	go func() {
		_, _, _ = ls.Do(context.Background(), false, nil, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
			close(inside)
			<-leave
			return run(ctx, rdb)
		})
	}()
	<-inside
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	var ran atomic.Bool
	_, cut, err := ls.Do(ctx, false, nil, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		ran.Store(true)
		return run(ctx, rdb)
	})
	close(leave)
	if ran.Load() || !cut || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second round trip with one lane in use: ran %v, cut %v, %v", ran.Load(), cut, err)
	}
	if _, cut, err := ls.Do(context.Background(), false, nil, run); err != nil || cut {
		t.Fatalf("once the lane is free: cut %v, %v", cut, err)
	}
}

// A lane whose round trip failed is not used again: the next round trip
// succeeds once the server is back.
func TestLaneDroppedAfterAFailure(t *testing.T) {
	mr := miniredis.RunT(t)
	ls := NewLanes(&redis.Options{Addr: mr.Addr(), PoolSize: 4}, nil)
	defer ls.Close()
	if _, _, err := ls.Do(context.Background(), false, nil, run); err != nil {
		t.Fatal(err)
	}
	mr.Close()
	if _, _, err := ls.Do(context.Background(), false, nil, run); err == nil {
		t.Fatal("a round trip to a closed server succeeded")
	}
	if err := mr.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ls.Do(context.Background(), false, nil, run); err != nil {
		t.Fatalf("after the server came back: %v", err)
	}
}

// A round trip cut short costs its lane; a lane kept in reserve, connected
// in the background, stands in for it: the next round trip does not dial.
func TestLaneSpareAfterACut(t *testing.T) {
	mr := miniredis.RunT(t)
	var dials atomic.Int32
	ls := NewLanes(&redis.Options{Addr: mr.Addr(), PoolSize: 4, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}, nil)
	defer ls.Close()
	ctx, cancel := context.WithCancel(context.Background())
	_, cut, err := ls.Do(ctx, false, nil, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		if _, err := run(ctx, rdb); err != nil {
			return nil, err
		}
		cancel()
		<-ctx.Done()
		return nil, ctx.Err()
	})
	if !cut || err == nil {
		t.Fatalf("cut %v, %v", cut, err)
	}
	ls.spares.Wait()
	if ls.idleLanes() == 0 {
		t.Fatal("no lane in reserve after a round trip cut short")
	}
	before := dials.Load()
	if _, _, err := ls.Do(context.Background(), false, nil, run); err != nil {
		t.Fatal(err)
	}
	ls.spares.Wait()
	if n := dials.Load() - before; n != 1 {
		t.Fatalf("%d dials since the round trip after a cut began, want 1: none for it (it took the lane in reserve), one for the next lane in reserve", n)
	}
}

// failFirst is a hook that fails the first EVALSHA with its error.
type failFirst struct {
	err    error
	failed atomic.Bool
}

func (h *failFirst) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failFirst) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" && h.failed.CompareAndSwap(false, true) {
			cmd.SetErr(h.err)
			return h.err
		}
		return next(ctx, cmd)
	}
}
func (h *failFirst) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// setup runs on each lane's client, and the hooks it adds see the lane's
// commands; a reply saying the server is no longer a primary (READONLY)
// drops the connection, so that the next command of the round trip (a
// retry by Persist) dials the server that is primary now.
func TestLaneSetupAndReadOnly(t *testing.T) {
	mr := miniredis.RunT(t)
	var dials atomic.Int32
	hook := &failFirst{err: errors.New("READONLY You can't write against a read only replica.")}
	ls := NewLanes(&redis.Options{Addr: mr.Addr(), PoolSize: 4, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}, func(c *redis.Client) error { c.AddHook(hook); return nil })
	defer ls.Close()
	res, _, err := ls.Do(context.Background(), false, nil, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		if err := rdb.Ping(ctx).Err(); err != nil { // dials
			return nil, err
		}
		if _, err := run(ctx, rdb); err == nil || !strings.HasPrefix(err.Error(), "READONLY") {
			return nil, fmt.Errorf("the hook's READONLY: %v", err)
		}
		return run(ctx, rdb)
	})
	if err != nil || res[0] != 1 {
		t.Fatalf("%v, %v", res, err)
	}
	if !hook.failed.Load() {
		t.Fatal("the setup's hook saw nothing")
	}
	ls.spares.Wait()
	if n := dials.Load(); n != 3 {
		t.Fatalf("%d dials, want 3: the lane's, its own again after READONLY, and one in reserve", n)
	}
	wantErr := errors.New("no")
	ls2 := NewLanes(&redis.Options{Addr: mr.Addr(), PoolSize: 4}, func(*redis.Client) error { return wantErr })
	defer ls2.Close()
	if _, cut, err := ls2.Do(context.Background(), false, nil, run); !errors.Is(err, wantErr) || cut {
		t.Fatalf("a setup that fails: cut %v, %v", cut, err)
	}
}

// A round trip that a replica refuses (READONLY: a failover demoted the
// server the lane was dialled to) is sent once more on a new lane.
func TestLaneReadOnlyRetriedOnANewLane(t *testing.T) {
	mr := miniredis.RunT(t)
	hook := &failFirst{err: errors.New("READONLY You can't write against a read only replica.")}
	var made atomic.Int32
	ls := NewLanes(&redis.Options{Addr: mr.Addr(), PoolSize: 4}, func(c *redis.Client) error {
		made.Add(1)
		c.AddHook(hook)
		return nil
	})
	defer ls.Close()
	res, cut, err := ls.Do(context.Background(), false, nil, run)
	if err != nil || cut || res[0] != 1 {
		t.Fatalf("%v, %v, %v", res, cut, err)
	}
	if !hook.failed.Load() || made.Load() < 2 {
		t.Fatalf("READONLY given: %v; lanes made: %d, want 2 or more", hook.failed.Load(), made.Load())
	}
}

// A TLS dial that hangs (go-redis dials TLS without heeding the context)
// is given up on too: the caller returns, the dial runs out by its
// DialTimeout, and nothing dials again once the lanes are closed.
func TestLaneTLSDialCutShort(t *testing.T) {
	addr := silentServer(t)
	ls := NewLanes(&redis.Options{Addr: addr, TLSConfig: &tls.Config{InsecureSkipVerify: true}, DialTimeout: time.Second, PoolSize: 4}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, _, err := ls.Do(ctx, true, nil, run); err == nil {
		t.Fatal("a round trip to a server that never answers succeeded")
	}
	if took := time.Since(start); took > 50*time.Millisecond+CleanupWait+200*time.Millisecond {
		t.Fatalf("returned %v after it began, its context ending after 50 ms", took)
	}
	ls.Close()
	deadline := time.Now().Add(3 * time.Second)
	for dialling() {
		if time.Now().After(deadline) {
			t.Fatal("still dialling 3 s after Close, the DialTimeout being 1 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// dialling reports whether a goroutine dials for a lane.
func dialling() bool {
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	return strings.Contains(stacks, "(*lane).dial") || strings.Contains(stacks, "tls.DialWithDialer")
}

// A round trip whose connection is dropped under it (its reply lost) is
// sent once more on a new lane when the user's client retries, as
// go-redis would; not when it does not.
func TestLaneDroppedConnectionRetried(t *testing.T) {
	mr := miniredis.RunT(t)
	px := redistest.NewProxy(t, mr.Addr())
	for _, retries := range []int{3, -1} {
		ls := NewLanes(&redis.Options{Addr: px.Addr, PoolSize: 4, MaxRetries: retries}, nil)
		if _, _, err := ls.Do(context.Background(), false, nil, run); err != nil {
			t.Fatal(err)
		}
		ls.spares.Wait() // its reply is not the one dropped
		px.DropReplies(1)
		res, cut, err := ls.Do(context.Background(), false, nil, run)
		ls.Close()
		px.ResetAll()
		switch {
		case retries > 0 && (err != nil || cut || res[0] != 1):
			t.Fatalf("MaxRetries %d, a reply lost: %v, %v, %v; want it sent again", retries, res, cut, err)
		case retries < 0 && err == nil:
			t.Fatalf("MaxRetries %d, a reply lost: sent again", retries)
		}
	}
}

// idleLanes returns how many lanes are idle.
func (ls *Lanes) idleLanes() int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return len(ls.idle)
}
