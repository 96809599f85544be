-- lib.lua: helpers shared by the mutex scripts. scripts.go prepends this file
-- to each script before loading it, so every script stays one atomic unit.
--
-- Keys of the wrong type: every script touches each key first with a read,
-- or with a write that comes before any other write, so that a key of the
-- wrong type fails the script with WRONGTYPE before it has changed the
-- lock or its token.
--
-- Waiter records live in a hash (owner -> "deadline:handoff"), where deadline
-- is the server time in ms by which the waiter must heartbeat again and
-- handoff is the lease in ms it is given when the lock is handed to it.

-- now_ms returns the server clock in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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

-- check_counter fails the script, before it writes anything, when the
-- fencing token key holds something other than a counter (INCR would only
-- fail later, after other writes). The error carries WRONGTYPE.
local function check_counter(token)
  local v = redis.call('GET', token)
  if v and not tonumber(v) then
    error('WRONGTYPE redisync: ' .. token .. ' does not hold a counter')
  end
  return tonumber(v) or 0
end

-- grant makes owner the holder of the free lock for lease ms and returns
-- its new fencing token. The token is minted first: a token key of the
-- wrong type fails the script before the lock is written.
local function grant(lock, token, owner, lease)
  local t = redis.call('INCR', token)
  redis.call('HSET', lock, owner, 1)
  redis.call('PEXPIRE', lock, lease)
  return t
end

-- hand_off gives the free lock to the first live waiter of the queue. Dead
-- waiters (heartbeat deadline passed) met on the way are dropped. The new
-- owner gets a hold count of 1, its hand-off lease and a fresh fencing token,
-- and "owner:token" is published on the channel unless the new owner is self
-- (the caller, who reads the token from the reply). It returns the new owner
-- and its token, or nil when nobody live is waiting.
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
      if deadline >= now then
        local t = grant(lock, token, head, handoff)
        if head ~= self then
          redis.call(publish, channel, head .. ':' .. t)
        end
        return head, t
      end
    end
  end
end
