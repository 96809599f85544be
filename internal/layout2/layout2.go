// Package layout2 is the layout-2 fair Mutex's calls, frozen for
// benchmarks and upgrade tests: redisync's lock as it stood at commit
// a868dfa, before the stored layout became layout 3 (one hash per lock).
// The benchmark runs it beside the current Mutex in one run, and an
// upgrade test runs a layout-2 process beside a layout-3 one on the same
// lock names. It is not a public API.
//
// scripts/ holds verbatim copies of that commit's lib.lua, acquire.lua,
// release.lua and renew.lua (TestScriptsFrozen keeps them so); each script
// is lib.lua followed by its own file, as the library's scripts.go
// assembled them. The key names are layout 2's (see lockKeys), copied
// here rather than read from internal/schema, which moves on.
//
// The driver makes the calls of the library's fair Mutex with its default
// options, and nothing else:
//
//   - Lock: acquire.lua in mode "queue" with a 15 s lease, a 3 s waiter
//     heartbeat and a 3 s hand-off lease. A call not granted waits for a
//     grant message "ticket:token:ms" on its Client's grant channel of
//     the lock, or attempts again (ARGV[8] = 1) after the lock's PTTL or
//     the 10 s recheck interval, whichever is shorter; when ctx ends it
//     withdraws (release.lua mode "withdraw").
//   - TryLock: acquire.lua in mode "try". Unlock: release.lua in mode
//     "release", with the hold's token.
//   - A Client heartbeats its fair waiters as the layout-2 watchdog did:
//     renew.lua kind "wait", one entry per lock on which it has waiters,
//     every second (a third of the 3 s heartbeat), the entries due within
//     a sixth of that sent in one call; a farewell (ms 0) when the last
//     waiter of a lock leaves. A reply that says a release may have
//     dropped them (2, 0; 3 once a waiter's own deadline may have passed)
//     makes the waiters attempt again.
//
// What the library did and the driver does not: holds are never renewed
// (no watchdog "hold" entries, no Lost, no Extend). A hold taken by an
// attempt lasts its 15 s lease, one handed over by a release the 3 s
// hand-off lease; Unlock well within that. No barging, no metadata, no
// reentrancy, no replicas, no sharded pub/sub (PUBLISH only, so one server
// or a cluster's plain pub/sub). Errors are returned, not outlasted: a
// Lock whose call to Redis fails withdraws and returns the error. Calls
// go through the given go-redis client, not connections of the driver's
// own.
package layout2

import (
	_ "embed"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The layout-2 library's defaults (options.go at a868dfa).
const (
	lease        = 15 * time.Second       // DefaultCrashTimeout: the lease an attempt sets
	heartbeat    = 3 * time.Second        // the waiter timeout: a fair waiter's heartbeat ttl
	handoffLease = heartbeat              // min(waiter timeout, crash timeout): a handed-over hold's lease
	recheck      = 10 * time.Second       // the longest a waiter sleeps without asking again
	every        = heartbeat / 3          // how often the waiters of a lock are heartbeated
	tombstoneTTL = 10 * time.Second       // how long a release is remembered
	linger       = 2 * time.Second        // how long an idle grant channel stays subscribed
	cleanupLimit = 5 * time.Second        // bounds a withdrawal sent after ctx ended
	publish      = "PUBLISH"              // the scripts' publish command
	renewBatch   = 256                    // the most entries of one renew call
	maxLabelLen  = 64                     // the longest label
	retryAfter   = 300 * time.Millisecond // min(max(ttl/10, 1ms), 1s): a failed heartbeat's retry
)

// DefaultPrefix is the library's default key prefix.
const DefaultPrefix = "redisync"

// Errors of the driver.
var (
	// ErrClosed is returned by calls of a closed Client.
	ErrClosed = errors.New("layout2: client closed")
	// ErrNotHeld is returned by Unlock when the Mutex holds nothing.
	ErrNotHeld = errors.New("layout2: not held")
	// ErrLost is returned by Unlock when Redis no longer had the hold:
	// its lease ran out.
	ErrLost = errors.New("layout2: hold lost")
)

// The scripts, each lib.lua followed by its own file.
var (
	//go:embed scripts/lib.lua
	luaLib string
	//go:embed scripts/acquire.lua
	luaAcquire string
	//go:embed scripts/release.lua
	luaRelease string
	//go:embed scripts/renew.lua
	luaRenew string
)

// scripts are the loaded scripts. They are built at the first NewClient,
// not at package init: redis.NewScript computes a SHA-1 digest, which a
// process in FIPS 140-only mode may not do, and a FIPS test run may import
// this package without using it.
var scripts struct {
	once                    sync.Once
	acquire, release, renew *redis.Script
}

// loadScripts builds the scripts once.
func loadScripts() {
	scripts.once.Do(func() {
		scripts.acquire = redis.NewScript(luaLib + luaAcquire)
		scripts.release = redis.NewScript(luaLib + luaRelease)
		scripts.renew = redis.NewScript(luaLib + luaRenew)
	})
}

// keys are the layout-2 keys and channel of one lock (internal/schema at
// a868dfa, Lock).
type keys struct {
	hash, token, queue, waiters, bargers, channel string
}

// LockKey returns the layout-2 lock hash of the lock called name under
// prefix, "prefix:lock:{name}": the key that exists while it is held, and
// whose hash tag decides its cluster slot.
func LockKey(prefix, name string) string { return prefix + ":lock:{" + name + "}" }

// lockKeys returns the keys of the lock called name under prefix.
func lockKeys(prefix, name string) keys {
	b := LockKey(prefix, name)
	return keys{hash: b, token: b + ":token", queue: b + ":queue", waiters: b + ":waiters",
		bargers: b + ":bargers", channel: b + ":ch"}
}

// tombstone returns the key that exists once the call of ticket id has
// ended (released, or withdrawn).
func (k keys) tombstone(id string) string { return k.hash + ":released:" + id }

// grantChannel returns the channel of grants to the fair waiters of the
// Client client.
func (k keys) grantChannel(client string) string { return k.channel + ":" + client }
