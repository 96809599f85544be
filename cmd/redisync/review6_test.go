package main

import (
	"testing"

	"github.com/redisync/redisync/internal/redistest"
)

// Review 6: "sem --resize M takes a size M >= 1 and no command", but the
// check is *resize < 0 || (*resize > 0 && argv != nil): --resize 0 passes
// it and is then ignored (the resize branch runs only for *resize > 0),
// so "sem --limit 2 --resize 0 NAME -- CMD" takes a permit and runs CMD
// instead of failing with a usage error (a typo in a resize runs the
// job, or holds a permit until signalled when no CMD is given).
func TestReview6SemResizeZeroIsNotAUsageError(t *testing.T) {
	addr := redistest.Addr(t)
	name := uniqueName(t)
	if code, p := runCode(t, addr, "sem", "--limit", "2", "--resize", "0", name, "--", "true"); code != exitUsage {
		t.Fatalf("sem --resize 0 with a command: exit %d, want %d (usage); stdout %q, stderr %q",
			code, exitUsage, p.stdout.String(), p.stderr.String())
	}
}
