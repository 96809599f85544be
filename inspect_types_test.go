package redisync

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/schema"
)

// InspectRWMutex describes a read-write lock as one: its writer, its
// readers and its queue of readers and writers, each marked read or write.
func TestInspectRWMutexWriterReadersAndQueue(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)

	st, err := c.InspectRWMutex(ctx, "rw")
	if err != nil {
		t.Fatal(err)
	}
	if !st.Empty() || st.Held() || st.Writer != nil || st.Name != "rw" {
		t.Fatalf("a lock never taken: %+v", st)
	}

	w := must(c.NewRWMutex("rw", WithLabel("writer")))
	if err := w.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// Queued behind the write: a reader, a writer, a reader.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r1, w2, r3 := must(c.NewRWMutex("rw", WithLabel("reader-1"))), must(c.NewRWMutex("rw", WithLabel("writer-2"))), must(c.NewRWMutex("rw", WithLabel("reader-3")))
	calls := []func(context.Context) error{r1.RLock, w2.Lock, r3.RLock}
	done := make([]<-chan error, len(calls))
	for i, call := range calls {
		done[i] = async(func() error { return call(wctx) })
		eventually(t, 5*time.Second, "the waiter to queue", func() bool {
			st, err := c.InspectRWMutex(ctx, "rw")
			return err == nil && st.QueueLen == i+1
		})
	}
	st, err = c.InspectRWMutex(ctx, "rw")
	if err != nil {
		t.Fatal(err)
	}
	if wr := st.Writer; wr == nil || wr.Label != "writer" || !strings.HasPrefix(wr.ID, "writer/") || wr.Lease <= 0 || wr.Lease > 30*time.Second {
		t.Fatalf("writer %+v, want writer's hold", wr)
	}
	if len(st.Readers) != 0 || st.ReadersLen != 0 || !st.Held() || st.Empty() {
		t.Fatalf("readers %+v (%d) under a write, held %v, empty %v", st.Readers, st.ReadersLen, st.Held(), st.Empty())
	}
	labels, writes := []string{"reader-1", "writer-2", "reader-3"}, []bool{false, true, false}
	if len(st.Queue) != 3 || st.QueueLen != 3 {
		t.Fatalf("queue %+v (%d), want 3 waiters", st.Queue, st.QueueLen)
	}
	for i, q := range st.Queue {
		if q.Label != labels[i] || q.Write != writes[i] || !strings.HasPrefix(q.Holder, labels[i]+"/") ||
			!strings.HasPrefix(q.ID, q.Holder+"#") || !q.Alive || q.Heartbeat <= 0 || q.Waited < 0 {
			t.Errorf("waiter %d: %+v, want %s (write %v)", i, q, labels[i], writes[i])
		}
	}

	// The write ends: the reader at the head reads, the writer behind it
	// waits, and the reader behind the writer too.
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done[0]; err != nil {
		t.Fatal(err)
	}
	st, err = c.InspectRWMutex(ctx, "rw")
	if err != nil {
		t.Fatal(err)
	}
	if st.Writer != nil || len(st.Readers) != 1 || st.ReadersLen != 1 || st.Readers[0].Label != "reader-1" ||
		st.Readers[0].Lease <= 0 || !st.Held() {
		t.Fatalf("writer %+v, readers %+v (%d); want reader-1 reading", st.Writer, st.Readers, st.ReadersLen)
	}
	if len(st.Queue) != 2 || !st.Queue[0].Write || st.Queue[0].Label != "writer-2" || st.Queue[1].Write || st.Queue[1].Label != "reader-3" {
		t.Fatalf("queue %+v, want writer-2 then reader-3", st.Queue)
	}
	cancel()
	for _, d := range done[1:] {
		if err := <-d; !errors.Is(err, context.Canceled) {
			t.Errorf("a waiter cancelled: %v", err)
		}
	}
	if err := r1.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// InspectElection describes an election as one: its leader with its
