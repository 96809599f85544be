-- handoff.lua: hand a hold to another process in two steps, so that no two
-- ever hold it at once (Mutex.Handoff, Mutex.Accept). The holder gives the
-- hold up under a one-time handle, having stopped believing it holds; the
-- taker then takes it under a ticket of its own, with a new fencing token.
--
-- A handle is "{handoff}" followed by a fresh ticket: no ticket starts with
-- '{' (labels may not hold one), so a take never moves a live hold.
--
-- KEYS[1] the lock's hash, KEYS[2] its fair queue (see lock_lib.lua)
-- KEYS[3] the taker's ticket's tombstone (take: see lock_lib.lua, refused)
-- ARGV[1] mode: "give" or "take"
-- give: ARGV[2] the holder's ticket, ARGV[3] the handle, ARGV[4] how long
--       in ms the hold waits for its taker before it runs out, ARGV[5] "1"
--       when a call of the holder's ticket may still be on its way: it is
--       refused from now on (lock_lib.lua, refused)
--       Reply: {1, 0} given (or given already: a retry)
--              {0, 0} the ticket does not hold the lock
-- take: ARGV[2] the handle, ARGV[3] the taker's ticket, ARGV[4] lease in ms,
--       ARGV[5] the taker's metadata ('' for none: the giver's goes)
--       Reply: {1, token} taken (or taken already by this ticket: a retry)
--              {0, 0} no hold waits under the handle
local s = load_lock(KEYS[1], KEYS[2], nil)
if ARGV[1] == 'give' then
  local ticket, handle = ARGV[2], ARGV[3]
  if s.owner == handle then
    return {1, 0}
  end
  if not held(s) or s.owner ~= ticket then
    return {0, 0}
  end
  if ARGV[5] == '1' then
    refuse_ticket(s, ticket)
  end
  s['end'] = now_ms() + tonumber(ARGV[4])
  set(s, F_OWNER, handle)
  set(s, F_END, string.format('%d', s['end']))
  keep_state(s, s['end'])
  flush(s)
  return {1, 0}
end

local handle, ticket, lease = ARGV[2], ARGV[3], tonumber(ARGV[4])
if s.owner == ticket and held(s) then
  return {1, s.token} -- a retry: nothing minted a token since
end
if string.sub(handle, 1, 9) ~= '{handoff}' or s.owner ~= handle or not held(s) or refused(s, ticket) then
  return {0, 0}
end
local t = mint_token(s)
s['end'] = now_ms() + lease
set(s, F_OWNER, ticket)
set(s, F_END, string.format('%d', s['end']))
set(s, F_META, ARGV[5])
keep_state(s, s['end'])
flush(s)
return {1, t}
