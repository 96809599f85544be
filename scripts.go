package redisync

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redisync/redisync/internal/roundtrip"
	"github.com/redisync/redisync/internal/schema"
	"github.com/redisync/redisync/internal/watchdog"
)

// The Lua scripts: each is the helpers of lib.lua, those of its
// primitive (lock_lib.lua or sem_lib.lua), then its own body.
var (
	//go:embed scripts/lib.lua
	luaLib string
	//go:embed scripts/lock_lib.lua
	luaLockLib string
	//go:embed scripts/acquire.lua
	luaAcquire string
	//go:embed scripts/release.lua
	luaRelease string
	//go:embed scripts/renew.lua
	luaRenew string
	//go:embed scripts/extend.lua
	luaExtend string
	//go:embed scripts/ttl.lua
	luaTTL string
	//go:embed scripts/handoff.lua
	luaHandoff string
	//go:embed scripts/wake.lua
	luaWake string
	//go:embed scripts/multi_acquire.lua
	luaMultiAcquire string
	//go:embed scripts/multi_release.lua
	luaMultiRelease string
	//go:embed scripts/proclaim.lua
	luaProclaim string
	//go:embed scripts/leader.lua
	luaLeader string
	//go:embed scripts/sem_lib.lua
	luaSemLib string
	//go:embed scripts/sem_acquire.lua
	luaSemAcquire string
	//go:embed scripts/sem_release.lua
	luaSemRelease string
	//go:embed scripts/sem_resize.lua
	luaSemResize string
	//go:embed scripts/sem_lease.lua
	luaSemLease string

	acquireScript = newScript("acquire", luaLockLib, luaAcquire)
	releaseScript = newScript("release", luaLockLib, luaRelease)
	renewScript   = newScript("renew", luaLockLib, luaRenew)
	extendScript  = newScript("extend", luaLockLib, luaExtend)
	ttlScript     = newScript("ttl", luaLockLib, luaTTL)
	handoffScript = newScript("handoff", luaLockLib, luaHandoff)
	wakeScript    = newScript("wake", luaLockLib, luaWake)

	multiAcquireScript = newScript("multiAcquire", luaLockLib, luaMultiAcquire)
	multiReleaseScript = newScript("multiRelease", luaLockLib, luaMultiRelease)
	proclaimScript     = newScript("proclaim", luaLockLib, luaProclaim)
	leaderScript       = newScript("leader", luaLockLib, luaLeader)

	semAcquireScript = newScript("semAcquire", luaSemLib, luaSemAcquire)
	semReleaseScript = newScript("semRelease", luaSemLib, luaSemRelease)
	semResizeScript  = newScript("semResize", luaSemLib, luaSemResize)
	semLeaseScript   = newScript("semLease", luaSemLib, luaSemLease)
)

// luaScript is a Lua script with its SHA-1 digest, which EVALSHA names it
// by. The digests are computed when the scripts change, not at run time
// (scripts_sha1.go, which go generate writes): a process in FIPS 140-only
// mode may not use SHA-1.
type luaScript struct {
	name, src, sha string
	lib, body      string // src is luaLib + lib + body
}

//go:generate go test . -run ^TestScriptDigests$ -update-digests

// newScript returns the script of body, which uses the helpers of lib.lua
// and lib; it is known as name in scripts_sha1.go and in the function
// library.
func newScript(name, lib, body string) *luaScript {
	src := luaLib + lib + body
	s := &luaScript{name: name, src: src, sha: scriptSHA1[name], lib: lib, body: body}
	allScripts = append(allScripts, s)
	return s
}

// allScripts are the scripts of newScript, whose digests go generate
// writes.
var allScripts []*luaScript

// Hash returns the script's SHA-1 digest, in hex.
func (s *luaScript) Hash() string { return s.sha }

