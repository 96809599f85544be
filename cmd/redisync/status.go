package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync"
)

const statusHelp = `Usage: redisync status [flags] NAME
       redisync status --all [--limit N] [--json] [flags]

Show the state of the lock NAME: who holds it (owner id,
remaining lease, fencing token) and the fair queue in order with each
waiter's heartbeat deadline; and of the semaphore NAME, if there is one:
its size, the permits available, the holders with their permits and
leases, and its queue in order; of the read-write lock NAME
(redisync.RWMutex), if there is one: its writer or its readers with
their leases, and its queue of readers and writers in order; and of the
election NAME, if there is one (see "redisync elect"): its leader with its
value, fencing token and lease, and the candidates waiting, in order. Only
reads Redis: the lock in one transaction, the semaphore in another, the
read-write lock in a third, the election in a fourth.

Only what exists is shown: a lock never taken is shown only if there is
no semaphore NAME either. Plain (--barging) waiters of a lock are not
queued: each process with waiters of the lock (plain or fair) is
subscribed to its own channel of the lock, and status counts the
subscribed processes (a process stays subscribed for 2 s after its last
waiter left).

With --all instead of NAME, list every lock, semaphore, read-write lock
and election under --prefix that is held or waited for: its kind, name,
holders and fair waiters in line (plain --barging waiters are not
counted), by kind and name, at most --limit N of them. It finds them
with SCAN (on every primary of a cluster), which reads every key name
under the prefix, then reads each as status NAME does. A key of another
program where one of theirs would be is listed with its error. Exit 0,
whatever it finds.

With --watch, status reads again every --interval (1s) until interrupted,
a live view of the holder, the queue and how long each waiter has waited:
on a terminal the table is redrawn in place; with --json, or when the
output is not a terminal, each reading is printed after the last (JSON:
one object per line). A reading that fails is reported and the next one
tried.

Exit codes: 0 the lock NAME, a permit of the semaphore NAME or the read-write
lock NAME is held, or the election NAME has a leader; 1 none of them
(free); 64 usage; 69 Redis unreachable; 70 Redis error.
With --watch: 0 when interrupted. With --all: 0, or 64, 69, 70.

Times come from the Redis server's clock. An owner id is the holder's
label (by default "host/pid"; see redisync.WithLabel), "/", its client id,
"-", a number, "." and a random part; a semaphore waiter is an owner id
followed by "#", 30 random digits and the number of its Acquire.

Examples:
  # who holds backup and who waits; exit 0 when it is held, 1 when free
  redisync status backup

  # on another Redis, database 2
  redisync status --redis redis://10.0.0.5:6379/2 deploy

  # who holds deploy, for a script ("free" when nobody does)
  redisync status --json deploy | jq -r '.lock.holder.owner // "free"'

  # the exit code in a script
  if redisync status backup >/dev/null; then echo "a backup runs"; fi

  # a live view until Ctrl-C, which exits 0
  redisync status --watch deploy

  # the permits available of the semaphore gpus
  redisync status --json gpus | jq '.semaphore.available'

  # which server and version, first: for a bug report
  redisync status --verbose deploy

  # everything held or waited for, at most 20 of them
  redisync status --all --limit 20

With --verbose, status first names the server it read and its version
(on a cluster, every primary): the first thing to give in a bug report.
It needs INFO (see docs/acl.md).

JSON (--json): {"servers"? (--verbose): [{"addr"?, "name", "version",
  "mode", "role"}], "name", "prefix", "server_time_ms",
  "lock": {"held", "holder": {"owner", "label", "lease_ms",
           "token", "metadata"?} | null, "last_token", "queue": [{"position", "owner",
           "label", "waited_ms",
           "heartbeat_ms", "handoff_lease_ms", "alive", "metadata"?}],
           "subscribed_processes"},
  "semaphore": {"size", "available", "holders": [{"owner", "label",
                "permits", "lease_ms"}], "queue": [{"position", "waiter",
                "owner", "label", "waited_ms", "permits", "heartbeat_ms",
                "grant_lease_ms", "alive"}]} | null,
  "rwmutex": {"writer": {"owner", "label", "lease_ms"} | null,
              "readers": [{"owner", "label", "lease_ms"}], "readers_len",
              "queue": [{"position", "waiter", "owner", "label", "write",
              "waited_ms", "heartbeat_ms", "alive"}]} | null,
  "election": {"leader": {"owner", "label", "lease_ms", "token",
               "metadata"?} | null, "last_token", "candidates": [{"position",
               "owner", "label", "waited_ms", "heartbeat_ms",
               "handoff_lease_ms", "alive", "metadata"?}]} | null}
An election's "metadata" is the leader's (or candidate's) value.
lease_ms is -1 for a lock key without expiry; a semaphore holder's lease_ms
of 0 or less means its lease ended and the next call reclaims its permits.
heartbeat_ms is the time left before a waiter that stops sending
heartbeats is skipped (negative: overdue).
"metadata"? is there when the holder or waiter stored metadata with
redisync.WithMetadata.
Without NAME: {"servers"? (--verbose), "prefix", "entries": [{"kind"
  ("lock", "semaphore", "rwmutex" or "election"), "name", "holders":
  [{"owner", "label", "permits"? (semaphore), "write"? (rwmutex),
  "value"? (election)}], "waiting", "size"?, "available"? (semaphore)}],
  "more" (--limit left some out)}
`

