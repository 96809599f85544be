// The semaphore command.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/schema"
)

const semHelp = `Usage: redisync sem --limit N [--permits n] [flags] NAME -- CMD [ARGS...]
       redisync sem --limit N [--permits n] [flags] NAME
       redisync sem --limit N --resize M [flags] NAME

Wait for n (default 1) of the N permits of the semaphore NAME, run CMD
while holding them, release them when CMD ends, and exit with CMD's exit
code. At most N permits of NAME are held at once, across all machines.
The first user of NAME stores N; when another size is stored, it rules
(change it with --resize).

Waiters are served first come, first served, so a large --permits is not
starved by small ones. Held permits are leased: a watchdog renews them
while CMD runs (or, with --lease, they are held for at most that long), and
if redisync dies they are freed when the lease runs out. If the permits are
lost anyway, CMD gets SIGTERM, then SIGKILL after --grace, and redisync
exits with 76.

Without CMD, hold the permits until a signal, then release them and exit 0;
once held, one line goes to stdout: the semaphore's Redis key and the
number of permits held. With -n/--no-wait, make one attempt and exit 73 at
once if the permits are not free (or others queue for them).
--busy-exit, --timeout-exit and --lost-exit change the exit codes 73, 75
and 76, to tell them from CMD's own (see "redisync help").

With --resize M, change the size of NAME from N (--limit) to M, and exit:
0 when done, 64 when NAME is stored with another size than N (nothing
changes). Holders keep their permits; nobody gets one until the permits in
use leave room under M, and waiters that fit under a larger M are served at
once. Users started with --limit N then fail (64): start them with M.

CMD gets redisync's stdin, stdout and stderr, and in its environment
REDISYNC_NAME and REDISYNC_PERMITS. Signals are passed on to CMD as by
"redisync lock"; a signal while waiting cancels the wait and leaves nothing
queued. On Linux, CMD and everything it started die with redisync, as
with "redisync lock".

Exit codes: CMD's own (no CMD: 0); 64 usage, or NAME is stored with another
--limit; 69 Redis unreachable; 70 Redis error; 73 not free (--no-wait; or
--busy-exit); 75 --wait ran out (or --timeout-exit); 76 permits lost while
CMD ran (or --lost-exit); 126/127 CMD cannot run / not found; 128+N signal
N.

Examples:
  # at most 4 encoding jobs at once across the fleet
  redisync sem --limit 4 encode -- ffmpeg -i in.mov out.mp4

  # a big job takes 3 of the 8 GPU slots; give up after 10 minutes (exit 75)
  redisync sem --limit 8 --permits 3 --wait 10m gpus -- ./train.sh

  # who holds permits, who waits
  redisync status gpus

  # the fleet got 4 more GPUs
  redisync sem --limit 8 --resize 12 gpus
`

