-- lib.lua: helpers shared by every script. scripts.go prepends this file,
-- then the helpers of the script's kind (lock_lib.lua, sem_lib.lua), to
-- each script before loading it, so every script stays one atomic unit.
--
-- Keys of the wrong type: every script reads each key it may write, or
-- writes it first, before any other write, so that a key of the wrong type,
-- or a value that is not what redisync stores, fails the script before it
-- has changed anything. Such errors carry the word WRONGTYPE. No read is
-- made only to check a type where the first write checks it.
--
-- Layouts: the stored layout of a lock (lock_lib.lua, LAYOUT) and of a
-- semaphore (sem_lib.lua, SEM_LAYOUT) is numbered (internal/schema). A
-- script that meets state of another layout fails with a LAYOUT error
-- rather than misread it: during a rolling deploy, mixed versions fail
-- loudly instead of letting two holders in.

-- other_layout fails the script: key was written in layout found (nil:
-- before layouts were numbered, layout 1), and this script reads layout
-- mine.
local function other_layout(key, found, mine)
  error('LAYOUT redisync: ' .. key .. ' was written in layout ' .. (found or '1') .. ', this redisync reads layout ' .. mine)
end

-- now_us returns the server clock in microseconds, as read by the
-- script's first call: a script reads the clock once (TIME is among the
-- dearest calls a script makes), and runs in a few microseconds.
local clock_us = nil
local function now_us()
  if not clock_us then
    local t = redis.call('TIME')
    clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return clock_us
end

-- now_ms returns the server clock in milliseconds (see now_us).
local function now_ms()
  return math.floor(now_us() / 1000)
end

-- wrong fails the script with a WRONGTYPE error about key.
local function wrong(key, what)
  error('WRONGTYPE redisync: ' .. key .. ' does not hold ' .. what)
end

-- The limits that the Go side checks before any call, checked again where
-- the data is, against callers that are not this library: MAX_MS the
-- longest lease, heartbeat or hand-off (redisync.MaxLease, 24 h), MAX_TEXT
-- the longest metadata or election value (redisync.MaxMetadataLen),
-- MAX_BATCH the most entries of one renewal (internal/watchdog.Batch).
local MAX_MS, MAX_TEXT, MAX_BATCH = 86400000, 1024, 256

-- limit fails the script, before it reads or writes anything, with a LIMIT
-- error saying what, unless ok. A message built of parts (what and the
-- rest) is joined only when it is shown: a call that passes pays nothing.
local function limit(ok, what, ...)
  if not ok then
    error(table.concat({'LIMIT redisync: ', what, ...}))
  end
end

-- ms_arg returns the argument v, a duration in ms, failing the script
-- unless it is a whole number from least to MAX_MS.
local function ms_arg(v, least, what)
  local n = tonumber(v)
  limit(n and n == math.floor(n) and n >= least and n <= MAX_MS,
    what, ' must be whole milliseconds from ', least, ' to ', MAX_MS)
  return n
end

