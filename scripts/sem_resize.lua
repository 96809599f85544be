-- sem_resize.lua: change the size of a semaphore, if it is what the caller
-- says it is.
--
-- KEYS: the semaphore's four keys (sem_lib.lua)
-- ARGV[1] from: the size the caller expects to be stored
-- ARGV[2] to: the new size
-- ARGV[3] flags: "sharded" (publish with SPUBLISH), or ""
-- ARGV[4] the grant channels' prefix (lib.lua, grant_channel)
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
local from, to = sem_args(ARGV[1], 1, 'from'), sem_args(ARGV[2], 1, 'to')
local k = sem_keys(KEYS, false)

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
sem_serve(k, to, now, false, 0, 0, ARGV[4])
sem_flush(k)
sem_publish(k, publish_cmd(ARGV[3]))
return {1, 0}
