-- sem_lease.lua: extend the lease of one semaphore holder, or read it
-- (Semaphore.Extend and TTL, RWMutex.Extend and TTL).
--
-- KEYS: the semaphore's four keys (sem_lib.lua)
-- ARGV[1] holder id
-- ARGV[2] mode: "extend" or "ttl"
-- ARGV[3] ms: in mode "extend", the least lease from now
--
-- The holder holds while it has a record and its lease has not ended. In
-- mode "extend" its lease ends no earlier than now + ms (it is never
-- shortened), and the keys live at least as long (sem_keep). A holder
-- whose lease has ended is left for the next acquire or release to
-- reclaim. A key of the wrong type counts as the holder gone, as in
-- renew.lua. The call reads one record and one score, whatever the number
-- of holders and waiters.
--
-- Reply: {1}   extended ("extend")
--        {ms}  the lease has ms more to run ("ttl"; at least 1)
--        {-2}  the holder holds no permits
local k = sem_keys(KEYS, false)
local holder, mode = ARGV[1], ARGV[2]

local now = now_ms()
local v = redis.pcall('HMGET', k.hash, holder, F_KEEP)
local e = redis.pcall('ZSCORE', k.expiry, holder)
if v.err or not v[1] or type(e) ~= 'string' or tonumber(e) <= now then
  return {-2}
end
if mode == 'ttl' then
  return {tonumber(e) - now}
end
local ms = tonumber(ARGV[3])
k.keep, k.used, k.used0, k.hw, k.ew = integer(v[2]) or 0, 0, 0, {}, {}
if tonumber(e) < now + ms then
  sem_zset(k, holder, now + ms)
end
sem_keep(k, now + ms)
sem_flush(k)
return {1}
