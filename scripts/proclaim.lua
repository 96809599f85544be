-- proclaim.lua: change the value of an election's leader, if the hold id
-- still leads (Election.Proclaim).
--
-- KEYS[1] the election's lock hash, KEYS[2] its fair queue (see
-- lock_lib.lua)
-- ARGV[1] the leader's hold id, ARGV[2] the new value ('' for none)
-- ARGV[3] the call's number: every Proclaim of an Election value has a
--         larger one than the last
-- ARGV[4] flags: "sharded" to publish with SPUBLISH, else ''
-- A value longer than lib.lua's MAX_TEXT fails the script (LIMIT error).
--
-- The hold keeps the number of the last Proclaim applied to it (in the
-- field '{proclaim}', which a new hold clears): a copy of an earlier
-- Proclaim that arrives late (a stalled connection, a retry by the client
-- library) changes nothing, and a retry of the last one reports success.
-- A value that is the leader's already changes nothing and announces
-- nothing.
--
-- Reply: 1 the hold id leads with the value now, or with a later
--          Proclaim's; 0 it does not lead
local s = load_lock(KEYS[1], KEYS[2], {F_PROCLAIM})
text_arg(ARGV[2], 'the value')
local seq = tonumber(ARGV[3])
if s.owner ~= ARGV[1] or not held(s) then
  return 0
end
if number(s.key, s.extra[1]) >= seq then
  return 1
end
set(s, F_PROCLAIM, ARGV[3])
if s.meta ~= ARGV[2] then
  s.meta = ARGV[2]
  set(s, F_META, ARGV[2])
  announce(s, s.token, ARGV[2], remaining(s), publish_cmd(ARGV[4]))
end
flush(s)
return 1
