package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redisinfo"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

func TestStatus(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redistest.Client(t)
	ctx := context.Background()
	name := uniqueName(t)
	keys := schema.LockKeys("redisync", name)

	// A free lock.
	code, p := runCode(t, addr, "status", "--json", name)
	var st Status
	if code != exitFree {
		t.Fatalf("exit %d, stderr %q", code, p.stderr.String())
	}
	if err := json.Unmarshal([]byte(p.stdout.String()), &st); err != nil || st.Lock.Held || st.Lock.Holder != nil || len(st.Lock.Queue) != 0 || st.Name != name {
		t.Fatalf("free lock: %+v, %v from %s", st, err, p.stdout.String())
	}

	// Held by the test, two redisync processes queued behind it in order.
	m := holdLock(t, name)
	holder, err := holdIDs(t, rdb, keys.Hash), error(nil)
	if err != nil || len(holder) != 1 {
		t.Fatalf("lock hash fields %q, %v", holder, err)
	}
	var waiters []*proc
	for i := range 2 {
		waiters = append(waiters, start(t, addr, "lock", name, "--", "true"))
		waitFor(t, "waiter "+strconv.Itoa(i+1)+" to queue", func() bool { return queueLen(t, name) == int64(i+1) })
	}
	records, err := rdb.LRange(ctx, keys.Queue, 0, -1).Result()
	if err != nil || len(records) != 2 {
		t.Fatalf("queue %q, %v", records, err)
	}
	var queue []string
	for _, r := range records {
		rec, ok := schema.ParseQueueRecord(r)
		if !ok {
			t.Fatalf("queue record %q", r)
		}
		queue = append(queue, rec.Ticket)
	}
	// And a plain one, which is not queued: its process is recorded and
	// subscribed to its own grant channel, as the fair ones are.
	waiters = append(waiters, start(t, addr, "lock", "--barging", name, "--", "true"))
	waitFor(t, "the plain waiter to subscribe", func() bool {
		return rdb.ZCard(ctx, keys.Bargers).Val() == 1 && len(rdb.PubSubChannels(ctx, keys.Channel+":*").Val()) == 3
	})

	code, p = runCode(t, addr, "status", "--json", name)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, p.stderr.String())
	}
	st = Status{}
	if err := json.Unmarshal([]byte(p.stdout.String()), &st); err != nil {
		t.Fatalf("%v in %s", err, p.stdout.String())
	}
	h := st.Lock.Holder
	if !st.Lock.Held || h == nil || h.Owner != holder[0] || h.Token != m.Token() || h.LeaseMS <= 0 || h.LeaseMS > 30000 {
		t.Errorf("holder %+v, want owner %s count 1 token %d and a lease", h, holder[0], m.Token())
	}
	// Labels say which process holds and waits: host/pid by default.
	host, _ := os.Hostname()
	if want := host + "/" + strconv.Itoa(os.Getpid()); h == nil || h.Label != want {
		t.Errorf("holder %+v, want the label %q", h, want)
	}
	for _, w := range st.Lock.Queue {
		if !strings.HasPrefix(w.Label, host+"/") || w.Label == h.Label {
			t.Errorf("waiter %+v: want the label of its own process on %s", w, host)
		}
	}
	if len(st.Lock.Queue) != 2 || st.Lock.SubscribedProcesses != 3 || st.Lock.BargingProcesses != 1 {
		t.Fatalf("queue %+v, %d waiting processes and %d barging, want 2 fair waiters, 3 processes and 1 barging",
			st.Lock.Queue, st.Lock.SubscribedProcesses, st.Lock.BargingProcesses)
	}
	for i, w := range st.Lock.Queue {
		if w.Position != i+1 || w.Owner != queue[i] || !w.Alive || w.HeartbeatMS <= 0 || w.HeartbeatMS > 3000 ||
			w.WaitedMS < 0 || w.WaitedMS > 60000 {
			t.Errorf("waiter %d: %+v, want owner %s, alive, heartbeat due within 3s, waiting less than a minute", i+1, w, queue[i])
		}
	}
	if q := st.Lock.Queue; len(q) == 2 && q[0].WaitedMS < q[1].WaitedMS {
		t.Errorf("the first waiter waited %d ms, less than the second's %d", q[0].WaitedMS, q[1].WaitedMS)
	}

	code, p = runCode(t, addr, "status", name)
	out := p.stdout.String()
	if code != 0 || !strings.Contains(out, holder[0]) || !regexp.MustCompile(`label +`+regexp.QuoteMeta(h.Label)+"\n").MatchString(out) || !strings.Contains(out, "2 waiting") || !strings.Contains(out, "3 process(es) (with waiters") ||
		strings.Index(out, queue[0]) > strings.Index(out, queue[1]) || !regexp.MustCompile(`fencing token +`+strconv.FormatInt(m.Token(), 10)+"\n").MatchString(out) {
		t.Errorf("exit %d, table:\n%s", code, out)
	}

	// Released: the waiters run, in turn.
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, w := range waiters {
		if code := w.wait(t); code != 0 {
			t.Errorf("waiter exit %d, stderr %q", code, w.stderr.String())
		}
	}
}

