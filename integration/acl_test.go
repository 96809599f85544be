package integration

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// The ACL rules of docs/acl.md, which TestACLDocumented checks against the
// page. aclBase is what the library needs on one Redis (standalone, a
// primary with replicas, or each Redlock node); the others are added to it.
const (
	aclBase = aclScope + " +fcall +evalsha +eval" + aclCalled
	// aclFunctionsOnly is the least-privileged user's: it calls the
	// function library, which it may not load, and runs no Lua of its own.
	aclFunctionsOnly = aclScope + " +fcall" + aclCalled
	// aclScope confines a user to the prefix's keys and channels.
	aclScope = "resetkeys resetchannels -@all ~redisync:* &redisync:*"
	// aclCalled is what the Client sends besides scripts, and what the
	// scripts call.
	aclCalled = " +ping +subscribe +unsubscribe +publish" +
		" +get +set +exists +type +pexpire +pexpireat +pttl +time" +
		" +hget +hmget +hset +hdel +hlen +hvals +rpush +lpop +lrem +lrange +llen" +
		" +zadd +zrem +zscore +zcard +zrange +zrangebyscore +zremrangebyscore"
	// aclReplicas is for WithReplicas.
	aclReplicas = "+wait"
	// aclCluster is for a *redis.ClusterClient.
	aclCluster = "+spublish +ssubscribe +sunsubscribe +cluster|slots +command +asking"
	// aclCLI is for the redisync command: status reads in a transaction,
	// and INFO tells a Redis Cluster node given as one address.
	aclCLI = "+multi +exec +hgetall +info +pubsub|numsub +pubsub|shardnumsub +pubsub|channels +pubsub|shardchannels"
	// aclCLIList is for "redisync status --all", which lists the
	// keys under the prefix with SCAN.
	aclCLIList = "+scan"
	// aclIdentity is for go-redis's CLIENT SETINFO on Redis 7.2 and later.
	aclIdentity = "+client|setinfo"
)

// aclPassword is the password of the users the tests create.
const aclPassword = "acl-test-password"

// aclServer is a redis-server of a test's own, and an admin client of it
// (the default user, allowed everything).
type aclServer struct {
	addr  string
	admin *redis.Client
}

// spawnACL starts a redis-server of the test's own: its script cache is
// empty (so the first script call is an EVAL), and its users and ACL LOG
// are the test's alone. Its administrator has loaded the function
// library, as docs/acl.md says.
func spawnACL(t *testing.T) aclServer {
	t.Helper()
	srv := redistest.Spawn(t)
	s := aclServer{srv.Addr, redistest.NewClient(t, srv.Addr)}
	admin, err := redisync.New(s.admin)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.LoadFunctions(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// setUser creates (or replaces) user with exactly the given rules and
// the password aclPassword, and empties the ACL LOG. On Redis 7.2 and
// later it adds aclIdentity, as docs/acl.md says.
func (s aclServer) setUser(t *testing.T, user string, rules ...string) {
	t.Helper()
	args := []string{"reset", "on", ">" + aclPassword}
	for _, r := range rules {
		args = append(args, strings.Fields(r)...)
	}
	if s.atLeast(t, 7, 2) {
		args = append(args, aclIdentity)
	}
	if err := s.admin.ACLSetUser(ctx, user, args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER %s %s: %v", user, strings.Join(args, " "), err)
	}
	if err := s.admin.ACLLogReset(ctx).Err(); err != nil {
		t.Fatal(err)
	}
}

// atLeast reports whether the server's version is major.minor or later.
func (s aclServer) atLeast(t *testing.T, major, minor int) bool {
	t.Helper()
	info, err := s.admin.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`redis_version:(\d+)\.(\d+)`).FindStringSubmatch(info)
	if m == nil {
		t.Fatalf("no redis_version in INFO server")
	}
	ma, _ := strconv.Atoi(m[1])
	mi, _ := strconv.Atoi(m[2])
	return ma > major || ma == major && mi >= minor
}

// client returns a go-redis client that logs in as user, closed when the
// test ends.
func (s aclServer) client(t *testing.T, user string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: s.addr, Username: user, Password: aclPassword})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// denials returns what the ACL LOG recorded since the last reset, one
// "reason object (context)" per entry.
func (s aclServer) denials(t *testing.T) []string {
	t.Helper()
	return denialsOf(t, s.admin)
}

