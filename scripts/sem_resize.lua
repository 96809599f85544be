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
local k = sem_keys(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
local from, to = tonumber(ARGV[1]), tonumber(ARGV[2])

-- Every key is read before anything is written (see sem_acquire.lua).
local head = sem_peek(k)
sem_open(k, {head})
local stored = k.size
if stored and stored ~= from and stored ~= to then
  return {0, stored}
end

local now = now_ms()
sem_reclaim(k, now) -- reads the records it reclaims before it writes
sem_store_size(k, to)
sem_serve(k, to, now, false, 0, 0, ARGV[3])
sem_flush(k)
sem_publish(k, ARGV[4])
return {1, 0}
