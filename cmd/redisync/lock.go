package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/schema"
)

const lockHelp = `Usage: redisync lock [flags] NAME -- CMD [ARGS...]
       redisync lock [flags] NAME

Wait for the lock NAME, run CMD while holding it, release it when CMD ends,
and exit with CMD's exit code.

Without CMD, hold the lock until a signal (SIGINT, SIGTERM, SIGHUP,
SIGQUIT), then release it and exit 0 (76 if it was lost meanwhile). Once
held, one line goes to stdout: the lock's Redis key and the fencing token,
separated by a space ("redisync:lock:{NAME} 7").

Waiters are served first come, first served across every process; with
--barging, redisync takes the lock whenever it finds it free, ahead of
processes that waited longer (as Redisson's RLock).

With -n/--no-wait, make one attempt: if the lock is taken, exit 73 at once
without running CMD (as flock -n). --wait 0, the default, waits forever.
--busy-exit, --timeout-exit and --lost-exit change the exit codes 73, 75
and 76, to tell them from CMD's own (as flock -E).

While CMD runs, the lock's lease is renewed by a watchdog (or, with --lease,
fixed: the lock is held for at most that long). If the lock is lost anyway
(lease ran out, key removed, Redis unreachable for a whole lease), CMD gets
SIGTERM, then SIGKILL after --grace, and redisync exits with 76.

CMD gets redisync's stdin, stdout and stderr, and in its environment
REDISYNC_TOKEN (the hold's fencing token: it grows with every new hold of
NAME, so a resource can reject writes carrying an older token) and
REDISYNC_NAME. SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to redisync are
passed on to CMD (a Ctrl-C typed in the terminal already reaches CMD and is
not sent twice). A signal while waiting cancels the wait and leaves nothing
queued; redisync then exits with 128+N.

On Linux, CMD runs under a small supervisor (redisync itself): if redisync
dies, even by SIGKILL or the OOM killer, CMD and every process it started
are killed with SIGKILL at once, so nothing runs on without the lock (the
lock itself is freed when its lease runs out). A SIGKILL after --grace
kills them all too. Elsewhere, CMD and its children outlive a killed
redisync.

Exit codes: CMD's own (no CMD: 0); 64 usage; 69 Redis unreachable; 70 Redis
error (among them, at once, a lock held by a version of redisync that
stores it in another layout: see docs/upgrading.md); 73 taken (--no-wait;
or --busy-exit); 75 --wait ran out (or --timeout-exit); 76 lock lost while
CMD ran (or --lost-exit); 126/127 CMD cannot run / not found; 128+N signal
N.

Examples:
  # one nightly backup at a time, across all machines
  redisync lock backup -- ./backup.sh --full

  # give up after 30 seconds of waiting in line (exit 75)
  redisync lock --wait 30s deploy -- make deploy

  # skip this run if another one holds the lock (exit 73)
  redisync lock -n cron-job -- ./job.sh || [ $? -eq 73 ]

  # the same, telling "taken" from the job's own exit codes
  redisync lock -n --busy-exit 200 cron-job -- ./job.sh || [ $? -eq 200 ]

  # hold the lock across several shell commands
  redisync lock deploy > /tmp/deploy.lock & holder=$!
  until [ -s /tmp/deploy.lock ]; do sleep 0.1; done
  read key token < /tmp/deploy.lock
  ./step1.sh "$token"; ./step2.sh "$token"
  kill $holder; wait $holder

  # hold for at most 5 minutes, whatever happens to this process
  redisync lock --lease 5m migrate -- ./migrate.sh

  # pass the fencing token on to the resource; TLS, password from the environment
  REDISYNC_PASSWORD=... redisync lock --redis rediss://redis.example.com:6380 job -- \
      sh -c 'curl -H "Fencing-Token: $REDISYNC_TOKEN" https://example.com/write'

  # on a Redis Cluster, named by any of its nodes, or several
  redisync lock --redis 10.0.0.1:7000,10.0.0.2:7000 report -- ./report.sh

  # on the primary named mymaster, found through its Sentinels
  redisync lock --redis redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster report -- ./report.sh
`

// holdFlags are the flags shared by lock, sem and elect.
type holdFlags struct {
	redis, prefix       *string
	wait, lease, grace  *time.Duration
	watchdog, heartbeat *time.Duration
	verbose, noWait     *bool
	// busyExit, timeoutExit and lostExit are the exit codes for taken
	// (--no-wait), --wait ran out and lost while CMD ran.
	busyExit, timeoutExit, lostExit *int
}

