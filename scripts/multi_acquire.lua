-- multi_acquire.lua: take several locks at once for one MultiMutex call,
-- all or none, when every one is free and nobody queues for it. It never
-- queues: a call that finds any lock held or queued for takes nothing, and
-- takes the locks one by one, in their global order, through acquire.lua.
-- Every key is in one Redis Cluster slot (the caller checks it).
--
-- For each lock i (0-based), three keys from KEYS[3*i+1]: the lock's hash,
-- its fair queue, and the ticket's tombstone (as acquire.lua's KEYS[1], 2
-- and 4)
-- ARGV[1] ticket: the call's own id; every hold it takes is stored under it
-- ARGV[2] lease in ms
-- ARGV[3] the caller's metadata (WithMetadata), stored with each hold; ''
--         for none
--
-- More than MAX_MULTI locks (lock_lib.lua) fail the script with a LIMIT
-- error, before it reads or writes anything.
--
-- Reply: {1, token1, token2, ...} every lock is held by the ticket (now, or
--                                 by an earlier try of this call)
--        {0}                      a lock is held by another owner or
--                                 queued for: nothing done
--        {-2}                     the ticket was withdrawn on some lock, or
--                                 holds only some: nothing done (the caller
--                                 withdraws it)
local ticket, lease = ARGV[1], tonumber(ARGV[2])
local n = multi_count(#KEYS)

-- Reads every lock before the first write: a key of the wrong type fails
-- the script having changed nothing.
local locks, held_n, busy = {}, 0, false
for i = 0, n - 1 do
  local s = load_lock(KEYS[3 * i + 1], KEYS[3 * i + 2], nil)
  locks[i + 1] = s
  if s.owner == ticket and held(s) then
    held_n = held_n + 1
  elseif refused(s, ticket) then
    return {-2}
  elseif held(s) or s.queue > 0 then
    busy = true
  end
  prepare(s)
end

local reply = {1}
if held_n == n then
  -- A retry of a call that took them all.
  for i = 1, n do
    reply[i + 1] = locks[i].token
  end
  return reply
end
if held_n > 0 then
  return {-2}
end
if busy then
  return {0}
end
for i = 1, n do
  reply[i + 1] = grant(locks[i], ticket, lease, ARGV[3], 'PUBLISH')
  flush(locks[i])
end
return reply
