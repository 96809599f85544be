-- extend.lua: make one hold of a lock last at least a given lease from
-- now (Mutex.Extend).
--
-- KEYS[1] the lock's hash, KEYS[2] its fair queue (see lock_lib.lua)
-- ARGV[1] hold id, ARGV[2] lease in ms
--
-- The lease is set only while the hold id holds the lock, and never
-- shortened: whatever order the calls that set a hold's lease run in (the
-- watchdog's renewals, concurrent Extends, a retry by the client library,
-- a call abandoned by its caller and arriving late), each one confirmed
-- gives its sender a lower bound of the lease's end. A key of the wrong
-- type counts as the hold gone, as in renew.lua.
--
-- A lease beyond lib.lua's MAX_MS fails the script (LIMIT error).
--
-- Reply: {1} the hold lasts at least ARGV[2] ms from now
--        {0} the hold id does not hold the lock
ms_arg(ARGV[2], 1, 'the lease')
local got, s = pcall(load_lock, KEYS[1], KEYS[2], nil)
if not got or s.owner ~= ARGV[1] or s['end'] <= now_ms() then
  return {0}
end
local until_ms = now_ms() + tonumber(ARGV[2])
if s['end'] < until_ms then
  s['end'] = until_ms
  set(s, F_END, string.format('%d', until_ms))
  keep_state(s, until_ms)
  flush(s)
end
return {1}
