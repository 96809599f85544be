-- proclaim.lua: change the value of an election's leader, if the hold id
-- still leads (Election.Proclaim).
--
-- KEYS[1] the election's lock hash, KEYS[2] its revision key
-- ARGV[1] the leader's hold id, ARGV[2] its fencing token, ARGV[3] the new
--         value ('' for none), ARGV[4] the channel of changes, ARGV[5] the
--         publish command (PUBLISH or SPUBLISH)
--
-- A value that is the leader's already changes nothing and announces
-- nothing: a retried call is not announced twice.
--
-- Reply: 1 the hold id leads with the value now; 0 it does not lead
local lock = KEYS[1]
elect(KEYS[2], ARGV[4], ARGV[5])
if hold_count(lock, ARGV[1]) == 0 then
  return 0
end
if (redis.call('HGET', lock, META_FIELD) or '') ~= ARGV[3] then
  set_meta(lock, ARGV[3])
  announce(tonumber(ARGV[2]), ARGV[3], redis.call('PTTL', lock))
end
return 1
