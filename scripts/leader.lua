-- leader.lua: read who leads an election, at one instant (Election.Leader,
-- and an observer after a gap). It only reads, with the commands every
-- script may call (docs/acl.md): no MULTI, no HGETALL.
--
-- KEYS[1] the election's lock hash, KEYS[2] its fencing token counter,
-- KEYS[3] its revision key
--
-- Reply: {revision, token, value, ms}, each a string: revision '0' when
-- none is stored; token '0' when nobody leads (the counter holds the
-- holder's token while the lock is held: see lib.lua, mint); value '' for
-- none; ms the leader's remaining lease (PTTL), '0' when nobody leads.
local v = redis.call('HMGET', KEYS[1], LAYOUT_FIELD, META_FIELD)
local holds = redis.call('HLEN', KEYS[1])
if v[1] then
  holds = holds - 1
end
if v[2] then
  holds = holds - 1
end
local rev = redis.call('GET', KEYS[3]) or '0'
if holds < 1 then
  return {rev, '0', '', '0'}
end
local ms = string.format('%d', redis.call('PTTL', KEYS[1]))
return {rev, redis.call('GET', KEYS[2]) or '0', v[2] or '', ms}
