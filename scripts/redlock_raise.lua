-- redlock_raise.lua: carry a Redlock's fencing token to one of its nodes.
--
-- KEYS[1] lock hash (owner -> hold count)
-- KEYS[2] fencing token counter (see lib.lua, mint)
-- ARGV[1] owner id of the node's hold
-- ARGV[2] the Redlock token: the largest token the quorum's nodes minted
--
-- While the owner still holds the lock on this node, the node's counter is
-- raised to at least the token, so that the next hold minted on this node
-- (by any owner, after this one's) gets a larger token. Raising is
-- idempotent, so a retried call changes nothing more.
--
-- Reply: 1 raised (or already at least the token), 0 the owner no longer
--        holds the lock here (nothing written)
local lock, token = KEYS[1], KEYS[2]
if redis.call('HEXISTS', lock, ARGV[1]) == 0 then
  return 0
end
local t = check_counter(token)
if t < tonumber(ARGV[2]) then
  redis.call('SET', token, ARGV[2], 'PX', math.max(state_memory_ms, redis.call('PTTL', lock)))
end
return 1