// Run sends the script: an FCALL of its function when rdb is a lane
// (roundtrip.Conn) to a server that runs the function library (see
// functions.go); otherwise, and from then on when the server has no
// functions or the user may not call them, or may not load the missing
// library but may send scripts, with send.
func (s *luaScript) Run(ctx context.Context, rdb redis.Scripter, keys []string, args ...any) *redis.Cmd {
	c, ok := rdb.(*roundtrip.Conn)
	if !ok || library().fn[s] == "" || !functionsToTry(c.Server) {
		return s.send(ctx, rdb, keys, args)
	}
	r, called := callFunction(ctx, c, s, keys, args)
	switch called {
	case functionsRefused:
		c.Server.Functions.Store(-1)
		c.Server.Recheck.Store(0)
		return s.send(ctx, rdb, keys, args)
	case libraryNotLoadable:
		// Scripts, if the user may send them, until a user that may
		// loads the library (LoadFunctions).
		r = s.send(ctx, rdb, keys, args)
		if err := r.Err(); err != nil && (refusedCommand(err, "evalsha") || refusedCommand(err, "eval")) {
			r.SetErr(notLoadedError(err))
		} else {
			c.Server.Recheck.Store(time.Now().Add(libraryRecheck).UnixNano())
			c.Server.Functions.Store(-1)
		}
	}
	return r
}

// libraryRecheck is how long a Client that found the library missing,
// and could not load it, sends scripts before it tries a function again.
var libraryRecheck = time.Minute

// functionsToTry reports whether a call to server is sent as an FCALL:
// unless the server was found to have no usable functions, and then once
// per libraryRecheck while that may pass.
func functionsToTry(server *roundtrip.Server) bool {
	if server.Functions.Load() >= 0 {
		return true
	}
	at := server.Recheck.Load()
	return at != 0 && time.Now().UnixNano() >= at &&
		server.Recheck.CompareAndSwap(at, time.Now().Add(libraryRecheck).UnixNano())
}

// send sends the script: EVALSHA, then EVAL when the server does not know
// it yet.
func (s *luaScript) send(ctx context.Context, rdb redis.Scripter, keys []string, args []any) *redis.Cmd {
	r := rdb.EvalSha(ctx, s.sha, keys, args...)
	if redis.HasErrorPrefix(r.Err(), "NOSCRIPT") {
		return rdb.Eval(ctx, s.src, keys, args...)
	}
	return r
}

// The typed arguments of the Lua scripts, one wrapper per script in the
// order of scripts.go: the only place that knows in which order a script
// reads its KEYS and ARGV, which its header in scripts/ documents.
// Durations go as whole milliseconds, flags as flag does.

// scriptCall is one call of a script: the script with its KEYS and ARGV,
// in the order it reads them.
type scriptCall struct {
	script *luaScript
	keys   []string
	args   []any
}

// run sends the call on rdb: EVALSHA, then EVAL when the server does not
// know the script yet.
func (c scriptCall) run(ctx context.Context, rdb redis.Scripter) *redis.Cmd {
	return c.script.Run(ctx, rdb, c.keys, c.args...)
}

// runAcked runs script on rdb and returns its reply as integers. With
// WithReplicas, when granted says the reply took something, it waits for
// the replicas on the connection that ran the script (rdb, a lane of one
// connection; on a Redis Cluster, a connection of its own to the primary
// that serves the script's first key); too few acknowledgements fail with
// ErrNotReplicated, which is not a reply from Redis, so the caller undoes
// the acquisition as it would after a lost reply.
func (c *Client) runAcked(ctx context.Context, rdb redis.UniversalClient, cfg config, script scriptCall, granted func([]int64) bool) ([]int64, error) {
	if cfg.replicas == 0 {
		return script.run(ctx, rdb).Int64Slice()
	}
	var conn redis.Scripter = rdb
	wait := func() (int64, error) {
		return rdb.Do(ctx, "WAIT", cfg.replicas, cfg.replicaTimeout.Milliseconds()).Int64()
	}
	if c.cluster != nil {
		node, err := c.cluster.MasterForKey(ctx, script.keys[0])
		if err != nil {
			return nil, err
		}
		nc := node.Conn()
		defer nc.Close()
		conn = nc
		wait = nc.Wait(ctx, cfg.replicas, cfg.replicaTimeout).Result
	}
	res, err := script.run(ctx, conn).Int64Slice()
	if err != nil || !granted(res) {
		return res, err
	}
	acked, err := wait()
	if err != nil {
		return nil, err
	}
	if acked < int64(cfg.replicas) {
		return nil, fmt.Errorf("%w: %d of %d replicas acknowledged within %v", ErrNotReplicated, acked, cfg.replicas, cfg.replicaTimeout)
	}
	return res, nil
}

