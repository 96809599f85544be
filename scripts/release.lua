-- release.lua: release one level of a hold; or withdraw from the fair queue
-- and undo an acquire whose reply was lost.
--
-- KEYS[1] lock hash, KEYS[2] fencing token counter, KEYS[3] queue,
-- KEYS[4] waiters, KEYS[5] tombstone: a short-lived string holding the token
--         of the owner's last full release, so that a retried release knows
--         it already applied
-- ARGV[1] owner id
-- ARGV[2] held: the hold count the caller believes it has (>= 1). A release
--         that finds held - 1 was already applied and is not applied again.
-- ARGV[3] lease in ms, re-armed while the count stays above zero
-- ARGV[4] token of the caller's hold (0 when unknown: no tombstone)
-- ARGV[5] tombstone TTL in ms
-- ARGV[6] channel, ARGV[7] publish command (PUBLISH or SPUBLISH)
-- ARGV[8] "withdraw" to remove the owner from the fair queue first
--
-- When the count reaches zero the lock is handed to the first live fair
-- waiter (who is told by a message "owner:token"), or deleted and an empty
-- message published so that one waiter per process tries again.
--
-- Reply: 1 released (count reached zero, now or in an earlier try of this call)
--        2 one level released, still held
--        0 not held by the owner
local lock, token, queue, waiters, tomb = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, held, mytoken = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])

local count = tonumber(redis.call('HGET', lock, owner) or '0')
check_counter(token)
-- Read the queue, and the waiters' records when they may be touched, before
-- the first write: a key of the wrong type fails the script here.
local queued = redis.call('ZCARD', queue)
if queued > 0 or ARGV[8] == 'withdraw' then
  redis.call('HLEN', waiters)
end
if ARGV[8] == 'withdraw' then
  redis.call('ZREM', queue, owner)
  redis.call('HDEL', waiters, owner)
end
if count == 0 then
  if mytoken > 0 and tonumber(redis.call('GET', tomb)) == mytoken then
    return 1
  end
  return 0
end
if count == held - 1 then
  return 2
end
if count ~= held then
  return redis.error_reply('ERR redisync: hold count of ' .. owner .. ' is ' .. count .. ', caller believes ' .. held)
end
if count > 1 then
  redis.call('HINCRBY', lock, owner, -1)
  redis.call('PEXPIRE', lock, tonumber(ARGV[3]))
  return 2
end

redis.call('DEL', lock)
if mytoken > 0 then
  redis.call('SET', tomb, mytoken, 'PX', tonumber(ARGV[5]))
end
if queued == 0 or not hand_off(lock, token, queue, waiters, ARGV[6], ARGV[7], nil) then
  redis.call(ARGV[7], ARGV[6], '')
end
return 1
