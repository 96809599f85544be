-- renew.lua: the watchdog's batch: extend held leases and refresh fair
-- waiters' heartbeats, for many locks in one call.
--
-- ARGV holds one triple per entry: kind ("hold" or "wait"), owner id, ms (the
-- lease of a hold, the heartbeat ttl of a waiter). KEYS holds the entries'
-- keys in the same order: one key for a hold (its lock hash), three for a
-- waiter (its queue, its waiters hash and the lock hash).
--
-- A hold is extended only while its owner still holds the lock; a waiter's
-- deadline is moved only while it is still queued (it keeps its hand-off
-- lease). A key of the wrong type counts as gone for its entry alone.
--
-- Reply: one integer per entry: 1 renewed, 0 gone (a lost hold, or a waiter
-- no longer queued: handed the lock, or dropped as dead), 2 a waiter renewed
-- whose lock is free: nobody will publish (a hand-off to a waiter that died
-- ran out), so it must look again itself.
local out = {}
local k = 1
local now = nil
for i = 1, #ARGV, 3 do
  local kind, owner, ms = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local ok = 0
  if kind == 'hold' then
    local lock = KEYS[k]
    k = k + 1
    if redis.pcall('HEXISTS', lock, owner) == 1 then
      redis.call('PEXPIRE', lock, ms)
      ok = 1
    end
  else
    local queue, waiters, lock = KEYS[k], KEYS[k + 1], KEYS[k + 2]
    k = k + 3
    local rec = redis.pcall('HGET', waiters, owner)
    if type(rec) == 'string' then
      now = now or now_ms()
      local _, handoff = parse_waiter(rec)
      redis.call('HSET', waiters, owner, (now + ms) .. ':' .. handoff)
      if redis.pcall('TYPE', queue)['ok'] == 'zset' then
        keep_alive(queue, 2 * ms)
      end
      keep_alive(waiters, 2 * ms)
      ok = 1
      if redis.call('EXISTS', lock) == 0 then
        ok = 2
      end
    end
  end
  out[#out + 1] = ok
end
return out