// acquireArgs are the arguments of scripts/acquire.lua.
type acquireArgs struct {
	ticket    string        // the call's own id
	lease     time.Duration // of the hold it takes
	mode      string        // "barge", "queue", "again" or "try"
	heartbeat time.Duration // mode "queue": the record's heartbeat ttl
	seq       int64         // mode "again": the number of the call's record
	handoff   time.Duration // mode "queue": the lease of a hold handed to it
	publish   string        // PUBLISH or SPUBLISH
	metadata  string        // stored with the hold; "" for none
	record    time.Duration // mode "barge": how long the Client is recorded as waiting; 0 for none
	others    bool          // mode "barge": other plain waiters of the Client wait for the lock
	most      int           // mode "queue": the most records the queue may hold for the call to join it; 0 for no limit
}

// call returns the script's call on the lock k.
func (a acquireArgs) call(k schema.Lock) scriptCall {
	var arg int64
	switch a.mode {
	case "queue":
		arg = a.heartbeat.Milliseconds()
	case "again":
		arg = a.seq
	case "barge":
		arg = a.record.Milliseconds()
	}
	mode := a.mode + sharded(a.publish)
	if a.others {
		mode += " others"
	}
	if a.most != 0 {
		mode += " most=" + strconv.Itoa(a.most)
	}
	return scriptCall{acquireScript,
		[]string{k.Hash, k.Queue, k.Bargers, k.Tombstone(a.ticket)},
		[]any{a.ticket, a.lease.Milliseconds(), mode, arg, a.handoff.Milliseconds(), a.metadata}}
}

// sharded returns the flag of a script that publishes with publish: "
// sharded" for SPUBLISH, else "".
func sharded(publish string) string {
	if publish == "SPUBLISH" {
		return " sharded"
	}
	return ""
}

// releaseArgs are the arguments of scripts/release.lua.
type releaseArgs struct {
	id      string // the hold id, or the ticket that withdraws
	token   int64  // mode "release": the hold's fencing token; 0 when unknown
	record  string // mode "withdraw": the call's queue record; "" when none or unknown
	refuse  bool   // a call of the ticket may still be on its way: refuse it from now on
	publish string // PUBLISH or SPUBLISH
	mode    string // "release" or "withdraw"
}

// call returns the script's call on the lock k.
func (a releaseArgs) call(k schema.Lock) scriptCall {
	var arg any = a.token
	mode := a.mode
	if a.mode == "withdraw" {
		arg = a.record
	}
	if a.refuse {
		mode += " refuse"
	}
	return scriptCall{releaseScript, []string{k.Hash, k.Queue, k.Bargers}, []any{a.id, arg, mode + sharded(a.publish)}}
}

// wakeCall returns the call of scripts/wake.lua on the lock k, which
// passes on a wake-up of plain waiters that reached none.
func wakeCall(k schema.Lock, publish string) scriptCall {
	return scriptCall{wakeScript, []string{k.Hash, k.Queue, k.Bargers}, []any{sharded(publish)}}
}

// renewCall returns the call of scripts/renew.lua that renews batch: the
// keys of its entries in turn, and a triple kind, owner, ms per entry. An
// entry's keys are one of the four layouts below, by kind.
func renewCall(batch []watchdog.Renewal) scriptCall {
	var keys []string
	args := make([]any, 0, 3*len(batch))
	for _, r := range batch {
		keys = append(keys, r.Keys...)
		args = append(args, r.Kind, r.Owner, r.TTL.Milliseconds())
	}
	return scriptCall{renewScript, keys, args}
}

// holdRenewKeys returns the keys in renew.lua of a hold of the lock k
// (kind "hold").
func holdRenewKeys(k schema.Lock) []string { return []string{k.Hash, k.Queue} }

// waitRenewKeys returns the keys in renew.lua of the fair waiters of the
// lock k (kind "wait").
func waitRenewKeys(k schema.Lock) []string { return []string{k.Hash, k.Queue} }

// semKeys returns the keys that every semaphore script takes, and
// renew.lua takes for a holder of the semaphore k (kind "sem") or for its
// waiters (kind "swait").
func semKeys(k schema.Semaphore) []string { return []string{k.Hash, k.Expiry, k.Queue, k.Ended} }

// extendArgs are the arguments of scripts/extend.lua.
type extendArgs struct {
	id    string        // the hold id
	lease time.Duration // the least lease from now
}

// call returns the script's call on the lock k.
func (a extendArgs) call(k schema.Lock) scriptCall {
	return scriptCall{extendScript, []string{k.Hash, k.Queue}, []any{a.id, a.lease.Milliseconds()}}
}