func TestStatusWrongType(t *testing.T) {
	addr := redistest.Addr(t)
	name := uniqueName(t)
	rdb, queue := redistest.Client(t), schema.LockKeys("redisync", name).Queue
	if err := rdb.Set(context.Background(), queue, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), queue) })
	code, p := runCode(t, addr, "status", name)
	if code != exitSoftware || !strings.Contains(p.stderr.String(), queue+" holds another type") {
		t.Errorf("exit %d, stderr %q; want %d", code, p.stderr.String(), exitSoftware)
	}
}

// Issue 17, point 3: status --watch is a live view that reads again and
// again, until interrupted.
func TestStatusWatch(t *testing.T) {
	addr := redistest.Addr(t)
	name := uniqueName(t)
	p := start(t, addr, "status", "--watch", "--json", "--interval", "20ms", name)
	readings := func() []Status {
		var out []Status
		for _, line := range strings.Split(p.stdout.String(), "\n") {
			var st Status
			if json.Unmarshal([]byte(line), &st) == nil && st.Name == name {
				out = append(out, st)
			}
		}
		return out
	}
	waitFor(t, "two readings of the free lock", func() bool { return len(readings()) >= 2 })
	if st := readings()[0]; st.Lock.Held {
		t.Fatalf("first reading %+v, want the lock free", st)
	}
	m := holdLock(t, name)
	waitFor(t, "a reading with the lock held", func() bool {
		r := readings()
		last := r[len(r)-1]
		return last.Lock.Held && last.Lock.Holder.Token == m.Token()
	})
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != exitOK {
		t.Errorf("exit %d after SIGINT, stderr %q", code, p.stderr.String())
	}
}

// Issue 19, point 8: status shows the metadata stored with a hold.
func TestStatusShowsMetadata(t *testing.T) {
	addr := redistest.Addr(t)
	name := uniqueName(t)
	holdLock(t, name, redisync.WithMetadata("deploy 42"))
	code, p := runCode(t, addr, "status", "--json", name)
	var st Status
	if err := json.Unmarshal([]byte(p.stdout.String()), &st); err != nil || code != 0 || st.Lock.Holder == nil || st.Lock.Holder.Metadata != "deploy 42" {
		t.Fatalf("exit %d, %v: %s", code, err, p.stdout.String())
	}
	if code, p = runCode(t, addr, "status", name); code != 0 || !regexp.MustCompile(`metadata +"deploy 42"\n`).MatchString(p.stdout.String()) {
		t.Errorf("exit %d, table:\n%s", code, p.stdout.String())
	}
}

// On a Redis Cluster, status counted the processes
// subscribed to a lock's channel both ways (PUBSUB NUMSUB and
// SHARDNUMSUB), since it cannot know whether the lock's users run with
// WithPlainPubSub. Through InspectLock it counts SHARDNUMSUB only: the
// waiters of a plain-pub/sub deployment (Redis Cluster before 7, or
// WithPlainPubSub) are shown as "0 process(es)". Later (CI at 984c03b):
// it asked only the node that serves the lock, but go-redis connects a
// plain subscriber to any node, so status counted it one time in three.
func TestStatusCountsPlainSubscribersOnCluster(t *testing.T) {
	cl := redistest.SpawnCluster(t, 3, 0)
	for _, barging := range []bool{true, false} {
		t.Run(fmt.Sprintf("barging=%v", barging), func(t *testing.T) {
			statusCountsPlainSubscriber(t, cl, barging)
		})
	}
	t.Run("on another node", func(t *testing.T) { statusCountsSubscriberElsewhere(t, cl) })
	t.Run("everything held", func(t *testing.T) { statusAllOnCluster(t, cl) })
	t.Run("verbose", func(t *testing.T) {
		st, err := readStatus(context.Background(), cl.NewClient(t), "redisync", uniqueName(t), true)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Servers) != 3 {
			t.Fatalf("status --verbose on a cluster of 3 primaries: servers %+v", st.Servers)
		}
		for _, s := range st.Servers {
			if s.Addr == "" || s.Mode != "cluster" || s.Role != "primary" || s.Version == "" {
				t.Fatalf("status --verbose on a cluster: server %+v, want a primary in cluster mode with its address", s)
			}
		}
	})
}

