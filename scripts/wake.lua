-- wake.lua: pass on a wake-up that reached a Client whose plain waiters of
-- the lock had all gone (see lib.lua, wake_barger): while the lock is free,
-- the plain waiters of the next recorded Client are woken.
--
-- KEYS[1] lock hash, KEYS[2] the Clients with plain waiters (see lib.lua,
--         record_barger)
-- ARGV[1] channel, ARGV[2] publish command (PUBLISH or SPUBLISH)
--
-- Reply: 1 when the lock was free, 0 when it is held (its release wakes a
-- Client then)
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
wake_barger(KEYS[2], ARGV[1], ARGV[2])
return 1
