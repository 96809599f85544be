package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
)

// releaseTimeout bounds the release after the command exited.
const releaseTimeout = 5 * time.Second

// forwarded are the signals that redisync passes on to the command (and
// that cancel the wait before the command starts).
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// signalError says that a signal interrupted redisync.
type signalError struct{ sig os.Signal }

func (e *signalError) Error() string { return "interrupted by " + signalName(e.sig) }

// code is the shell's exit code for the signal: 128+N.
func (e *signalError) code() int {
	if s, ok := e.sig.(syscall.Signal); ok {
		return exitSignal + int(s)
	}
	return exitSignal + int(syscall.SIGINT)
}

// signalName returns "SIGTERM" and the like.
func signalName(sig os.Signal) string {
	switch sig {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	case syscall.SIGQUIT:
		return "SIGQUIT"
	case syscall.SIGKILL:
		return "SIGKILL"
	}
	return sig.String()
}

// hold is what the command runs under: a held lock, or held permits.
type hold struct {
	line    string                      // printed when there is no command: key and token or permits
	desc    string                      // for messages: `lock "jobs" (token 7)`
	plural  bool                        // desc is plural: "permits ... were lost"
	env     []string                    // added to the command's environment
	lost    <-chan struct{}             // closed when the hold is lost
	release func(context.Context) error // wraps redisync.ErrLockLost when it was lost
	close   func()                      // closes the redisync Client
}

// was returns the verb "was" agreeing with h.desc.
func (h *hold) was() string {
	if h.plural {
		return "were"
	}
	return "was"
}

// it returns the pronoun "it" agreeing with h.desc.
func (h *hold) it() string {
	if h.plural {
		return "they"
	}
	return "it"
}

// exitCodes are redisync's own exit codes for the ends of a job that are
// not the command's: --busy-exit, --timeout-exit and --lost-exit.
type exitCodes struct {
	busy    int // --no-wait found it taken
	timeout int // --wait ran out
	lost    int // the hold was lost while the command ran or the hold was kept
}

// job is one run of lock, sem or elect: acquire, run the command,
// release.
type job struct {
	what    string // `lock "jobs"`, for messages
	name    string // NAME, as the library's messages quote it
	target  target
	wait    time.Duration // 0: forever
	grace   time.Duration // between SIGTERM and SIGKILL when the hold is lost
	verbose bool
	argv    []string
	codes   exitCodes
	// acquire creates a redisync Client on rdb and blocks until the
	// hold is acquired or ctx ends. It closes what it created on error.
	acquire func(ctx context.Context, rdb redis.UniversalClient) (*hold, error)
	// holders describes who holds, for --verbose: "" when free.
	holders func(ctx context.Context, rdb redis.UniversalClient) string
	// explain, if set, returns a better message than err's for a failed
	// acquire (naming the key of the wrong type, the way out of a size
	// mismatch), or "" to keep err's.
	explain func(ctx context.Context, rdb redis.UniversalClient, err error) string
}

// execute runs j and returns redisync's exit code.
func (j *job) execute() int {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	rdb, h, code := j.acquirePhase(sigs)
	if h == nil {
		return code
	}
	defer func() { _ = rdb.Close() }()
	defer h.close()
	if len(j.argv) == 0 {
		return j.holdPhase(h, sigs)
	}
	return j.runPhase(h, sigs)
}

// holdPhase prints h.line and holds h until a signal (then releases it
// and returns 0) or its loss (76).
func (j *job) holdPhase(h *hold, sigs <-chan os.Signal) int {
	fmt.Fprintln(os.Stdout, h.line)
	select {
	case sig := <-sigs:
		if err := j.release(h); err != nil {
			return errorf(j.codes.lost, "%s: %s", h.desc, libMessage(err, j.name))
		}
		if j.verbose {
			fmt.Fprintf(os.Stderr, "redisync: released %s on %s\n", h.desc, signalName(sig))
		}
		return exitOK
	case <-h.lost:
		_ = j.release(h)
		return errorf(j.codes.lost, "%s %s LOST (lease ran out, key removed, or Redis unreachable)", h.desc, h.was())
	}
}

