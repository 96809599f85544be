-- sem_release.lua: give back permits of a semaphore; or withdraw a waiter
-- and give back what was granted to it in the meantime.
--
-- KEYS: the semaphore's four keys (sem_lib.lua)
-- ARGV[1] holder id
-- ARGV[2] mode "withdraw": the waiter id of a call that gives up: it
--         leaves the queue, and the id is refused from now on (a copy of
--         one of its calls still on its way takes nothing). Mode
--         "release": the waiter id of the holder's Acquire under way that
--         may be queued, or "": a release that empties the holder record
--         gives that waiter its call number, so that a grant to it, which
--         makes the record anew, counts every call of the old one applied
-- ARGV[3] "n:size:held:seq": the permits to give back ("release"), or
--         wanted by the waiter ("withdraw"); the size as the caller knows
--         it (the stored one rules); the permits the caller believes it
--         holds (not counting a grant to its waiter that it has not
--         taken); and its call number (>= 1, increasing): a call numbered
--         no higher than the holder record's (see sem_lib.lua) was applied
--         already, or is a stale copy; it changes nothing
-- ARGV[4] "lease:memory", in ms: the lease re-armed while the holder keeps
--         permits; how long a full release is remembered
-- ARGV[5] mode ("release" or "withdraw"), then flags, separated by
--         spaces: "rw" (a RWMutex's: sem_acquire.lua), "sharded" (publish
--         with SPUBLISH), "refuse" (release: a call of the holding may
--         still be on its way, its reply lost or given up: a release that
--         empties the record refuses the holder id for the memory;
--         sem_lib.lua, sem_retire)
-- ARGV[6] the grant channels' prefix (lib.lua, grant_channel)
--
-- Freed permits go to the queue's head waiters, as many as they cover
-- (sem_serve), named in one message.
--
-- Reply: 1 released (now or by an earlier try of this call); withdraw: the
--          waiter had been granted and its permits were given back
--        0 withdraw: the waiter had not been granted
--        -1 release: the holder holds fewer permits than held or n (lost)
local holder, waiter, flags = ARGV[1], ARGV[2], ARGV[5]
local n, size, held, seq = sem_args(ARGV[3], 4, 'the call')
local lease, memory = sem_args(ARGV[4], 2, 'the times')
limit(math.max(lease, memory) <= MAX_MS, 'the times must be at most ', MAX_MS, ' ms')
local mode = string.match(flags, '^%a+')
local k = sem_keys(KEYS, sem_flag(flags, 'rw'))

-- Every key is read before anything is written (see sem_acquire.lua):
-- the queue by sem_peek, the hash by sem_open, the expiry zset by
-- sem_reclaim; the ended zset only where it is needed, before any other
-- write.
sem_open(k, {holder, sem_peek(k)}, {waiter})
-- The stored size rules (it may have been resized since the caller read
-- it); the caller's is for a semaphore whose size has expired.
size = k.size or size

local now = now_ms()
sem_reclaim(k, now)
local mine, mseq = sem_mine(k, holder)
local result = 1
if mode == 'withdraw' then
  mark_withdrawn(k, waiter)
  local was = redis.call('ZREM', k.queue, waiter)
  sem_hset(k, waiter, false)
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
  if mine == 0 and applied(k, holder, seq, now) then
    sem_flush(k)
    return 1 -- an earlier copy of this call emptied the record
  end
  if mine < held or mine < n then
    sem_flush(k)
    return -1
  end
  if mine == n then
    sem_retire(k, holder, seq, now, memory, sem_flag(flags, 'refuse'))
    sem_put(k, holder, 0, seq)
    local rec = string.match(k.extra[waiter] or '', '^(%d+:%d+:%d+:)%d+$')
    if rec then
      sem_hset(k, waiter, rec .. seq)
    end
  else
    -- The permits kept start their lease anew, unless a longer one is
    -- left (sem_lease.lua, Extend).
    sem_put(k, holder, mine - n, seq)
    sem_lease(k, holder, now, lease, true)
  end
end
sem_serve(k, size, now, false, 0, 0, ARGV[6])
sem_flush(k)
sem_publish(k, publish_cmd(flags))
return result
