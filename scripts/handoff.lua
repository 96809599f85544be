-- handoff.lua: hand a hold to another process in two steps, so that no two
-- ever hold it at once (Mutex.Handoff, Mutex.Accept). The holder gives the
-- hold up under a one-time handle, having stopped believing it holds; the
-- taker then takes it under a ticket of its own, with a new fencing token.
--
-- A handle is "{handoff}" followed by a fresh ticket: no hold id starts
-- with '{' (labels may not hold one), so a take never moves a live hold.
--
-- KEYS[1] lock hash, KEYS[2] fencing token counter (see lib.lua, mint)
-- ARGV[1] mode: "give" or "take"
-- give: KEYS[3] the holder's release tombstone (see release.lua): a late
--       copy of the call that took the hold takes nothing from now on
--       ARGV[2] the holder's ticket, ARGV[3] the handle, ARGV[4] how long
--       in ms the hold waits for its taker before it runs out, ARGV[5] the
--       hold's token, ARGV[6] how long the tombstone lasts in ms
--       Reply: {1, 0} given (or given already: a retry)
--              {0, 0} the ticket does not hold the lock
-- take: KEYS[3] the taker's ticket's tombstone (see lib.lua, ended): a late
--       copy of a take whose call gave up takes nothing
--       ARGV[2] the handle, ARGV[3] the taker's ticket, ARGV[4] lease in ms,
--       ARGV[5] the taker's metadata ('' for none: the giver's goes)
--       Reply: {1, token} taken (or taken already by this ticket: a retry)
--              {0, 0} no hold waits under the handle
local lock, mode = KEYS[1], ARGV[1]

-- Read what may be written first: a key of the wrong type fails here.
local t = check_counter(KEYS[2])
if mode == 'give' then
  local ticket, handle = ARGV[2], ARGV[3]
  if hold_count(lock, handle) > 0 then
    return {1, 0}
  end
  if hold_count(lock, ticket) == 0 then
    return {0, 0}
  end
  redis.call('SET', KEYS[3], ARGV[5], 'PX', tonumber(ARGV[6]))
  redis.call('HDEL', lock, ticket)
  redis.call('HSET', lock, handle, 1)
  redis.call('PEXPIRE', lock, tonumber(ARGV[4]))
  return {1, 0}
end

local handle, ticket, lease = ARGV[2], ARGV[3], tonumber(ARGV[4])
if hold_count(lock, ticket) > 0 then
  return {1, t} -- a retry: nothing minted a token since
end
if string.sub(handle, 1, 9) ~= '{handoff}' or ended(KEYS[3]) or hold_count(lock, handle) == 0 then
  return {0, 0}
end
local token = mint(KEYS[2], lease)
redis.call('HDEL', lock, handle)
redis.call('HSET', lock, ticket, 1)
set_meta(lock, ARGV[5])
redis.call('PEXPIRE', lock, lease)
return {1, token}
