package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
)

const statusHelp = `Usage: redisync status [flags] NAME

Show the state of the lock NAME: who holds it (owner id, hold count,
remaining lease, fencing token) and the fair queue in order with each
waiter's heartbeat deadline; and of the semaphore NAME, if there is one:
its size, the permits available, the holders with their permits and
leases, and its queue in order. Only reads Redis, in one transaction.

Only what exists is shown: a lock never taken is shown only if there is
no semaphore NAME either. Plain (not --fair) waiters of a lock leave no
record in Redis: each process with waiters of the lock (plain or fair) is
subscribed to its channel, and status counts the subscribed processes (a
process stays subscribed for 2 s after its last waiter left).

Exit codes: 0 the lock NAME or a permit of the semaphore NAME is held;
1 neither is held (free); 64 usage; 69 Redis unreachable; 70 Redis error.

Times come from the Redis server's clock. An owner id is the holder's
label (by default "host/pid"; see redisync.WithLabel), "/", its client id
and a number; a semaphore waiter is an owner id followed by "#" and the
number of its Acquire.

Examples:
  redisync status backup
  redisync status --redis redis://10.0.0.5:6379/2 deploy
  redisync status --json deploy | jq -r '.lock.holder.owner // "free"'
  if redisync status backup >/dev/null; then echo "a backup runs"; fi
  redisync status --json gpus | jq '.semaphore.available'

JSON (--json): {"name", "prefix", "server_time_ms",
  "lock": {"held", "holder": {"owner", "label", "count", "lease_ms",
           "token"} | null, "last_token", "queue": [{"position", "owner",
           "label", "arrival",
           "heartbeat_ms", "handoff_lease_ms", "alive"}],
           "subscribed_processes"},
  "semaphore": {"size", "available", "holders": [{"owner", "label",
                "permits", "lease_ms"}], "queue": [{"position", "waiter",
                "owner", "label", "arrival", "permits", "heartbeat_ms",
                "grant_lease_ms", "alive"}]} | null}
lease_ms is -1 for a lock key without expiry; a semaphore holder's lease_ms
of 0 or less means its lease ended and the next call reclaims its permits.
heartbeat_ms is the time left before a waiter that stops sending
heartbeats is skipped (negative: overdue).
`

// Status is the state of one lock name (and semaphore of the same name),
// as read in one transaction.
type Status struct {
	Name         string     `json:"name"`
	Prefix       string     `json:"prefix"`
	ServerTimeMS int64      `json:"server_time_ms"`
	Lock         LockStatus `json:"lock"`
	Semaphore    *SemStatus `json:"semaphore"`
}

// LockStatus is the state of a lock.
type LockStatus struct {
	Held      bool     `json:"held"`
	Holder    *Holder  `json:"holder"`
	LastToken int64    `json:"last_token"`
	Queue     []Waiter `json:"queue"`
	// SubscribedProcesses counts the processes subscribed to the lock's
	// channel: those with waiters, plain or fair, and those whose last
	// waiter left less than 2 s ago.
	SubscribedProcesses int64 `json:"subscribed_processes"`
}

// Holder is the owner of a lock.
type Holder struct {
	Owner   string `json:"owner"`
	Label   string `json:"label"` // who holds, for people (see redisync.WithLabel)
	Count   int64  `json:"count"`
	LeaseMS int64  `json:"lease_ms"`
	Token   int64  `json:"token"`
}

// Waiter is a fair waiter of a lock.
type Waiter struct {
	Position       int    `json:"position"`
	Owner          string `json:"owner"`
	Label          string `json:"label"`
	Arrival        int64  `json:"arrival"`
	HeartbeatMS    int64  `json:"heartbeat_ms"`
	HandoffLeaseMS int64  `json:"handoff_lease_ms"`
	Alive          bool   `json:"alive"`
}

// lockKeys are the keys of the lock name under prefix, as in mutex.go.
type lockKeys struct{ lock, token, queue, waiters, channel string }

