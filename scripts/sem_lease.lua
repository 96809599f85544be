-- sem_lease.lua: extend the lease of one semaphore holder, or read it
-- (Semaphore.Extend and TTL, RWMutex.Extend and TTL).
--
-- KEYS[1] holders, KEYS[2] expiry, KEYS[3] size (see sem_lib.lua)
-- ARGV[1] holder id
-- ARGV[2] mode: "extend" or "ttl"
-- ARGV[3] ms: in mode "extend", the least lease from now
--
-- The holder holds while it has a record and its lease has not ended. In
-- mode "extend" its lease ends no earlier than now + ms (it is never
-- shortened), and the keys live at least as long (the size too). A holder
-- whose lease has ended is left for the next acquire or release to
-- reclaim. A key of the wrong type counts as the holder gone, as in
-- renew.lua. The call reads one record and one score, whatever the number
-- of holders and waiters.
--
-- Reply: {1}   extended ("extend")
--        {ms}  the lease has ms more to run ("ttl"; at least 1)
--        {-2}  the holder holds no permits
local k = {holders = KEYS[1], expiry = KEYS[2], size = KEYS[3]}
local holder, mode = ARGV[1], ARGV[2]

local now = now_ms()
local rec = redis.pcall('HGET', k.holders, holder)
local e = redis.pcall('ZSCORE', k.expiry, holder)
if type(rec) ~= 'string' or type(e) ~= 'string' or tonumber(e) <= now then
  return {-2}
end
if mode == 'ttl' then
  return {tonumber(e) - now}
end
local ms = tonumber(ARGV[3])
sem_lease(k, holder, now, ms)
return {1}