// Status is the state of one lock name (and semaphore of the same name),
// each read in one transaction.
type Status struct {
	// Servers are the servers read, with --verbose: the one server, or
	// every primary of a cluster.
	Servers      []ServerStatus `json:"servers,omitempty"`
	Name         string         `json:"name"`
	Prefix       string         `json:"prefix"`
	ServerTimeMS int64          `json:"server_time_ms"`
	Lock         LockStatus     `json:"lock"`
	Semaphore    *SemStatus     `json:"semaphore"`
	RWMutex      *RWStatus      `json:"rwmutex"`
	// Election is the election NAME (status_elect.go); null when nothing
	// of it is stored.
	Election *ElectStatus `json:"election"`
}

// ServerStatus names a server (redisync.Server).
type ServerStatus struct {
	Addr    string `json:"addr,omitempty"` // a cluster node's
	Name    string `json:"name"`           // "redis" or "valkey"
	Version string `json:"version"`
	Mode    string `json:"mode"` // "standalone" or "cluster"
	Role    string `json:"role"` // "primary" or "replica"
}

// LockStatus is the state of a lock.
type LockStatus struct {
	Held      bool     `json:"held"`
	Holder    *Holder  `json:"holder"`
	LastToken int64    `json:"last_token"`
	Queue     []Waiter `json:"queue"`
	// QueueLen counts the fair queue's records, of which Queue lists the
	// first redisync.InspectPage (LockState.QueueLen).
	QueueLen int `json:"queue_len"`
	// SubscribedProcesses counts the processes subscribed to the lock's
	// channels (LockState.Subscribers): a process with waiters, fair or
	// barging, among those Inspect lists, counts once.
	SubscribedProcesses int64 `json:"subscribed_processes"`
	// BargingProcesses counts the processes recorded as having barging
	// waiters (LockState.Barging).
	BargingProcesses int64 `json:"barging_processes"`
}

// Holder is the owner of a lock.
type Holder struct {
	Owner   string `json:"owner"`
	Label   string `json:"label"` // who holds, for people (see redisync.WithLabel)
	LeaseMS int64  `json:"lease_ms"`
	Token   int64  `json:"token"`
	// Metadata is what the holder stored with its hold
	// (redisync.WithMetadata); omitted when none.
	Metadata string `json:"metadata,omitempty"`
}

// Waiter is a fair waiter of a lock.
type Waiter struct {
	Position       int    `json:"position"`
	Owner          string `json:"owner"`
	Label          string `json:"label"`
	WaitedMS       int64  `json:"waited_ms"` // since it joined the queue
	HeartbeatMS    int64  `json:"heartbeat_ms"`
	HandoffLeaseMS int64  `json:"handoff_lease_ms"`
	Alive          bool   `json:"alive"`
	Metadata       string `json:"metadata,omitempty"`
}

