package redisync

import (
	"cmp"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limits on names and durations, checked before any call to Redis.
const (
	// MaxNameLen is the longest name accepted, in bytes.
	MaxNameLen = 1024
	// MaxLease is the longest lease, watchdog lease or heartbeat accepted.
	MaxLease = 24 * time.Hour
	// minDuration is the shortest lease accepted: Redis counts in ms.
	minDuration = time.Millisecond
)

// Option configures a Client (New), a Redlock (NewRedlock), or one
// primitive (NewMutex, NewSemaphore, ...): each option's documentation
// says where it applies. Given to New or NewRedlock, an option is the
// default of everything created from it that it applies to; given to one
// constructor, it overrides that default for that value. An option given
// where it means nothing (Barging to a Semaphore, WithPlainPubSub to a
// Mutex) is ErrInvalidOption, from New (or NewRedlock), or from every call
// of the value built with it. A nil Option is skipped.
type Option interface{ setting() setting }

// setting is what an Option is: a change to a config, and where it means
// something.
type setting struct {
	name  string // as a user writes it, for errors
	where where
	set   func(*config)
}

func (s setting) setting() setting { return s }

// where is the set of places an option means something in.
type where uint16

// The places an option can be given to.
const (
	atClient    where = 1 << iota // New
	atMutex                       // NewMutex, NewMultiMutex
	atSemaphore                   // NewSemaphore
	atRWMutex                     // NewRWMutex
	atElection                    // NewElection
	atRedlock                     // NewRedlock
	atRedMutex                    // Redlock.NewMutex
	atInspect                     // InspectLock, InspectSemaphore, InspectRWMutex, InspectElection, ResizeSemaphore

	// local: the primitives of one deployment, whose defaults New sets.
	local = atMutex | atSemaphore | atRWMutex | atElection
	// locks: the primitives that hold a lease.
	leased = local | atRedMutex
)

// places names each place, for errors.
var places = []struct {
	at   where
	name string
}{
	{atClient, "New"}, {atMutex, "NewMutex, NewMultiMutex"}, {atSemaphore, "NewSemaphore"}, {atRWMutex, "NewRWMutex"},
	{atElection, "NewElection"}, {atRedlock, "NewRedlock"}, {atRedMutex, "Redlock.NewMutex"},
	{atInspect, "Inspect..., ResizeSemaphore"},
}

// option returns the Option called name, which means something where.
// Given to New (or NewRedlock), an option that means something to a
// primitive that New (or a Redlock) creates means something there too.
func option(name string, at where, set func(*config)) Option {
	if at&local != 0 {
		at |= atClient
	}
	if at&atRedMutex != 0 {
		at |= atRedlock
	}
	return setting{name: name, where: at, set: set}
}

// config is the set of options of one primitive.
type config struct {
	prefix         string
	lease          time.Duration // fixed lease; 0: watchdog
	watchdog       time.Duration // lease kept alive by the watchdog
	maxHold        time.Duration // how long the watchdog renews a hold; 0: no cap
	heartbeat      time.Duration // fair waiters' liveness deadline and hand-off lease
	recheck        time.Duration // longest sleep without a message
	barging        bool          // a Mutex takes a free lock whatever its queue
	maxWaiters     int           // the most calls a fair lock's queue holds for a Lock to join it; 0: no limit
	plain          bool          // plain pub/sub on a Redis Cluster (an option of New)
	replicas       int           // replicas that must acknowledge an acquisition; 0: none
	replicaTimeout time.Duration
	node           time.Duration             // Redlock: per-node timeout; 0: the default
	label          string                    // the start of every hold id (WithLabel)
	metadata       string                    // stored with every hold of a Mutex (WithMetadata)
	obs            Observer                  // WithObserver (an option of New)
	connSetup      func(*redis.Client) error // WithConnSetup (an option of New)
	log            *slog.Logger              // WithLogger (an option of New)
	err            error                     // the first invalid option
}

// DefaultCrashTimeout is how long the lease of a hold lasts, renewed by
// the watchdog while its holder lives: a holder whose process dies keeps
// others out for at most this long (see WithCrashTimeout).
const DefaultCrashTimeout = 15 * time.Second

func defaultConfig() config {
	return config{
		label:      defaultLabel(),
		prefix:     "redisync",
		watchdog:   DefaultCrashTimeout,
		heartbeat:  3 * time.Second,
		recheck:    10 * time.Second,
		maxWaiters: DefaultMaxWaiters,
	}
}

// holdLease is the lease set by an acquisition.
func (cfg *config) holdLease() time.Duration {
	return cmp.Or(cfg.lease, cfg.watchdog)
}

// grantLease is the lease of a hold handed over, or permits granted, to a
// waiter by another call's release: short under the watchdog, which
// extends it, so that a grant to a waiter that just died costs little.
func (cfg *config) grantLease() time.Duration {
	if cfg.lease > 0 {
		return cfg.lease
	}
	return min(cfg.heartbeat, cfg.watchdog)
}

// with returns a copy of cfg with opts applied, given at place (a nil
// option is skipped): an option that means nothing there is an invalid
// one.
func with(cfg config, at where, opts []Option) config {
	for _, o := range opts {
		if o == nil {
			continue
		}
		s := o.setting()
		if s.where&at == 0 {
			cfg.invalid("%s means nothing to %s", s.name, placeName(at))
			continue
		}
		s.set(&cfg)
	}
	return cfg
}

// placeName names the place at.
func placeName(at where) string {
	for _, p := range places {
		if p.at == at {
			return p.name
		}
	}
	return "this"
}

// invalid records the first invalid option.
func (cfg *config) invalid(format string, args ...any) {
	if cfg.err == nil {
		cfg.err = fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
	}
}

// checkDuration records an error when d is outside [1ms, MaxLease].
func (cfg *config) checkDuration(what string, d time.Duration) bool {
	if d < minDuration || d > MaxLease {
		cfg.invalid("%s %v is outside [%v, %v]", what, d, minDuration, MaxLease)
		return false
	}
	return true
}

// WithCrashTimeout sets how long a holder whose process dies (or loses
// Redis for good) keeps others out: the lease of each hold, which the
// Client's watchdog renews every d/3 while the holder lives. A shorter d
// frees a crashed holder's locks sooner, and costs a renewal call more
// often (one call per Client and renewal round, whatever the number of
// holds); a hold whose renewals fail for about d is lost (Lost closes). d
// must be in [3ms, MaxLease]. It applies to every primitive that holds (a
// Mutex, RWMutex, Semaphore, MultiMutex, Election, RedMutex), and to New
// and NewRedlock as their default.
//
// The default is DefaultCrashTimeout, 15 s.
func WithCrashTimeout(d time.Duration) Option {
	return option("WithCrashTimeout", leased, func(cfg *config) {
		if cfg.checkDuration("crash timeout", d) && cfg.checkDuration("crash timeout/3", d/3) {
			cfg.watchdog = d
		}
	})
}

// WithFixedLease gives every hold a fixed lease d, with no watchdog
// renewal: the lock is released by Redis d after it was taken (re-entering
// does not re-arm it; a Semaphore's Acquire and partial Release re-arm its
// holder's), and Lost is closed when d has passed locally; Extend
// lengthens it. d must be in [1ms, MaxLease]. It applies where
// WithCrashTimeout does.
//
// The default is no fixed lease: the watchdog keeps the lease alive (see
// WithCrashTimeout).
func WithFixedLease(d time.Duration) Option {
	return option("WithFixedLease", leased, func(cfg *config) {
		if cfg.checkDuration("fixed lease", d) {
			cfg.lease = d
		}
	})
}

// WithMaxHold caps how long the watchdog renews a hold: once d has passed
// since the hold was taken, no renewal is sent. A holder that hangs but
// stays alive (a stuck goroutine, a deadlock, a call that never returns)
// then loses the lock by d plus one watchdog lease at the latest: Lost
// closes by the hold's local deadline, before Redis can let anyone else
// in, and Unlock reports ErrLockLost. Holders that finish in time are not
// affected. Extend is not capped: it is the holder's own call, made when
// it is evidently alive. d must not be negative; 0 means no cap.
//
// It applies where WithCrashTimeout does: to a RedMutex too (its node
// holds are renewed no longer), and to a Semaphore for its holding
// (counted from when the value went from no permits to some). A hold with
// a fixed lease (WithFixedLease) is never renewed anyway.
//
// The default is no cap.
func WithMaxHold(d time.Duration) Option {
	return option("WithMaxHold", leased, func(cfg *config) {
		if d < 0 {
			cfg.invalid("max hold %v is negative", d)
			return
		}
		cfg.maxHold = d
	})
}

// WithWaiterTimeout sets how long a queued waiter whose process died
// keeps its place (and a lock handed to it, others out): a waiter is kept
// alive by a heartbeat its Client sends every d/3, one per lock however
// many of its waiters queue there, and a hold handed to a waiter has a
// lease of d until its watchdog extends it. d must be in [3ms, MaxLease].
// It applies to the primitives that queue their waiters (a fair Mutex,
// RWMutex, Semaphore, MultiMutex, Election), and to New as their default.
//
// A handed-over hold's deadline counts from the last heartbeat that Redis
// confirmed before the hand-off, up to d/3 and a round trip earlier, and
// its first renewal takes another round trip: so d must exceed three round
// trips to Redis (and the crash timeout too), or a waiter handed the lock
// loses it at once (safely: Lost closes before anyone else can get in).
//
// The default is 3 s.
func WithWaiterTimeout(d time.Duration) Option {
	return option("WithWaiterTimeout", local, func(cfg *config) {
		if cfg.checkDuration("waiter timeout", d) && cfg.checkDuration("waiter timeout/3", d/3) {
			cfg.heartbeat = d
		}
	})
}

// WithRecheck sets the longest a waiter sleeps without asking Redis again
// when no message wakes it. Messages are only a hint (pub/sub may lose one
// across a reconnect), so this bounds every wait. d must be in [1ms,
// MaxLease].
//
// It applies to every primitive that waits, and to New and NewRedlock as
// their default.
//
// The default is 10 s.
func WithRecheck(d time.Duration) Option {
	return option("WithRecheck", leased, func(cfg *config) {
		if cfg.checkDuration("recheck interval", d) {
			cfg.recheck = d
		}
	})
}

// WithKeyPrefix sets the prefix of every Redis key and channel. It must not
// be empty nor contain '{' or '}' (the name is the keys' hash tag).
//
// It applies everywhere: to New and NewRedlock as the default, to every
// primitive, and to the Inspect calls and ResizeSemaphore, which read and
// change a primitive's keys.
//
// The default is "redisync".
func WithKeyPrefix(p string) Option {
	return option("WithKeyPrefix", leased|atInspect, func(cfg *config) {
		if p == "" || strings.ContainsAny(p, "{}") {
			cfg.invalid("key prefix %q must be non-empty and without braces", p)
			return
		}
		cfg.prefix = p
	})
}

// Barging makes a Mutex unfair, as Redisson's RLock and Java's
// ReentrantLock(false) are: a released lock goes to whichever waiter asks
// first, and a Lock may take a free lock ahead of waiters that have waited
// longer. A barging holder that releases and locks again at once can keep
// the lock from others, and the waiter that a release wakes (one, in one
// process) often finds the lock taken again. In exchange no queue is kept,
// and an uncontended Lock and Unlock run a call fewer inside Redis.
// docs/benchmarks.md measures the trade-off.
//
// It applies to a Mutex and a MultiMutex (each of its names), and to New
// as their default. (A RedMutex always barges: see NewMutex of Redlock.)
//
// The default is fair: a Mutex serves its waiters first come, first
// served across all processes, and the release that frees the lock hands
// it directly to the next waiter, in the same script. See the package
// documentation.
func Barging() Option {
	return option("Barging", atMutex, func(cfg *config) { cfg.barging = true })
}

// DefaultMaxWaiters is the most calls that may wait in a lock's fair
// queue for a Lock to join it, unless WithMaxWaiters says otherwise.
const DefaultMaxWaiters = 10000

// WithMaxWaiters bounds the fair queue of a lock: a Lock that finds n
// calls queued for the lock already, and would have to join them, fails at
// once with ErrQueueFull rather than wait, leaving nothing in Redis. A call
// that has joined the queue is never refused (its later attempts and
// heartbeats are not joins); one whose place was dropped (its process
// stalled beyond its waiter timeout) joins anew, and may be refused then.
// TryLock never joins, and a barging Mutex keeps no queue: neither is
// affected. Redis checks the queue's length as the call would join, one
// call more on that path only. n must not be negative; 0 means no limit.
//
// It applies to a fair Mutex, a MultiMutex (each of its names; a refused
// name gives back those taken) and an Election (Campaign), and to New as
// their default. Every caller of a lock should give the same n: each
// call is checked against its own.
//
// The default is DefaultMaxWaiters, 10,000: more than a lock served in
// turn works through in any reasonable wait (at 1 ms per hold, the last of
// 10,000 waiters waits 10 s), and a bound on what a runaway caller (a
// retry loop that starts a Lock per request) piles up on a shared Redis:
// the queue's memory (about 100 bytes per waiter, plus its metadata: 1 MB
// at the default), and the time of the withdrawal of a waiter that gives
// up, which searches the queue for its record (about 0.35 ms of Redis
// 7.0 at the end of 10,000 records, ten times that at 100,000).
func WithMaxWaiters(n int) Option {
	return option("WithMaxWaiters", atMutex|atElection, func(cfg *config) {
		if n < 0 {
			cfg.invalid("max waiters %d is negative", n)
			return
		}
		cfg.maxWaiters = n
	})
}

// Fair makes a Mutex fair, the default: given to NewMutex, it undoes a
// Client's Barging for that Mutex. See Barging.
func Fair() Option {
	return option("Fair", atMutex, func(cfg *config) { cfg.barging = false })
}

// WithPlainPubSub makes a Client on a Redis Cluster wake waiters with
// plain PUBLISH and SUBSCRIBE, which every node of the cluster relays to
// every other, instead of sharded pub/sub, which needs Redis 7. Every
// Client of a cluster must agree: a waiter subscribed one way does not hear
// a release published the other. It applies to New and NewRedlock (each
// node's Client), and matters only on a Redis Cluster.
//
// The default on a Redis Cluster is sharded pub/sub.
func WithPlainPubSub() Option {
	return option("WithPlainPubSub", atClient|atRedlock, func(cfg *config) { cfg.plain = true })
}

// WithConnSetup makes a Client run setup on each go-redis client it builds
// for connections of its own. A Client of one server (a redis.NewClient;
// not a failover client, nor a Redis Cluster's) sends its calls and its
// watchdog's renewals on connections it opens itself, from the options of
// the client given to New, so that a call whose context ends returns at
// once whatever the client's timeouts: the hooks added to that client
// (AddHook: tracing, metrics) do not see those calls unless setup adds
// them too, e.g.
//
//	redisync.WithConnSetup(func(c *redis.Client) error { return redisotel.InstrumentTracing(c) })
//
// setup runs on each of those clients, one per connection: a connection
// whose call was cut short or failed is replaced by a new client, set up
// anew. So it should add hooks and nothing that stays registered per
// client (go-redis pool metrics would pile up). An error from setup fails
// the call that needed the connection. It applies to New and NewRedlock
// (each node's Client). See docs/deployment.md for the connections a
// Client opens.
//
// The default is no setup.
func WithConnSetup(setup func(*redis.Client) error) Option {
	return option("WithConnSetup", atClient|atRedlock, func(cfg *config) { cfg.connSetup = setup })
}

// checkName validates a primitive's name. The name is its keys' hash tag
// (the part of "{name}" up to the first '}'), so it must not start with
// '}': the tag would be empty, and Redis Cluster would hash each key whole
// and scatter them over slots.
func checkName(name string) error {
	switch {
	case name == "" || len(name) > MaxNameLen:
		return fmt.Errorf("%w: length %d is outside [1, %d]", ErrInvalidName, len(name), MaxNameLen)
	case name[0] == '}':
		return fmt.Errorf("%w: %s starts with '}', which would leave its keys no hash tag", ErrInvalidName, quote(name))
	}
	return nil
}

// MaxLabelLen is the longest label accepted by WithLabel, in bytes.
const MaxLabelLen = 64

// WithLabel sets the label that identifies holders to people: every hold
// id (a lock hash's field, a semaphore holder's, a waiter's) starts with
// it, followed by "/" and the Client's own id, so that status and any
// introspection tell which process holds. The default is "host/pid" (the
// host name and process id). Given to New, it labels everything of the
// Client; given to NewMutex or NewSemaphore, that value's holds only.
//
// A label is 1 to MaxLabelLen printable ASCII characters other than space,
// '{' and '}' (which would change a key's hash tag): ErrInvalidOption
// otherwise. It costs nothing in calls; it makes hold ids longer. It
// applies to New and NewRedlock as the default, and to every primitive.
func WithLabel(label string) Option {
	return option("WithLabel", leased, func(cfg *config) {
		if err := checkLabel(label); err != "" {
			cfg.invalid("label %q %s", label, err)
			return
		}
		cfg.label = label
	})
}

// MaxMetadataLen is the longest metadata accepted by WithMetadata, in bytes.
const MaxMetadataLen = 1024

// WithMetadata stores meta with every hold of a Mutex (and of a RedMutex,
// on each node): whatever tells people or programs more about the holder
// than its label, such as a job id or the version that runs. Anyone can
// read it with Client.InspectLock (LockHolder.Metadata) and see it in
// redisync status; a fair waiter carries it in its place in the queue, so
// that a hand-off stores it too, and Accept stores the taker's. It is at
// most MaxMetadataLen bytes (ErrInvalidOption otherwise), of any content.
// A Semaphore does not store it.
//
// It applies to a Mutex, a MultiMutex (each name's hold) and a RedMutex,
// and to New and NewRedlock as their default. (An Election's value is the
// metadata of its leader's hold: see Campaign.)
//
// The default is none. It costs no call; it adds its length to each
// acquisition's request.
func WithMetadata(meta string) Option {
	return option("WithMetadata", atMutex|atRedMutex, func(cfg *config) {
		if len(meta) > MaxMetadataLen {
			cfg.invalid("metadata of %d bytes is longer than %d", len(meta), MaxMetadataLen)
			return
		}
		cfg.metadata = meta
	})
}

// checkLabel says what is wrong with label, or "".
func checkLabel(label string) string {
	if label == "" || len(label) > MaxLabelLen {
		return fmt.Sprintf("is not 1 to %d bytes long", MaxLabelLen)
	}
	for _, r := range label {
		if r <= ' ' || r > '~' || r == '{' || r == '}' {
			return "has a character other than printable ASCII, or a space, '{' or '}'"
		}
	}
	return ""
}

// defaultLabel is "host/pid", with what a label may not hold replaced.
func defaultLabel() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	label := []byte(host + "/" + strconv.Itoa(os.Getpid()))
	for i, b := range label {
		if b <= ' ' || b > '~' || b == '{' || b == '}' {
			label[i] = '_'
		}
	}
	if len(label) > MaxLabelLen {
		label = label[len(label)-MaxLabelLen:]
	}
	return string(label)
}

