package redisync

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestOptionWhereItMeansNothing: one Option type serves every
// constructor; an option given where it means nothing is ErrInvalidOption
// from the constructor given it, before any call to Redis.
func TestOptionWhereItMeansNothing(t *testing.T) {
	_, rdb, cnt := newMini(t)
	c := newClient(t, rdb)
	r := newRedlock(t, []redis.UniversalClient{rdb})
	for _, tc := range []struct {
		what string
		call func() error
	}{
		{"Barging to a Semaphore", func() error { return errOf(c.NewSemaphore("s", 1, Barging())) }},
		{"Barging to a RWMutex", func() error { return errOf(c.NewRWMutex("rw", Barging())) }},
		{"Barging to an Election", func() error { return errOf(c.NewElection("e", Barging())) }},
		{"WithPlainPubSub to a Mutex", func() error { return errOf(c.NewMutex("m", WithPlainPubSub())) }},
		{"WithNodeTimeout to a Mutex", func() error { return errOf(c.NewMutex("m", WithNodeTimeout(time.Second))) }},
		{"WithMetadata to a Semaphore", func() error { return errOf(c.NewSemaphore("s", 1, WithMetadata("x"))) }},
		{"WithObserver to a RedMutex", func() error { return errOf(r.NewMutex("m", WithObserver(nil))) }},
		{"WithReplicas to a RedMutex", func() error { return errOf(r.NewMutex("m", WithReplicas(1, time.Second))) }},
		{"WithWaiterTimeout to a RedMutex", func() error { return errOf(r.NewMutex("m", WithWaiterTimeout(time.Second))) }},
		{"WithLabel to InspectLock", func() error { _, err := c.InspectLock(ctx, "m", WithLabel("x")); return err }},
		{"Barging to NewRedlock", func() error { _, err := NewRedlock([]redis.UniversalClient{rdb}, Barging()); return err }},
		{"WithNodeTimeout to New", func() error { _, err := New(rdb, WithNodeTimeout(time.Second)); return err }},
	} {
		if err := tc.call(); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", tc.what, err)
		} else if !strings.Contains(err.Error(), "means nothing") {
			t.Errorf("%s: %q does not say where the option means nothing", tc.what, err)
		}
	}
	if n := cnt.n.Load(); n != 0 {
		t.Errorf("%d commands reached Redis", n)
	}
	// Given to New, an option of the primitives is their default: a
	// Semaphore of a barging Client is as any other.
	barging := newClient(t, rdb, Barging(), WithMetadata("x"))
	s := must(barging.NewSemaphore("s", 1))
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatalf("a Semaphore of a Client given Barging: %v", err)
	}
	if err := s.Release(ctx, 1); err != nil {
		t.Fatal(err)
	}
}

// TestConstructorsRefuseBadInput: New refuses a bad client or option.
func TestConstructorsRefuseBadInput(t *testing.T) {
	_, rdb, cnt := newMini(t)
	var typedNil *redis.Client
	for _, tc := range []struct {
		what string
		rdb  redis.UniversalClient
		opts []Option
		want error
	}{
		{"nil client", nil, nil, ErrNilClient},
		{"typed nil client", typedNil, nil, ErrNilClient},
		{"bad lease", rdb, []Option{WithFixedLease(0)}, ErrInvalidOption},
		{"bad label", rdb, []Option{WithLabel("a b")}, ErrInvalidOption},
	} {
		if c, err := New(tc.rdb, tc.opts...); c != nil || !errors.Is(err, tc.want) {
			t.Errorf("New, %s: %v, %v; want nil, %v", tc.what, c, err, tc.want)
		}
	}
	c, err := New(rdb)
	if err != nil || c == nil {
		t.Fatalf("New of a good client: %v, %v", c, err)
	}
	_ = c.Close()
	if n := cnt.n.Load(); n != 0 {
		t.Errorf("%d commands sent", n)
	}
}

// TestDefaultCrashTimeout: the renewed lease is DefaultCrashTimeout.
func TestDefaultCrashTimeout(t *testing.T) {
	if d := defaultConfig().watchdog; d != DefaultCrashTimeout {
		t.Fatalf("default crash timeout %v, want %v", d, DefaultCrashTimeout)
	}
}