func addHoldFlags(fs *flag.FlagSet) holdFlags {
	return holdFlags{
		redis:     redisFlag(fs),
		prefix:    fs.String("prefix", "redisync", "key `prefix` of the Redis keys"),
		wait:      durationFlag(fs, "wait", 0, "give up (exit 75, or --timeout-exit) after waiting this `duration` (e.g. 30s, 5m);\n0 or unset waits forever"),
		lease:     durationFlag(fs, "lease", 0, "fixed lease: hold for at most this `duration`, no renewal; 0 or unset renews with a watchdog"),
		watchdog:  durationFlag(fs, "watchdog-lease", 30*time.Second, "lease kept alive by the watchdog, renewed every third of it;\nif redisync dies, others get in after at most this `duration`"),
		heartbeat: durationFlag(fs, "heartbeat", 3*time.Second, "how long a waiter stays queued without a heartbeat (sent every third of it), a `duration`"),
		grace:     durationFlag(fs, "grace", 10*time.Second, "after a loss, how long CMD has between SIGTERM and SIGKILL, a `duration`"),
		verbose:   fs.Bool("verbose", false, "report who holds while waiting, acquiring and releasing on stderr"),
		noWait:    noWaitFlags(fs),
		busyExit: fs.Int("busy-exit", exitBusy, "exit with this `code` (1-255, not 64, 69, 70, 126-192) when -n/--no-wait finds it taken,\n"+
			"to tell that from CMD's own exit codes (as flock -E)"),
		timeoutExit: fs.Int("timeout-exit", exitTimeout, "exit with this `code` (1-255, not 64, 69, 70, 126-192) when --wait runs out"),
		lostExit:    fs.Int("lost-exit", exitLost, "exit with this `code` (1-255, not 64, 69, 70, 126-192) when the hold is lost while CMD runs (or while held without CMD)"),
	}
}

// codes returns the exit codes that the flags set.
func (f holdFlags) codes() exitCodes {
	return exitCodes{busy: *f.busyExit, timeout: *f.timeoutExit, lost: *f.lostExit}
}

// noWaitFlags adds -n and --no-wait, the same flag.
func noWaitFlags(fs *flag.FlagSet) *bool {
	b := fs.Bool("no-wait", false, "try once, never wait: exit 73 (--busy-exit) at once if it is taken (as flock -n)")
	fs.BoolVar(b, "n", false, "short for --no-wait")
	return b
}

// check validates the flags and returns the library options they give.
func (f holdFlags) check() ([]redisync.Option, error) {
	if err := checkPrefix(*f.prefix); err != nil {
		return nil, err
	}
	switch {
	case *f.wait < 0:
		return nil, fmt.Errorf("--wait %v is negative", *f.wait)
	case *f.lease < 0:
		return nil, fmt.Errorf("--lease %v is negative", *f.lease)
	case *f.lease > 0 && (*f.lease < time.Millisecond || *f.lease > redisync.MaxLease):
		return nil, fmt.Errorf("--lease %v must be in [1ms, %v], or 0 for a lease renewed by the watchdog", *f.lease, redisync.MaxLease)
	case *f.grace < 0:
		return nil, fmt.Errorf("--grace %v is negative", *f.grace)
	case *f.noWait && *f.wait > 0:
		return nil, errors.New("--no-wait and --wait: give one")
	}
	// The watchdog renews every third of its lease, the heartbeat is
	// sent every third of its timeout: a third must be at least 1ms.
	for _, d := range []struct {
		name  string
		value time.Duration
	}{{"watchdog-lease", *f.watchdog}, {"heartbeat", *f.heartbeat}} {
		if d.value < 3*time.Millisecond || d.value > redisync.MaxLease {
			return nil, fmt.Errorf("--%s %v must be in [3ms, %v] (it is renewed every third of it)", d.name, d.value, redisync.MaxLease)
		}
	}
	for _, c := range []struct {
		name  string
		value int
	}{{"busy-exit", *f.busyExit}, {"timeout-exit", *f.timeoutExit}, {"lost-exit", *f.lostExit}} {
		switch {
		case c.value < 1 || c.value > 255:
			return nil, fmt.Errorf("--%s %d must be in [1, 255]", c.name, c.value)
		case c.value == exitUsage || c.value == exitUnavailable || c.value == exitSoftware ||
			c.value == exitCannotRun || c.value == exitNotFound:
			return nil, fmt.Errorf("--%s %d is one of redisync's own exit codes (64, 69, 70, 126, 127)", c.name, c.value)
		case c.value > exitSignal && c.value <= exitSignal+64:
			return nil, fmt.Errorf("--%s %d is the exit code of a process killed by signal %d (129-192)", c.name, c.value, c.value-exitSignal)
		}
	}
	opts := []redisync.Option{
		redisync.WithKeyPrefix(*f.prefix),
		redisync.WithCrashTimeout(*f.watchdog),
		redisync.WithWaiterTimeout(*f.heartbeat),
	}
	if *f.lease > 0 {
		opts = append(opts, redisync.WithFixedLease(*f.lease))
	}
	return opts, nil
}

