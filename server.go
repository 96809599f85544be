package redisync

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/redisync/redisync/internal/redisinfo"
)

// Server describes one Redis server that a Client uses: the first thing
// to say in a bug report.
type Server struct {
	// Addr is the node's address on a Redis Cluster, "" otherwise.
	Addr string
	// Name is "redis" or "valkey".
	Name string
	// Version is the server's own version, such as "7.0.15" or "8.1.1"
	// (Valkey's own, not the Redis version it reports for compatibility).
	Version string
	// Mode is "standalone" or "cluster".
	Mode string
	// Role is "primary" or "replica".
	Role string
}

// String returns the server as "valkey 8.1.1 (cluster primary)", after
// its address when it has one.
func (s Server) String() string {
	i := redisinfo.Server{Name: s.Name, Version: s.Version, Mode: s.Mode, Role: s.Role}
	if s.Addr == "" {
		return i.String()
	}
	return s.Addr + ": " + i.String()
}

// Servers describes the servers the Client uses: the one server (on a
// group watched by Sentinel, its primary now), or every primary of a
// Redis Cluster. It reads INFO, which an ACL user must be allowed
// (docs/acl.md), and returns the errors of Redis.
func (c *Client) Servers(ctx context.Context) ([]Server, error) {
	if err := cmp.Or(ctx.Err(), c.usable()); err != nil {
		return nil, wrapOp("servers", "", err)
	}
	var mu sync.Mutex
	var servers []Server
	_, _, err := c.rt.Run(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		if c.cluster == nil {
			s, err := describe(ctx, rdb)
			servers = []Server{s}
			return nil, err
		}
		return nil, c.cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			s, err := describe(ctx, node)
			s.Addr = node.Options().Addr
			mu.Lock()
			servers = append(servers, s)
			mu.Unlock()
			return err
		})
	}, nil)
	if err != nil {
		return nil, wrapOp("servers", "", redisError(err))
	}
	slices.SortFunc(servers, func(a, b Server) int { return strings.Compare(a.Addr, b.Addr) })
	return servers, nil
}

// describe reads what INFO says of the server rdb talks to.
func describe(ctx context.Context, rdb redis.UniversalClient) (Server, error) {
	// One section at a time: INFO takes several only since Redis 7.
	server, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return Server{}, err
	}
	repl, err := rdb.Info(ctx, "replication").Result()
	if err != nil {
		return Server{}, err
	}
	i := redisinfo.Parse(server + "\n" + repl)
	return Server{Name: i.Name, Version: i.Version, Mode: i.Mode, Role: i.Role}, nil
}

// probe records that the server was found to have what a Client needs
// beyond Lua scripts.
type probe struct{ ok atomic.Bool }

// ready checks, until a check succeeds, that the server has what the
// Client uses beyond Lua scripts (whose absence any script call reports:
// see unsupported): on a Redis Cluster, sharded pub/sub (SPUBLISH, Redis
// 7), unless WithPlainPubSub. Scripts publish after they wrote, so a
// missing command must be found before a script meets it, not by one
// that fails part way. The check publishes an empty message on channel,
// the caller's grant channel, which the scripts publish on and an ACL
// must allow: nobody hears it before the Client's first wait, and then an
// empty message is only a hint to look again. It returns
// ErrUnsupportedServer, saying what to do, or the error that kept it
// from checking.
func (c *Client) ready(ctx context.Context, channel string) error {
	if c.publish != "SPUBLISH" || c.probe.ok.Load() {
		return nil
	}
	_, _, err := c.rt.Run(ctx, func(ctx context.Context, rdb redis.UniversalClient) ([]int64, error) {
		return nil, rdb.Do(ctx, "SPUBLISH", channel, "").Err()
	}, nil)
	switch {
	case isUnknownCommand(err):
		return fmt.Errorf("%w: the cluster has no sharded pub/sub (SPUBLISH: Redis 7 or later); "+
			"give every Client of it WithPlainPubSub (%v)", ErrUnsupportedServer, oneLine(err.Error()))
	case err != nil:
		return redisError(err)
	}
	c.probe.ok.Store(true)
	return nil
}

// isUnknownCommand reports whether err says that the server does not know
// a command (sent, or called from a script: Redis and Valkey word it
// differently), or, on Valkey without its Lua module, cannot run scripts.
// Only the start of the error is read: a script's own error may quote a
// key of the user's choosing.
func isUnknownCommand(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	for _, prefix := range []string{
		"ERR unknown command ",
		"ERR Unknown Redis command called from script",
		"ERR Unknown command called from script",
		"ERR Could not find scripting engine",
	} {
		if strings.HasPrefix(msg, prefix) {
			return true
		}
	}
	return strings.HasPrefix(msg, "ERR Engine '") && strings.Contains(msg, "' not found")
}

// unsupported returns ErrUnsupportedServer, with what Redis said, when err
// says that the server lacks a command redisync uses; nil otherwise.
func unsupported(err error) error {
	if !isUnknownCommand(err) {
		return nil
	}
	return &unsupportedError{msg: oneLine(err.Error()), err: err}
}

// unsupportedError is ErrUnsupportedServer with what Redis said.
type unsupportedError struct {
	msg string
	err error // from Redis
}

func (e *unsupportedError) Error() string {
	return ErrUnsupportedServer.Error() + ": it lacks a command redisync needs " +
		"(Redis 7.0 or later, or Valkey 8.0 or later, with Lua scripting): " + e.msg
}
func (e *unsupportedError) Unwrap() []error { return []error{ErrUnsupportedServer, e.err} }
