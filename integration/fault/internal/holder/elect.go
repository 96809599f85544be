package main

// The election loop:
//
//	holder elect -addr A -name N -register R [-watchdog L] [-heartbeat H]
//
// prints "ready", then campaigns in the election N again and again until
// its stdin ends (or says "stop"): it leads for 0-200 ms, writing to the
// fenced register R (internal/fence) with its token when its term starts
// and when it ends, then resigns. A write the register rejects while the
// leader still believes it leads (its Lost has not closed within 100 ms
// of the rejection: the time the watchdog needs to run after a SIGCONT)
// proves that another leader led meanwhile: it prints "violation TOKEN".
// Every term prints "term TOKEN", every loss "lost TOKEN"; on the end,
// "done N" with the number of terms.

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/integration/fault/internal/fence"
)

// electLoop runs the election loop on c.
func electLoop(c *redisync.Client, rdb *redis.Client) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	emit("ready")
	go func() {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() && in.Text() != "stop" {
		}
		cancel()
	}()
	e, err := c.NewElection(*name)
	if err != nil {
		return err
	}
	me := fmt.Sprintf("pid %d", os.Getpid())
	terms := 0
	for ctx.Err() == nil {
		if err := e.Campaign(ctx, me); err != nil {
			if ctx.Err() != nil {
				break
			}
			return err
		}
		token, lost := e.Token(), e.Lost()
		terms++
		emit("term %d", token)
		if err := fenced(ctx, rdb, token, lost); err != nil {
			return err
		}
		t := time.NewTimer(time.Duration(rand.IntN(200)) * time.Millisecond)
		select {
		case <-t.C:
			if err := fenced(ctx, rdb, token, lost); err != nil {
				return err
			}
		case <-lost:
			emit("lost %d", token)
		}
		t.Stop()
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = e.Resign(rctx) // lost, or resigned: either way, campaign again
		rcancel()
	}
	emit("done %d", terms)
	return nil
}

// fenced writes to the register with token, unless lost is closed, and
// reports a rejection while the leader still believes it leads.
func fenced(ctx context.Context, rdb *redis.Client, token int64, lost <-chan struct{}) error {
	select {
	case <-lost:
		return nil
	default:
	}
	ok, err := fence.Write(context.WithoutCancel(ctx), rdb, *register, token, "elect", "elect")
	if err != nil || ok {
		return err
	}
	t := time.NewTimer(100 * time.Millisecond)
	defer t.Stop()
	select {
	case <-lost:
		emit("lost %d", token)
	case <-t.C:
		emit("violation %d", token)
	}
	return nil
}
