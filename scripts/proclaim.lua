-- proclaim.lua: change the value of an election's leader, if the hold id
-- still leads (Election.Proclaim).
--
-- KEYS[1] the election's lock hash, KEYS[2] its revision key
-- ARGV[1] the leader's hold id, ARGV[2] its fencing token, ARGV[3] the new
--         value ('' for none), ARGV[4] the channel of changes, ARGV[5] the
--         publish command (PUBLISH or SPUBLISH)
-- ARGV[6] the call's number: every Proclaim of an Election value has a
--         larger one than the last
--
-- The hold keeps the number of the last Proclaim applied to it (in the
-- field '{proclaim}', which goes with the hold): a copy of an earlier
-- Proclaim that arrives late (a stalled connection, a retry by the client
-- library) changes nothing, and a retry of the last one reports success.
-- A value that is the leader's already changes nothing and announces
-- nothing.
--
-- Reply: 1 the hold id leads with the value now, or with a later
--          Proclaim's; 0 it does not lead
local lock, seq = KEYS[1], tonumber(ARGV[6])
elect(KEYS[2], ARGV[4], ARGV[5])
if hold_count(lock, ARGV[1]) == 0 then
  return 0
end
local last = redis.call('HGET', lock, PROCLAIM_FIELD)
if last and (integer(last) or wrong(lock, 'a Proclaim number')) >= seq then
  return 1
end
redis.call('HSET', lock, PROCLAIM_FIELD, ARGV[6])
if (redis.call('HGET', lock, META_FIELD) or '') ~= ARGV[3] then
  set_meta(lock, ARGV[3])
  announce(tonumber(ARGV[2]), ARGV[3], redis.call('PTTL', lock))
end
return 1