func runStatus(args []string) int {
	fs := newFlags("status")
	redisURL := redisFlag(fs)
	prefix := fs.String("prefix", "redisync", "key `prefix` of the Redis keys")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	watch := fs.Bool("watch", false, "read again every --interval until interrupted: a live view")
	verbose := fs.Bool("verbose", false, "name the server and its version (every primary of a cluster) first")
	interval := durationFlag(fs, "interval", time.Second, "how often --watch reads (`duration`)")
	all := fs.Bool("all", false, "list everything held or waited for under --prefix, instead of NAME")
	limit := fs.Int("limit", 0, "with --all: list at most `N` (0 or unset: all)")
	p, err := parseArgs(fs, statusHelp, args)
	if errors.Is(err, errHelp) {
		return exitOK
	}
	list := *all
	switch {
	case err != nil:
	case *all && len(p.pos) > 0:
		err = fmt.Errorf("--all lists everything: give no NAME (%q)", p.pos[0])
	case !*all && (p.dashdash || len(p.pos) != 1):
		err = errors.New("want one NAME, or --all to list everything")
	case checkPrefix(*prefix) != nil:
		err = checkPrefix(*prefix)
	case *interval < 10*time.Millisecond:
		err = fmt.Errorf("--interval %v is shorter than 10ms", *interval)
	case *limit < 0:
		err = fmt.Errorf("--limit %d must be at least 1, or 0 for no limit", *limit)
	case list && *watch:
		err = errors.New("--watch needs a NAME")
	case !list && flagSet(fs, "limit"):
		err = errors.New("--limit is for the list of --all")
	case !list:
		err = checkName(p.pos[0])
	}
	if err != nil {
		return usageError("status", err)
	}

	ctx := context.Background()
	rdb, err := connect(ctx, resolveTarget(*redisURL))
	if err != nil {
		return connectExit(err)
	}
	defer func() { _ = rdb.Close() }()
	if list {
		return printListing(ctx, rdb, *prefix, *limit, *asJSON, *verbose)
	}
	name := p.pos[0]
	if *watch {
		return watchStatus(rdb, *prefix, name, *interval, *asJSON, *verbose)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := readStatus(ctx, rdb, *prefix, name, *verbose)
	if err != nil {
		return errorf(errorCode(err), "%v", trimPrefix(err))
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(st); err != nil {
			return errorf(exitSoftware, "%v", err)
		}
	} else {
		st.print(os.Stdout)
	}
	if !st.held() {
		return exitFree
	}
	return exitOK
}

// printListing prints what listStatus finds, for people or as JSON, and
// returns the exit code: 0, whatever it found. With servers, it first
// names the servers, as status --verbose does.
func printListing(ctx context.Context, rdb redis.UniversalClient, prefix string, limit int, asJSON, servers bool) int {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	l, err := listStatus(ctx, rdb, prefix, limit, servers)
	if err != nil {
		return errorf(errorCode(err), "%v", trimPrefix(err))
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(l); err != nil {
			return errorf(exitSoftware, "%v", err)
		}
		return exitOK
	}
	(&Status{Servers: l.Servers}).printServers(os.Stdout)
	l.print(os.Stdout)
	return exitOK
}

// watchStatus reads the status every interval until SIGINT or SIGTERM,
// and exits 0 then. On a terminal it redraws the table in place; else
// (and with --json, one compact object per line) it prints each reading
// after the last. A failed reading is reported and the next one tried:
// an operator's view outlives a Redis restart.
func watchStatus(rdb redis.UniversalClient, prefix, name string, interval time.Duration, asJSON, verbose bool) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	_, redraw := terminalWidth(os.Stdout)
	redraw = redraw && !asJSON && os.Getenv("TERM") != "dumb"
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, max(interval, time.Second))
		st, err := readStatus(rctx, rdb, prefix, name, verbose)
		cancel()
		var b strings.Builder
		switch {
		case ctx.Err() != nil:
			return exitOK
		case err != nil:
			fmt.Fprintf(&b, "%s  cannot read the status of %q: %v\n", time.Now().Format(time.TimeOnly), name, err)
		case asJSON:
			_ = json.NewEncoder(&b).Encode(st)
		default:
			fmt.Fprintf(&b, "%s  every %v (Ctrl-C to stop)\n", time.UnixMilli(st.ServerTimeMS).Format(time.TimeOnly), interval)
			st.print(&b)
		}
		if redraw {
			fmt.Fprint(os.Stdout, "\x1b[H\x1b[2J") // to the top left, and clear
		} else if !asJSON {
			b.WriteString("\n")
		}
		fmt.Fprint(os.Stdout, b.String())
		select {
		case <-ctx.Done():
			return exitOK
		case <-tick.C:
		}
	}
}

