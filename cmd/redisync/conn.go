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

// The environment variables that hold passwords, so that they need not be
// on the command line, where ps shows them to every user.
const (
	envPassword         = "REDISYNC_PASSWORD"          // then $REDIS_PASSWORD
	envSentinelPassword = "REDISYNC_SENTINEL_PASSWORD" // the sentinels' own, if they have one
)

// redisHelp describes --redis and the environment, for the usage.
const redisHelp = `Redis is found, in order, from --redis, $REDIS_URL, $REDIS_ADDR, else
127.0.0.1:6379 (demo: an embedded in-process Redis). Any of them may be:
  host:port                      one server; a Redis Cluster node is
                                 recognised and the whole cluster used
  host:port,host:port,...        seed nodes of a Redis Cluster
  redis://[user@]host:port[/db]  a URL as go-redis reads it; several
                                 comma-separated host:port: a cluster
  rediss://...                   the same over TLS
  redis+sentinel://[user@]host:port[,host:port...]/MASTER[/db]
                                 the primary named MASTER, found through
                                 these Sentinels (rediss+sentinel: TLS)
  unix:///path/to/redis.sock[?db=N]
The password comes from $REDISYNC_PASSWORD, else $REDIS_PASSWORD (the
Sentinels' own, if they need one, from $REDISYNC_SENTINEL_PASSWORD). A
password in the URL (redis://user:password@...) works too but is not
advised: other users see command lines with ps.
`

// target is where to find Redis, and where that came from.
type target struct {
	spec   string // URL or host:port; "" when nothing was given
	source string // "--redis", "$REDIS_URL", "$REDIS_ADDR" or "default"
}

// redisFlag adds --redis to fs.
func redisFlag(fs *flag.FlagSet) *string {
	return fs.String("redis", "", "Redis `URL` or host:port[,host:port...] (see \"redisync help\");\ndefault $REDIS_URL, then $REDIS_ADDR, then "+defaultAddr)
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

// plan is how to reach Redis: exactly one of its fields is set.
type plan struct {
	single   *redis.Options         // one server, maybe a cluster node (see connect)
	cluster  *redis.ClusterOptions  // seed nodes of a Redis Cluster
	failover *redis.FailoverOptions // a primary found through Sentinels
}

// plan parses t. A spec with "://" is a URL (see redisHelp); anything else
// is host:port (or a bare host, port 6379), or several comma-separated
// for a cluster. A password missing from the spec is taken from the
// environment. Errors never include a password.
func (t target) plan() (*plan, error) {
	spec := cmp.Or(t.spec, defaultAddr)
	p, err := parseSpec(spec)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message repeats the URL, password included
		}
		what := "URL"
		if !strings.Contains(spec, "://") {
			what = "address"
		}
		return nil, fmt.Errorf("bad Redis %s %q (from %s): %v", what, redact(spec), t.source, err)
	}
	pw := cmp.Or(os.Getenv(envPassword), os.Getenv("REDIS_PASSWORD"))
	switch {
	case p.single != nil:
		p.single.Password = cmp.Or(p.single.Password, pw)
	case p.cluster != nil:
		p.cluster.Password = cmp.Or(p.cluster.Password, pw)
	case p.failover != nil:
		p.failover.Password = cmp.Or(p.failover.Password, pw)
		p.failover.SentinelPassword = os.Getenv(envSentinelPassword)
	}
	return p, nil
}

// parseSpec parses a URL or a list of addresses.
func parseSpec(spec string) (*plan, error) {
	scheme, rest, isURL := strings.Cut(spec, "://")
	if !isURL {
		addrs, err := parseAddrs(spec)
		if err != nil {
			return nil, err
		}
		if len(addrs) == 1 {
			return &plan{single: &redis.Options{Addr: addrs[0]}}, nil
		}
		return &plan{cluster: &redis.ClusterOptions{Addrs: addrs}}, nil
	}
	switch scheme {
	case "unix":
		opts, err := redis.ParseURL(spec)
		return &plan{single: opts}, err
	case "redis", "rediss", "redis+sentinel", "rediss+sentinel":
	default:
		return nil, fmt.Errorf("unknown scheme %q: want redis://, rediss://, redis+sentinel://, rediss+sentinel:// or unix://", scheme)
	}
	// scheme://[userinfo@]host[,host...][/path][?query]
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	userinfo, hostList := "", authority
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo, hostList = authority[:i+1], authority[i+1:]
	}
	addrs, err := parseAddrs(hostList)
	if err != nil {
		return nil, err
	}
	base, sentinel := strings.CutSuffix(scheme, "+sentinel")
	var master string
	if sentinel {
		path, query, _ := strings.Cut(tail, "?")
		path = strings.TrimPrefix(path, "/")
		master, path, _ = strings.Cut(path, "/")
		if master == "" {
			return nil, errors.New("missing the master name: want " + scheme + "://host:port[,host:port...]/MASTER[/db]")
		}
		tail = "/" + path
		if query != "" {
			tail += "?" + query
		}
	}
	// go-redis reads the options from a URL of the first address.
	opts, err := redis.ParseURL(base + "://" + userinfo + addrs[0] + tail)
	if err != nil {
		return nil, err
	}
	switch {
	case sentinel:
		return &plan{failover: failoverOptions(opts, master, addrs)}, nil
	case len(addrs) > 1:
		if opts.DB != 0 {
			return nil, fmt.Errorf("database %d: a cluster has database 0 only", opts.DB)
		}
		return &plan{cluster: clusterOptions(opts, addrs)}, nil
	}
	return &plan{single: opts}, nil
}

