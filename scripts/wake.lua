-- wake.lua: pass on a wake-up that reached a Client whose plain waiters of
-- the lock had all gone (see lock_lib.lua, wake_barger): while the lock is
-- free, the plain waiters of the next recorded Client are woken.
--
-- KEYS[1] the lock's hash, KEYS[2] its fair queue (see lock_lib.lua)
-- KEYS[3] the Clients with plain waiters (lock_lib.lua, record_barger)
-- ARGV[1] flags: "sharded" to publish with SPUBLISH, else ''
--
-- Reply: 1 when the lock was free, 0 when it is held (its release wakes a
-- Client then)
local s = load_lock(KEYS[1], KEYS[2], nil)
if held(s) then
  return 0
end
wake_barger(s, KEYS[3], publish_cmd(ARGV[1]))
flush(s)
return 1