// held reports whether the lock or any permit of the semaphore is held
// (by a holder whose lease has not ended).
func (st *Status) held() bool {
	if st.Lock.Held || (st.Election != nil && st.Election.Leader != nil) {
		return true
	}
	if s := st.Semaphore; s != nil {
		for _, h := range s.Holders {
			if h.LeaseMS > 0 {
				return true
			}
		}
	}
	return st.RWMutex != nil && st.RWMutex.held()
}

// readStatus reads the lock name and the semaphore of that name through
// redisync's introspection (Client.InspectLock and InspectSemaphore): each
// is read in one transaction, at one instant. It only reads. A key of
// another type than redisync uses is an error. With servers, it first
// reads which servers these are (Client.Servers).
func readStatus(ctx context.Context, rdb redis.UniversalClient, prefix, name string, servers bool) (*Status, error) {
	c, err := redisync.New(rdb, redisync.WithKeyPrefix(prefix))
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Close() }()
	var ss []ServerStatus
	if servers {
		if ss, err = readServers(ctx, c); err != nil {
			return nil, err
		}
	}
	l, err := c.InspectLock(ctx, name)
	if err != nil {
		return nil, err
	}
	s, err := c.InspectSemaphore(ctx, name)
	if err != nil {
		return nil, err
	}
	st := &Status{Servers: ss, Name: name, Prefix: prefix, ServerTimeMS: l.ServerTime.UnixMilli(), Lock: lockStatus(l)}
	if !s.Empty() {
		st.Semaphore = semaphoreStatus(s)
	}
	rw, err := c.InspectRWMutex(ctx, name)
	if err != nil {
		return nil, err
	}
	if !rw.Empty() {
		st.RWMutex = rwStatus(rw)
	}
	if st.Election, err = readElection(ctx, c, name); err != nil {
		return nil, err
	}
	return st, nil
}

// readServers reads which servers c uses (Client.Servers).
func readServers(ctx context.Context, c *redisync.Client) ([]ServerStatus, error) {
	found, err := c.Servers(ctx)
	if err != nil {
		return nil, err
	}
	var ss []ServerStatus
	for _, s := range found {
		ss = append(ss, ServerStatus{Addr: s.Addr, Name: s.Name, Version: s.Version, Mode: s.Mode, Role: s.Role})
	}
	return ss, nil
}

// lockStatus converts what InspectLock (or InspectElection) read.
func lockStatus(l *redisync.LockState) LockStatus {
	st := LockStatus{Held: l.Held(), LastToken: l.LastToken, Queue: []Waiter{}, QueueLen: l.QueueLen,
		SubscribedProcesses: l.Subscribers, BargingProcesses: l.Barging}
	if h := l.Holder; h != nil {
		st.Holder = &Holder{Owner: h.ID, Label: h.Label, LeaseMS: leaseMS(h.Lease), Token: h.Token, Metadata: h.Metadata}
	}
	for i, w := range l.Queue {
		st.Queue = append(st.Queue, Waiter{Position: i + 1, Owner: w.ID, Label: w.Label,
			WaitedMS: w.Waited.Milliseconds(), HeartbeatMS: w.Heartbeat.Milliseconds(),
			HandoffLeaseMS: w.HandoffLease.Milliseconds(), Alive: w.Alive, Metadata: w.Metadata})
	}
	return st
}

// queueText describes a queue of n records of which shown are listed.
func queueText(n, shown int) string {
	s := fmt.Sprintf("%d waiting, first come first served", max(n, shown))
	if n > shown {
		s += fmt.Sprintf(" (the first %d listed)", shown)
	}
	return s
}

