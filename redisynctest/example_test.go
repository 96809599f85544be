package redisynctest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redisync/redisync"
	"github.com/redisync/redisync/redisynctest"
)

// runJob is the user's code under test: it takes the lock "nightly", then
// works in steps until done, and stops as soon as the lock is lost, for
// then another process may run the job too.
func runJob(ctx context.Context, c *redisync.Client, steps int, step func(i int)) error {
	m, err := c.NewMutex("nightly")
	if err != nil {
		return err
	}
	if err := m.Lock(ctx); err != nil {
		return err
	}
	defer func() { _ = m.Unlock(context.Background()) }()
	for i := range steps {
		select {
		case <-m.Lost():
			return fmt.Errorf("stopped after %d steps: %w", i, redisync.ErrLockLost)
		default:
		}
		step(i)
	}
	return nil
}

// testNightlyJob is a test of runJob, as a test file would have it (func
// TestNightlyJob(t *testing.T)): the job must stop when its lock is lost,
// and another process must get the lock at once, not after the crash
// timeout.
func testNightlyJob(t testing.TB) {
	kit := redisynctest.New(t)
	a, b := kit.Client(), kit.Client() // two processes running the job

	ctx := context.Background()
	started := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- runJob(ctx, a, 1000, func(i int) {
			if i == 3 {
				close(started)
			}
			time.Sleep(time.Millisecond)
		})
	}()
	<-started

	// Process b waits for the lock; then a's lease ends, as if a had
	// stalled for longer than the crash timeout.
	second := make(chan error, 1)
	go func() { second <- runJob(ctx, b, 1, func(int) {}) }()
	time.Sleep(50 * time.Millisecond) // b queues
	kit.EndLease("nightly")

	if err := <-first; !errors.Is(err, redisync.ErrLockLost) {
		t.Errorf("the first job: %v, want ErrLockLost", err)
	}
	if err := <-second; err != nil {
		t.Errorf("the second job: %v", err)
	}
	fmt.Println("the first job stopped, the second ran")
}

func Example() {
	t := &exampleT{}
	defer t.finish()
	testNightlyJob(t)
	// Output:
	// the first job stopped, the second ran
}

// exampleT stands in for the *testing.T that go test gives a test, which
// an example has not: it runs the cleanups when the example ends, and
// panics where a test would fail.
type exampleT struct {
	testing.TB
	cleanups []func()
}

func (t *exampleT) Helper()                           {}
func (t *exampleT) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (t *exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

func (t *exampleT) finish() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
