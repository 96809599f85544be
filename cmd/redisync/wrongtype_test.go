package main

import (
	"context"
	"strings"
	"testing"

	"github.com/redisync/redisync/internal/redistest"
	"github.com/redisync/redisync/internal/schema"
)

// TestWrongTypeNamesTheKeyOnce: a plain string where lock, sem or elect
// keeps its state fails the command with 70 and a message that names the
// primitive once and the key of the wrong type once.
func TestWrongTypeNamesTheKeyOnce(t *testing.T) {
	addr := redistest.Addr(t)
	rdb := redistest.Client(t)
	name := uniqueName(t)
	quoted := `"` + name + `"`
	cases := []struct {
		key  string
		args []string
	}{
		{schema.LockKeys("redisync", name).Hash, []string{"lock", name, "--", "true"}},
		{schema.LockKeys("redisync", name).Hash + ":token", []string{"lock", "-n", name, "--", "true"}}, // layout 2's, read once
		{schema.SemaphoreKeys("redisync", name).Hash, []string{"sem", "--limit", "2", name, "--", "true"}},
		{schema.ElectionKeys("redisync", name).Hash, []string{"elect", name, "--", "true"}},
	}
	for _, c := range cases {
		ctx := context.Background()
		if err := rdb.Set(ctx, c.key, "not redisync's", 0).Err(); err != nil {
			t.Fatal(err)
		}
		code, p := runCode(t, addr, c.args...)
		if err := rdb.Del(ctx, c.key).Err(); err != nil {
			t.Fatal(err)
		}
		s := p.stderr.String()
		if code != exitSoftware || strings.Count(s, c.key) != 1 || strings.Count(s, quoted) != 1 || !strings.Contains(s, "wrong type") {
			t.Errorf("%q with a string at %s: exit %d, stderr %q; want %d and a message naming %s once and the key once",
				c.args, c.key, code, s, exitSoftware, quoted)
		}
	}
}