// value, token and lease, and its candidates with theirs.
func TestInspectElectionLeaderAndCandidates(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)

	st, err := c.InspectElection(ctx, "sched")
	if err != nil {
		t.Fatal(err)
	}
	if !st.Empty() || st.Leader != nil || st.Name != "sched" {
		t.Fatalf("an election never held: %+v", st)
	}

	a := must(c.NewElection("sched", WithLabel("node-a")))
	if err := a.Campaign(ctx, "10.0.0.1"); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b, cc := must(c.NewElection("sched", WithLabel("node-b"))), must(c.NewElection("sched", WithLabel("node-c")))
	won := async(func() error { return b.Campaign(wctx, "10.0.0.2") })
	eventually(t, 5*time.Second, "b to queue", func() bool {
		st, err := c.InspectElection(ctx, "sched")
		return err == nil && st.CandidatesLen == 1
	})
	lost := async(func() error { return cc.Campaign(wctx, "10.0.0.3") })
	eventually(t, 5*time.Second, "c to queue", func() bool {
		st, err := c.InspectElection(ctx, "sched")
		return err == nil && st.CandidatesLen == 2
	})
	if err := a.Proclaim(ctx, "10.0.0.1:9090"); err != nil {
		t.Fatal(err)
	}

	st, err = c.InspectElection(ctx, "sched")
	if err != nil {
		t.Fatal(err)
	}
	l := st.Leader
	if l == nil || l.Label != "node-a" || !strings.HasPrefix(l.ID, "node-a/") || l.Value != "10.0.0.1:9090" ||
		l.Token != a.Token() || l.Token == 0 || st.LastToken != a.Token() || l.Lease <= 0 || l.Lease > 30*time.Second || st.Empty() {
		t.Fatalf("leader %+v (last token %d), want node-a with its value and token %d", l, st.LastToken, a.Token())
	}
	labels, values := []string{"node-b", "node-c"}, []string{"10.0.0.2", "10.0.0.3"}
	if len(st.Candidates) != 2 {
		t.Fatalf("candidates %+v, want b then c", st.Candidates)
	}
	for i, cd := range st.Candidates {
		if cd.Label != labels[i] || !strings.HasPrefix(cd.ID, labels[i]+"/") || cd.Value != values[i] ||
			!cd.Alive || cd.Heartbeat <= 0 || cd.HandoffLease <= 0 || cd.Waited < 0 {
			t.Errorf("candidate %d: %+v, want %s with %q", i, cd, labels[i], values[i])
		}
	}

	// a resigns: b leads, with a later token; c still waits.
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-won; err != nil {
		t.Fatal(err)
	}
	st, err = c.InspectElection(ctx, "sched")
	if err != nil {
		t.Fatal(err)
	}
	if l := st.Leader; l == nil || l.Label != "node-b" || l.Value != "10.0.0.2" || l.Token != b.Token() || l.Token <= a.Token() ||
		st.CandidatesLen != 1 || len(st.Candidates) != 1 || st.Candidates[0].Label != "node-c" {
		t.Fatalf("after a resigned: leader %+v, candidates %+v", st.Leader, st.Candidates)
	}
	cancel()
	if err := <-lost; !errors.Is(err, context.Canceled) {
		t.Errorf("c cancelled: %v", err)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// Only WithKeyPrefix applies to the Inspect functions: any other option
// is ErrInvalidOption.
func TestInspectTakesOnlyTheKeyPrefix(t *testing.T) {
	_, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	inspect := map[string]func(opts ...Option) error{
		"InspectLock":      func(opts ...Option) error { _, err := c.InspectLock(ctx, "x", opts...); return err },
		"InspectSemaphore": func(opts ...Option) error { _, err := c.InspectSemaphore(ctx, "x", opts...); return err },
		"InspectRWMutex":   func(opts ...Option) error { _, err := c.InspectRWMutex(ctx, "x", opts...); return err },
		"InspectElection":  func(opts ...Option) error { _, err := c.InspectElection(ctx, "x", opts...); return err },
	}
	for name, f := range inspect {
		if err := f(WithKeyPrefix("app")); err != nil {
			t.Errorf("%s with WithKeyPrefix: %v", name, err)
		}
		for _, o := range []Option{WithLabel("x"), WithMetadata("m"), WithFixedLease(time.Second)} {
			if err := f(o); !errors.Is(err, ErrInvalidOption) {
				t.Errorf("%s with %s: %v, want ErrInvalidOption", name, o.setting().name, err)
			}
		}
	}
}

// An Inspect function's error names the primitive it was asked about,
// not the one whose keys it is stored as.
func TestInspectErrorsNameThePrimitive(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	if err := mr.Set(schema.ElectionKeys("redisync", "e").Hash, "a string"); err != nil {
		t.Fatal(err)
	}
	mr.HSet(schema.RWMutexKeys("redisync", "rw").Hash, "{size}", "five")
	if _, err := c.InspectElection(ctx, "e"); !errors.Is(err, ErrWrongType) || !strings.Contains(err.Error(), `inspect election "e"`) {
		t.Errorf("InspectElection of a string: %v, want ErrWrongType naming the election", err)
	}
	if _, err := c.InspectRWMutex(ctx, "rw"); !errors.Is(err, ErrWrongType) || !strings.Contains(err.Error(), `inspect rwmutex "rw"`) {
		t.Errorf("InspectRWMutex of a bad size: %v, want ErrWrongType naming the read-write lock", err)
	}
}

// The Inspect types show no storage detail: no exported count of permits
// that a write takes, no hold count that is always 1.
func TestInspectTypesHideTheLayout(t *testing.T) {
	if _, ok := reflect.TypeFor[LockHolder]().FieldByName("Count"); ok {
		t.Error("LockHolder has a Count")
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, s := range g.Specs {
				if v, ok := s.(*ast.ValueSpec); ok {
					for _, id := range v.Names {
						if id.Name == "RWMutexWrite" {
							t.Errorf("%s exports RWMutexWrite", fset.Position(id.Pos()))
						}
					}
				}
			}
		}
	}
}
