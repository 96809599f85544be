// Package redisync provides distributed synchronization primitives on
// Redis for Go services: a leased Mutex with a blocking Lock(ctx), fair
// (FIFO) unless it opts out, fencing tokens, a counting Semaphore whose
// permits are leased to their holders, and a fair RWMutex (many readers
// or one writer, each reader on a lease of its own). It works on a single
// Redis, a primary with replicas (WithReplicas), Redis Cluster (sharded
// pub/sub), and independent Redis nodes (NewRedlock).
//
// # Sharing a value
//
// A Mutex, RWMutex, MultiMutex or RedMutex value is used as a *sync.Mutex
// is: the goroutines that share it exclude each other, and everyone else
// who locks the same name, in this process or another. Each Lock call
// takes the lock on its own, with its own place in the queue and its own
// fencing token; Unlock may come from any goroutine. A lock is reentrant
// through its hold's context: a Lock (or Do) whose ctx comes from the
// hold, the ctx that Do passes its function or HoldContext's, adds a
// level to the hold; any other Lock waits its turn, in the goroutine that
// holds too. A Semaphore value is one holder, as a
// golang.org/x/sync/semaphore.Weighted is: permits taken through it add
// up.
//
// # Waiting without polling
//
// A Mutex that finds its lock held does not poll Redis. It registers with
// its Client's one subscriber (a single pub/sub connection shared by every
// waiter of every lock of that Client; one per primary on a Redis Cluster),
// makes sure the subscription is
// confirmed, looks at the lock once more, and sleeps. The release that
// frees the lock hands it to the next queued waiter in the same script and
// publishes the grant on that waiter's Client's own channel of the lock,
// so that only the grantee's process wakes. A release that hands the lock
// to nobody wakes barging waiters (Barging) instead: each Client with one
// is recorded in Redis when its waiter finds the lock taken, and the
// release wakes one of those Clients, whose subscriber wakes one of its
// waiters (or, when they have all gone, passes the wake-up on to the next
// Client). A message is only a hint: every sleep is also bounded
// by the lock's remaining lease and by the recheck interval (WithRecheck),
// and a reconnect of the subscriber makes every waiter look again.
//
// # Leases, the watchdog and loss
//
// Every hold has a lease in Redis, so a holder that dies frees the lock
// when the lease runs out. By default the Client's watchdog keeps a 15 s
// lease alive while the lock is held (DefaultCrashTimeout; see
// WithCrashTimeout), renewing every hold of the Client in one script call
// every 5 s. When a renewal finds the hold gone, or
// renewals fail until the lease must have run out by the local clock, the
// hold is lost: Mutex.Lost is closed before Redis can give the lock to
// anyone else, and Unlock reports ErrLockLost.
//
// Mutex.Extend makes a hold last at least a given lease from now (never
// shortening it), Mutex.TTL reads what is left of it in Redis,
// Mutex.Handoff and Mutex.Accept hand a hold to another process (a new
// fencing token, and never two holders at once), and
// WithMaxHold caps how long the watchdog renews a hold, so that a holder
// that hangs while alive loses the lock. WithLabel names the holder for
// people: every hold id starts with it ("host/pid" by default), and
// "redisync status" shows it.
//
// # Contexts
//
// A blocking call (Lock, RLock, Acquire, Campaign) whose context ends
// first returns the context's error, wrapped, within about 25 ms, and
// leaves nothing behind; clean-up still under way goes on in the
// background, and Close waits for it. Once a context's deadline has
// passed the call fails with the context's error, whatever else failed
// meanwhile: on a loaded machine the timer that ends a context can fire
// after its deadline, and the call waits for it (at most 25 ms), so that
// ctx.Err() is set when it returns. A release (Unlock, Release) is sent
// whatever its context says.
//
// # Options
//
// An option's type says where it applies: Option everywhere, Option
// on one deployment (New, NewMutex, NewSemaphore), Option to New and
// NewMutex, Option to locks, Option to what a Client runs (New,
// NewRedlock), Option to a Redlock. Giving one where it has no meaning,
// such as Barging to a Semaphore, does not compile. Options of New (or
// NewRedlock) are the defaults of everything it creates; those given to
// one value override them.
//
// # Fencing tokens
//
// Every new hold of a lock gets a token strictly larger than every earlier
// hold's (Mutex.Token). A lease cannot protect a resource from a holder
// that paused past its lease; a resource that rejects writes carrying a
// token lower than the highest it has seen can. See docs/guarantees.md.
//
// # Observing
//
// WithObserver tells an Observer every call and every background event
// (holds taken, released, lost; renewals; reconnections), for metrics and
// traces (the module github.com/redisync/redisync/redisyncotel records them with
// OpenTelemetry); WithLogger logs with log/slog what an operator must see.
// Without them a call pays a nil check. See docs/operations.md.
//
// # Leader election
//
// Client.NewElection is leader election with the semantics of etcd's
// concurrency.Election, built on the fair lock: Campaign waits its turn
// (candidates in arrival order) and leads while it holds the election's
// lock, whose metadata is the leader's value; the leader has a hold's
// lease, fencing token and Lost. Observe streams every change, pushed by
// the scripts that make it through the Client's subscriber, each numbered
// with the revision it follows so that a lost message shows as a gap,
// reported with the current leader read at once. An election's keys are
// a lock's under "redisync:elect:{name}", and its changes are published
// on "redisync:elect:{name}:changes".
//
// # Keys
//
// A lock called name lives in keys that share the hash tag {name}, so that
// its scripts touch one Redis Cluster slot:
//
//	redisync:lock:{name}                 hash: the lock's state (holder, lease end, last token, queue length, Clients' waiter deadlines)
//	redisync:lock:{name}:waiting         fair waiters' records in arrival order (list)
//	redisync:lock:{name}:bargers         Clients with plain waiters (zset)
//	redisync:lock:{name}:released:ticket a withdrawn call's refusal, while a copy of it may be on its way (an hour)
//	redisync:lock:{name}:ch:client       the channel of one Client's waiters: grants and wake-ups
//
// A release does not delete the hash: it outlives every hold by an hour,
// and its TTL is pushed out only when it runs low. It holds the field
// "{layout}", the version of this layout: a call that meets a lock, or a
// semaphore in use, of another layout (another version of redisync on
// the same Redis) fails with ErrLayout and holds nothing
// (docs/upgrading.md).
//
// A semaphore's keys are "redisync:sem:{name}...", and a read-write
// lock's (RWMutex, a semaphore underneath) "redisync:rw:{name}...", in the
// same way. The
// prefix "redisync" is set with WithKeyPrefix. Every key has a TTL: nothing
// is left in Redis for good. docs/design.md describes every key and script.
package redisync