func denialsOf(t *testing.T, admin *redis.Client) []string {
	t.Helper()
	entries, err := admin.ACLLog(ctx, 100).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, fmt.Sprintf("%s %s (%s)", e.Reason, e.Object, e.Context))
	}
	return out
}

// noDenials fails the test if the ACL LOG recorded anything: a command
// refused inside a script called with redis.pcall, or one whose error
// go-redis or redisync does not report, shows up there only.
func (s aclServer) noDenials(t *testing.T) {
	t.Helper()
	if d := s.denials(t); len(d) > 0 {
		t.Errorf("the ACL refused: %q", d)
	}
}

// aclClients returns n redisync Clients, each on a go-redis client of its
// own logged in as user, closed when the test ends.
func (s aclServer) aclClients(t *testing.T, user string, n int, opts ...redisync.Option) []*redisync.Client {
	t.Helper()
	cs := make([]*redisync.Client, n)
	for i := range cs {
		c, err := redisync.New(s.client(t, user), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		cs[i] = c
	}
	return cs
}

// TestACLUserCanUseEveryPrimitive runs every primitive, with contention so
// that waiters subscribe and releases publish and hand over, as a user
// restricted to the documented ACL, and checks that the ACL refused
// nothing (not even what the library would not report).
func TestACLUserCanUseEveryPrimitive(t *testing.T) {
	s := spawnACL(t)
	s.setUser(t, "redisync", aclBase)
	cnt := cmdCounter{s.admin}

	t.Run("Mutex", func(t *testing.T) {
		cs := s.aclClients(t, "redisync", 2)
		res := contend(t, mutexes(cs, redistest.Name(t), 4, redisync.Barging()), 2*time.Millisecond, rounds(10))
		increasing(t, res.tokens)
		res = contend(t, mutexes(cs, redistest.Name(t), 4), 2*time.Millisecond, rounds(10))
		increasing(t, res.tokens)
		st := cnt.stats(t)
		for _, cmd := range []string{"fcall", "subscribe", "publish", "zrem"} {
			if st[cmd] == 0 {
				t.Errorf("Redis ran no %s: the path that sends it was not exercised", strings.ToUpper(cmd))
			}
		}
		s.noDenials(t)
	})

	t.Run("Subscriber", func(t *testing.T) {
		// The subscriber PINGs a connection silent for 3 s, and
		// UNSUBSCRIBEs a channel 2 s after its last waiter left.
		cs := s.aclClients(t, "redisync", 2)
		name := redistest.Name(t)
		holder, waiter := must(cs[0].NewMutex(name)), must(cs[1].NewMutex(name))
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		before := cnt.stats(t)
		got := make(chan error, 1)
		go func() { got <- waiter.Lock(ctx) }()
		// Redisync's spare connections PING too: wait for a subscribed
		// connection whose last command was a PING.
		eventually(t, 10*time.Second, "the subscriber to PING", func() bool {
			list, err := s.admin.ClientList(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range strings.Split(list, "\n") {
				f := " " + c + " "
				if strings.Contains(f, " cmd=ping ") && !strings.Contains(f, " sub=0 ") && strings.Contains(f, " user=redisync ") {
					return true
				}
			}
			return false
		})
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiter did not get the lock within 10 s of its release")
		}
		if err := waiter.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the subscriber to UNSUBSCRIBE", func() bool {
			return cnt.stats(t)["unsubscribe"] > before["unsubscribe"]
		})
		s.noDenials(t)
	})

	t.Run("TryLock", func(t *testing.T) {
		cs := s.aclClients(t, "redisync", 2)
		for _, opts := range [][]redisync.Option{{redisync.Barging()}, nil} {
			name := redistest.Name(t)
			a, b := must(cs[0].NewMutex(name, opts...)), must(cs[1].NewMutex(name, opts...))
			if ok, err := a.TryLock(ctx); !ok || err != nil {
				t.Fatalf("TryLock of a free lock: %v, %v", ok, err)
			}
			if ok, err := b.TryLock(ctx); ok || err != nil {
				t.Fatalf("TryLock of a held lock: %v, %v; want false, nil", ok, err)
			}
			if err := a.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if ok, err := b.TryLock(ctx); !ok || err != nil {
				t.Fatalf("TryLock after Unlock: %v, %v", ok, err)
			}
			if err := b.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		s.noDenials(t)
	})

	t.Run("Watchdog", func(t *testing.T) {
		// Leases and heartbeats of 300 ms, renewed every 100 ms: held
		// and waited on for 3 leases, everything must have been renewed
		// (a fair waiter's and a semaphore waiter's heartbeats too).
		const lease = 300 * time.Millisecond
		cs := s.aclClients(t, "redisync", 2, redisync.WithCrashTimeout(lease), redisync.WithWaiterTimeout(lease))
		name := redistest.Name(t)
		holder, waiter := must(cs[0].NewMutex(name)), must(cs[1].NewMutex(name))
		sem, semWaiter := must(cs[0].NewSemaphore(name, 1)), must(cs[1].NewSemaphore(name, 1))
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := sem.Acquire(ctx, 1); err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 2)
		go func() { got <- waiter.Lock(ctx) }()
		go func() { got <- semWaiter.Acquire(ctx, 1) }()
		select {
		case <-holder.Lost():
			t.Fatal("the mutex's hold was lost: the watchdog could not renew it")
		case <-sem.Lost():
			t.Fatal("the semaphore's permit was lost: the watchdog could not renew it")
		case err := <-got:
			t.Fatalf("a waiter returned while the lock and the permit were held: %v", err)
		case <-time.After(3 * lease):
		}
		// The waiters are still queued, not dropped as dead.
		if n := waitingLen(t, s.admin, lockKey(name)); n != 1 {
			t.Errorf("%s:waiting has %d waiters, want 1", lockKey(name), n)
		}
		semQueue, _ := semKeys(name)
		if n := s.admin.ZCard(ctx, semQueue).Val(); n != 1 {
			t.Errorf("%s has %d waiters, want 1", semQueue, n)
		}
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := sem.Release(ctx, 1); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("a waiter did not get the lock or the permit within 10 s of its release")
			}
		}
		if err := waiter.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := semWaiter.Release(ctx, 1); err != nil {
			t.Fatal(err)
		}
		s.noDenials(t)
	})

	t.Run("Semaphore", func(t *testing.T) {
		cs := s.aclClients(t, "redisync", 3)
		name := redistest.Name(t)
		a, b, c := must(cs[0].NewSemaphore(name, 2)), must(cs[1].NewSemaphore(name, 2)), must(cs[2].NewSemaphore(name, 2))
		if err := a.Acquire(ctx, 2); err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() { got <- b.Acquire(ctx, 1) }()
		queue, _ := semKeys(name)
		eventually(t, 10*time.Second, "b to queue", func() bool { return s.admin.ZCard(ctx, queue).Val() == 1 })
		if ok, err := c.TryAcquire(ctx, 1); ok || err != nil {
			t.Fatalf("TryAcquire with no permit free: %v, %v; want false, nil", ok, err)
		}
		if err := a.Release(ctx, 1); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the queued Acquire did not get the permit released for it within 10 s")
		}
		for _, r := range []struct {
			s *redisync.Semaphore
			n int64
		}{{a, 1}, {b, 1}} {
			if err := r.s.Release(ctx, r.n); err != nil {
				t.Fatal(err)
			}
		}
		s.noDenials(t)
	})

	t.Run("Redlock", func(t *testing.T) {
		nodes := []aclServer{s, spawnACL(t), spawnACL(t)}
		for _, n := range nodes[1:] {
			n.setUser(t, "redisync", aclBase)
		}
		rls := make([]*redisync.Redlock, 2)
		for i := range rls {
			var rdbs []redis.UniversalClient
			for _, n := range nodes {
				rdbs = append(rdbs, n.client(t, "redisync"))
			}
			nc, err := redisync.NewRedlock(rdbs)
			if err != nil {
				t.Fatal(err)
			}
			rls[i] = nc
			rl := rls[i]
			t.Cleanup(func() { _ = rl.Close() })
		}
		name := redistest.Name(t)
		ls := []locker{must(rls[0].NewMutex(name)), must(rls[1].NewMutex(name)), must(rls[0].NewMutex(name)), must(rls[1].NewMutex(name))}
		increasing(t, contend(t, ls, 2*time.Millisecond, rounds(5)).tokens)
		for _, n := range nodes {
			n.noDenials(t)
		}
	})

	t.Run("WithReplicas", func(t *testing.T) {
		// No replica: WAIT runs and answers 0, hence ErrNotReplicated.
		s.setUser(t, "redisync-wait", aclBase, aclReplicas)
		c := s.aclClients(t, "redisync-wait", 1, redisync.WithReplicas(1, 20*time.Millisecond))[0]
		err := must(c.NewMutex(redistest.Name(t))).Lock(ctx)
		if !errors.Is(err, redisync.ErrNotReplicated) {
			t.Fatalf("Lock with WithReplicas and no replica: %v; want ErrNotReplicated", err)
		}
		s.noDenials(t)
	})
}

