-- renew.lua: the watchdog's batch: extend held leases and keep Clients'
-- fair waiters alive, for many locks and semaphores in one call.
--
-- ARGV holds one triple per entry: kind ("hold", "sem", "wait" for the fair
-- waiters of a lock or "swait" for those of a semaphore), owner (the hold's
-- or semaphore holder's id; for waiters, the Client's id), ms (the lease of
-- a hold, the heartbeat ttl of waiters; 0 for waiters is a farewell: the
-- Client has no waiters there any more, and its deadline goes). KEYS holds
-- the entries' keys in the same order: two for a hold or a lock's waiters
-- (the lock's hash and queue: see lock_lib.lua), four for a semaphore
-- holder or a semaphore's waiters (the semaphore's keys: see
-- sem_lib.lua).
--
-- A hold is extended only while its owner still holds the lock, and never
-- shortened (a longer lease set by Mutex.Extend stays); a semaphore
-- holder only while it holds permits whose lease has not ended (an ended one
-- is left for the semaphore's next script to reclaim). Waiters are kept
-- alive by their Client's deadline (lib.lua, CLIENT_FIELD), one entry per
-- lock and Client however many of its waiters are queued: its cost does not
-- grow with the queue. A key of the wrong type, or a lock of another
-- layout, counts as gone for its entry alone.
--
-- More than lib.lua's MAX_BATCH entries, or an ms beyond MAX_MS, fail the
-- script (LIMIT error) before it renews anything.
--
-- Reply: one integer per entry, then the server time in ms. For a hold: 1
-- renewed, 0 gone (lost). For waiters: 1 kept alive; otherwise each of them
-- must look again itself, since its wake-up may never come: 3 kept alive,
-- but the Client's deadline had passed (or was not there yet), so a
-- release may have dropped some of them as dead (told twice: see below);
-- 2 kept alive, but the lock or semaphore is held by nobody (a hand-off to
-- a waiter that died ran out), or (a semaphore) a dead waiter heads its
-- queue; 0 the key is of the wrong type.

-- renew_hold extends the hold of owner on the lock whose hash and queue
-- are lock and queue to at least ms from now, and reports whether it holds.
local function renew_hold(lock, queue, owner, ms)
  local st = load_lock(lock, queue, nil)
  if st.owner ~= owner or st['end'] <= now_ms() then
    return 0
  end
  if st['end'] < now_ms() + ms then
    st['end'] = now_ms() + ms
    set(st, F_END, string.format('%d', st['end']))
    keep_state(st, st['end'])
  end
  flush(st)
  return 1
end

-- renew_wait moves the deadline of the Client owner's fair waiters on the
-- lock to ms from now (0: a farewell, the field goes) and returns the
-- entry's reply.
local function renew_wait(lock, queue, owner, ms)
  local field = CLIENT_FIELD .. owner
  local st = load_lock(lock, queue, {field})
  local d = st.extra[1]
  if ms == 0 then
    if d then
      redis.call('HDEL', lock, field)
    end
    return 1
  end
  local now = now_ms()
  -- A lapse is reported by two heartbeats in a row (the field keeps a mark,
  -- ':L', until the second): the reply of one may be lost (a retry by
  -- go-redis runs it again, and would otherwise find nothing wrong), and
  -- the waiters it tells would sleep on, dropped.
  local lapsed = (deadline_of(d) or -1) < now
  local told = d and string.sub(d, -2) == ':L'
  prepare(st)
  set(st, field, (now + ms) .. (lapsed and ':L' or ''))
  keep_state(st, now + 2 * ms)
  flush(st)
  if not held(st) then
    return 2
  elseif lapsed or told then
    return 3
  end
  return 1
end

-- keep_sem has the keys of a semaphore (its hash first) live at least
-- state_memory_ms past ms from now. Its hash's {keep} (sem_lib.lua,
-- sem_keep) says until when they do; they are pushed out with it when it
-- runs low.
local function keep_sem(keys, keep, ms)
  local now = now_ms()
  if (integer(keep) or 0) < now + ms + state_memory_ms then
    redis.call('HSET', keys[1], '{keep}', string.format('%d', now + ms + 2 * state_memory_ms))
    for _, key in ipairs(keys) do
      redis.call('PEXPIRE', key, ms + 2 * state_memory_ms)
    end
  end
end

limit(#ARGV <= 3 * MAX_BATCH, 'a renewal must have at most ', MAX_BATCH, ' entries')
for i = 3, #ARGV, 3 do
  ms_arg(ARGV[i], 0, 'a renewal')
end
local out = {}
local k = 1
for i = 1, #ARGV, 3 do
  local kind, owner, ms = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local ok = 0
  if kind == 'hold' or kind == 'wait' then
    local f = kind == 'hold' and renew_hold or renew_wait
    local got, r = pcall(f, KEYS[k], KEYS[k + 1], owner, ms)
    k = k + 2
    if got then
      ok = r
    end
  elseif kind == 'sem' then
    local keys = {KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]}
    k = k + 4
    local now = now_ms()
    local v = redis.pcall('HMGET', keys[1], owner, '{keep}')
    local e = redis.pcall('ZSCORE', keys[2], owner)
    if not v.err and v[1] and type(e) == 'string' and tonumber(e) > now then
      if tonumber(e) < now + ms then
        redis.call('ZADD', keys[2], now + ms, owner)
      end
      keep_sem(keys, v[2], ms)
      ok = 1
    end
  else
    local keys = {KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]}
    k = k + 4
    local hash, queue, field = keys[1], keys[3], CLIENT_FIELD .. owner
    local v = redis.pcall('HMGET', hash, field, '{used}', '{keep}')
    if ms == 0 then
      -- A farewell: the Client has no waiters here any more.
      if not v.err and v[1] then
        redis.call('HDEL', hash, field)
      end
      ok = 1
    elseif not v.err and not v[2] then
      ok = 2 -- no state (or another layout's): the waiters look again
    elseif not v.err then
      local now = now_ms()
      -- A lapse is reported by two heartbeats in a row (as renew_wait's).
      local lapsed = (deadline_of(v[1]) or -1) < now
      local told = v[1] and string.sub(v[1], -2) == ':L'
      redis.call('HSET', hash, field, (now + ms) .. (lapsed and ':L' or ''))
      keep_sem(keys, v[3], 2 * ms)
      ok = 1
      if (tonumber(string.match(v[2], '^(%d+)')) or 0) == 0 then
        ok = 2
      elseif redis.pcall('TYPE', queue)['ok'] == 'zset' then
        -- A dead waiter at the head is dropped only by a script that
        -- serves the queue: a semaphore's waiter behind it whose request
        -- fits would sleep on until a lease ends. Have them look again;
        -- an attempt serves the queue. (A lock's release drops dead
        -- waiters as it hands over.)
        local head = redis.call('ZRANGE', queue, 0, 0)[1]
        if head and client_of(head) ~= owner then
          local w = redis.call('HMGET', hash, head, client_field(head))
          if not alive(tonumber(string.match(w[1] or '', '^(%d+):')), w[2], now) then
            ok = 2
          end
        end
      end
      if ok == 1 and (lapsed or told) then
        ok = 3
      end
    end
  end
  out[#out + 1] = ok
end
out[#out + 1] = now_ms()
return out
