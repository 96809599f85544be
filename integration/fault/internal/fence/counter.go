package fence

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Counter is the resource of the lock-set workload: an integer in Redis
// that lock holders update read-modify-write (read it, pause, write the
// value read plus one). Every write that Redis applies is appended, in the
// same script, to a log that a checker reads afterwards: the log is the
// order in which Redis applied the writes, each with the value its writer
// had read, so a lost update shows as a write whose read value is not the
// value written before it.
//
// A fenced Counter checks fencing tokens: Read raises the highest token
// seen to the reader's (a holder claims the resource before it reads) and
// refuses a token below it, and Write refuses a token below it. Claiming
// on read is what makes a read-modify-write safe: once a new holder has
// read, a stale holder's write can no longer land between its read and its
// write. An unfenced Counter is a plain value: tokens are not looked at.
//
// Keys: Key (hash: value, max, rejected), Key+":log" (list of applied
// writes), Key+":ops" (hash: op id -> reply, so that a write that go-redis
// retries after a lost reply is applied and logged once).
type Counter struct {
	Key    string
	Fenced bool
}

// counterReadScript is a fenced Counter's read.
//
// KEYS[1] counter hash. ARGV[1] token.
//
// Reply: {1, value}, the token now the highest seen; or {0, max}, the
// token refused as lower than max.
var counterReadScript = redis.NewScript(`
local max = tonumber(redis.call('HGET', KEYS[1], 'max') or '0')
local t = tonumber(ARGV[1])
if t < max then
  redis.call('HINCRBY', KEYS[1], 'rejected', 1)
  return {0, max}
end
if t > max then
  redis.call('HSET', KEYS[1], 'max', ARGV[1])
end
return {1, tonumber(redis.call('HGET', KEYS[1], 'value') or '0')}
`)

// counterWriteScript is a Counter's write of read+1.
//
// KEYS[1] counter hash, KEYS[2] log, KEYS[3] ops.
// ARGV[1] op id (no spaces), ARGV[2] token, ARGV[3] the value the writer
// read, ARGV[4] "1" for a fenced counter (the token is checked).
//
// Reply: 1 applied, 0 refused (fenced, token below the highest seen). An
// op id seen before gets the reply it got then, and nothing is written.
// An applied write is logged as "op token read wrote server-time-µs".
var counterWriteScript = redis.NewScript(`
local prev = redis.call('HGET', KEYS[3], ARGV[1])
if prev then
  return tonumber(prev)
end
if ARGV[4] == '1' then
  local max = tonumber(redis.call('HGET', KEYS[1], 'max') or '0')
  if tonumber(ARGV[2]) < max then
    redis.call('HINCRBY', KEYS[1], 'rejected', 1)
    redis.call('HSET', KEYS[3], ARGV[1], 0)
    return 0
  end
  redis.call('HSET', KEYS[1], 'max', ARGV[2])
end
local wrote = tonumber(ARGV[3]) + 1
redis.call('HSET', KEYS[1], 'value', wrote)
local now = redis.call('TIME')
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. wrote .. ' ' ..
  now[1] .. string.format('%06d', tonumber(now[2])))
redis.call('HSET', KEYS[3], ARGV[1], 1)
return 1
`)

// Read returns the counter's value. A fenced counter first claims it for
// token: ok is false, and nothing is read, when a higher token has claimed
// or written it. An unfenced counter ignores token.
func (c Counter) Read(ctx context.Context, rdb redis.Cmdable, token int64) (value int64, ok bool, err error) {
	if !c.Fenced {
		v, err := rdb.HGet(ctx, c.Key, "value").Int64()
		if err == redis.Nil {
			return 0, true, nil
		}
		return v, err == nil, err
	}
	res, err := counterReadScript.Run(ctx, rdb, []string{c.Key}, token).Int64Slice()
	if err != nil {
		return 0, false, err
	}
	if len(res) != 2 {
		return 0, false, fmt.Errorf("fence: read reply %v", res)
	}
	return res[1], res[0] == 1, nil
}

// Write writes read+1 as the op with id op (unique, without spaces) under
// token, and reports whether the counter applied it (a fenced counter
// refuses a token below the highest it has seen).
func (c Counter) Write(ctx context.Context, rdb redis.Scripter, token, read int64, op string) (bool, error) {
	fenced := "0"
	if c.Fenced {
		fenced = "1"
	}
	n, err := counterWriteScript.Run(ctx, rdb, []string{c.Key, c.Key + ":log", c.Key + ":ops"}, op, token, read, fenced).Int64()
	return n == 1, err
}

// Entry is one applied write in a Counter's log.
type Entry struct {
	Op    string
	Token int64
	Read  int64     // the value the writer had read
	Wrote int64     // Read + 1
	At    time.Time // Redis's clock when it applied the write
}

// Log returns the counter's log of applied writes, in the order Redis
// applied them, and its current value.
func (c Counter) Log(ctx context.Context, rdb redis.Cmdable) ([]Entry, int64, error) {
	raw, err := rdb.LRange(ctx, c.Key+":log", 0, -1).Result()
	if err != nil {
		return nil, 0, err
	}
	log := make([]Entry, 0, len(raw))
	for i, s := range raw {
		f := strings.Fields(s)
		if len(f) != 5 {
			return nil, 0, fmt.Errorf("fence: log entry %d: malformed %q", i, s)
		}
		var n [4]int64
		for j := range n {
			if n[j], err = strconv.ParseInt(f[j+1], 10, 64); err != nil {
				return nil, 0, fmt.Errorf("fence: log entry %d: %v", i, err)
			}
		}
		log = append(log, Entry{Op: f[0], Token: n[0], Read: n[1], Wrote: n[2], At: time.UnixMicro(n[3])})
	}
	v, err := rdb.HGet(ctx, c.Key, "value").Int64()
	if err == redis.Nil {
		err = nil
	}
	return log, v, err
}