-- text_arg returns the argument v, failing the script when it is longer
-- than MAX_TEXT bytes.
local function text_arg(v, what)
  limit(#v <= MAX_TEXT, what, ' must be at most ', MAX_TEXT, ' bytes')
  return v
end

-- integer returns v as a number when it is a base-10 integer, as redisync
-- writes them (digits, after a '-' for a negative one), else nil. The
-- pattern is matched with find, which makes no copy of v.
local function integer(v)
  if type(v) == 'string' and string.find(v, '^%-?%d+$') then
    return tonumber(v)
  end
  return nil
end

-- CLIENT_FIELD starts the field of a lock's or a semaphore's hash that
-- holds a Client's liveness deadline there:
-- CLIENT_FIELD .. client -> server time in ms. The Client's watchdog moves
-- it forward (renew.lua), once per lock or semaphore on which it has
-- waiters, whatever their number: a waiter is alive while its own deadline
-- or its Client's has not passed. No ticket or waiter id starts with '{'.
local CLIENT_FIELD = '{client}'

-- client_of returns the client id in a ticket ("label/client-n.random"),
-- a hold id, or a semaphore waiter id ("label/client-n.random#digits")
-- (internal/schema, Client): the random parts are hex, without '-'.
local function client_of(id)
  local c = string.match(id, '[^/]*$')
  c = string.match(c, '^(.*)#') or c
  return string.match(c, '^(.*)%-') or c
end

-- client_field returns the field that holds the
-- liveness deadline of id's Client.
local function client_field(id)
  return CLIENT_FIELD .. client_of(id)
end

-- deadline_of returns the deadline in a Client's field ("ms", or "ms:L"
-- while a lapse is being reported: see renew.lua), or nil.
local function deadline_of(v)
  local ms = type(v) == 'string' and string.match(v, '^(%d+)')
  return ms and tonumber(ms) or nil
end

-- alive reports whether a waiter is alive at now (ms): its own deadline,
-- or its Client's (a value read from client_field, or false), has not
-- passed.
local function alive(deadline, client, now)
  return (deadline and deadline >= now) or (deadline_of(client) or -1) >= now
end

-- keep_longer extends a key's TTL to at least ms, never shortening it,
-- reading the TTL first: one call when it is long enough already. It
-- suits a key whose TTL is usually longer than ms, as a fencing token
-- counter's; keep_alive suits the others.
local function keep_longer(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- keep_alive extends a key's TTL to at least ms, never shortening it. A
-- key that has a TTL shorter than ms takes one call (PEXPIRE GT, Redis 7);
-- one that has none yet (GT leaves it as it is) or a longer one takes two,
-- the second PEXPIRE NX, which sets a TTL only where there is none. Before
-- Redis 7 (PEXPIRE has no GT), the script reads the TTL first from then on
-- (keep_longer), as do the calls after it in a function library, which
-- keeps the flag (an error that refused one call turns it off too: the
-- fallback gives the same result, one read more). An ms below 1 asks for
-- nothing (a PEXPIRE in the past would delete the key).
local expire_gt = true
local function keep_alive(key, ms)
  if ms < 1 then
    return
  end
  if expire_gt then
    local set = redis.pcall('PEXPIRE', key, ms, 'GT')
    if set == 1 then
      return
    end
    expire_gt = type(set) == 'number'
    if expire_gt then
      redis.call('PEXPIRE', key, ms, 'NX')
      return
    end
  end
  keep_longer(key, ms)
end

-- check_counter returns the value of a counter kept in a key of its own
-- (0 when absent), and fails the script, before it writes anything, when
-- the key holds something other than an integer. The value is read once
-- per script (see counters).
local counters = {}
local function check_counter(token)
  local c = counters[token]
  if c == nil then
    local v = redis.call('GET', token)
    c = v and (integer(v) or wrong(token, 'a counter')) or 0
    counters[token] = c
  end
  return c
end

-- begin_call readies the caches above for a call of a function of the
-- library (see functions.go), whose locals outlive the call, unlike a
-- script's: the call reads the clock and the counters anew.
local function begin_call()
  clock_us = nil
  counters = {}
end

-- state_memory_ms is how long redisync's record of an idle lock or
-- semaphore (its last fencing token, a semaphore's size) outlives
-- its last use: nothing redisync writes stays in Redis for good.
local state_memory_ms = 3600000

-- publish_cmd is the command that publishes: PUBLISH, or SPUBLISH when the
-- caller's flags ask for it (on a Redis Cluster).
local function publish_cmd(flags)
  if string.find(flags, 'sharded', 1, true) then
    return 'SPUBLISH'
  end
  return 'PUBLISH'
end

-- grant_channel returns the channel on which a grant to id (a ticket, or a
-- semaphore waiter id, "label/client-n.random#digits") is published: channel, ':' and
-- the id's client (internal/schema, Client). Only the grantee's process
-- subscribes to it, so only it is woken.
local function grant_channel(channel, id)
  return channel .. ':' .. client_of(id)
end