// leaseMS converts a remaining lease to ms: -1 for no expiry.
func leaseMS(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Milliseconds()
}

// print writes st for people: the lock, unless it has no key and the
// semaphore has, and the semaphore if it has keys.
func (st *Status) print(out io.Writer) {
	st.printServers(out)
	l := st.Lock
	if !l.Held && l.LastToken == 0 && len(l.Queue) == 0 && l.QueueLen == 0 && l.SubscribedProcesses == 0 && l.BargingProcesses == 0 && (st.Semaphore != nil || st.RWMutex != nil || st.Election != nil) {
		st.printOthers(out)
		return
	}
	fmt.Fprintf(out, "lock %q (prefix %q)\n", st.Name, st.Prefix)
	if h := l.Holder; h != nil {
		field(out, "holder", h.Owner)
		field(out, "label", h.Label)
		field(out, "lease", leaseText(h.LeaseMS))
		field(out, "fencing token", strconv.FormatInt(h.Token, 10))
		if h.Metadata != "" {
			field(out, "metadata", strconv.Quote(h.Metadata))
		}
	} else {
		field(out, "holder", "none (free)")
		if l.LastToken > 0 {
			field(out, "last token", strconv.FormatInt(l.LastToken, 10))
		}
	}
	field(out, "subscribed", fmt.Sprintf("%d process(es) (with waiters, fair or barging)", l.SubscribedProcesses))
	if l.BargingProcesses > 0 {
		field(out, "barging", fmt.Sprintf("%d process(es) recorded with barging waiters", l.BargingProcesses))
	}
	if len(l.Queue) == 0 && l.QueueLen == 0 {
		field(out, "queue", "empty")
	} else {
		field(out, "queue", queueText(l.QueueLen, len(l.Queue)))
		rows := [][]string{{"#", "owner", "waiting for", "heartbeat due", "hand-off lease", "metadata"}}
		for _, w := range l.Queue {
			meta := ""
			if w.Metadata != "" {
				meta = strconv.Quote(w.Metadata)
			}
			rows = append(rows, []string{strconv.Itoa(w.Position), w.Owner, ms(w.WaitedMS), heartbeatText(w), ms(w.HandoffLeaseMS), meta})
		}
		table(out, rows)
	}
	st.printOthers(out)
}

// printServers writes a line for each of st.Servers (--verbose).
func (st *Status) printServers(out io.Writer) {
	for _, s := range st.Servers {
		v := fmt.Sprintf("%s %s (%s %s)", s.Name, s.Version, s.Mode, s.Role)
		if s.Addr != "" {
			v = s.Addr + ": " + v
		}
		fmt.Fprintf(out, "server %s\n", v)
	}
}

// printOthers writes the semaphore and the election of st's name, those
// that have state.
func (st *Status) printOthers(out io.Writer) {
	if st.Semaphore != nil {
		printSemaphore(out, st)
	}
	if st.RWMutex != nil {
		printRW(out, st)
	}
	if st.Election != nil {
		printElection(out, st)
	}
}

// field writes one "name  value" line of a status.
func field(out io.Writer, name, value string) {
	fmt.Fprintf(out, "  %-14s %s\n", name, value)
}

// table writes rows as aligned columns, indented under a field.
func table(out io.Writer, rows [][]string) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintf(tw, "    %s\n", strings.Join(r, "\t"))
	}
	_ = tw.Flush()
}

// leaseText describes a remaining lease.
func leaseText(leaseMS int64) string {
	if leaseMS < 0 {
		return "no expiry"
	}
	return ms(leaseMS) + " left"
}

// heartbeatText describes a waiter's heartbeat deadline.
func heartbeatText(w Waiter) string {
	switch {
	case w.HeartbeatMS == 0 && w.HandoffLeaseMS == 0:
		return "no record (skipped)"
	case !w.Alive:
		return "overdue by " + ms(-w.HeartbeatMS) + " (skipped)"
	}
	return "in " + ms(w.HeartbeatMS)
}

// ms formats a duration in milliseconds.
func ms(n int64) string {
	d := time.Duration(n) * time.Millisecond
	if d >= time.Second {
		d = d.Round(100 * time.Millisecond)
	}
	return d.String()
}
