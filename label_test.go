package redisync

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// Issue 19, point 4: a hold says which process holds it. Every hold id
// starts with the label: "host/pid" by default, the Client's WithLabel, or
// a value's own.
func TestLabelsIdentifyHolders(t *testing.T) {
	mr, rdb, _ := newMini(t)
	host, _ := os.Hostname()
	def := host + "/" + strconv.Itoa(os.Getpid()) + "/"
	fields := func(key string) []string { return holdIDs(t, mr, key) }
	m := must(newClient(t, rdb).NewMutex("a"))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if f := fields("redisync:lock:{a}"); len(f) != 1 || !strings.HasPrefix(f[0], def) {
		t.Errorf("hold ids %q, want one starting with %q", f, def)
	}

	c := newClient(t, rdb, WithLabel("billing-cron"))
	b := must(c.NewMutex("b"))
	own := must(c.NewMutex("c", WithLabel("web-3/worker-7")))
	s := must(c.NewSemaphore("s", 2))
	for _, x := range []*Mutex{b, own} {
		if err := x.Lock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{
		"redisync:lock:{b}": "billing-cron/",
		"redisync:lock:{c}": "web-3/worker-7/",
		"redisync:sem:{s}":  "billing-cron/",
	} {
		if f := fields(key); len(f) != 1 || !strings.HasPrefix(f[0], want) {
			t.Errorf("%s: hold ids %q, want one starting with %q", key, f, want)
		}
	}
}

// The default label keeps to what a label may hold, however the host is
// named.
func TestDefaultLabelIsValid(t *testing.T) {
	if l := defaultLabel(); checkLabel(l) != "" {
		t.Fatalf("default label %q: %s", l, checkLabel(l))
	}
}