// TestStatusVerboseNamesTheServer: status --verbose names the server and
// its version as its INFO does (Valkey by its own version, not the Redis
// version it reports), in the table and in JSON.
func TestStatusVerboseNamesTheServer(t *testing.T) {
	addr := redistest.Addr(t)
	info, err := redistest.Client(t).Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := redisinfo.Parse(info)
	name := uniqueName(t)
	code, p := runCode(t, addr, "status", "--verbose", name)
	line := fmt.Sprintf("server %s %s (standalone primary)\n", want.Name, want.Version)
	if code != exitFree || !strings.HasPrefix(p.stdout.String(), line) {
		t.Fatalf("status --verbose: exit %d, output %q; want it to start with %q", code, p.stdout.String(), line)
	}
	code, p = runCode(t, addr, "status", "--verbose", "--json", name)
	var st Status
	if err := json.Unmarshal([]byte(p.stdout.String()), &st); err != nil || code != exitFree {
		t.Fatalf("status --verbose --json: exit %d, %v, %s", code, err, p.stdout.String())
	}
	if len(st.Servers) != 1 || st.Servers[0] != (ServerStatus{Name: want.Name, Version: want.Version, Mode: "standalone", Role: "primary"}) {
		t.Fatalf("status --verbose --json: servers %+v, want %s", st.Servers, want)
	}
}

// statusCountsSubscriberElsewhere subscribes to a lock's channel with
// plain pub/sub on a node that does not serve the lock, as go-redis may
// connect a plain subscriber, and checks that status counts it.
func statusCountsSubscriberElsewhere(t *testing.T, cl *redistest.Cluster) {
	crdb := cl.NewClient(t)
	ctx := context.Background()
	name := uniqueName(t)
	k := schema.LockKeys("redisync", name)
	primary := cl.PrimaryFor(t, crdb, k.Hash).Addr
	var other string
	for _, n := range cl.Nodes {
		if n.Addr != primary {
			other = n.Addr
			break
		}
	}
	node := redis.NewClient(&redis.Options{Addr: other})
	t.Cleanup(func() { _ = node.Close() })
	ps := node.Subscribe(ctx, k.Channel)
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(ctx); err != nil { // the confirmation
		t.Fatal(err)
	}
	st, err := readStatus(ctx, crdb, "redisync", name, false)
	if err != nil {
		t.Fatal(err)
	}
	if st.Lock.SubscribedProcesses != 1 {
		t.Errorf("status: %d subscribed processes; want 1 (a plain subscriber on %s, the lock on %s)",
			st.Lock.SubscribedProcesses, other, primary)
	}
}

// statusCountsPlainSubscriber has a waiter with plain pub/sub wait for a
// lock on cl, barging (on the lock's channel) or fair (on its grant
// channel), and checks that status counts its process.
func statusCountsPlainSubscriber(t *testing.T, cl *redistest.Cluster, barging bool) {
	crdb := cl.NewClient(t)
	ctx := context.Background()
	name := uniqueName(t)
	k := schema.LockKeys("redisync", name)
	opts := []redisync.Option{redisync.WithPlainPubSub()}
	if barging {
		opts = append(opts, redisync.Barging())
	}

	holder, err := redisync.New(crdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Close() })
	m := must(holder.NewMutex(name))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Unlock(ctx) }()

	waiter, err := redisync.New(cl.NewClient(t), append(opts, redisync.WithRecheck(time.Minute))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = waiter.Close() })
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- must(waiter.NewMutex(name)).Lock(lctx) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("waiter: %v", err)
		}
	}()

	// A plain subscriber may be connected to any node of the cluster
	// (PUBLISH reaches them all): wait until one node has it.
	waitFor(t, "the waiter to subscribe on a node", func() bool {
		var n atomic.Int64
		err := crdb.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error {
			n.Add(int64(len(node.PubSubChannels(ctx, k.Channel+"*").Val())))
			return nil
		})
		return err == nil && n.Load() == 1
	})

	st, err := readStatus(ctx, crdb, "redisync", name, false)
	if err != nil {
		t.Fatal(err)
	}
	if st.Lock.SubscribedProcesses != 1 {
		t.Errorf("status: %d subscribed processes; want 1 (the plain-pub/sub waiter)", st.Lock.SubscribedProcesses)
	}
}
