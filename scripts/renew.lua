-- renew.lua: the watchdog's batch: extend held leases and refresh fair
-- waiters' heartbeats, for many locks in one call.
--
-- ARGV holds one triple per entry: kind ("hold", "sem", "wait" for a fair
-- lock's waiter or "swait" for a semaphore's), owner id,
-- ms (the lease of a hold, the heartbeat ttl of a waiter). KEYS holds the
-- entries' keys in the same order: two for a hold (its lock hash and its
-- fencing token counter, kept as long as the lease: see lib.lua, mint),
-- three for a semaphore holder (its holders hash, expiry zset and size,
-- which live as long as it holds), three for a
-- waiter (its queue, its waiters hash, and the lock hash or the
-- semaphore's holders hash).
--
-- A hold is extended only while its owner still holds the lock, and never
-- shortened (a longer lease set by Mutex.Extend stays); a semaphore
-- holder only while it holds permits whose lease has not ended (an ended one
-- is left for the semaphore's next script to reclaim); a waiter's deadline
-- is moved only while it is still queued (the rest of its record, such as
-- its hand-off lease, is kept). A key of the wrong type counts as gone for
-- its entry alone.
--
-- Reply: one integer per entry: 1 renewed, 0 gone (a lost hold, or a waiter
-- no longer queued: handed the lock or its permits, or dropped as dead), 2 a
-- waiter renewed that must look again itself, since nobody will publish:
-- its lock or semaphore is held by nobody (a hand-off to a waiter that died
-- ran out), or a dead waiter heads its queue.
local out = {}
local k = 1
local now = nil
for i = 1, #ARGV, 3 do
  local kind, owner, ms = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local ok = 0
  if kind == 'hold' then
    local lock = KEYS[k]
    k = k + 2
    if redis.pcall('HEXISTS', lock, owner) == 1 then
      keep_alive(lock, ms)
      keep_alive(KEYS[k - 1], ms)
      if not redis.call('HGET', lock, LAYOUT_FIELD) then
        -- This version's hold in a hash that layout 1 wrote (its release
        -- handed the lock over): mark it, so that this version's calls
        -- wait for the hold instead of failing with ErrLayout.
        redis.call('HSET', lock, LAYOUT_FIELD, LAYOUT)
      end
      ok = 1
    end
  elseif kind == 'sem' then
    local holders, expiry, size = KEYS[k], KEYS[k + 1], KEYS[k + 2]
    k = k + 3
    now = now or now_ms()
    local rec = redis.pcall('HGET', holders, owner)
    local e = redis.pcall('ZSCORE', expiry, owner)
    if type(rec) == 'string' and type(e) == 'string' and tonumber(e) > now then
      if tonumber(e) < now + ms then
        redis.call('ZADD', expiry, now + ms, owner)
      end
      keep_alive(holders, ms)
      keep_alive(expiry, ms)
      if redis.pcall('TYPE', size)['ok'] == 'string' then
        keep_alive(size, ms)
      end
      ok = 1
    end
  else
    local queue, waiters, lock = KEYS[k], KEYS[k + 1], KEYS[k + 2]
    k = k + 3
    local rec = redis.pcall('HGET', waiters, owner)
    if type(rec) == 'string' then
      now = now or now_ms()
      redis.call('HSET', waiters, owner, (now + ms) .. (string.match(rec, '^%d+(:.*)$') or ''))
      if redis.pcall('TYPE', queue)['ok'] == 'zset' then
        keep_alive(queue, 2 * ms)
      end
      keep_alive(waiters, 2 * ms)
      ok = 1
      if redis.call('EXISTS', lock) == 0 then
        ok = 2
      elseif kind == 'swait' and redis.pcall('TYPE', queue)['ok'] == 'zset' then
        -- A dead waiter at the head (its heartbeat deadline passed) is
        -- dropped only by a script that serves the queue: a semaphore's
        -- waiter behind it whose request fits would sleep on until a
        -- lease ends. Tell it to look again; its attempt serves the queue.
        -- (A fair lock's release drops dead waiters as it hands over.)
        local head = redis.call('ZRANGE', queue, 0, 0)[1]
        if head and head ~= owner then
          local d = tonumber(string.match(redis.pcall('HGET', waiters, head) or '', '^(%d+):'))
          if not d or d < now then
            ok = 2
          end
        end
      end
    end
  end
  out[#out + 1] = ok
end
return out
