-- extend.lua: make one hold of a lock last at least a given lease from
-- now (Mutex.Extend).
--
-- KEYS[1] lock hash, KEYS[2] its fencing token counter (kept as long as
--         the lease, so that it tells the holder's token)
-- ARGV[1] hold id, ARGV[2] lease in ms
--
-- The lease is set only while the hold id holds the lock, and never
-- shortened: whatever order the calls that set a hold's lease run in (the
-- watchdog's renewals, concurrent Extends, a retry by the client library,
-- a call abandoned by its caller and arriving late), each one confirmed
-- gives its sender a lower bound of the lease's end. A key of the wrong
-- type counts as the hold gone, as in renew.lua.
--
-- Reply: {1} the hold lasts at least ARGV[2] ms from now
--        {0} the hold id does not hold the lock
local lock, id, ms = KEYS[1], ARGV[1], tonumber(ARGV[2])
if redis.pcall('HEXISTS', lock, id) ~= 1 then
  return {0}
end
keep_alive(lock, ms)
keep_longer(KEYS[2], ms)
return {1}