func newLockKeys(prefix, name string) lockKeys {
	base := prefix + ":lock:{" + name + "}"
	return lockKeys{base, base + ":token", base + ":queue", base + ":waiters", base + ":ch"}
}

func runStatus(args []string) int {
	fs := newFlags("status")
	redisURL := redisFlag(fs)
	prefix := fs.String("prefix", "redisync", "key `prefix` of the Redis keys")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	p, err := parseArgs(fs, statusHelp, args)
	if errors.Is(err, errHelp) {
		return exitOK
	}
	switch {
	case err != nil:
	case p.dashdash || len(p.pos) != 1:
		err = errors.New("want exactly one NAME")
	case checkPrefix(*prefix) != nil:
		err = checkPrefix(*prefix)
	default:
		err = checkName(p.pos[0])
	}
	if err != nil {
		return usageError("status", err)
	}
	name := p.pos[0]

	ctx := context.Background()
	rdb, err := connect(ctx, resolveTarget(*redisURL))
	if err != nil {
		return connectExit(err)
	}
	defer func() { _ = rdb.Close() }()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := readStatus(ctx, rdb, *prefix, name)
	if err != nil {
		return errorf(errorCode(err), "cannot read the status of %q: %v", name, err)
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

// held reports whether the lock or any permit of the semaphore is held
// (by a holder whose lease has not ended).
func (st *Status) held() bool {
	if st.Lock.Held {
		return true
	}
	if s := st.Semaphore; s != nil {
		for _, h := range s.Holders {
			if h.LeaseMS > 0 {
				return true
			}
		}
	}
	return false
}

// readStatus reads the lock name and the semaphore of that name in one
// MULTI/EXEC transaction, so that holders, tokens and queues are seen at
// one instant. It only reads. A key of another type than redisync uses
// is an error that names the keys.
func readStatus(ctx context.Context, rdb redis.Cmdable, prefix, name string) (*Status, error) {
	k := newLockKeys(prefix, name)
	var (
		owners  *redis.MapStringStringCmd
		pttl    *redis.DurationCmd
		token   *redis.StringCmd
		queue   *redis.ZSliceCmd
		waiters *redis.MapStringStringCmd
		now     *redis.TimeCmd
		subs    []*redis.MapStringIntCmd
		sem     func(nowMS int64) (*SemStatus, error)
	)
	_, cluster := rdb.(*redis.ClusterClient)
	cmds, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		owners = p.HGetAll(ctx, k.lock)
		pttl = p.PTTL(ctx, k.lock)
		token = p.Get(ctx, k.token)
		queue = p.ZRangeWithScores(ctx, k.queue, 0, -1)
		waiters = p.HGetAll(ctx, k.waiters)
		now = p.Time(ctx)
		subs = append(subs, p.PubSubNumSub(ctx, k.channel))
		if cluster { // waiters subscribe with SSUBSCRIBE there, by default
			subs = append(subs, p.PubSubShardNumSub(ctx, k.channel))
		}
		sem = readSemaphore(ctx, p, prefix, name)
		return nil
	})
	// The transaction's error is its first command's error, and GET of
	// a lock never taken is redis.Nil: look at every command.
	for _, c := range cmds {
		if cerr := c.Err(); cerr != nil && !errors.Is(cerr, redis.Nil) {
			return nil, keyError(cerr, prefix, name)
		}
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	st := &Status{Name: name, Prefix: prefix, ServerTimeMS: now.Val().UnixMilli()}
	if v := token.Val(); v != "" {
		if st.Lock.LastToken, err = strconv.ParseInt(v, 10, 64); err != nil {
			return nil, fmt.Errorf("the fencing token key %s holds %q, not a counter", k.token, v)
		}
	}
	if len(owners.Val()) > 0 {
		st.Lock.Held = true
		st.Lock.Holder = &Holder{
			Owner:   firstKey(owners.Val()),
			Label:   labelOf(firstKey(owners.Val())),
			LeaseMS: ttlMS(pttl.Val()),
			Token:   st.Lock.LastToken, // every new hold mints the next token
		}
		st.Lock.Holder.Count, _ = strconv.ParseInt(owners.Val()[st.Lock.Holder.Owner], 10, 64)
	}
	for _, c := range subs {
		st.Lock.SubscribedProcesses += c.Val()[k.channel]
	}
	st.Lock.Queue = []Waiter{}
	for i, z := range queue.Val() {
		w := Waiter{Position: i + 1, Owner: fmt.Sprint(z.Member), Arrival: int64(z.Score)}
		w.Label = labelOf(w.Owner)
		if deadline, handoff, ok := parseWaiter(waiters.Val()[w.Owner]); ok {
			w.HeartbeatMS = deadline - st.ServerTimeMS
			w.HandoffLeaseMS = handoff
			w.Alive = w.HeartbeatMS >= 0
		}
		st.Lock.Queue = append(st.Lock.Queue, w)
	}
	if st.Semaphore, err = sem(st.ServerTimeMS); err != nil {
		return nil, err
	}
	return st, nil
}

// keyError explains a WRONGTYPE error from a read of the keys of name.
func keyError(err error, prefix, name string) error {
	if strings.HasPrefix(err.Error(), "WRONGTYPE") {
		return fmt.Errorf("a key %s:*:{%s}* holds a value of another type than redisync uses: %w", prefix, name, err)
	}
	return err
}

// parseWaiter splits a waiter record "deadlineMs:handoffMs".
func parseWaiter(rec string) (deadline, handoff int64, ok bool) {
	a, b, found := strings.Cut(rec, ":")
	d, err1 := strconv.ParseInt(a, 10, 64)
	h, err2 := strconv.ParseInt(b, 10, 64)
	return d, h, found && err1 == nil && err2 == nil
}

// ttlMS converts a PTTL reply to ms: -1 for no expiry, 0 for gone.
func ttlMS(d time.Duration) int64 {
	switch {
	case d == -1:
		return -1
	case d < 0:
		return 0
	}
	return d.Milliseconds()
}

// labelOf returns the label that starts an owner id ("label/client-n"),
// or "" for an id without one.
func labelOf(owner string) string {
	i := strings.LastIndexByte(owner, '/')
	if i < 0 {
		return ""
	}
	return owner[:i]
}

// firstKey returns the smallest key of m (a lock hash has one).
func firstKey(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys[0]
}

// print writes st for people: the lock, unless it has no key and the
// semaphore has, and the semaphore if it has keys.
func (st *Status) print(out io.Writer) {
	l := st.Lock
	if !l.Held && l.LastToken == 0 && len(l.Queue) == 0 && l.SubscribedProcesses == 0 && st.Semaphore != nil {
		printSemaphore(out, st)
		return
	}
	fmt.Fprintf(out, "lock %q (prefix %q)\n", st.Name, st.Prefix)
	if h := l.Holder; h != nil {
		field(out, "holder", h.Owner)
		field(out, "label", h.Label)
		field(out, "hold count", strconv.FormatInt(h.Count, 10))
		field(out, "lease", leaseText(h.LeaseMS))
		field(out, "fencing token", strconv.FormatInt(h.Token, 10))
	} else {
		field(out, "holder", "none (free)")
		if l.LastToken > 0 {
			field(out, "last token", strconv.FormatInt(l.LastToken, 10))
		}
	}
	field(out, "subscribed", fmt.Sprintf("%d process(es) (with waiters, plain or fair, or within 2 s of their last)", l.SubscribedProcesses))
	if len(l.Queue) == 0 {
		field(out, "queue", "empty")
	} else {
		field(out, "queue", fmt.Sprintf("%d waiting, first come first served", len(l.Queue)))
		rows := [][]string{{"#", "owner", "arrival", "heartbeat due", "hand-off lease"}}
		for _, w := range l.Queue {
			rows = append(rows, []string{strconv.Itoa(w.Position), w.Owner, strconv.FormatInt(w.Arrival, 10), heartbeatText(w), ms(w.HandoffLeaseMS)})
		}
		table(out, rows)
	}
	if st.Semaphore != nil {
		printSemaphore(out, st)
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