// commandLine checks that p has exactly one NAME, and a command after
// "--" if there is one. No "--": no command (hold until a signal).
func commandLine(p parsed) (string, []string, error) {
	switch {
	case len(p.pos) == 0:
		return "", nil, errors.New("missing NAME")
	case len(p.pos) > 1 && !p.dashdash:
		return "", nil, fmt.Errorf("missing -- before the command (%q): write NAME -- CMD [ARGS...]", p.pos[1])
	case len(p.pos) > 1:
		return "", nil, fmt.Errorf("unexpected argument %q before --", p.pos[1])
	case !p.dashdash:
		return p.pos[0], nil, checkName(p.pos[0])
	case len(p.cmd) == 0 || p.cmd[0] == "":
		return "", nil, errors.New("missing command after --")
	}
	return p.pos[0], p.cmd, checkName(p.pos[0])
}

func runLock(args []string) int {
	fs := newFlags("lock")
	barging := fs.Bool("barging", false, "take the lock whenever it is free, ahead of processes that waited longer (the default is first come, first served)")
	fs.Bool("fair", true, "first come, first served: the default, kept so that scripts written for earlier versions run")
	hf := addHoldFlags(fs)
	p, err := parseArgs(fs, lockHelp, args)
	if errors.Is(err, errHelp) {
		return exitOK
	}
	if err != nil {
		return usageError("lock", err)
	}
	name, argv, err := commandLine(p)
	if err != nil {
		return usageError("lock", err)
	}
	opts, err := hf.check()
	if err != nil {
		return usageError("lock", err)
	}
	if *barging {
		opts = append(opts, redisync.Barging())
	}
	prefix, try := *hf.prefix, *hf.noWait
	j := &job{
		what:    fmt.Sprintf("lock %q", name),
		name:    name,
		target:  resolveTarget(*hf.redis),
		wait:    *hf.wait,
		grace:   *hf.grace,
		verbose: *hf.verbose,
		argv:    argv,
		codes:   hf.codes(),
		acquire: func(ctx context.Context, rdb redis.UniversalClient) (*hold, error) {
			return acquireLock(ctx, rdb, prefix, name, try, opts)
		},
		explain: func(ctx context.Context, rdb redis.UniversalClient, err error) string {
			return explainWrongType(ctx, rdb, prefix, name, err, func(ctx context.Context, c *redisync.Client) error {
				_, err := c.InspectLock(ctx, name)
				return err
			})
		},
		holders: func(ctx context.Context, rdb redis.UniversalClient) string {
			st, err := readStatus(ctx, rdb, prefix, name, false)
			if err != nil || st.Lock.Holder == nil {
				return ""
			}
			h := st.Lock.Holder
			return fmt.Sprintf("held by %s (token %d, lease %s)", h.Owner, h.Token, leaseText(h.LeaseMS))
		},
	}
	return j.execute()
}

// errBusy is returned by an acquire with --no-wait when it is taken.
var errBusy = errors.New("taken")

// acquireLock blocks until the lock name is held; with try, it makes one
// attempt and fails with errBusy.
func acquireLock(ctx context.Context, rdb redis.UniversalClient, prefix, name string, try bool, opts []redisync.Option) (*hold, error) {
	c, err := redisync.New(rdb, opts...)
	if err != nil {
		return nil, err
	}
	m, err := c.NewMutex(name)
	switch {
	case err != nil:
	case try:
		var ok bool
		if ok, err = m.TryLock(ctx); err == nil && !ok {
			err = errBusy
		}
	default:
		err = m.Lock(ctx)
	}
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	token := m.Token()
	return &hold{
		line:    fmt.Sprintf("%s %d", schema.LockKeys(prefix, name).Hash, token),
		desc:    fmt.Sprintf("lock %q (token %d)", name, token),
		env:     []string{"REDISYNC_TOKEN=" + strconv.FormatInt(token, 10), "REDISYNC_NAME=" + name},
		lost:    m.Lost(),
		release: m.Unlock,
		close:   func() { _ = c.Close() },
	}, nil
}
