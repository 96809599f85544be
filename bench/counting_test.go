package main

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestGoRedisCounterSkipsHandshake(t *testing.T) {
	var counts clientCounts
	h := goRedisCounter{&counts}
	ctx := context.Background()
	nop := func(context.Context, redis.Cmder) error { return nil }
	nopPipe := func(context.Context, []redis.Cmder) error { return nil }

	_ = h.ProcessHook(nop)(ctx, redis.NewCmd(ctx, "evalsha", "abc", 1, "k"))
	_ = h.ProcessPipelineHook(nopPipe)(ctx, []redis.Cmder{
		redis.NewCmd(ctx, "hello", 3),
		redis.NewCmd(ctx, "client", "setinfo", "LIB-NAME", "go-redis"),
	})
	_ = h.ProcessPipelineHook(nopPipe)(ctx, []redis.Cmder{
		redis.NewCmd(ctx, "set", "k", "v"),
		redis.NewCmd(ctx, "pexpire", "k", 10),
	})
	if r, c := counts.requests.Load(), counts.commands.Load(); r != 2 || c != 3 {
		t.Errorf("counted %d requests of %d commands, want 2 of 3 (the handshake left out)", r, c)
	}
}

func TestBackgroundRequests(t *testing.T) {
	bare := context.Background()
	ctx, call := marked(bare)
	call.active.Store(true)
	inside := context.WithoutCancel(ctx) // as a library detaches a call's context
	if goRedisBackground(inside) || rueidisBackground(inside) {
		t.Error("a request of a call in progress counted in the background")
	}
	call.active.Store(false)
	if !goRedisBackground(inside) || !rueidisBackground(inside) {
		t.Error("a request made with a call's context after it returned not counted in the background")
	}
	if !goRedisBackground(bare) {
		t.Error("a go-redis request without a call's context (a watchdog's) not counted in the background")
	}
	if rueidisBackground(bare) {
		t.Error("a rueidislock request without a call's context (its release) counted in the background")
	}
}