func runSem(args []string) int {
	fs := newFlags("sem")
	limit := fs.Int64("limit", 0, "size of the semaphore: `N` permits in all (required; stored when NAME has none, else the stored size rules)")
	permits := fs.Int64("permits", 1, "`number` of permits to hold while CMD runs, in [1, --limit]")
	resize := fs.Int64("resize", 0, "change the size of NAME from --limit to `M`, and exit")
	hf := addHoldFlags(fs)
	p, err := parseArgs(fs, semHelp, args)
	if errors.Is(err, errHelp) {
		return exitOK
	}
	if err != nil {
		return usageError("sem", err)
	}
	name, argv, err := commandLine(p)
	const most = redisync.MaxSemaphoreSize
	switch {
	case err != nil:
	case !flagSet(fs, "limit"):
		err = errors.New("missing --limit N: the number of permits of the semaphore")
	case *limit < 1 || *limit > most:
		err = outOfRange("limit", *limit, most)
	case *permits < 1 || *permits > *limit:
		err = fmt.Errorf("--permits %d must be in [1, --limit %d]", *permits, *limit)
	case !flagSet(fs, "resize"):
	case *resize < 1 || *resize > most:
		err = outOfRange("resize", *resize, most)
	case argv != nil:
		err = errors.New("--resize takes no command: it changes the size and exits")
	}
	if err != nil {
		return usageError("sem", err)
	}
	opts, err := hf.check()
	if err != nil {
		return usageError("sem", err)
	}
	if flagSet(fs, "resize") {
		return resizeSem(resolveTarget(*hf.redis), *hf.prefix, name, *limit, *resize, opts)
	}
	size, n, prefix, try := *limit, *permits, *hf.prefix, *hf.noWait
	j := &job{
		what:    fmt.Sprintf("%d of the %d permits of semaphore %q", n, size, name),
		name:    name,
		target:  resolveTarget(*hf.redis),
		wait:    *hf.wait,
		grace:   *hf.grace,
		verbose: *hf.verbose,
		argv:    argv,
		codes:   hf.codes(),
		acquire: func(ctx context.Context, rdb redis.UniversalClient) (*hold, error) {
			return acquireSem(ctx, rdb, prefix, name, size, n, try, opts)
		},
		explain: func(ctx context.Context, rdb redis.UniversalClient, err error) string {
			if s := explainSize(ctx, rdb, prefix, name, size, err); s != "" {
				return s
			}
			return explainWrongType(ctx, rdb, prefix, name, err, func(ctx context.Context, c *redisync.Client) error {
				_, err := c.InspectSemaphore(ctx, name)
				return err
			})
		},
		holders: func(ctx context.Context, rdb redis.UniversalClient) string {
			st, err := readStatus(ctx, rdb, prefix, name, false)
			if err != nil || st.Semaphore == nil || len(st.Semaphore.Holders) == 0 {
				return ""
			}
			s := st.Semaphore
			var who []string
			for _, h := range s.Holders {
				who = append(who, fmt.Sprintf("%s (%d)", h.Owner, h.Permits))
			}
			return fmt.Sprintf("%d of %d permits available, held by %s", s.Available, s.Size, strings.Join(who, ", "))
		},
	}
	return j.execute()
}

// outOfRange says that the flag name's value n is outside [1, most].
func outOfRange(name string, n, most int64) error {
	if n < 1 {
		return fmt.Errorf("--%s %d must be at least 1", name, n)
	}
	return fmt.Errorf("--%s %d must be at most %d", name, n, most)
}

// flagSet reports whether the flag name was given.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// resizeSem changes the size of the semaphore name from size to to.
func resizeSem(t target, prefix, name string, size, to int64, opts []redisync.Option) int {
	ctx := context.Background()
	rdb, err := connect(ctx, t)
	if err != nil {
		return connectExit(err)
	}
	defer func() { _ = rdb.Close() }()
	c, err := redisync.New(rdb, opts...)
	if err != nil {
		return errorf(errorCode(err), "%s", trimPrefix(err))
	}
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.ResizeSemaphore(ctx, name, size, to); err != nil {
		msg := libMessage(err, name)
		if !errors.Is(err, redisync.ErrSizeMismatch) {
			return errorf(errorCode(err), "cannot resize semaphore %q: %s", name, msg)
		}
		if stored := storedSize(ctx, rdb, prefix, name); stored > 0 && stored != size {
			msg = fmt.Sprintf("stored size %d, not --limit %d; nothing changed (resize with --limit %d --resize %d)", stored, size, stored, to)
		}
		return errorf(errorCode(err), "cannot resize semaphore %q: %s", name, msg)
	}
	fmt.Printf("semaphore %q: %d permits (was %d)\n", name, to, size)
	return exitOK
}

// acquireSem blocks until n permits of the semaphore name are held; with
// try, it makes one attempt and fails with errBusy.
func acquireSem(ctx context.Context, rdb redis.UniversalClient, prefix, name string, size, n int64, try bool, opts []redisync.Option) (*hold, error) {
	c, err := redisync.New(rdb, opts...)
	if err != nil {
		return nil, err
	}
	s, err := c.NewSemaphore(name, size)
	switch {
	case err != nil:
	case try:
		var ok bool
		if ok, err = s.TryAcquire(ctx, n); err == nil && !ok {
			err = errBusy
		}
	default:
		err = s.Acquire(ctx, n)
	}
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return &hold{
		line:   fmt.Sprintf("%s %d", schema.SemaphoreKeys(prefix, name).Hash, n),
		desc:   fmt.Sprintf("%d of the %d permits of semaphore %q", n, size, name),
		plural: true,
		env:    []string{"REDISYNC_NAME=" + name, "REDISYNC_PERMITS=" + strconv.FormatInt(n, 10)},
		lost:   s.Lost(),
		release: func(ctx context.Context) error {
			return s.Release(ctx, n)
		},
		close: func() { _ = c.Close() },
	}, nil
}