// TestACLWithoutARuleFails is the negative control: the same ACL with one
// rule less makes redisync fail (or, where the library does not report it,
// makes the ACL LOG record what TestACLUserCanUseEveryPrimitive checks).
func TestACLWithoutARuleFails(t *testing.T) {
	s := spawnACL(t)
	for _, tc := range []struct {
		drop, add string // rule dropped from aclBase, and one added
		denied    string // what the ACL LOG records
		lockFails bool   // whether an uncontended Lock fails
	}{
		{drop: "+time", denied: "command time (lua)", lockFails: true},
		// Scripts are sent only where functions may not be called.
		{drop: "+eval", add: "-fcall", denied: "command eval (toplevel)", lockFails: true},
		// A Client that may not call functions sends scripts: the lock
		// still works, and only the ACL LOG tells.
		{drop: "+fcall", denied: "command fcall (toplevel)"},
		{drop: "~redisync:*", add: "~other:*", denied: "key redisync:lock:{", lockFails: true},
		// Waiters fall back to looking every 250 ms: the lock still works,
		// and only the ACL LOG tells.
		{drop: "+subscribe", denied: "command subscribe (toplevel)"},
	} {
		t.Run("without "+tc.drop, func(t *testing.T) {
			rules := strings.Fields(aclBase)
			i := slices.Index(rules, tc.drop)
			if i < 0 {
				t.Fatalf("%s is not in the ACL", tc.drop)
			}
			rules = slices.Delete(rules, i, i+1)
			if tc.add != "" {
				rules = append(rules, tc.add)
			}
			s.setUser(t, "partial", strings.Join(rules, " "))
			if err := s.admin.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			cs := s.aclClients(t, "partial", 2)
			name := redistest.Name(t)
			m := must(cs[0].NewMutex(name))
			err := m.Lock(ctx)
			if tc.lockFails {
				if err == nil {
					t.Fatal("Lock succeeded")
				}
				if held := s.admin.Exists(ctx, "redisync:lock:{"+name+"}").Val(); held != 0 {
					t.Error("a failed Lock left the lock held")
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				waited := make(chan error, 1)
				w := must(cs[1].NewMutex(name))
				go func() { waited <- w.Lock(ctx) }()
				eventually(t, 10*time.Second, "the waiter to try to subscribe", func() bool { return len(s.denials(t)) > 0 })
				if err := m.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-waited:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the waiter did not get the lock within 10 s of its release")
				}
				if err := w.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			d := s.denials(t)
			if !strings.Contains(strings.Join(d, "\n"), tc.denied) {
				t.Errorf("ACL LOG %q, want an entry %q", d, tc.denied)
			}
			t.Logf("Lock: %v; ACL LOG: %q", err, d)
		})
	}
}

// TestACLCLI runs the redisync command as a user restricted to the
// library's ACL and the command's additions: a fair lock queued behind a
// holder, and status.
func TestACLCLI(t *testing.T) {
	s := spawnACL(t)
	s.setUser(t, "redisync", aclBase, aclCLI)
	bin := buildCLI(t)
	url := "redis://redisync@" + s.addr
	run := func(args ...string) *exec.Cmd {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "REDIS_URL="+url, "REDIS_ADDR=", "REDISYNC_PASSWORD="+aclPassword, "REDIS_PASSWORD=")
		return cmd
	}
	name := redistest.Name(t)

	out, err := run("lock", name, "--", "sh", "-c", `echo "token $REDISYNC_TOKEN"`).CombinedOutput()
	first, perr := strconv.ParseInt(strings.TrimPrefix(strings.TrimSpace(string(out)), "token "), 10, 64)
	if err != nil || perr != nil || !strings.HasPrefix(string(out), "token ") || first <= 0 {
		t.Fatalf("lock: %v, output %q; want a token and nothing else", err, out)
	}

	// Held by the library, as the same user: a fair lock from the command
	// queues behind it, status shows both, and the release hands it over.
	c := s.aclClients(t, "redisync", 1)[0]
	m := must(c.NewMutex(name))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr strings.Builder
	waiter := run("lock", name, "--", "sh", "-c", `echo "token $REDISYNC_TOKEN"`)
	waiter.Stdout, waiter.Stderr = &stdout, &stderr
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = waiter.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = waiter.Process.Kill()
			<-exited
		}
	})
	eventually(t, 10*time.Second, "the command to queue", func() bool { return waitingLen(t, s.admin, lockKey(name)) == 1 })

	out, err = run("status", name).Output()
	held := strconv.FormatInt(m.Token(), 10)
	if err != nil || m.Token() <= first || !regexp.MustCompile(`fencing token +`+held+`\n`).Match(out) {
		t.Errorf("status while held: %v, output %q; want exit 0 and the holder's token %s (above %d)", err, out, held, first)
	}
	before := m.Token()
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		got, perr := strconv.ParseInt(strings.TrimPrefix(strings.TrimSpace(stdout.String()), "token "), 10, 64)
		if waitErr != nil || perr != nil || got <= before || stderr.String() != "" {
			t.Errorf("queued lock: %v, stdout %q, stderr %q; want a token above %d", waitErr, stdout.String(), stderr.String(), before)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the queued command did not get the lock within 10 s of its release")
	}

	cmd := run("status", name)
	err = cmd.Run()
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 1 {
		t.Errorf("status of a free lock: %v; want exit 1", err)
	}
	s.noDenials(t)

	// Without NAME, status lists what is held, with SCAN.
	s.setUser(t, "redisync", aclBase, aclCLI, aclCLIList)
	m = must(s.aclClients(t, "redisync", 1)[0].NewMutex(name))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	out, err = run("status", "--all").Output()
	if err != nil || !regexp.MustCompile(`(?m)^lock +"`+regexp.QuoteMeta(name)+`" `).Match(out) {
		t.Errorf("status --all: %v, output %q; want the lock %s listed", err, out, name)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	s.noDenials(t)
}