// acquirePhase connects and waits for the hold, until a signal or --wait
// ends the wait. It returns the hold, or nil and the exit code.
func (j *job) acquirePhase(sigs <-chan os.Signal) (redis.UniversalClient, *hold, int) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case sig := <-sigs:
			cancel(&signalError{sig})
		case <-stop:
		}
	}()
	stopWatch := func() { close(stop); wg.Wait() }

	rdb, err := connect(ctx, j.target)
	if err != nil {
		stopWatch()
		return nil, nil, connectExit(err)
	}
	wctx, wcancel := ctx, context.CancelFunc(func() {})
	if j.wait > 0 {
		wctx, wcancel = context.WithTimeout(ctx, j.wait)
	}
	defer wcancel()
	if j.verbose && j.holders != nil {
		if who := j.holders(wctx, rdb); who != "" {
			fmt.Fprintf(os.Stderr, "redisync: %s is %s; waiting\n", j.what, who)
		}
	}
	start := time.Now()
	h, err := j.acquire(wctx, rdb)
	stopWatch()

	var se *signalError
	sigErr := errors.As(context.Cause(ctx), &se)
	switch {
	case err == nil && sigErr:
		// The signal came just as the hold was granted.
		j.release(h)
		h.close()
	case err == nil:
		if j.verbose {
			fmt.Fprintf(os.Stderr, "redisync: acquired %s after %v\n", h.desc, time.Since(start).Round(time.Millisecond))
		}
		return rdb, h, exitOK
	}
	defer func() { _ = rdb.Close() }()
	switch {
	case sigErr:
		return nil, nil, errorf(se.code(), "%v while waiting for %s; left nothing queued", se, j.what)
	case errors.Is(err, errBusy):
		return nil, nil, errorf(j.codes.busy, "%s is taken (--no-wait)", j.what)
	case errors.Is(err, context.DeadlineExceeded) && ended(wctx, err):
		return nil, nil, errorf(j.codes.timeout, "timed out after %v (--wait) waiting for %s", j.wait, j.what)
	}
	return nil, nil, errorf(errorCode(err), "cannot acquire %s: %s", j.what, j.message(rdb, err))
}

// message describes err, the failure of an acquire on rdb, for the
// message that names j.what already: by explain, or by the library's
// message without its own prefix.
func (j *job) message(rdb redis.UniversalClient, err error) string {
	if j.explain != nil {
		ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
		defer cancel()
		if s := j.explain(ctx, rdb, err); s != "" {
			return s
		}
	}
	return libMessage(err, j.name)
}

// runPhase runs the command under h and returns redisync's exit code.
func (j *job) runPhase(h *hold, sigs <-chan os.Signal) int {
	c, err := startChild(j.argv, append(os.Environ(), h.env...))
	if err != nil {
		j.release(h)
		code := exitCannotRun
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			code = exitNotFound
		}
		return errorf(code, "cannot run %s: %v", j.argv[0], err)
	}
	done := make(chan error, 1)
	go func() { done <- c.wait() }()

	lost := h.lost
	wasLost := false
	var kill *time.Timer
	var killC <-chan time.Time
	defer func() {
		if kill != nil {
			kill.Stop()
		}
	}()
	for {
		select {
		case err := <-done:
			return j.finish(h, c.cmd, err, wasLost)
		case sig := <-sigs:
			if sentByTerminal(sig) {
				continue // the command, in our process group, got it too
			}
			if j.verbose {
				fmt.Fprintf(os.Stderr, "redisync: passing %s on to pid %d\n", signalName(sig), c.pid)
			}
			_ = c.signal(sig)
		case <-lost:
			lost, wasLost = nil, true
			fmt.Fprintf(os.Stderr, "redisync: %s %s LOST while the command ran (lease ran out, key removed, or Redis unreachable); sending SIGTERM to pid %d\n", h.desc, h.was(), c.pid)
			_ = c.signal(syscall.SIGTERM)
			kill = time.NewTimer(j.grace)
			killC = kill.C
		case <-killC:
			killC = nil
			fmt.Fprintf(os.Stderr, "redisync: pid %d still running %v after SIGTERM (--grace); sending SIGKILL\n", c.pid, j.grace)
			_ = c.signal(syscall.SIGKILL)
		}
	}
}

