-- sem_release.lua: give back permits of a semaphore; or withdraw a waiter
-- and give back what was granted to it in the meantime.
--
-- KEYS[1] holders, KEYS[2] expiry, KEYS[3] queue, KEYS[4] waiters,
-- KEYS[5] released, KEYS[6] withdrawn calls, KEYS[7] size (see
-- sem_lib.lua), KEYS[8] the fencing token counter of a RWMutex's writes
-- (sem_acquire.lua)
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
-- ARGV[13] release: "1" when a call of the holding may still be on its way
--          (its reply was lost, or it was given up): a release that
--          empties the record refuses the holder id for the memory
--          (sem_lib.lua, sem_retire)
--
-- Freed permits go to the queue's head waiters, as many as they cover
-- (sem_serve), named in one message.
--
-- Reply: 1 released (now or by an earlier try of this call); withdraw: the
--          waiter had been granted and its permits were given back
--        0 withdraw: the waiter had not been granted
--        -1 release: the holder holds fewer permits than held or n (lost)
local k = sem_keys(KEYS[1], KEYS[2], KEYS[7], KEYS[3], KEYS[4])
local released = KEYS[5]
local holder, n, held, seq, mode = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
if ARGV[12] == '1' then
  k.fence = KEYS[8]
end

-- Every key is read before anything is written (see sem_acquire.lua):
-- the queue and the waiters by sem_peek, the holders hash by sem_open,
-- the expiry zset by sem_reclaim; the released and withdrawn zsets only
-- where they are needed, before any other write.
sem_open(k, {holder, sem_peek(k)})
-- The stored size rules (it may have been resized since the caller read
-- it); the caller's is for a semaphore whose size has expired.
local size = k.size or tonumber(ARGV[8])
sem_mine(k, holder) -- the caller's record is checked

local now = now_ms()
sem_reclaim(k, now)
sem_check_fence(k, 0, size, n)
local mine, mseq = sem_mine(k, holder)
local result = 1
if mode == 'withdraw' then
  mark_withdrawn(k, KEYS[6], ARGV[6])
  k.first = nil -- the queue changes: sem_serve reads its head anew
  local was = redis.call('ZREM', k.queue, ARGV[6])
  redis.call('HDEL', k.waiters, ARGV[6])
  k.waiters_cut = true
  result = 0
  if was == 0 and mine >= held + n and mseq < seq then
    sem_put(k, holder, mine - n, seq)
    result = 1
  end
else
  -- The holders reclaimed above go whatever the reply.
  if mine > 0 and mseq >= seq then
    sem_flush(k)
    return 1 -- applied already: this is a retry, or a stale copy
  end
  if mine == 0 and applied(released, holder, seq, now) then
    sem_flush(k)
    return 1 -- an earlier copy of this call emptied the record
  end
  if mine < held or mine < n then
    sem_flush(k)
    return -1
  end
  if mine == n then
    sem_retire(k, released, holder, seq, now, tonumber(ARGV[9]), ARGV[13] == '1')
    sem_put(k, holder, 0, seq)
    local rec = ARGV[6] ~= '' and string.match(redis.call('HGET', k.waiters, ARGV[6]) or '', '^(%d+:%d+:%d+:)%d+$')
    if rec then
      sem_put_waiter(k, ARGV[6], rec .. seq)
      if k.first[1] == ARGV[6] then
        k.first = nil -- the head's record changed: sem_serve reads it anew
      end
    end
  else
    -- The permits kept start their lease anew, unless a longer one is
    -- left (sem_lease.lua, Extend).
    sem_put(k, holder, mine - n, seq)
    sem_lease(k, holder, now, tonumber(ARGV[7]), true)
  end
end
sem_serve(k, size, now, false, 0, 0, ARGV[10])
sem_flush(k)
sem_publish(k, ARGV[11])
return result
