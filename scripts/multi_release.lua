-- multi_release.lua: release the holds of a MultiMutex on several locks at
-- once, as release.lua releases each (mode "release"), in one call. Every
-- key is in one Redis Cluster slot (the caller checks it).
--
-- For each lock i (0-based), three keys from KEYS[3*i+1]: the lock's hash,
-- its fair queue and the Clients with plain waiters (as release.lua's)
-- ARGV[1] flags: "sharded" to publish with SPUBLISH, else ''
-- For each lock i, two arguments from ARGV[2*i+2]: the hold id, and the
-- hold's token ('0' when unknown)
--
-- More than MAX_MULTI locks (lock_lib.lua) fail the script with a LIMIT
-- error, before it reads or writes anything. Every lock is read before the
-- first write: a key of the wrong type or a lock of another layout fails
-- the call having changed nothing.
--
-- Reply: {r1, r2, ...}, for each lock as release.lua's reply
local n = multi_count(#KEYS)
local publish = publish_cmd(ARGV[1])
local locks = {}
for i = 0, n - 1 do
  local s = load_lock(KEYS[3 * i + 1], KEYS[3 * i + 2], nil)
  if s.queue > 0 then
    redis.call('LLEN', s.queue_key) -- a queue of the wrong type fails here, before any write
  end
  locks[i + 1] = s
end
local reply = {}
for i, s in ipairs(locks) do
  reply[i] = release(s, ARGV[2 * i], ARGV[2 * i + 1], KEYS[3 * i], publish)
  flush(s)
end
return reply
