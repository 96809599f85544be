package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// startTimeout bounds how long a spawned redis-server may take to answer.
const startTimeout = 10 * time.Second

// server is the Redis under test and the benchmark's own connection to it.
type server struct {
	addr  string
	admin *redis.Client // one connection: snapshots and samples

	proc    *exec.Cmd     // a redis-server the benchmark started; nil for -redis
	exited  chan struct{} // closed when proc has exited
	waitErr error         // proc's exit status, once exited is closed
	dir     string        // proc's working directory and log
}

// startServer runs binary (redis-server) on a free loopback port, without
// persistence, and connects to it. close stops it.
func startServer(ctx context.Context, binary string) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	return spawn(ctx, binary, port)
}

// spawn runs binary (redis-server) on the loopback port, without
// persistence and with the extra arguments, in a directory of its own, and
// connects to it. close stops it.
func spawn(ctx context.Context, binary string, port int, extra ...string) (*server, error) {
	dir, err := os.MkdirTemp("", "redisync-bench-")
	if err != nil {
		return nil, err
	}
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log")}
	args = append(args, extra...)
	s := &server{addr: fmt.Sprintf("127.0.0.1:%d", port), dir: dir}
	s.proc = exec.Command(binary, args...)
	if err := s.proc.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	s.exited = make(chan struct{})
	go func() {
		s.waitErr = s.proc.Wait()
		close(s.exited)
	}()
	s.admin = redis.NewClient(&redis.Options{Addr: s.addr, PoolSize: 1})
	if err := s.waitReady(ctx); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
		return nil, errors.Join(fmt.Errorf("%s did not start: %w\n%s", binary, err, bytes.TrimSpace(log)), s.close(ctx, ""))
	}
	return s, nil
}

// connectServer connects to the Redis at addr.
func connectServer(ctx context.Context, addr string) (*server, error) {
	s := &server{addr: addr, admin: redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})}
	if err := s.admin.Ping(ctx).Err(); err != nil {
		return nil, errors.Join(fmt.Errorf("redis at %s: %w", addr, err), s.admin.Close())
	}
	return s, nil
}

// waitReady waits until the spawned server answers PING.
func (s *server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := s.admin.Ping(ctx).Err()
		if err == nil {
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("exited: %v", s.waitErr)
		case <-ctx.Done():
			return err
		case <-tick.C:
		}
	}
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
		if err := s.proc.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			errs = append(errs, err)
		}
		<-s.exited
		errs = append(errs, os.RemoveAll(s.dir))
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

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