// finish releases h after the command exited with waitErr and returns
// redisync's exit code.
func (j *job) finish(h *hold, cmd *exec.Cmd, waitErr error, wasLost bool) int {
	code := childExitCode(waitErr)
	rerr := j.release(h)
	switch {
	case wasLost:
		return errorf(j.codes.lost, "exiting with %d: %s %s lost while the command ran (the command %s)", j.codes.lost, h.desc, h.was(), describeExit(cmd, code))
	case errors.Is(rerr, redisync.ErrLockLost):
		return errorf(j.codes.lost, "%s %s lost before the command finished (found on release; the command %s): other holders may have run alongside it", h.desc, h.was(), describeExit(cmd, code))
	case rerr != nil:
		fmt.Fprintf(os.Stderr, "redisync: warning: cannot release %s: %s; %s will be freed when the lease runs out\n", h.desc, libMessage(rerr, j.name), h.it())
	case j.verbose:
		fmt.Fprintf(os.Stderr, "redisync: released %s; the command %s\n", h.desc, describeExit(cmd, code))
	}
	return code
}

// release releases h, bounded by releaseTimeout.
func (j *job) release(h *hold) error {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	return h.release(ctx)
}

// childExitCode is the exit code of a command that ended with waitErr,
// 128+N when signal N killed it, as shells report it.
func childExitCode(waitErr error) int {
	var ee *exec.ExitError
	switch {
	case waitErr == nil:
		return exitOK
	case errors.As(waitErr, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return exitSignal + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return exitSoftware
}

// describeExit says how the command ended, for messages.
func describeExit(cmd *exec.Cmd, code int) string {
	if ps := cmd.ProcessState; ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "was killed by " + signalName(ws.Signal())
		}
	}
	return fmt.Sprintf("exited with %d", code)
}

// errorCode classifies an error from the library or Redis.
func errorCode(err error) int {
	var ne net.Error
	switch {
	case errors.Is(err, redisync.ErrInvalidName), errors.Is(err, redisync.ErrInvalidOption),
		errors.Is(err, redisync.ErrInvalidPermits), errors.Is(err, redisync.ErrSizeMismatch):
		return exitUsage
	case errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, redis.ErrClosed):
		return exitUnavailable
	}
	return exitSoftware
}

// ended reports whether err is ctx's end: ctx has ended, or err is its
// deadline and the deadline has passed (a redisync call fails with its
// deadline once it has passed, before the context's timer fires and
// ctx.Err() says so).
func ended(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && errors.Is(err, context.DeadlineExceeded) && !time.Now().Before(dl)
}

// trimPrefix drops the library's "redisync: " from an error message, since
// redisync's own messages start with it.
func trimPrefix(err error) string {
	return strings.TrimPrefix(err.Error(), "redisync: ")
}

// libMessage returns the message of err, an error of the library's call
// on the primitive called name, without what redisync's own message says
// already: the library's "redisync: " and the call and name it names
// (`lock "jobs": `), so that `cannot acquire lock "jobs": ...` does not go
// on with `lock "jobs": ...`.
func libMessage(err error, name string) string {
	msg := trimPrefix(err)
	q := ` ` + quoteName(name) + `: `
	i := strings.Index(msg, q)
	if i <= 0 || strings.TrimLeft(msg[:i], "abcdefghijklmnopqrstuvwxyz ") != "" {
		return msg
	}
	return msg[i+len(q):]
}

// quoteName quotes name as the library's messages do: cut to 64 bytes
// with "..." when longer.
func quoteName(name string) string {
	const most = 64
	if len(name) > most {
		name = name[:most] + "..."
	}
	return `"` + name + `"`
}