// WithReplicas makes every acquisition wait until at least n replicas of
// the primary have acknowledged it (WAIT n timeout, on the connection that
// ran the acquire script), so that a failover to one of them keeps the
// hold and its fencing token. When fewer acknowledge within timeout, the
// acquisition is undone and the call fails with ErrNotReplicated. A lock
// or permits handed over by a release are confirmed the same way, with a
// round trip of the new holder's own.
//
// WAIT is not consensus: an acknowledged write can still be lost (a
// replica that acknowledged may not be the one promoted, and replicas
// acknowledge receipt, not persistence). It narrows the window in which a
// failover grants a lock twice; it does not close it. See
// docs/deployment.md.
// n must be in [1, 100] and timeout in [1ms, MaxLease]. It applies to the
// primitives of one deployment (a Mutex, RWMutex, Semaphore, MultiMutex,
// Election), and to New as their default; not to a Redlock.
//
// The default is not to wait for replicas.
func WithReplicas(n int, timeout time.Duration) Option {
	return option("WithReplicas", local, func(cfg *config) {
		if n < 1 || n > 100 {
			cfg.invalid("replicas %d is outside [1, 100]", n)
			return
		}
		if cfg.checkDuration("replica timeout", timeout) {
			cfg.replicas, cfg.replicaTimeout = n, timeout
		}
	})
}
