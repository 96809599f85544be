-- lib.lua: helpers shared by the mutex scripts. scripts.go prepends this file
-- to each script before loading it, so every script stays one atomic unit.
--
-- Waiter records live in a hash (owner -> "deadline:handoff"), where deadline
-- is the server time in ms by which the waiter must heartbeat again and
-- handoff is the lease in ms it is given when the lock is handed to it.

-- now_ms returns the server clock in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- type_error returns an error reply when a key exists with another type than
-- expected, before the script writes anything, and nil otherwise.
-- spec is a list of {key, type} pairs.
local function type_error(spec)
  for _, kt in ipairs(spec) do
    local got = redis.call('TYPE', kt[1])['ok']
    if got ~= 'none' and got ~= kt[2] then
      return redis.error_reply('WRONGTYPE redisync: key ' .. kt[1] .. ' holds a ' .. got .. ', want a ' .. kt[2])
    end
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

-- hand_off gives the free lock to the first live waiter of the queue. Dead
-- waiters (heartbeat deadline passed) met on the way are dropped. The new
-- owner gets a hold count of 1, its hand-off lease and a fresh fencing token,
-- and "owner:token" is published on the channel unless the new owner is self
-- (the caller, who reads the token from the reply). It returns the new owner
-- and its token, or nil when nobody live is waiting.
local function hand_off(lock, token, queue, waiters, channel, publish, now, self)
  while true do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then
      return nil
    end
    redis.call('ZREM', queue, head)
    local rec = redis.call('HGET', waiters, head)
    redis.call('HDEL', waiters, head)
    if rec then
      local deadline, handoff = parse_waiter(rec)
      if deadline >= now then
        redis.call('HSET', lock, head, 1)
        redis.call('PEXPIRE', lock, handoff)
        local t = redis.call('INCR', token)
        if head ~= self then
          redis.call(publish, channel, head .. ':' .. t)
        end
        return head, t
      end
    end
  end
end
