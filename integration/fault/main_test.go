// Package fault is redisync's fault-tolerance suite: real processes killed
// and paused, Redis killed and restarted, connections reset, delayed and
// blackholed, a replica promoted, and bad input. Each test states how it
// would fail. See docs/guarantees.md for the claims they back.
package fault

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/redisync/redisync/integration/internal/container"
	"github.com/redisync/redisync/internal/redistest"
	"go.uber.org/goleak"
)

// holderBin is the path of the holder helper binary, built once by TestMain.
var holderBin string

func TestMain(m *testing.M) { goleak.VerifyTestMain(withHolder{redistest.Main(m, container.Redis)}) }

// withHolder builds the holder helper before the tests run.
type withHolder struct{ inner interface{ Run() int } }

func (w withHolder) Run() int {
	dir, err := os.MkdirTemp("", "redisync-fault-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	holderBin = filepath.Join(dir, "holder")
	build := exec.Command("go", "build", "-o", holderBin, "./internal/holder")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the holder helper:", err)
		return 1
	}
	return w.inner.Run()
}
