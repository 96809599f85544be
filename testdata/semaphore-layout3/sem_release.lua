-- sem_release.lua: give back permits of a semaphore; or withdraw a waiter
-- and give back what was granted to it in the meantime.
--
-- KEYS[1] holders, KEYS[2] expiry, KEYS[3] queue, KEYS[4] waiters
-- (see sem_lib.lua), KEYS[5] released: zset "holder:seq" -> ms of server
--         time until which a release that emptied the holder is remembered,
--         so that a retry of it knows it was applied; and "holder" -> the
--         same, which retires the holder id (see sem_acquire.lua)
-- KEYS[6] withdrawn calls (see sem_lib.lua, mark_withdrawn), KEYS[7] size,
-- KEYS[8] the fencing token counter of a RWMutex's writes (sem_acquire.lua)
-- ARGV[1] holder id
-- ARGV[2] n: permits to give back ("release"), or wanted by the waiter
--         ("withdraw")
-- ARGV[3] held: the permits the caller believes it holds (not counting a
--         grant to its waiter that it has not taken)
-- ARGV[4] seq: the caller's call number (>= 1, increasing): a call
--         numbered no higher than the holder record's (see sem_lib.lua) was
--         applied already, or is a stale copy; it changes nothing
-- ARGV[5] mode: "release"; or "withdraw" with ARGV[6] the waiter id of a
--         call that gives up: it leaves the queue, and the id is refused from
--         now on (a copy of one of its calls still on its way takes nothing)
-- ARGV[6] release: the waiter id of the holder's Acquire under way that
--         may be queued, or "": a release that empties the holder record
--         gives that waiter its call number, so that a grant to it, which
--         makes the record anew, counts every call of the old one applied
-- ARGV[7] lease in ms, re-armed while the holder keeps permits
-- ARGV[8] size as the caller knows it (the stored one rules), ARGV[9]
--         memory of a full release in ms
-- ARGV[10] channel, ARGV[11] publish command (PUBLISH or SPUBLISH)
-- ARGV[12] "1" for a RWMutex (sem_acquire.lua, ARGV[14])
--
-- Freed permits go to the queue's head waiters, as many as they cover
-- (sem_serve), named in one message.
--
-- Reply: 1 released (now or by an earlier try of this call); withdraw: the
--          waiter had been granted and its permits were given back
--        0 withdraw: the waiter had not been granted
--        -1 release: the holder holds fewer permits than held or n (lost)
local k = {holders = KEYS[1], expiry = KEYS[2], size = KEYS[7], queue = KEYS[3], waiters = KEYS[4]}
local released = KEYS[5]
local holder, n, held, seq, mode = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
-- The stored size rules (it may have been resized since the caller read
-- it); the caller's is for a semaphore whose size key has expired.
local size = sem_size(k) or tonumber(ARGV[8])
if ARGV[12] == '1' then
  k.fence = KEYS[8]
  check_counter(k.fence)
end

-- Every key is read before anything is written (see sem_acquire.lua):
-- the queue and the waiters by sem_peek, the expiry zset last, by
-- sem_reclaim before it writes; the withdrawn calls only where they are
-- written.
sem_peek(k)
local applied = redis.call('ZSCORE', released, holder .. ':' .. seq)
sem_load(k)
sem_mine(k, holder) -- the caller's record is checked
if mode == 'withdraw' then
  redis.call('ZCARD', KEYS[6])
end

local now = now_ms()
sem_reclaim(k, now)
prune(released, now)
local mine, mseq = sem_mine(k, holder)
local result = 1
if mode == 'withdraw' then
  mark_withdrawn(KEYS[6], ARGV[6])
  k.first = nil -- the queue changes: sem_serve reads its head anew
  local was = redis.call('ZREM', k.queue, ARGV[6])
  redis.call('HDEL', k.waiters, ARGV[6])
  result = 0
  if was == 0 and mine >= held + n and mseq < seq then
    sem_put(k, holder, mine - n, seq)
    result = 1
  end
else
  if applied or (mine > 0 and mseq >= seq) then
    return 1
  end
  if mine < held or mine < n then
    return -1
  end
  sem_put(k, holder, mine - n, seq)
  if mine == n then
    local rec = ARGV[6] ~= '' and string.match(redis.call('HGET', k.waiters, ARGV[6]) or '', '^(%d+:%d+:%d+:)%d+$')
    if rec then
      redis.call('HSET', k.waiters, ARGV[6], rec .. seq)
      if k.first[1] == ARGV[6] then
        k.first = nil -- the head's record changed: sem_serve reads it anew
      end
    end
    local ms = tonumber(ARGV[9])
    redis.call('ZADD', released, now + ms, holder .. ':' .. seq, now + ms, holder)
    keep_alive(released, ms)
  else
    sem_rearm(k, holder, now, tonumber(ARGV[7]))
  end
end
sem_serve(k, size, sem_used(k), now, false, 0, 0, ARGV[10], ARGV[11])
return result
