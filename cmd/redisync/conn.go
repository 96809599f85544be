package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// defaultAddr is the Redis used by lock, sem and status when neither
// --redis, $REDIS_URL nor $REDIS_ADDR says otherwise.
const defaultAddr = "127.0.0.1:6379"

// pingTimeout bounds the first PING, which tells an unreachable server.
const pingTimeout = 3 * time.Second

// target is where to find Redis, and where that came from.
type target struct {
	spec   string // URL or host:port; "" when nothing was given
	source string // "--redis", "$REDIS_URL", "$REDIS_ADDR" or "default"
}

// redisFlag adds --redis to fs.
func redisFlag(fs *flag.FlagSet) *string {
	return fs.String("redis", "", "Redis `URL` (redis://[user:pass@]host:port[/db], rediss:// for TLS) or host:port;\ndefault $REDIS_URL, then $REDIS_ADDR, then "+defaultAddr)
}

// resolveTarget picks the Redis to use from the flag and the environment.
// spec is "" when none of them is set.
func resolveTarget(flagValue string) target {
	switch {
	case flagValue != "":
		return target{flagValue, "--redis"}
	case os.Getenv("REDIS_URL") != "":
		return target{os.Getenv("REDIS_URL"), "$REDIS_URL"}
	case os.Getenv("REDIS_ADDR") != "":
		return target{os.Getenv("REDIS_ADDR"), "$REDIS_ADDR"}
	}
	return target{"", "default"}
}

// options parses t into go-redis options. A spec with "://" is a URL as
// redis.ParseURL reads it (redis, rediss, unix); anything else is host:port
// (or a bare host, port 6379). Errors never include a password.
func (t target) options() (*redis.Options, error) {
	spec := cmp.Or(t.spec, defaultAddr)
	if strings.Contains(spec, "://") {
		opts, err := redis.ParseURL(spec)
		if err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err // its message repeats the URL, password included
			}
			return nil, fmt.Errorf("bad Redis URL %q (from %s): %v", redact(spec), t.source, err)
		}
		return opts, nil
	}
	host, port, err := net.SplitHostPort(spec)
	if err != nil { // no port: a bare host, or an IPv6 address
		host, port = strings.Trim(spec, "[]"), "6379"
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return nil, fmt.Errorf("bad Redis address %q (from %s): port %q is not a number in [1, 65535]", spec, t.source, port)
	}
	if host == "" || strings.ContainsAny(host, "/@ ") {
		return nil, fmt.Errorf("bad Redis address %q (from %s): want host:port or a redis:// URL", spec, t.source)
	}
	return &redis.Options{Addr: net.JoinHostPort(host, port)}, nil
}

// redact hides the password of a URL, even one that does not parse.
func redact(spec string) string {
	if u, err := url.Parse(spec); err == nil {
		return u.Redacted()
	}
	i := strings.Index(spec, "://")
	j := strings.LastIndex(spec, "@")
	if i < 0 || j < i {
		return spec
	}
	return spec[:i+3] + "xxxxx" + spec[j:]
}

// describe names the server of opts for messages.
func describe(opts *redis.Options) string {
	s := opts.Addr
	if opts.Network == "unix" {
		s = "unix:" + s
	}
	if opts.TLSConfig != nil {
		s += " (TLS)"
	}
	return s
}

// connectError is a failure to reach Redis or to be accepted by it.
type connectError struct{ err error }

func (e *connectError) Error() string { return e.err.Error() }
func (e *connectError) Unwrap() error { return e.err }

// connect opens a client for t and checks it with a PING bounded by
// pingTimeout and ctx. Errors are *connectError (unreachable, refused)
// or a usage error (bad URL), told apart by exitCode.
func connect(ctx context.Context, t target) (*redis.Client, error) {
	opts, err := t.options()
	if err != nil {
		return nil, err
	}
	if opts.DialTimeout == 0 || opts.DialTimeout > pingTimeout {
		opts.DialTimeout = pingTimeout
	}
	rdb := redis.NewClient(opts)
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		_ = rdb.Close()
		if cause := context.Cause(ctx); cause != nil {
			return nil, cause // interrupted by a signal
		}
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer to PING within %v", pingTimeout)
		}
		return nil, &connectError{fmt.Errorf("cannot reach Redis at %s (from %s): %v", describe(opts), t.source, err)}
	}
	return rdb, nil
}

// connectExit prints a connect error and returns its exit code.
func connectExit(err error) int {
	var ce *connectError
	var se *signalError
	switch {
	case errors.As(err, &se):
		return errorf(se.code(), "%v", err)
	case errors.As(err, &ce):
		return errorf(exitUnavailable, "%v", err)
	}
	return errorf(exitUsage, "%v", err)
}