// buildCLI builds the redisync command into a directory of the test's own
// and returns its path.
func buildCLI(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "redisync")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join("..", "cmd", "redisync")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/redisync: %v\n%s", err, out)
	}
	return bin
}

// TestACLCluster runs a fair Mutex and a Semaphore on a Redis Cluster as a
// user restricted to the library's ACL and the cluster's additions, on
// every node.
func TestACLCluster(t *testing.T) {
	cl := redistest.SpawnCluster(t, 3, 0)
	var admins []*redis.Client
	for _, addr := range cl.Addrs() {
		admin := redistest.NewClient(t, addr)
		s := aclServer{addr, admin}
		s.setUser(t, "redisync", aclBase, aclCluster)
		admins = append(admins, admin)
	}
	var cs []*redisync.Client
	for range 2 {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), Username: "redisync", Password: aclPassword})
		t.Cleanup(func() { _ = rdb.Close() })
		c, err := redisync.New(rdb)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		cs = append(cs, c)
	}
	for i := range 3 {
		name := fmt.Sprintf("%s-%d", redistest.Name(t), i) // likely on different primaries
		increasing(t, contend(t, mutexes(cs, name, 4), 2*time.Millisecond, rounds(5)).tokens)
	}
	name := redistest.Name(t)
	a, b := must(cs[0].NewSemaphore(name, 1)), must(cs[1].NewSemaphore(name, 1))
	if err := a.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- b.Acquire(ctx, 1) }()
	crdb := cl.NewClient(t)
	queue, _ := semKeys(name)
	eventually(t, 10*time.Second, "b to queue", func() bool { return crdb.ZCard(ctx, queue).Val() == 1 })
	if err := a.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the queued Acquire did not get the permit within 10 s of its release")
	}
	if err := b.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for _, admin := range admins {
		if d := denialsOf(t, admin); len(d) > 0 {
			t.Errorf("the ACL of %s refused: %q", admin.Options().Addr, d)
		}
	}
}

