-- ttl.lua: what is left of one hold's lease (Mutex.TTL).
--
-- KEYS[1] lock hash
-- ARGV[1] hold id
--
-- Reply: {pttl} the hold id holds the lock, whose PTTL in ms is pttl (-1:
--               no TTL, which only a command outside redisync sets)
--        {-2}   the hold id does not hold the lock (a key of the wrong type
--               counts as the hold gone, as in renew.lua)
if redis.pcall('HEXISTS', KEYS[1], ARGV[1]) ~= 1 then
  return {-2}
end
return {redis.call('PTTL', KEYS[1])}