// documentedOptions are the options docs/options.md lists, in its order,
// with the default it gives each.
var documentedOptions = []struct {
	opt         Option
	what, deflt string
}{
	{WithCrashTimeout(time.Second), "how long a crashed holder keeps others out: the lease the watchdog renews every third of it", "15 s"},
	{WithFixedLease(time.Second), "a lease that is not renewed: the hold ends when it runs out (Extend lengthens it)", "renewed"},
	{WithMaxHold(time.Second), "stop renewing a hold this long after it was taken (a holder that hangs loses it)", "no cap"},
	{WithWaiterTimeout(time.Second), "how long a queued waiter whose process died keeps its place", "3 s"},
	{WithRecheck(time.Second), "the longest a waiter sleeps without a message", "10 s"},
	{Barging(), "take a free lock ahead of queued waiters (Redisson's unfair lock)", "fair"},
	{Fair(), "undo a Client's Barging for one Mutex", "fair"},
	{WithMaxWaiters(1), "the most calls queued for a lock: a Lock that would join more fails with ErrQueueFull", "10,000"},
	{WithMetadata(""), "a string stored with every hold, read by InspectLock and redisync status", "none"},
	{WithLabel("x"), "how hold ids start, to name the holder to people", "host/pid"},
	{WithKeyPrefix("x"), "the prefix of every key and channel", "redisync"},
	{WithReplicas(1, time.Second), "wait for n replicas to acknowledge every acquisition (WAIT)", "no wait"},
	{WithNodeTimeout(time.Second), "how long a Redlock round waits for one node", "lease/10, at most 500 ms"},
	{WithPlainPubSub(), "PUBLISH and SUBSCRIBE on a Redis Cluster, for servers before Redis 7", "sharded pub/sub"},
	{WithObserver(nil), "tell an Observer every call and background event (metrics, traces)", "none"},
	{WithLogger(nil), "log what an operator must see with log/slog", "none"},
	{WithConnSetup(nil), "run a function on each go-redis client of the Client's own connections (to add hooks)", "none"},
}

// optionsTable renders docs/options.md's table from the options' own
// places.
func optionsTable() string {
	var b strings.Builder
	b.WriteString("| option | what it sets | default |")
	for _, p := range places {
		b.WriteString(" " + p.name + " |")
	}
	b.WriteString("\n|---|---|---|" + strings.Repeat("---|", len(places)) + "\n")
	for _, o := range documentedOptions {
		s := o.opt.setting()
		fmt.Fprintf(&b, "| `%s` | %s | %s |", s.name, o.what, o.deflt)
		for _, p := range places {
			mark := ""
			if s.where&p.at != 0 {
				mark = "yes"
			}
			b.WriteString(" " + mark + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// TestOptionsDocumented: docs/options.md's table says where each option
// applies as the options themselves do.
func TestOptionsDocumented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("docs", "options.md"))
	if err != nil {
		t.Fatal(err)
	}
	if want := optionsTable(); !strings.Contains(string(b), want) {
		t.Fatalf("docs/options.md lacks the table of the options as they are; it should hold:\n\n%s", want)
	}
}

// TestEveryOptionDocumented: every exported function that returns an
// Option, but the deprecated ones, is in docs/options.md's table.
func TestEveryOptionDocumented(t *testing.T) {
	listed := map[string]bool{}
	for _, o := range documentedOptions {
		listed[o.opt.setting().name] = true
	}
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !fn.Name.IsExported() || fn.Type.Results == nil || len(fn.Type.Results.List) != 1 {
				continue
			}
			if id, ok := fn.Type.Results.List[0].Type.(*ast.Ident); !ok || id.Name != "Option" {
				continue
			}
			if fn.Doc != nil && strings.Contains(fn.Doc.Text(), "Deprecated:") {
				continue
			}
			if !listed[fn.Name.Name] {
				t.Errorf("%s (%s) is not in documentedOptions, nor in docs/options.md", fn.Name.Name, name)
			}
		}
	}
}
