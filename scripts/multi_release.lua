-- multi_release.lua: release the holds of a MultiMutex on several locks at
-- once, as release.lua releases each (mode "release"), in one call. Every
-- key is in one Redis Cluster slot (the caller checks it).
--
-- For each lock i (0-based), six keys from KEYS[6*i+1]: lock hash, fencing
-- token counter, queue, waiters, the hold's release tombstone and the
-- Clients with plain waiters (as release.lua's KEYS[1] to KEYS[6])
-- ARGV[1] tombstone TTL in ms, ARGV[2] publish command (PUBLISH or SPUBLISH)
-- For each lock i, three arguments from ARGV[3*i+3]: the hold id, the
-- hold's token ('0' when unknown: no tombstone), and the lock's channel
--
-- The locks are released in turn, each as release.lua does (each lock's
-- keys read before its own writes), so a key of the wrong type on a later
-- lock fails the call after the earlier locks were released: the caller
-- then releases each lock alone, and the earlier ones' tombstones make
-- those calls report success (multimutex.go, release).
--
-- Reply: {r1, r2, ...}, for each lock as release.lua's reply: 1 released
-- (now or in an earlier try of this call), 0 not held by the hold id
local reply = {}
for i = 0, #KEYS / 6 - 1 do
  local k, a = 6 * i, 3 * i + 2
  local count = hold_count(KEYS[k + 1], ARGV[a + 1])
  reply[i + 1] = release_hold(count, KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 6], KEYS[k + 5],
    ARGV[a + 2], ARGV[1], ARGV[a + 3], ARGV[2])
end
return reply
