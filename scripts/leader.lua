-- leader.lua: read who leads an election, at one instant (Election.Leader,
-- and an observer after a gap). It only reads.
--
-- KEYS[1] the election's lock hash (see lock_lib.lua)
--
-- Reply: {revision, token, value, ms}, each a string: revision '0' when
-- none is stored; token '0' when nobody leads; value '' for none; ms the
-- leader's remaining lease, '0' when nobody leads.
local s = load_lock(KEYS[1], nil, nil)
local rev = string.format('%d', s.rev or 0)
if not held(s) then
  return {rev, '0', '', '0'}
end
return {rev, string.format('%d', s.token), s.meta, string.format('%d', remaining(s))}
