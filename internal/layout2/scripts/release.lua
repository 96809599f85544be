-- release.lua: release a hold; or withdraw a call from the fair queue,
-- giving back the lock if it was handed to the call meanwhile.
--
-- KEYS[1] lock hash, KEYS[2] fencing token counter, KEYS[3] queue,
-- KEYS[4] waiters, KEYS[5] the hold id's tombstone (see lib.lua, ended): on
--         a release, a short-lived string holding the hold's token, so that a
--         retried release knows it applied
-- KEYS[6] the Clients with plain waiters (see lib.lua, record_barger)
-- ARGV[1] hold id: the ticket of the call that took the hold, or of the
--         call that withdraws
-- ARGV[2] token of the hold (0 when unknown: no tombstone)
-- ARGV[3] tombstone TTL in ms
-- ARGV[4] channel, ARGV[5] publish command (PUBLISH or SPUBLISH)
-- ARGV[6] mode: "release"; or "withdraw": the call that owns the ticket
--         gives up; it leaves the queue, and the ticket is refused from now
--         on, so that a copy of one of its calls still on its way (a stalled
--         connection, a retry by the client library) takes nothing
-- KEYS[7], ARGV[7] an election's revision key and channel of changes
--         (absent for a plain lock): the new holder, or none, is announced
--         there (see lib.lua, announce)
--
-- A hold is released whatever its count (the count of levels is kept by
-- the holder). The lock is handed to the first live fair waiter (who is
-- told by a message "ticket:token"), or deleted and the plain waiters of
-- one Client are woken (see lib.lua, wake_barger).
--
-- Reply: 1 released (now or in an earlier try of this call)
--        0 not held by the hold id
local lock, token, queue, waiters, tomb = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id, mode = ARGV[1], ARGV[6]

local count = hold_count(lock, id)
elect(KEYS[7], ARGV[7], ARGV[5])
if mode == 'withdraw' then
  -- Read every key written here before the first write: a key of the
  -- wrong type fails the script having changed nothing. (The token counter
  -- too: a hand-off below mints after these writes. withdraw_ticket writes
  -- a key of any type.)
  redis.call('HLEN', waiters)
  check_counter(token)
  redis.call('ZREM', queue, id)
  del_waiter(waiters, id)
  withdraw_ticket(tomb)
end
return release_hold(count, lock, token, queue, waiters, KEYS[6], tomb, ARGV[2], ARGV[3], ARGV[4], ARGV[5])