// TestACLDocumented checks that docs/acl.md shows the rules the tests
// above use, as they are.
func TestACLDocumented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "docs", "acl.md"))
	if err != nil {
		t.Fatal(err)
	}
	// As one line, without shell line continuations, quotes, and the
	// escapes of '|' in tables.
	doc := strings.NewReplacer("\\\n", " ", "'", "", "\\|", "|").Replace(string(b))
	doc = strings.Join(strings.Fields(doc), " ")
	for _, rules := range []string{aclBase, aclFunctionsOnly, aclReplicas, aclCluster, aclCLI, aclCLIList, aclIdentity} {
		if !strings.Contains(doc, rules) {
			t.Errorf("docs/acl.md does not show %q", rules)
		}
	}
}

// TestACLCoversEveryScriptCommand fails, without a Redis, when a script
// calls a command that the documented rules do not allow: a user who
// deployed those rules would have that script fail after an upgrade.
// (The channel's publish command is passed to the scripts as an argument;
// TestACLUserCanUseEveryPrimitive and TestACLCluster cover it.)
func TestACLCoversEveryScriptCommand(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "scripts", "*.lua"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts found: %v", err)
	}
	allowed := map[string]bool{}
	for _, rule := range strings.Fields(aclBase) {
		if cmd, ok := strings.CutPrefix(rule, "+"); ok {
			allowed[cmd] = true
		}
	}
	call := regexp.MustCompile(`redis\.p?call\('([A-Za-z]+)'`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range call.FindAllStringSubmatch(string(b), -1) {
			if cmd := strings.ToLower(m[1]); !allowed[cmd] {
				t.Errorf("%s calls %s, which docs/acl.md does not allow", filepath.Base(f), m[1])
			}
		}
	}
}
