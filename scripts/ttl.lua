-- ttl.lua: what is left of one hold's lease (Mutex.TTL).
--
-- KEYS[1] the lock's hash (see lock_lib.lua)
-- ARGV[1] hold id
--
-- Reply: {ms} the hold id holds the lock for ms more
--        {-2} the hold id does not hold the lock (a key of the wrong type
--             counts as the hold gone, as in renew.lua)
local got, s = pcall(load_lock, KEYS[1], nil, nil)
if not got or s.owner ~= ARGV[1] or s['end'] <= now_ms() then
  return {-2}
end
return {s['end'] - now_ms()}
