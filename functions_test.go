package redisync

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// sentCommands is a hook that records the name of every command a Client
// sends on its own connections (handshakes aside).
type sentCommands struct {
	passHooks
	mu    sync.Mutex
	names []string
}

func (s *sentCommands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !handshake(cmd) {
			s.mu.Lock()
			s.names = append(s.names, strings.ToLower(cmd.Name()))
			s.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

// take returns the names recorded since the last take.
func (s *sentCommands) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.names
	s.names = nil
	return n
}

// clientSending returns a Client of rdb whose own connections record what
// they send in the returned hook.
func clientSending(t *testing.T, rdb *redis.Client) (*Client, *sentCommands) {
	t.Helper()
	sent := &sentCommands{}
	c, err := New(rdb, WithConnSetup(func(c *redis.Client) error { c.AddHook(sent); return nil }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, sent
}

// lockUnlock takes the lock name with a Mutex of c, and gives it back.
func lockUnlock(t *testing.T, c *Client, name string) {
	t.Helper()
	m := must(c.NewMutex(name))
	if err := m.Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// libraryLoaded reports whether rdb's server has the function library.
func libraryLoaded(t *testing.T, rdb *redis.Client) bool {
	t.Helper()
	libs, err := rdb.Do(context.Background(), "function", "list", "libraryname", library().name).Slice()
	if err != nil {
		t.Fatal(err)
	}
	return len(libs) == 1
}

// On a server with functions, a Client of one server calls its scripts as
// functions: it loads the library where the server lacks it (a server new
// to this version, or whose functions were flushed), and sends no script.
func TestFunctionsLoadedAndCalled(t *testing.T) {
	s := redistest.Spawn(t)
	admin := redistest.NewClient(t, s.Addr)
	c, sent := clientSending(t, redistest.NewClient(t, s.Addr))
	lockUnlock(t, c, "a")
	want := []string{"fcall", "function", "fcall", "fcall"} // acquire (not found, load, again), release
	if got := sent.take(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("a new server: sent %q, want %q", got, want)
	}
	if !libraryLoaded(t, admin) {
		t.Fatalf("the library %s is not loaded", library().name)
	}
	lockUnlock(t, c, "a")
	if got := sent.take(); strings.Join(got, " ") != "fcall fcall" {
		t.Fatalf("with the library loaded: sent %q, want two FCALLs", got)
	}
	if err := admin.Do(context.Background(), "function", "flush").Err(); err != nil {
		t.Fatal(err)
	}
	lockUnlock(t, c, "a")
	if got := sent.take(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("after FUNCTION FLUSH: sent %q, want %q", got, want)
	}
}

// A Client whose ACL user may not call functions, or of a server that has
// none (the embedded Redis), sends scripts: it tries an FCALL once.
func TestFunctionsRefusedFallBackToScripts(t *testing.T) {
	t.Run("no FCALL for the ACL user", func(t *testing.T) {
		s := redistest.Spawn(t)
		admin := redistest.NewClient(t, s.Addr)
		if err := admin.Do(context.Background(), "acl", "setuser", "nofn", "on", ">pw", "~*", "&*", "+@all", "-fcall").Err(); err != nil {
			t.Fatal(err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "nofn", Password: "pw"})
		t.Cleanup(func() { _ = rdb.Close() })
		testFallBack(t, rdb)
		if libraryLoaded(t, admin) {
			t.Error("the library was loaded for a user that may not call it")
		}
	})
	t.Run("no FUNCTION LOAD for the ACL user", func(t *testing.T) {
		s := redistest.Spawn(t)
		admin := redistest.NewClient(t, s.Addr)
		if err := admin.Do(context.Background(), "acl", "setuser", "noload", "on", ">pw", "~*", "&*", "+@all", "-function").Err(); err != nil {
			t.Fatal(err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "noload", Password: "pw"})
		t.Cleanup(func() { _ = rdb.Close() })
		c, sent := clientSending(t, rdb)
		lockUnlock(t, c, "a")
		if got := strings.Join(sent.take(), " "); got != "fcall function evalsha eval evalsha eval" {
			t.Fatalf("first Lock+Unlock sent %q", got)
		}
		lockUnlock(t, c, "a")
		if got := strings.Join(sent.take(), " "); got != "evalsha evalsha" {
			t.Fatalf("then sent %q, want scripts only", got)
		}
	})
	t.Run("the embedded Redis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		testFallBack(t, rdb)
	})
}

// testFallBack checks that a Client of rdb, which may not call functions,
// tries one FCALL and sends scripts from then on.
func testFallBack(t *testing.T, rdb *redis.Client) {
	t.Helper()
	c, sent := clientSending(t, rdb)
	lockUnlock(t, c, "a")
	if got := strings.Join(sent.take(), " "); got != "fcall evalsha eval evalsha eval" {
		t.Fatalf("first Lock+Unlock sent %q, want one FCALL, then scripts", got)
	}
	lockUnlock(t, c, "a")
	if got := strings.Join(sent.take(), " "); got != "evalsha evalsha" {
		t.Fatalf("then sent %q, want scripts only", got)
	}
}

// LoadFunctions loads the library where it is missing, and changes
// nothing where it is there; a server without functions fails it with
// ErrUnsupportedServer.
func TestLoadFunctions(t *testing.T) {
	s := redistest.Spawn(t)
	admin := redistest.NewClient(t, s.Addr)
	c := newClient(t, redistest.NewClient(t, s.Addr))
	for range 2 {
		if err := c.LoadFunctions(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !libraryLoaded(t, admin) {
			t.Fatalf("the library %s is not loaded", library().name)
		}
	}
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := newClient(t, rdb).LoadFunctions(context.Background()); !errors.Is(err, ErrUnsupportedServer) {
		t.Fatalf("LoadFunctions on the embedded Redis: %v, want ErrUnsupportedServer", err)
	}
}

// Only a refusal of the command itself sends the script instead: an error
// raised inside a function that ran (which may have written) is the call's.
func TestRefusedCommandIsTheCommandItself(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want bool
	}{
		{"ERR unknown command 'FCALL', with args beginning with: 'redisync_x_acquire' '4' ", true},
		{"ERR unknown command `fcall`, with args beginning with: `redisync_x_acquire`, ", true},
		{"NOPERM User u has no permissions to run the 'fcall' command", true},
		{"NOPERM this user has no permissions to run the 'fcall' command", true},
		{"ERR Unknown command called from script script: 9, on @user_function:12.", false},
		{"ERR Unknown Redis command called from script script: 9, on @user_function:12.", false},
		{"ERR ACL failure in script: User u has no permissions to run the 'publish' command script: 9, on @user_function:40.", false},
		{"ERR The user executing the script can't run this command or subcommand script: 9, on @user_function:40.", false},
		{"NOPERM this user has no permissions to access one of the keys used as arguments", false},
		{"ERR unknown command 'fcall_ro'", false},
	} {
		if got := refusedCommand(replyError(tc.msg), "fcall"); got != tc.want {
			t.Errorf("%q: refused %v, want %v", tc.msg, got, tc.want)
		}
	}
}

// A server where another library holds one of the functions' names (here
// the release's), and this version's library is missing: loading it fails,
// and the Client sends its scripts, which run what this version sent.
// (Whoever may load functions can change what every Client of the server
// runs: docs/acl.md.)
func TestFunctionNameTakenFallsBackToScripts(t *testing.T) {
	s := redistest.Spawn(t)
	admin := redistest.NewClient(t, s.Addr)
	squat := "#!lua name=squat\nredis.register_function('" + library().fn[releaseScript] + "', function() return 1 end)"
	if err := admin.Do(context.Background(), "function", "load", squat).Err(); err != nil {
		t.Fatal(err)
	}
	c, sent := clientSending(t, redistest.NewClient(t, s.Addr))
	m := must(c.NewMutex("a"))
	if err := m.Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(sent.take(), " "); got != "fcall function evalsha eval evalsha eval" {
		t.Fatalf("Lock+Unlock sent %q, want one FCALL, a refused load, then the scripts", got)
	}
	if st, _ := serverLockState(t, admin, schema.LockKeys("redisync", "a")); st.Owner != "" {
		t.Fatalf("the lock's state %+v after Unlock: want it free (released by the script)", st)
	}
}

// A Client whose user may not load the missing library tries a function
// again once libraryRecheck has passed, and calls the library once a user
// that may has loaded it.
func TestFunctionsTriedAgainOnceLoaded(t *testing.T) {
	defer func(d time.Duration) { libraryRecheck = d }(libraryRecheck)
	libraryRecheck = time.Nanosecond
	s := redistest.Spawn(t)
	admin := redistest.NewClient(t, s.Addr)
	if err := admin.Do(context.Background(), "acl", "setuser", "noload", "on", ">pw", "~*", "&*", "+@all", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "noload", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	c, sent := clientSending(t, rdb)
	lockUnlock(t, c, "a")
	if got := sent.take(); !slices.Contains(got, "evalsha") {
		t.Fatalf("without the library, sent %q: want scripts", got)
	}
	if err := newClient(t, admin).LoadFunctions(context.Background()); err != nil {
		t.Fatal(err)
	}
	lockUnlock(t, c, "a")
	if got := strings.Join(sent.take(), " "); got != "fcall fcall" {
		t.Fatalf("once the library is loaded: sent %q, want two FCALLs", got)
	}
}

// A read-only script's function runs where a write is refused, as the
// script did: Mutex.TTL on a server out of memory.
func TestReadOnlyFunctionsRunOutOfMemory(t *testing.T) {
	s := redistest.Spawn(t)
	admin := redistest.NewClient(t, s.Addr)
	c, sent := clientSending(t, redistest.NewClient(t, s.Addr))
	m := must(c.NewMutex("a", WithFixedLease(time.Minute)))
	if err := m.Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(context.Background(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	sent.take()
	ttl, err := m.TTL(context.Background())
	if err := admin.ConfigSet(context.Background(), "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err != nil || ttl <= 0 {
		t.Fatalf("TTL out of memory: %v, %v; want the remaining lease", ttl, err)
	}
	if got := strings.Join(sent.take(), " "); got != "fcall" {
		t.Fatalf("TTL sent %q, want one FCALL", got)
	}
	if err := m.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A function reads the server clock at each call, not once for the
// library's life: a lease read 300 ms after it was set is shorter.
func TestFunctionsReadTheClockPerCall(t *testing.T) {
	s := redistest.Spawn(t)
	c, sent := clientSending(t, redistest.NewClient(t, s.Addr))
	m := must(c.NewMutex("a", WithFixedLease(5*time.Second)))
	if err := m.Lock(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-time.After(300 * time.Millisecond) // the time between the two calls
	ttl, err := m.TTL(context.Background())
	if err != nil || ttl > 4800*time.Millisecond {
		t.Fatalf("TTL 300 ms after a 5 s lease was set: %v, %v; want at most 4.8 s", ttl, err)
	}
	if got := sent.take(); !slices.Contains(got, "fcall") || slices.Contains(got, "evalsha") {
		t.Fatalf("sent %q, want functions only", got)
	}
	if err := m.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
}
