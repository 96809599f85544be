package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/redisserver"
)

// server is the Redis under test and the benchmark's own connection to it.
type server struct {
	addr  string
	admin *redis.Client       // one connection: snapshots and samples
	proc  *redisserver.Server // a redis-server the benchmark started; nil for -redis
}

// startServer runs binary (redis-server) on a free loopback port, without
// persistence, and connects to it. close stops it.
func startServer(binary string) (*server, error) {
	proc, err := redisserver.Start(binary, "")
	if err != nil {
		return nil, err
	}
	return started(proc), nil
}

// started connects to a server the benchmark started.
func started(proc *redisserver.Server) *server {
	return &server{addr: proc.Addr, admin: redis.NewClient(&redis.Options{Addr: proc.Addr, PoolSize: 1}), proc: proc}
}

// connectServer connects to the Redis at addr.
func connectServer(ctx context.Context, addr string) (*server, error) {
	s := &server{addr: addr, admin: redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})}
	if err := s.admin.Ping(ctx).Err(); err != nil {
		return nil, errors.Join(fmt.Errorf("redis at %s: %w", addr, err), s.admin.Close())
	}
	return s, nil
}

// close removes the keys matching pattern (if any) from an external
// server, or stops the spawned server.
func (s *server) close(ctx context.Context, pattern string) error {
	var errs []error
	if s.proc == nil && pattern != "" {
		errs = append(errs, s.unlink(ctx, pattern))
	}
	errs = append(errs, s.admin.Close())
	if s.proc != nil {
		errs = append(errs, s.proc.Stop())
	}
	return errors.Join(errs...)
}

// unlink deletes the keys matching pattern.
func (s *server) unlink(ctx context.Context, pattern string) error {
	iter := s.admin.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		if err := s.admin.Unlink(ctx, iter.Val()).Err(); err != nil {
			return err
		}
	}
	return iter.Err()
}