// parseAddrs splits comma-separated host[:port] (port 6379 by default)
// and checks each.
func parseAddrs(list string) ([]string, error) {
	var addrs []string
	for _, a := range strings.Split(list, ",") {
		host, port, err := net.SplitHostPort(a)
		if err != nil { // no port: a bare host, or an IPv6 address
			host, port = strings.Trim(a, "[]"), "6379"
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return nil, fmt.Errorf("port %q is not a number in [1, 65535]", port)
		}
		if host == "" || strings.ContainsAny(host, "/@ ") {
			return nil, fmt.Errorf("%q: want host:port[,host:port...] or a redis:// URL", a)
		}
		addrs = append(addrs, net.JoinHostPort(host, port))
	}
	return addrs, nil
}

// clusterOptions returns the options of a cluster client with the seed
// nodes addrs and the other settings of o.
func clusterOptions(o *redis.Options, addrs []string) *redis.ClusterOptions {
	return &redis.ClusterOptions{
		Addrs: addrs, ClientName: o.ClientName, Protocol: o.Protocol,
		Username: o.Username, Password: o.Password, TLSConfig: o.TLSConfig,
		MaxRetries: o.MaxRetries, MinRetryBackoff: o.MinRetryBackoff, MaxRetryBackoff: o.MaxRetryBackoff,
		DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
		PoolSize: o.PoolSize, PoolTimeout: o.PoolTimeout,
		MinIdleConns: o.MinIdleConns, MaxIdleConns: o.MaxIdleConns,
		ConnMaxIdleTime: o.ConnMaxIdleTime, ConnMaxLifetime: o.ConnMaxLifetime,
	}
}

// failoverOptions returns the options of a client of the primary master
// found through the Sentinels at addrs, with the other settings of o.
func failoverOptions(o *redis.Options, master string, addrs []string) *redis.FailoverOptions {
	return &redis.FailoverOptions{
		MasterName: master, SentinelAddrs: addrs, ClientName: o.ClientName, Protocol: o.Protocol,
		Username: o.Username, Password: o.Password, DB: o.DB, TLSConfig: o.TLSConfig,
		MaxRetries: o.MaxRetries, MinRetryBackoff: o.MinRetryBackoff, MaxRetryBackoff: o.MaxRetryBackoff,
		DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
		PoolSize: o.PoolSize, PoolTimeout: o.PoolTimeout,
		MinIdleConns: o.MinIdleConns, MaxIdleConns: o.MaxIdleConns,
		ConnMaxIdleTime: o.ConnMaxIdleTime, ConnMaxLifetime: o.ConnMaxLifetime,
	}
}

// capDialTimeout bounds the dial timeout by pingTimeout.
func capDialTimeout(d *time.Duration) {
	if *d == 0 || *d > pingTimeout {
		*d = pingTimeout
	}
}

// open returns a client for p, with dials bounded by pingTimeout.
func (p *plan) open() redis.UniversalClient {
	switch {
	case p.cluster != nil:
		capDialTimeout(&p.cluster.DialTimeout)
		return redis.NewClusterClient(p.cluster)
	case p.failover != nil:
		capDialTimeout(&p.failover.DialTimeout)
		return redis.NewFailoverClient(p.failover)
	}
	capDialTimeout(&p.single.DialTimeout)
	return redis.NewClient(p.single)
}

// String names the Redis of p for messages.
func (p *plan) String() string {
	var s string
	tls := false
	switch {
	case p.cluster != nil:
		s, tls = "cluster "+strings.Join(p.cluster.Addrs, ","), p.cluster.TLSConfig != nil
	case p.failover != nil:
		s = fmt.Sprintf("master %q of sentinels %s", p.failover.MasterName, strings.Join(p.failover.SentinelAddrs, ","))
		tls = p.failover.TLSConfig != nil
	default:
		s, tls = p.single.Addr, p.single.TLSConfig != nil
		if p.single.Network == "unix" {
			s = "unix:" + s
		}
	}
	if tls {
		s += " (TLS)"
	}
	return s
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

// connectError is a failure to reach Redis or to be accepted by it.
type connectError struct{ err error }

func (e *connectError) Error() string { return e.err.Error() }
func (e *connectError) Unwrap() error { return e.err }

// connect opens a client for t and checks it with a PING bounded by
// pingTimeout and ctx. A single server that turns out to be a Redis
// Cluster node is used as the seed of a cluster client, so that every
// name works whichever node serves its slot. Errors are *connectError
// (unreachable, refused) or a usage error (bad URL), told apart by
// exitCode.
func connect(ctx context.Context, t target) (redis.UniversalClient, error) {
	p, err := t.plan()
	if err != nil {
		return nil, err
	}
	rdb, err := ping(ctx, t, p)
	if err != nil || p.single == nil || p.single.Network == "unix" {
		return rdb, err
	}
	ictx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	info, err := rdb.Info(ictx, "cluster").Result()
	if err != nil || !strings.Contains(info, "cluster_enabled:1") {
		return rdb, nil // not a cluster node (or a server without INFO)
	}
	_ = rdb.Close()
	return ping(ctx, t, &plan{cluster: clusterOptions(p.single, []string{p.single.Addr})})
}

// ping opens a client for p and checks it with a PING.
func ping(ctx context.Context, t target, p *plan) (redis.UniversalClient, error) {
	rdb := p.open()
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		_ = rdb.Close()
		if cause := context.Cause(ctx); cause != nil {
			return nil, cause // interrupted by a signal
		}
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			err = fmt.Errorf("no answer to PING within %v", pingTimeout)
		case p.failover != nil && errors.Is(err, redis.Nil):
			err = fmt.Errorf("no Sentinel answered with the address of a master named %q", p.failover.MasterName)
		}
		msg := strings.ReplaceAll(err.Error(), "\n", "; ") // joined errors
		return nil, &connectError{fmt.Errorf("cannot reach Redis at %s (from %s): %s", p, t.source, msg)}
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
