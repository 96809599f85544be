-- multi_acquire.lua: take several locks at once for one MultiMutex call,
-- all or none, when every one is free and nobody queues for it. It never
-- queues: a call that finds any lock held or queued for takes nothing, and
-- takes the locks one by one, in their global order, through acquire.lua.
-- Every key is in one Redis Cluster slot (the caller checks it).
--
-- For each lock i (0-based), four keys from KEYS[4*i+1]:
--   lock hash, fencing token counter, queue, and the ticket's tombstone
--   (as acquire.lua's KEYS[1], 2, 3 and 5)
-- ARGV[1] ticket: the call's own id; every hold it takes is stored under it
-- ARGV[2] lease in ms
-- ARGV[3] the caller's metadata (WithMetadata), stored with each hold; ''
--         for none
--
-- Reply: {1, token1, token2, ...} every lock is held by the ticket (now, or
--                                 by an earlier try of this call)
--        {0}                      a lock is held by another owner or
--                                 queued for: nothing done
--        {-2}                     the ticket was withdrawn or released on
--                                 some lock, or holds only some: nothing
--                                 done (the caller withdraws it)
local ticket, lease = ARGV[1], tonumber(ARGV[2])
local n = #KEYS / 4

-- Reads every lock before the first write: a key of the wrong type fails
-- the script having changed nothing.
local held, busy = 0, false
for i = 0, n - 1 do
  local lock, token, queue = KEYS[4 * i + 1], KEYS[4 * i + 2], KEYS[4 * i + 3]
  check_counter(token)
  if ended(KEYS[4 * i + 4]) then
    return {-2}
  end
  local count, layout = read_hold(lock, ticket)
  if count > 0 then
    held = held + 1
  elseif redis.call('EXISTS', lock) == 1 then
    if layout ~= LAYOUT then
      other_layout(lock, layout)
    end
    busy = true
  elseif redis.call('ZCARD', queue) > 0 then
    busy = true
  end
end

local reply = {1}
if held == n then
  -- A retry of a call that took them all: as acquire.lua, never shorten.
  for i = 0, n - 1 do
    keep_alive(KEYS[4 * i + 1], lease)
    keep_longer(KEYS[4 * i + 2], lease) -- as acquire.lua: see lib.lua, mint
    reply[i + 2] = check_counter(KEYS[4 * i + 2])
  end
  return reply
end
if held > 0 then
  return {-2}
end
if busy then
  return {0}
end
for i = 0, n - 1 do
  reply[i + 2] = grant(KEYS[4 * i + 1], KEYS[4 * i + 2], ticket, lease, ARGV[3])
end
return reply
