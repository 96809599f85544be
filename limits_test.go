package redisync

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redisync/redisync/internal/schema"
	"github.com/redisync/redisync/internal/watchdog"
)

// The scripts check the limits that the Go side checks before any call
// (a lease or heartbeat of at most MaxLease, metadata and election values
// of at most MaxMetadataLen bytes, renewals of at most watchdog.Batch
// entries) again where the data is: a caller that is not this library
// gets ErrInvalidOption, and nothing is written.
func TestScriptsEnforceTheLimits(t *testing.T) {
	mr, rdb, _ := newMini(t)
	k := schema.LockKeys("redisync", "limits")
	acquire := func(mode string, lease, heartbeat time.Duration, meta string) scriptCall {
		return acquireArgs{ticket: "vm/1/c-1", lease: lease, mode: mode, heartbeat: heartbeat,
			handoff: time.Second, publish: "PUBLISH", metadata: meta}.call(k)
	}
	renewals := func(n int, ttl time.Duration) scriptCall {
		batch := make([]watchdog.Renewal, n)
		for i := range batch {
			batch[i] = watchdog.Renewal{Kind: "hold", Owner: "vm/1/c-1", Keys: holdRenewKeys(k), TTL: ttl}
		}
		return renewCall(batch)
	}
	for _, tc := range []struct {
		what string
		call scriptCall
	}{
		{"a lease of 0", acquire("barge", 0, time.Second, "")},
		{"a lease over MaxLease", acquire("barge", MaxLease+time.Millisecond, time.Second, "")},
		{"a heartbeat over MaxLease", acquire("queue", time.Second, MaxLease+time.Millisecond, "")},
		{"metadata over MaxMetadataLen", acquire("queue", time.Second, time.Second, strings.Repeat("m", MaxMetadataLen+1))},
		{"an extension over MaxLease", extendArgs{id: "vm/1/c-1", lease: MaxLease + time.Millisecond}.call(k)},
		{"a renewal over MaxLease", renewals(1, MaxLease+time.Millisecond)},
		{"a renewal of more than a batch", renewals(watchdog.Batch+1, time.Second)},
		{"an election value over MaxMetadataLen", proclaimArgs{id: "vm/1/c-1", value: strings.Repeat("v", MaxMetadataLen+1),
			publish: "PUBLISH", seq: 1}.call(schema.ElectionKeys("redisync", "limits"))},
		{"a multi-lock acquisition of more than MaxMultiNames", multiAcquire(MaxMultiNames + 1)},
		{"a multi-lock release of more than MaxMultiNames", multiRelease(MaxMultiNames + 1)},
	} {
		err := tc.call.run(ctx, rdb).Err()
		if !errors.Is(redisError(err), ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", tc.what, err)
		}
	}
	if keys := mr.Keys(); len(keys) != 0 {
		t.Errorf("calls beyond the limits wrote %q", keys)
	}
	// At the limits, the calls run.
	if err := acquire("queue", MaxLease, MaxLease, strings.Repeat("m", MaxMetadataLen)).run(ctx, rdb).Err(); err != nil {
		t.Errorf("an acquisition at the limits: %v", err)
	}
	if err := renewals(watchdog.Batch, MaxLease).run(ctx, rdb).Err(); err != nil {
		t.Errorf("a renewal of a whole batch at the longest lease: %v", err)
	}
	if err := multiAcquire(MaxMultiNames).run(ctx, rdb).Err(); err != nil {
		t.Errorf("a multi-lock acquisition of MaxMultiNames: %v", err)
	}
	if err := multiRelease(MaxMultiNames).run(ctx, rdb).Err(); err != nil {
		t.Errorf("a multi-lock release of MaxMultiNames: %v", err)
	}
}

// multiAcquire returns a call of multi_acquire.lua on n locks.
func multiAcquire(n int) scriptCall {
	return multiAcquireArgs{ticket: "vm/1/c-1", lease: time.Second}.call(manyLocks(n))
}

// multiRelease returns a call of multi_release.lua on n locks.
func multiRelease(n int) scriptCall {
	a := multiReleaseArgs{publish: "PUBLISH"}
	for range n {
		a.ids, a.tokens = append(a.ids, "vm/1/c-1"), append(a.tokens, 0)
	}
	return a.call(manyLocks(n))
}

// manyLocks returns the keys of n locks that share a slot.
func manyLocks(n int) []schema.Lock {
	ks := make([]schema.Lock, n)
	for i, name := range manyNames("multi-", n) {
		ks[i] = schema.LockKeys("redisync", name)
	}
	return ks
}

// manyNames returns n names that start with prefix.
func manyNames(prefix string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return names
}

// A MultiMutex of MaxMultiNames names takes them all, in one script call
// on one Redis, and releases them.
func TestMultiMutexAtMaxMultiNames(t *testing.T) {
	mr, rdb, _ := newMini(t)
	c := newClient(t, rdb)
	m := c.NewMultiMutex(manyNames("at-max-", MaxMultiNames))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range m.Names() {
		if !lockHeld(t, mr, schema.LockKeys("redisync", name).Hash) {
			t.Fatalf("%s is not held", name)
		}
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range m.Names() {
		if lockHeld(t, mr, schema.LockKeys("redisync", name).Hash) {
			t.Fatalf("%s is still held", name)
		}
	}
}

// The first error kind in a script's error is its own: a key named after
// another kind does not change it.
func TestRedisErrorReadsTheScriptsOwnKind(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want error
	}{
		{"ERR user_script:1: WRONGTYPE redisync: p:lock:{LIMIT redisync: x} does not hold a lock", ErrWrongType},
		{"ERR user_function:1: WRONGTYPE redisync: p:lock:{LAYOUT redisync: x} does not hold a lock", ErrWrongType},
		{"ERR user_script:1: LIMIT redisync: the lease must be whole milliseconds from 1 to 86400000", ErrInvalidOption},
		{"ERR user_script:1: LAYOUT redisync: p:lock:{WRONGTYPE} was written in layout 2, this redisync reads layout 3", ErrLayout},
	} {
		err := redisError(replyError(tc.msg))
		for _, e := range []error{ErrWrongType, ErrInvalidOption, ErrLayout} {
			if errors.Is(err, e) != (e == tc.want) {
				t.Errorf("%q: errors.Is(%v) = %v", tc.msg, e, errors.Is(err, e))
			}
		}
	}
}