// ttlArgs are the arguments of scripts/ttl.lua.
type ttlArgs struct {
	id string // the hold id
}

// call returns the script's call on the lock k.
func (a ttlArgs) call(k schema.Lock) scriptCall {
	return scriptCall{ttlScript, []string{k.Hash}, []any{a.id}}
}

// handoffGiveArgs are the arguments of scripts/handoff.lua in mode "give".
type handoffGiveArgs struct {
	id     string        // the holder's ticket
	handle string        // under which the hold waits for its taker
	lease  time.Duration // how long it waits for its taker before it runs out
	refuse bool          // a call of the holder's ticket may still be on its way
}

// call returns the script's call on the lock k.
func (a handoffGiveArgs) call(k schema.Lock) scriptCall {
	return scriptCall{handoffScript,
		[]string{k.Hash, k.Queue, k.Tombstone(a.id)},
		[]any{"give", a.id, a.handle, a.lease.Milliseconds(), flag(a.refuse)}}
}

// handoffTakeArgs are the arguments of scripts/handoff.lua in mode "take".
type handoffTakeArgs struct {
	handle   string        // from the giver's Handoff
	ticket   string        // the taker's
	lease    time.Duration // of the hold taken
	metadata string        // the taker's; "" for none
}

// call returns the script's call on the lock k.
func (a handoffTakeArgs) call(k schema.Lock) scriptCall {
	return scriptCall{handoffScript,
		[]string{k.Hash, k.Queue, k.Tombstone(a.ticket)},
		[]any{"take", a.handle, a.ticket, a.lease.Milliseconds(), a.metadata}}
}

// semAcquireArgs are the arguments of scripts/sem_acquire.lua.
type semAcquireArgs struct {
	holder    string        // the holder id
	n         int64         // permits wanted
	size      int64         // of the semaphore, as the caller knows it
	held      int64         // the permits the caller believes it holds
	seq       int64         // the caller's call number
	lease     time.Duration // of the permits granted
	mode      string        // "queue" or "try"
	waiter    string        // the call's waiter id, "holder#call"
	queued    bool          // an earlier attempt of the call queued it, or may have
	heartbeat time.Duration // the waiter's heartbeat ttl
	grant     time.Duration // the lease of a grant to a waiter
	publish   string        // PUBLISH or SPUBLISH
	fence     bool          // a RWMutex's: a write is granted a fencing token
}

// call returns the script's call on the semaphore k.
func (a semAcquireArgs) call(k schema.Semaphore) scriptCall {
	flags := a.mode
	if a.queued {
		flags += " again"
	}
	return scriptCall{semAcquireScript, semKeys(k), []any{a.holder, a.waiter,
		semNumbers(a.n, a.size, a.held, a.seq),
		semNumbers(a.lease.Milliseconds(), a.heartbeat.Milliseconds(), a.grant.Milliseconds()),
		semFlags(flags, a.fence, a.publish), k.Channel}}
}

// semNumbers returns the numbers ns as a semaphore script takes them,
// "n1:n2:...".
func semNumbers(ns ...int64) string {
	b := make([]byte, 0, 16*len(ns))
	for i, n := range ns {
		if i > 0 {
			b = append(b, ':')
		}
		b = strconv.AppendInt(b, n, 10)
	}
	return string(b)
}

// semFlags returns a semaphore script's mode and flags: mode, then "rw"
// for a RWMutex's semaphore and "sharded" when it publishes with
// SPUBLISH.
func semFlags(mode string, fence bool, publish string) string {
	if fence {
		mode += " rw"
	}
	return mode + sharded(publish)
}

// tombstoneTTL is how long Redis remembers a semaphore holding's full
// release, so that a release retried by go-redis after a lost reply
// reports success.
const tombstoneTTL = 10 * time.Second

// semLeaseArgs are the arguments of scripts/sem_lease.lua.
type semLeaseArgs struct {
	holder string        // the holder id
	mode   string        // "extend" or "ttl"
	lease  time.Duration // the least lease from now ("extend")
}

// call returns the script's call on the semaphore k.
func (a semLeaseArgs) call(k schema.Semaphore) scriptCall {
	return scriptCall{semLeaseScript, semKeys(k), []any{a.holder, a.mode, a.lease.Milliseconds()}}
}

