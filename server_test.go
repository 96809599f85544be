package redisync

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/redisinfo"
	"github.com/redisync/redisync/internal/redistest"
)

// delegating is a user's client that forwards every call to a
// ClusterClient without embedding it: nothing tells redisync it is a
// cluster, so New refuses it.
type delegating struct{ redis.UniversalClient }

// TestNewAcceptsOnlyClientsItCanUse: a Client, a ClusterClient, a
// failover Client and types that embed them work; a Ring, and a client
// whose kind redisync cannot tell, are refused at New, not at a call.
func TestNewAcceptsOnlyClientsItCanUse(t *testing.T) {
	type wrappedCluster struct{ *redis.ClusterClient }
	type wrappedClient struct{ *redis.Client }
	single := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	failover := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:1"}})
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1", "b": "127.0.0.1:2"}})
	t.Cleanup(func() { _, _, _, _ = single.Close(), cluster.Close(), failover.Close(), ring.Close() })
	for _, tc := range []struct {
		rdb     redis.UniversalClient
		cluster bool
		want    error
	}{
		{single, false, nil},
		{failover, false, nil},
		{wrappedClient{single}, false, nil},
		{cluster, true, nil},
		{wrappedCluster{cluster}, true, nil},
		{ring, false, ErrUnsupportedClient},
		{delegating{cluster}, false, ErrUnsupportedClient},
	} {
		c, err := New(tc.rdb)
		if !errors.Is(err, tc.want) {
			t.Errorf("New(%T): %v, want %v", tc.rdb, err, tc.want)
		}
		if _, rerr := NewRedlock([]redis.UniversalClient{tc.rdb}); !errors.Is(rerr, tc.want) {
			t.Errorf("NewRedlock(%T): %v, want %v", tc.rdb, rerr, tc.want)
		}
		if err != nil {
			if c != nil {
				t.Errorf("New(%T) refused it but returned a Client", tc.rdb)
			}
			continue
		}
		if got := c.cluster != nil; got != tc.cluster {
			t.Errorf("New(%T): cluster %v, want %v", tc.rdb, got, tc.cluster)
		}
		_ = c.Close()
	}
}

// TestParseInfo reads the server's name, version, mode and role as Redis
// and Valkey print them.
func TestParseInfo(t *testing.T) {
	for _, tc := range []struct{ info, want string }{
		{"# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n# Replication\r\nrole:master\r\n",
			"redis 7.0.15 (standalone primary)"},
		{"redis_version:8.0.2\nredis_mode:cluster\nrole:slave\n", "redis 8.0.2 (cluster replica)"},
		{"redis_version:7.2.4\nserver_name:valkey\nvalkey_version:8.1.1\nserver_mode:standalone\nrole:master\n",
			"valkey 8.1.1 (standalone primary)"},
	} {
		if got := redisinfo.Parse(tc.info).String(); got != tc.want {
			t.Errorf("Parse(%q) = %q, want %q", tc.info, got, tc.want)
		}
	}
}

// TestServers names the server the tests run on, as INFO does.
func TestServers(t *testing.T) {
	rdb := redistest.Client(t)
	c := newClient(t, rdb)
	servers, err := c.Servers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := redisinfo.Parse(info + "\nrole:master")
	if len(servers) != 1 || servers[0].Name != want.Name || servers[0].Version != want.Version ||
		servers[0].Mode != "standalone" || servers[0].Role != "primary" || servers[0].Addr != "" {
		t.Fatalf("Servers: %v, want one %v", servers, want)
	}
	if !strings.Contains(servers[0].String(), want.Version) {
		t.Fatalf("Server.String() = %q, want the version %s in it", servers[0].String(), want.Version)
	}
}

// TestServerWithoutLua: a server that cannot run scripts (Valkey 9.1
// without its Lua module; here, a server whose EVAL and EVALSHA are
// renamed away) fails the first call with ErrUnsupportedServer, saying
// what redisync needs, and leaves nothing written.
func TestServerWithoutLua(t *testing.T) {
	s := redistest.Spawn(t, "--rename-command", "EVAL", "", "--rename-command", "EVALSHA", "")
	rdb := redistest.NewClient(t, s.Addr)
	c := newClient(t, rdb)
	for _, call := range []func(context.Context) error{
		c.NewMutex("a").Lock,
		func(ctx context.Context) error { _, err := c.NewMutex("a", Barging()).TryLock(ctx); return err },
		func(ctx context.Context) error { return c.NewSemaphore("s", 2).Acquire(ctx, 1) },
	} {
		err := call(ctx)
		if !errors.Is(err, ErrUnsupportedServer) || !strings.Contains(err.Error(), "Lua") {
			t.Fatalf("a call on a server without scripts: %v, want ErrUnsupportedServer naming Lua", err)
		}
	}
	if n := rdb.DBSize(ctx).Val(); n != 0 {
		t.Fatalf("%d keys written by calls that failed", n)
	}
}
