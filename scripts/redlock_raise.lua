-- redlock_raise.lua: carry a Redlock's fencing token to one of its nodes.
--
-- KEYS[1] the lock's hash on this node (see lock_lib.lua)
-- ARGV[1] owner id of the node's hold
-- ARGV[2] the Redlock token: the largest token the quorum's nodes minted
--
-- While the owner still holds the lock on this node, the node's last token
-- is raised to at least the token, so that the next hold minted on this
-- node (by any owner, after this one's) gets a larger token. Raising is
-- idempotent, so a retried call changes nothing more.
--
-- Reply: 1 raised (or already at least the token), 0 the owner no longer
--        holds the lock here (nothing written)
local s = load_lock(KEYS[1], nil, nil)
if s.owner ~= ARGV[1] then
  return 0
end
local t = tonumber(ARGV[2])
if s.token < t then
  set(s, F_TOKEN, string.format('%d', t))
  flush(s)
end
return 1
