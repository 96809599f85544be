-- sem_resize.lua: change the size of a semaphore, if it is what the caller
-- says it is.
--
-- KEYS[1] holders, KEYS[2] expiry, KEYS[3] size, KEYS[4] queue,
-- KEYS[5] waiters (see sem_lib.lua)
-- ARGV[1] from: the size the caller expects to be stored
-- ARGV[2] to: the new size
-- ARGV[3] channel, ARGV[4] publish command (PUBLISH or SPUBLISH)
--
-- Holders keep their permits: after a shrink more may be in use than the
-- new size until they give them back, and nobody is granted a permit
-- until the permits in use leave room under the new size. After a growth
-- the queue is served at once. Semaphore values opened with the old size
-- go on with the new one (sem_acquire.lua: the stored size rules).
--
-- Reply: {1, 0}      resized (or the size was to already); when no size was
--                    stored (the semaphore is idle), it is stored
--        {0, stored} the stored size is neither from nor to: nothing done
local k = {holders = KEYS[1], expiry = KEYS[2], size = KEYS[3], queue = KEYS[4], waiters = KEYS[5]}
local from, to = tonumber(ARGV[1]), tonumber(ARGV[2])

-- Every key is read before anything is written (see sem_acquire.lua).
local stored = sem_size(k)
redis.call('ZCARD', k.expiry)
redis.call('ZCARD', k.queue)
redis.call('HLEN', k.waiters)
sem_load(k)
if stored and stored ~= from and stored ~= to then
  return {0, stored}
end

local now = now_ms()
local live = math.max(redis.call('PTTL', k.holders), redis.call('PTTL', k.queue))
sem_reclaim(k, now) -- reads the records it reclaims before it writes
sem_store_size(k, to)
keep_alive(k.size, state_memory_ms)
keep_alive(k.size, live)
sem_serve(k, to, sem_used(k), now, false, 0, 0, ARGV[3], ARGV[4])
return {1, 0}
