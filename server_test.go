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
// without its Lua module; here, a server whose EVAL, EVALSHA, FCALL and
// FUNCTION are renamed away) fails the first call with ErrUnsupportedServer, saying
// what redisync needs, and leaves nothing written.
func TestServerWithoutLua(t *testing.T) {
	s := redistest.Spawn(t, "--rename-command", "EVAL", "", "--rename-command", "EVALSHA", "",
		"--rename-command", "FCALL", "", "--rename-command", "FUNCTION", "")
	rdb := redistest.NewClient(t, s.Addr)
	c := newClient(t, rdb)
	for _, call := range []func(context.Context) error{
		must(c.NewMutex("a")).Lock,
		func(ctx context.Context) error { _, err := must(c.NewMutex("a", Barging())).TryLock(ctx); return err },
		func(ctx context.Context) error { return must(c.NewSemaphore("s", 2)).Acquire(ctx, 1) },
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

// TestUnknownCommandOnlyFromTheServer: an error is read as a missing
// command only from the shape the server gives it, never from a key name
// quoted in a script's own error: a lock named "unknown command" whose
// counter holds the wrong type fails with ErrWrongType.
func TestUnknownCommandOnlyFromTheServer(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	name := "ERR unknown command x"
	mr.HSet("redisync:lock:{"+name+"}:token", "f", "v")
	err := must(c.NewMutex(name)).Lock(ctx)
	if !errors.Is(err, ErrWrongType) || errors.Is(err, ErrUnsupportedServer) {
		t.Fatalf("Lock with a counter of the wrong type: %v, want ErrWrongType only", err)
	}
	for _, msg := range []string{
		"ERR unknown command 'EVALSHA', with args beginning with: 'abc'",
		"ERR Unknown Redis command called from script script: 98, on @user_script:1.",
		"ERR Unknown command called from script script: 98, on @user_script:1.",
		"ERR Could not find scripting engine 'lua'",
		"ERR Engine 'lua' not found",
	} {
		if !errors.Is(redisError(replyError(msg)), ErrUnsupportedServer) {
			t.Errorf("%q: not ErrUnsupportedServer", msg)
		}
	}
	for _, msg := range []string{
		"NOPERM this user has no permissions to run the 'evalsha' command",
		"ERR user_script:1: WRONGTYPE redisync: redisync:lock:{unknown command}:token does not hold a counter",
	} {
		if errors.Is(redisError(replyError(msg)), ErrUnsupportedServer) {
			t.Errorf("%q: read as ErrUnsupportedServer", msg)
		}
	}
}

// TestNewRefusesAWrapperOfNothing: a wrapper whose embedded client is nil
// is refused at New, not at the first call, where it would panic.
func TestNewRefusesAWrapperOfNothing(t *testing.T) {
	type wrappedCluster struct{ *redis.ClusterClient }
	type wrappedClient struct{ *redis.Client }
	for _, rdb := range []redis.UniversalClient{wrappedCluster{}, wrappedClient{}} {
		if c, err := New(rdb); c != nil || !errors.Is(err, ErrNilClient) {
			t.Errorf("New(%T of nil): %v, %v; want ErrNilClient", rdb, c, err)
		}
	}
}

// TestRedlockNodesOfEveryKind: primaries found through Sentinel are told
// apart (go-redis gives each the same placeholder address), and one
// server given twice, once wrapped, is found the same node.
func TestRedlockNodesOfEveryKind(t *testing.T) {
	type wrapped struct{ *redis.Client }
	failover := func(master string) *redis.Client {
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: master, SentinelAddrs: []string{"127.0.0.1:1"}})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	a, b, c := failover("a"), failover("b"), failover("c")
	if r, err := NewRedlock([]redis.UniversalClient{a, b, c}); err != nil {
		t.Fatalf("three Sentinel groups: %v", err)
	} else {
		_ = r.Close()
	}
	single := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = single.Close() })
	if _, err := NewRedlock([]redis.UniversalClient{single, wrapped{single}, a}); !errors.Is(err, ErrDuplicateNode) {
		t.Fatalf("a server given bare and wrapped: %v, want ErrDuplicateNode", err)
	}
}
