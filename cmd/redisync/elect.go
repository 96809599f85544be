package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
	"github.com/redisync/redisync/internal/schema"
)

const electHelp = `Usage: redisync elect [flags] NAME -- CMD [ARGS...]
       redisync elect [flags] NAME

Campaign in the election NAME, run CMD while this process leads, resign
when CMD ends (the next candidate leads at once), and exit with CMD's exit
code. Candidates are served first come, first served across every
process: run the same line on several machines, and one runs CMD at a time,
the next taking over when it ends, crashes or loses the leadership.

With -n/--no-wait, make one attempt: if another candidate leads, or
candidates wait their turn, exit 73 at once without running CMD and
leave nothing queued.

Without CMD, lead until a signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT), then
resign and exit 0 (76 if the leadership was lost meanwhile). Once leading,
one line goes to stdout: the election's Redis key and the fencing token
("redisync:elect:{NAME} 7").

--value is what this candidate leads with: others read it with
"redisync status NAME" (and the library's Election.Leader and Observe),
e.g. the address where the leader serves. The default is the host and pid.

While CMD runs, the leadership's lease is renewed by a watchdog (or, with
--lease, fixed). If the leadership is lost anyway (lease ran out, key
removed, Redis unreachable for a whole lease), CMD gets SIGTERM, then
SIGKILL after --grace, and redisync exits with 76. On Linux, CMD and
every process it started are killed at once if redisync dies, as for
"redisync lock": nothing runs on without the leadership.

CMD gets redisync's stdin, stdout and stderr, and in its environment
REDISYNC_TOKEN (the leader's fencing token: it grows with every new leader,
so a resource can reject writes from an older one), REDISYNC_NAME and
REDISYNC_VALUE. Signals are passed on to CMD as by "redisync lock".

Exit codes: CMD's own (no CMD: 0); 64 usage; 69 Redis unreachable; 70 Redis
error; 73 taken (--no-wait; or --busy-exit); 75 --wait ran out (or
--timeout-exit); 76 leadership lost while CMD ran (or --lost-exit);
126/127 CMD cannot run / not found; 128+N signal N.

Examples:
  # one scheduler at a time; a standby takes over within the lease
  redisync elect --value "$(hostname):8080" scheduler -- ./scheduler

  # run the report here only if no other machine leads now
  redisync elect -n --busy-exit 200 report -- ./report.sh || [ $? -eq 200 ]

  # who leads, and who waits to
  redisync status scheduler
`

func runElect(args []string) int {
	fs := newFlags("elect")
	value := fs.String("value", "", "the `value` this candidate leads with, read by others (default host/pid)")
	hf := addHoldFlags(fs)
	p, err := parseArgs(fs, electHelp, args)
	if errors.Is(err, errHelp) {
		return exitOK
	}
	if err != nil {
		return usageError("elect", err)
	}
	name, argv, err := commandLine(p)
	if err != nil {
		return usageError("elect", err)
	}
	opts, err := hf.check()
	if err != nil {
		return usageError("elect", err)
	}
	val := *value
	if val == "" {
		host, _ := os.Hostname()
		val = host + "/" + strconv.Itoa(os.Getpid())
	}
	if len(val) > redisync.MaxMetadataLen {
		return usageError("elect", fmt.Errorf("--value of %d bytes is longer than %d", len(val), redisync.MaxMetadataLen))
	}
	prefix, try := *hf.prefix, *hf.noWait
	j := &job{
		what:    fmt.Sprintf("leadership of %q", name),
		name:    name,
		target:  resolveTarget(*hf.redis),
		wait:    *hf.wait,
		grace:   *hf.grace,
		verbose: *hf.verbose,
		argv:    argv,
		codes:   hf.codes(),
		acquire: func(ctx context.Context, rdb redis.UniversalClient) (*hold, error) {
			return campaign(ctx, rdb, prefix, name, val, try, opts)
		},
		explain: func(ctx context.Context, rdb redis.UniversalClient, err error) string {
			return explainWrongType(ctx, rdb, prefix, name, err, func(ctx context.Context, c *redisync.Client) error {
				_, err := c.InspectElection(ctx, name)
				return err
			})
		},
		holders: func(ctx context.Context, rdb redis.UniversalClient) string {
			st, err := readStatus(ctx, rdb, prefix, name, false)
			if err != nil || st.Election == nil || st.Election.Leader == nil {
				return ""
			}
			h := st.Election.Leader
			return fmt.Sprintf("held by %s, value %q (token %d, lease %s)", h.Owner, h.Metadata, h.Token, leaseText(h.LeaseMS))
		},
	}
	return j.execute()
}

// campaign blocks until this process leads the election name with value;
// with try, it makes one attempt and fails with errBusy when another
// candidate leads or candidates wait.
func campaign(ctx context.Context, rdb redis.UniversalClient, prefix, name, value string, try bool, opts []redisync.Option) (*hold, error) {
	c, err := redisync.New(rdb, opts...)
	if err != nil {
		return nil, err
	}
	e, err := c.NewElection(name)
	switch {
	case err != nil:
	case try:
		var ok bool
		if ok, err = e.TryCampaign(ctx, value); err == nil && !ok {
			err = errBusy
		}
	default:
		err = e.Campaign(ctx, value)
	}
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	token := e.Token()
	return &hold{
		line: fmt.Sprintf("%s %d", schema.ElectionKeys(prefix, name).Hash, token),
		desc: fmt.Sprintf("leadership of %q (token %d)", name, token),
		env: []string{"REDISYNC_TOKEN=" + strconv.FormatInt(token, 10), "REDISYNC_NAME=" + name,
			"REDISYNC_VALUE=" + value},
		lost:    e.Lost(),
		release: e.Resign,
		close:   func() { _ = c.Close() },
	}, nil
}
