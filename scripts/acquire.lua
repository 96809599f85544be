-- acquire.lua: take, re-enter or queue for a lock.
--
-- KEYS[1] lock hash (owner -> hold count), with the lease as its TTL
-- KEYS[2] fencing token counter (no TTL)
-- KEYS[3] queue: zset of fair waiters (owner -> arrival number)
-- KEYS[4] waiters: hash of fair waiters' records (owner -> "deadline:handoff")
-- ARGV[1] owner id
-- ARGV[2] lease in ms
-- ARGV[3] held: the hold count the caller believes it has. A call that finds
--         held + 1 was already applied (a retry after a lost reply, or a
--         hand-off the caller has not heard of yet) and adopts it instead of
--         counting it twice.
-- ARGV[4] mode: "barge" takes a free lock whatever the queue; "queue" respects
--         the queue and joins it when the lock is not granted; "try" respects
--         the queue but never joins it
-- ARGV[5] heartbeat ttl in ms (mode "queue")
-- ARGV[6] hand-off lease in ms (mode "queue")
-- ARGV[7] channel, ARGV[8] publish command (PUBLISH or SPUBLISH)
--
-- Reply: {1, token}   held (newly, re-entered or adopted); token of the hold
--        {0, pttl}    held by another owner; pttl is the lock's PTTL
--                     (-1: no TTL; -2: none, the lock was handed to another)
--        {-1, 0}      held > 0 but the caller's hold no longer exists (lost)
local lock, token, queue, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, lease, held, mode = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]

local count = tonumber(redis.call('HGET', lock, owner) or '0')
local t = check_counter(token)
if count > 0 then
  if count == held then
    redis.call('HINCRBY', lock, owner, 1)
  elseif count ~= held + 1 then
    return redis.error_reply('ERR redisync: hold count of ' .. owner .. ' is ' .. count .. ', caller believes ' .. held)
  end
  redis.call('PEXPIRE', lock, lease)
  return {1, t}
end
if held > 0 then
  return {-1, 0}
end

local pttl = redis.call('PTTL', lock)
if mode == 'barge' then
  if pttl ~= -2 then
    return {0, pttl}
  end
  return {1, grant(lock, token, owner, lease)}
end

local queued = redis.call('ZSCORE', queue, owner)
redis.call('HLEN', waiters) -- a key of the wrong type fails here, before any write
if pttl == -2 then
  local head, t = hand_off(lock, token, queue, waiters, ARGV[7], ARGV[8], owner)
  if head == nil then
    return {1, grant(lock, token, owner, lease)}
  end
  if head == owner then
    redis.call('PEXPIRE', lock, lease)
    return {1, t}
  end
  pttl = redis.call('PTTL', lock)
  queued = redis.call('ZSCORE', queue, owner)
end
if mode == 'queue' then
  local ttl = tonumber(ARGV[5])
  if not queued then
    local last = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')[2]
    redis.call('ZADD', queue, (tonumber(last) or 0) + 1, owner)
  end
  redis.call('HSET', waiters, owner, (now_ms() + ttl) .. ':' .. ARGV[6])
  keep_alive(queue, 2 * ttl)
  keep_alive(waiters, 2 * ttl)
end
return {0, pttl}
