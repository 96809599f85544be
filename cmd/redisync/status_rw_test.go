package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

func TestStatusRWMutex(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redistest.Client(t)
	ctx := context.Background()
	name := uniqueName(t)
	c, err := redisync.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r1, r2, w := must(c.NewRWMutex(name)), must(c.NewRWMutex(name)), must(c.NewRWMutex(name))
	for _, r := range []*redisync.RWMutex{r1, r2} {
		if err := r.RLock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- w.Lock(ctx) }()
	queue := schema.RWMutexKeys("redisync", name).Queue
	waitFor(t, "the writer to queue", func() bool { return rdb.ZCard(ctx, queue).Val() == 1 })

	code, p := runCode(t, addr, "status", "--json", name)
	var st Status
	if err := json.Unmarshal([]byte(p.stdout.String()), &st); code != 0 || err != nil {
		t.Fatalf("exit %d, %v in %s", code, err, p.stdout.String())
	}
	rw := st.RWMutex
	if rw == nil || rw.Writer != nil || len(rw.Readers) != 2 || rw.ReadersLen != 2 || len(rw.Queue) != 1 || !rw.Queue[0].Write || !rw.Queue[0].Alive {
		t.Fatalf("rwmutex %+v, want 2 readers and a writer queued", rw)
	}
	code, p = runCode(t, addr, "status", name)
	if out := p.stdout.String(); code != 0 || !strings.Contains(out, `rwmutex "`+name+`"`) || !strings.Contains(out, "readers") ||
		!strings.Contains(out, "write") || strings.Contains(out, `lock "`) {
		t.Errorf("exit %d, table:\n%s", code, out)
	}

	for _, r := range []*redisync.RWMutex{r1, r2} {
		if err := r.RUnlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the writer did not get in")
	}
	code, p = runCode(t, addr, "status", name)
	if out := p.stdout.String(); code != 0 || !strings.Contains(out, "writer ") {
		t.Errorf("exit %d, table:\n%s", code, out)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if code, p = runCode(t, addr, "status", name); code != exitFree {
		t.Errorf("free: exit %d, stdout:\n%s", code, p.stdout.String())
	}
}
