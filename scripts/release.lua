-- release.lua: release a hold; or withdraw a call, giving back the lock if
-- it was handed to the call meanwhile.
--
-- KEYS[1] the lock's hash, KEYS[2] its fair queue (see lock_lib.lua)
-- KEYS[3] the Clients with plain waiters (lock_lib.lua, record_barger)
-- ARGV[1] hold id: the ticket of the call that took the hold, or of the
--         call that withdraws
-- ARGV[2] mode "release": the hold's token ('0' when unknown); mode
--         "withdraw": the call's queue record ('' when it has none, or it is
--         unknown)
-- ARGV[3] mode, then flags, separated by spaces: "release" or "withdraw";
--         "refuse" (a call of the ticket may still be on its way: refuse
--         it from now on, see lock_lib.lua, refused), "sharded" (publish
--         with SPUBLISH)
--
-- A hold is released whatever its count (the count of levels is kept by
-- the holder). The lock is handed to the first live fair waiter (who is
-- told by a message "ticket:token:ms"), or left free and the plain waiters
-- of one Client are woken (see lock_lib.lua, free).
--
-- Reply: 1 released (now, or by an earlier try of this call); or withdrawn
--        2 not held, and a later hold was taken since: the hold ended
--          (released by an earlier try, or its lease ran out)
--        0 not held by the hold id
local id, flags = ARGV[1], ARGV[3]
local publish = publish_cmd(flags)
local s = load_lock(KEYS[1], KEYS[2])
local r = 1
if string.sub(flags, 1, 8) == 'withdraw' then
  withdraw(s, id, ARGV[2], string.find(flags, 'refuse', 1, true), KEYS[3], publish)
else
  r = release(s, id, ARGV[2], KEYS[3], publish)
  if string.find(flags, 'refuse', 1, true) then
    refuse_ticket(s, id)
  end
end
flush(s)
return r
