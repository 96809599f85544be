-- lib.lua: helpers shared by the scripts. scripts.go prepends this file to
-- each script before loading it, so every script stays one atomic unit.
--
-- Keys of the wrong type: every script reads each key it may write (or
-- writes it first) before any other write, so that a key of the wrong type,
-- or a value that is not what redisync stores, fails the script before it
-- has changed anything. Such errors carry the word WRONGTYPE.
--
-- Waiter records live in a hash (ticket -> "deadline:handoff"), where
-- deadline is the server time in ms by which the waiter must heartbeat again
-- and handoff is the lease in ms it is given when the lock is handed to it.

-- now_ms returns the server clock in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- wrong fails the script with a WRONGTYPE error about key.
local function wrong(key, what)
  error('WRONGTYPE redisync: ' .. key .. ' does not hold ' .. what)
end

-- integer returns v as a number when it is a base-10 integer, else nil.
local function integer(v)
  if type(v) == 'string' and string.match(v, '^%-?%d+$') then
    return tonumber(v)
  end
  return nil
end

-- parse_waiter splits a waiter record into its deadline and hand-off lease.
local function parse_waiter(v)
  local deadline, handoff = string.match(v, '^(%d+):(%d+)$')
  return tonumber(deadline), tonumber(handoff)
end

-- keep_alive extends a key's TTL to at least ms, never shortening it.
local function keep_alive(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- check_counter returns the fencing token counter's value (0 when absent)
-- and fails the script, before it writes anything, when the key holds
-- something other than an integer.
local function check_counter(token)
  local v = redis.call('GET', token)
  if not v then
    return 0
  end
  return integer(v) or wrong(token, 'a counter')
end

-- hold_count returns the count stored for a hold's field in the lock hash
-- (0 when absent), failing the script when it is not a positive integer.
local function hold_count(lock, id)
  local v = redis.call('HGET', lock, id)
  if not v then
    return 0
  end
  local n = integer(v)
  if not n or n < 1 then
    wrong(lock, 'a hold count for ' .. id)
  end
  return n
end

-- state_memory_ms is how long redisync's record of an idle lock or
-- semaphore (a lock's fencing token counter, a semaphore's size) outlives
-- its last use: nothing redisync writes stays in Redis for good.
local state_memory_ms = 3600000

-- mint returns a new fencing token of the lock whose counter is the key
-- token: the server clock in microseconds, or the last token issued plus
-- one when that is larger. The counter remembers the last token for
-- state_memory_ms, so tokens strictly increase while it is stored, and
-- after it expired unless the server clock stepped back by more than the
-- time since the last token (at least state_memory_ms).
local function mint(token)
  local c = redis.call('TIME')
  local t = math.max(tonumber(c[1]) * 1000000 + tonumber(c[2]), check_counter(token) + 1)
  redis.call('SET', token, string.format('%d', t), 'PX', state_memory_ms)
  return t
end

-- grant makes owner the holder of the free lock for lease ms and returns
-- its new fencing token. The token is minted first: a token key of the
-- wrong type fails the script before the lock is written.
local function grant(lock, token, owner, lease)
  local t = mint(token)
  redis.call('HSET', lock, owner, 1)
  redis.call('PEXPIRE', lock, lease)
  return t
end

-- hand_off gives the free lock to the first live waiter of the queue. Dead
-- waiters (heartbeat deadline passed) met on the way are dropped. The new
-- owner gets a hold count of 1, its hand-off lease and a fresh fencing token,
-- and "ticket:token" is published on the channel unless the new owner is
-- self (the caller, who reads the token from the reply). It returns the new
-- owner and its token, or nil when nobody live is waiting.
local function hand_off(lock, token, queue, waiters, channel, publish, self)
  local now = nil
  while true do
    local head = redis.call('ZPOPMIN', queue)[1]
    if not head then
      return nil
    end
    local rec = redis.call('HGET', waiters, head)
    if rec then
      redis.call('HDEL', waiters, head)
      now = now or now_ms()
      local deadline, handoff = parse_waiter(rec)
      if deadline and deadline >= now then
        local t = grant(lock, token, head, handoff)
        if head ~= self then
          redis.call(publish, channel, head .. ':' .. string.format('%d', t))
        end
        return head, t
      end
    end
  end
end

-- withdrawn_ms is how long a withdrawn ticket (a call that gave up) stays
-- refused: a copy of one of its calls still in flight when it was withdrawn
-- (a stalled connection, a retry by the client library) must not take
-- anything on its late arrival.
local withdrawn_ms = 120000

-- mark_withdrawn refuses a ticket from now on (see withdrawn_ms), in a zset
-- ticket -> server time of the withdrawal, pruned as it goes.
local function mark_withdrawn(gone, ticket)
  local now = now_ms()
  redis.call('ZREMRANGEBYSCORE', gone, '-inf', now - withdrawn_ms)
  redis.call('ZADD', gone, now, ticket)
  redis.call('PEXPIRE', gone, withdrawn_ms)
end

-- is_withdrawn reports whether a ticket was withdrawn (see mark_withdrawn).
local function is_withdrawn(gone, ticket)
  return redis.call('ZSCORE', gone, ticket) ~= false
end
