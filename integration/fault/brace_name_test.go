package fault

import (
	"errors"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/redistest"
)

// A name starting with '}' is rejected up front with
// ErrInvalidName, before any command reaches Redis (its keys would not
// share a hash slot: CROSSSLOT on a cluster).
func TestBraceNameRejected(t *testing.T) {
	for _, tc := range []struct{ label, prefix string }{{"close-brace", "}"}, {"close-brace-abc", "}abc"}} {
		t.Run(tc.label, func(t *testing.T) {
			addr := redistest.Addr(t)
			rdb := redistest.NewClient(t, addr)
			name := tc.prefix + redistest.Name(t)
			t.Cleanup(func() {
				for _, k := range []string{lockKey(name), semKey(name), semKey(name) + ":expiry", semKey(name) + ":size"} {
					rdb.Del(ctx, k)
				}
			})
			crdb := redistest.NewClient(t, addr)
			if err := crdb.Ping(ctx).Err(); err != nil { // a live connection, before counting
				t.Fatal(err)
			}
			hook := &countingHook{}
			crdb.AddHook(hook)
			c, err := redisync.New(crdb, withHook(hook))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			for _, op := range []struct {
				name string
				call func() error
			}{
				{"NewMutex", func() error { _, err := c.NewMutex(name); return err }},
				{"NewSemaphore", func() error { _, err := c.NewSemaphore(name, 2); return err }},
				{"NewRWMutex", func() error { _, err := c.NewRWMutex(name); return err }},
				{"NewElection", func() error { _, err := c.NewElection(name); return err }},
			} {
				err := within(t, 5*time.Second, op.name, op.call)
				if !errors.Is(err, redisync.ErrInvalidName) {
					t.Errorf("%s(%q): %v, want ErrInvalidName", op.name, name, err)
				}
			}
			if n := hook.cmds.Load(); n != 0 {
				t.Errorf("%d commands reached Redis for the name %q", n, name)
			}
		})
	}
}
