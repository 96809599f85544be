package redisync

import (
	"cmp"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
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

// Each option says by its type where it applies, so that an option given
// where it has no meaning (Barging to a Semaphore, WithPlainPubSub to a Mutex)
// does not compile. An option given to New (or NewRedlock) is the default
// of everything the Client (or Redlock) creates; one given to NewMutex or
// NewSemaphore overrides it for that value.

// ClientOption configures New.
type ClientOption interface{ applyClient(*config) }

// MutexOption configures NewMutex (and InspectLock, which uses its key
// prefix).
type MutexOption interface{ applyMutex(*config) }

// SemaphoreOption configures NewSemaphore (and ResizeSemaphore and
// InspectSemaphore, which use its key prefix).
type SemaphoreOption interface{ applySemaphore(*config) }

// RedlockOption configures NewRedlock.
type RedlockOption interface{ applyRedlock(*config) }

// RedMutexOption configures Redlock.NewMutex.
type RedMutexOption interface{ applyRedMutex(*config) }

// ElectionOption configures NewElection (and InspectElection, which uses
// its key prefix).
type ElectionOption interface{ applyElection(*config) }

// Option applies everywhere: New, NewMutex, NewSemaphore, NewElection,
// NewRedlock and Redlock.NewMutex.
type Option interface {
	ClientOption
	MutexOption
	SemaphoreOption
	RedlockOption
	RedMutexOption
	ElectionOption
}

// LocalOption applies to New, NewMutex, NewSemaphore and NewElection: to
// primitives on one Redis deployment, not to a Redlock.
type LocalOption interface {
	ClientOption
	MutexOption
	SemaphoreOption
	ElectionOption
}

// LockOption applies to locks: New, NewMutex, NewRedlock and
// Redlock.NewMutex.
type LockOption interface {
	ClientOption
	MutexOption
	RedlockOption
	RedMutexOption
}

// FairnessOption applies to New and NewMutex.
type FairnessOption interface {
	ClientOption
	MutexOption
}

// SetupOption applies to what a Client runs for everything it creates (its
// subscriber, observer and logger): New, and NewRedlock for the Client of
// each node.
type SetupOption interface {
	ClientOption
	RedlockOption
}

// RedOption applies to NewRedlock and Redlock.NewMutex.
type RedOption interface {
	RedlockOption
	RedMutexOption
}

// setting is every option: a change to a config.
type setting func(*config)

func (s setting) applyClient(cfg *config)    { s(cfg) }
func (s setting) applyMutex(cfg *config)     { s(cfg) }
func (s setting) applySemaphore(cfg *config) { s(cfg) }
func (s setting) applyRedlock(cfg *config)   { s(cfg) }
func (s setting) applyRedMutex(cfg *config)  { s(cfg) }
func (s setting) applyElection(cfg *config)  { s(cfg) }

// config is the set of options of one primitive.
type config struct {
	prefix         string
	lease          time.Duration // fixed lease; 0: watchdog
	watchdog       time.Duration // lease kept alive by the watchdog
	maxHold        time.Duration // how long the watchdog renews a hold; 0: no cap
	heartbeat      time.Duration // fair waiters' liveness deadline and hand-off lease
	recheck        time.Duration // longest sleep without a message
	barging        bool          // a Mutex takes a free lock whatever its queue
	plain          bool          // plain pub/sub on a Redis Cluster (an option of New)
	replicas       int           // replicas that must acknowledge an acquisition; 0: none
	replicaTimeout time.Duration
	node           time.Duration // Redlock: per-node timeout; 0: the default
	label          string        // the start of every hold id (WithLabel)
	metadata       string        // stored with every hold of a Mutex (WithMetadata)
	obs            Observer      // WithObserver (an option of New)
	log            *slog.Logger  // WithLogger (an option of New)
	err            error         // the first invalid option
}

func defaultConfig() config {
	return config{
		label:     defaultLabel(),
		prefix:    "redisync",
		watchdog:  30 * time.Second,
		heartbeat: 3 * time.Second,
		recheck:   10 * time.Second,
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

// with returns a copy of cfg with opts applied by apply (a nil option is
// skipped).
func with[O any](cfg config, opts []O, apply func(O, *config)) config {
	for _, o := range opts {
		if any(o) != nil {
			apply(o, &cfg)
		}
	}
	return cfg
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

// WithLease gives every hold a fixed lease d, with no watchdog renewal: the
// lock is released by Redis d after it was taken (re-entering does not
// re-arm it; a Semaphore's Acquire and partial Release re-arm its
// holder's), and Lost is closed when d has passed locally. d must be in
// [1ms, MaxLease].
//
// The default is no fixed lease: the watchdog keeps a lease of 30 s (see
// WithWatchdogLease) alive while the lock is held.
func WithLease(d time.Duration) Option {
	return setting(func(cfg *config) {
		if cfg.checkDuration("lease", d) {
			cfg.lease = d
		}
	})
}

// WithWatchdogLease sets the lease that the watchdog keeps alive while a
// lock is held; it renews it every d/3. A holder whose process dies frees
// the lock after at most d. d must be in [3ms, MaxLease].
//
// The default is 30 s.
func WithWatchdogLease(d time.Duration) Option {
	return setting(func(cfg *config) {
		if cfg.checkDuration("watchdog lease", d) && cfg.checkDuration("watchdog lease/3", d/3) {
			cfg.watchdog = d
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
// A Mutex uses it, a RedMutex too (its node holds are renewed no longer),
// and a Semaphore for its holding (counted from when the value went from
// no permits to some). A hold with a fixed lease (WithLease) is never
// renewed anyway.
//
// The default is no cap.
func WithMaxHold(d time.Duration) Option {
	return setting(func(cfg *config) {
		if d < 0 {
			cfg.invalid("max hold %v is negative", d)
			return
		}
		cfg.maxHold = d
	})
}

// WithHeartbeat sets how long a fair waiter stays queued without a
// heartbeat (sent every d/3 by the Client), and the lease of a hold handed
// to a waiter until its watchdog extends it. A waiter whose process dies is
// skipped within d; a hand-off to a waiter that died frees the lock within
// d. d must be in [3ms, MaxLease].
//
// A handed-over hold's deadline counts from the last heartbeat that Redis
// confirmed before the hand-off, up to d/3 and a round trip earlier, and
// its first renewal takes another round trip: so d must exceed three round
// trips to Redis (and the watchdog lease too), or a waiter handed the lock
// loses it at once (safely: Lost closes before anyone else can get in).
//
// The default is 3 s.
func WithHeartbeat(d time.Duration) LocalOption {
	return setting(func(cfg *config) {
		if cfg.checkDuration("heartbeat", d) && cfg.checkDuration("heartbeat/3", d/3) {
			cfg.heartbeat = d
		}
	})
}

// WithRecheck sets the longest a waiter sleeps without asking Redis again
// when no message wakes it. Messages are only a hint (pub/sub may lose one
// across a reconnect), so this bounds every wait. d must be in [1ms,
// MaxLease].
//
// The default is 10 s.
func WithRecheck(d time.Duration) Option {
	return setting(func(cfg *config) {
		if cfg.checkDuration("recheck interval", d) {
			cfg.recheck = d
		}
	})
}

// WithKeyPrefix sets the prefix of every Redis key and channel. It must not
// be empty nor contain '{' or '}' (the name is the keys' hash tag).
//
// The default is "redisync".
func WithKeyPrefix(p string) Option {
	return setting(func(cfg *config) {
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
// The default is fair: a Mutex serves its waiters first come, first
// served across all processes, and the release that frees the lock hands
// it directly to the next waiter, in the same script. See the package
// documentation.
func Barging() FairnessOption {
	return setting(func(cfg *config) { cfg.barging = true })
}

// Fair makes a Mutex fair, the default: given to NewMutex, it undoes a
// Client's Barging for that Mutex. See Barging.
func Fair() FairnessOption {
	return setting(func(cfg *config) { cfg.barging = false })
}

// WithPlainPubSub makes a Client on a Redis Cluster wake waiters with
// plain PUBLISH and SUBSCRIBE, which every node of the cluster relays to
// every other, instead of sharded pub/sub, which needs Redis 7. It only
// has an effect as an option of New, and only on a *redis.ClusterClient.
//
// The default on a *redis.ClusterClient is sharded pub/sub.
func WithPlainPubSub() SetupOption {
	return setting(func(cfg *config) { cfg.plain = true })
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
// otherwise. It costs nothing in calls; it makes hold ids longer.
func WithLabel(label string) Option {
	return setting(func(cfg *config) {
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
// The default is none. It costs no call; it adds its length to each
// acquisition's request.
func WithMetadata(meta string) LockOption {
	return setting(func(cfg *config) {
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