// semReleaseArgs are the arguments of scripts/sem_release.lua. The memory
// of a full release lasts tombstoneTTL.
type semReleaseArgs struct {
	holder  string        // the holder id
	n       int64         // permits to give back ("release"), or wanted by the waiter ("withdraw")
	held    int64         // the permits the caller believes it holds
	seq     int64         // the caller's call number
	mode    string        // "release" or "withdraw"
	waiter  string        // the waiter id withdrawn, or of the holder's Acquire under way; or ""
	lease   time.Duration // re-armed while the holder keeps permits
	size    int64         // as the caller knows it
	publish string        // PUBLISH or SPUBLISH
	fence   bool          // a RWMutex's (semAcquireArgs.fence)
	refuse  bool          // a call of the holding may still be on its way
}

// call returns the script's call on the semaphore k.
func (a semReleaseArgs) call(k schema.Semaphore) scriptCall {
	flags := a.mode
	if a.refuse {
		flags += " refuse"
	}
	return scriptCall{semReleaseScript, semKeys(k), []any{a.holder, a.waiter,
		semNumbers(a.n, a.size, a.held, a.seq), semNumbers(a.lease.Milliseconds(), tombstoneTTL.Milliseconds()),
		semFlags(flags, a.fence, a.publish), k.Channel}}
}

// semResizeArgs are the arguments of scripts/sem_resize.lua.
type semResizeArgs struct {
	from, to int64  // the size expected to be stored, and the new one
	publish  string // PUBLISH or SPUBLISH
}

// call returns the script's call on the semaphore k.
func (a semResizeArgs) call(k schema.Semaphore) scriptCall {
	return scriptCall{semResizeScript, semKeys(k), []any{a.from, a.to, semFlags("", false, a.publish), k.Channel}}
}

// redlockRaiseArgs are the arguments of scripts/redlock_raise.lua.
type redlockRaiseArgs struct {
	id    string // the owner id of the node's hold
	token int64  // the Redlock's token
}

// call returns the script's call on the lock k, one node's.
func (a redlockRaiseArgs) call(k schema.Lock) scriptCall {
	return scriptCall{redlockRaiseScript, []string{k.Hash}, []any{a.id, a.token}}
}

// multiAcquireArgs are the arguments of scripts/multi_acquire.lua.
type multiAcquireArgs struct {
	ticket   string        // the call's own id, under which every hold is stored
	lease    time.Duration // of the holds it takes
	metadata string        // stored with every hold; "" for none
}

// call returns the script's call on the locks ks, which share a slot.
func (a multiAcquireArgs) call(ks []schema.Lock) scriptCall {
	keys := make([]string, 0, 3*len(ks))
	for _, k := range ks {
		keys = append(keys, k.Hash, k.Queue, k.Tombstone(a.ticket))
	}
	return scriptCall{multiAcquireScript, keys, []any{a.ticket, a.lease.Milliseconds(), a.metadata}}
}

// multiReleaseArgs are the arguments of scripts/multi_release.lua.
type multiReleaseArgs struct {
	ids     []string // the hold id on each lock
	tokens  []int64  // the hold's token on each lock; 0 when unknown
	publish string   // PUBLISH or SPUBLISH
}

// call returns the script's call on the locks ks, which share a slot.
func (a multiReleaseArgs) call(ks []schema.Lock) scriptCall {
	keys := make([]string, 0, 3*len(ks))
	args := []any{sharded(a.publish)}
	for i, k := range ks {
		keys = append(keys, k.Hash, k.Queue, k.Bargers)
		args = append(args, a.ids[i], a.tokens[i])
	}
	return scriptCall{multiReleaseScript, keys, args}
}

// proclaimArgs are the arguments of scripts/proclaim.lua.
type proclaimArgs struct {
	id      string // the leader's hold id
	value   string // the new value
	publish string // PUBLISH or SPUBLISH
	seq     int64  // the call's number, larger than the Election's last
}

// call returns the script's call on the election k.
func (a proclaimArgs) call(k schema.Lock) scriptCall {
	return scriptCall{proclaimScript, []string{k.Hash, k.Queue}, []any{a.id, a.value, a.seq, sharded(a.publish)}}
}

// leaderCall returns the call of scripts/leader.lua on the election k.
func leaderCall(k schema.Lock) scriptCall {
	return scriptCall{leaderScript, []string{k.Hash}, nil}
}
