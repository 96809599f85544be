// Package fence is the fenced resource of the fault-tolerance tests: a
// register in Redis that accepts a write only when its fencing token is at
// least the highest token it has seen (Kleppmann's "storage that checks
// tokens"), a log of critical-section entries and exits for the mutex
// history checker, and the read-modify-write counters of the lock-set
// workload (Counter), fenced and unfenced. Both the tests and the holder
// helper binary use it, so that a write from a paused or crashed process is
// judged by the same rule.
package fence

import (
	"context"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// writeScript is the fenced register.
//
// KEYS[1] register hash: max (highest token seen), value, writer, accepted,
//
//	rejected
//
// ARGV[1] token, ARGV[2] value, ARGV[3] writer
//
// Reply: 1 accepted, 0 rejected (token lower than the highest seen). A token
// equal to the highest is accepted, so one hold may write many times.
var writeScript = redis.NewScript(`
local max = tonumber(redis.call('HGET', KEYS[1], 'max') or '0')
local t = tonumber(ARGV[1])
if t < max then
  redis.call('HINCRBY', KEYS[1], 'rejected', 1)
  return 0
end
redis.call('HSET', KEYS[1], 'max', t, 'value', ARGV[2], 'writer', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'accepted', 1)
return 1
`)

// Write offers value, written by writer under token, to the register at
// key, and reports whether the register accepted it.
func Write(ctx context.Context, rdb redis.Scripter, key string, token int64, value, writer string) (bool, error) {
	n, err := writeScript.Run(ctx, rdb, []string{key}, token, value, writer).Int64()
	return n == 1, err
}

// Enter and Exit append "+token" and "-token" to the history list at key.
// Each is one atomic RPUSH, so the list is the order in which Redis saw
// every critical section's entry and exit: a linearization of the history.
func Enter(ctx context.Context, rdb redis.Cmdable, key string, token int64) error {
	return rdb.RPush(ctx, key, "+"+itoa(token)).Err()
}

// Exit: see Enter.
func Exit(ctx context.Context, rdb redis.Cmdable, key string, token int64) error {
	return rdb.RPush(ctx, key, "-"+itoa(token)).Err()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
