-- sem_lib.lua: helpers shared by the semaphore scripts. scripts.go prepends
-- lib.lua and this file to each semaphore script.
--
-- A semaphore's state lives in keys under the hash tag {name}:
--   holders: hash holder id -> "permits:seq", where seq is the highest call
--            number of the holder's value applied to it: a call numbered
--            seq again is a retry (of a call that was applied), one numbered
--            lower a stale copy; neither changes anything; and USED -> the
--            permits in use, the sum of the records' permits
--   expiry:  zset holder id -> end of the holder's lease, ms of server time
--   size:    string "size:layout", the size every Client must agree on
--            and the layout of the semaphore's keys (sem_size); it lives while
--            the semaphore is in use, and state_memory_ms after the last
--            Acquire (see lib.lua)
--   queue:   zset waiter id -> when it joined (join_queue); a waiter id is
--            "holder id#call number", one per blocked Acquire
--   waiters: hash waiter id -> "deadline:lease:permits:seq": the deadline
--            (ms of server time) until which it is alive on its own, the
--            lease its permits get when granted, how many it wants, and the
--            number of the call that queued it (or last found it queued): a
--            grant applies that call; and a Client's liveness deadline (see
--            lib.lua, CLIENT_FIELD)
-- Holders whose lease has ended are removed by every script call before it
-- does anything else, at most reclaim_max of them.
--
-- The work of one call is bounded by constants, whatever the number of
-- holders, waiters and withdrawn calls: no call reads every record.

-- SEM_LAYOUT is the version of the semaphore's stored layout that these
-- scripts read and write (internal/schema.SemLayout), carried in its size
-- record after the size ("size:layout").
local SEM_LAYOUT = '3'

-- USED is the field of the holders hash that counts the permits in use
-- (no holder id is USED: an id has a '/', see internal/schema, Client).
-- Every change of a record changes it in the same call; it is absent
-- while nobody holds a permit.
local USED = '{used}'

-- reclaim_max bounds the holders whose lease ended that one call removes;
-- serve_max the waiters one call grants or drops as dead, and nudge_max
-- the waiters after them that it asks to go on (see sem_serve); prune_max
-- the entries one call forgets from the zsets of withdrawn calls and of
-- releases.
local reclaim_max, serve_max, nudge_max, prune_max = 64, 8, 2, 64

-- withdrawn_ms is how long a withdrawn call (one that gave up) stays
-- refused: a copy of one of its calls still in flight when it was withdrawn
-- (a stalled connection, a retry by the client library) must not take
-- anything on its late arrival.
local withdrawn_ms = 120000

-- join_queue appends id to a fair queue (a zset) unless it is queued
-- already (ZADD NX: it keeps its place). Its score is the server time in
-- microseconds when it joined (now_us), or the last member's plus one when
-- that is larger: the order of the queue is the order of arrival even if
-- the clock steps back, and the score tells how long a waiter has waited.
-- It reads the queue's tail, then calls record (if not nil), then writes
-- the queue: a queue of the wrong type fails the script before record
-- writes anything. The queue then lives at least ms (keep_alive); one
-- that this call created (it had no tail) has no TTL yet, and gets it in
-- one call.
local function join_queue(queue, id, us, record, ms)
  local tail = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')
  local last = tonumber(tail[2]) or 0
  if record then
    record()
  end
  redis.call('ZADD', queue, 'NX', string.format('%d', math.max(us, last + 1)), id)
  if tail[1] or ms < 1 then
    keep_alive(queue, ms)
  else
    redis.call('PEXPIRE', queue, ms)
  end
end

-- prune removes from the zset key the members scored upto (ms) or
-- lower, the lowest scored first, at most prune_max of them: each call
-- adds at most one member, so a zset pruned this way stays as short as
-- its members' time to live allows.
local function prune(key, upto)
  local old = redis.call('ZRANGEBYSCORE', key, '-inf', string.format('%d', upto), 'LIMIT', 0, prune_max)
  if #old > 0 then
    redis.call('ZREM', key, unpack(old))
  end
end

-- mark_withdrawn refuses a waiter id from now on (see
-- withdrawn_ms), in a zset waiter id -> server time of the withdrawal,
-- pruned as it goes.
local function mark_withdrawn(gone, waiter)
  local now = now_ms()
  prune(gone, now - withdrawn_ms)
  redis.call('ZADD', gone, now, waiter)
  redis.call('PEXPIRE', gone, withdrawn_ms)
end

-- is_withdrawn reports whether a waiter id was withdrawn (see
-- mark_withdrawn).
local function is_withdrawn(gone, waiter)
  return redis.call('ZSCORE', gone, waiter) ~= false
end

-- sem_parse splits a holder record into permits and call number. A record
-- that redisync did not write fails the script (check it before writing).
local function sem_parse(v, key)
  if not v then
    return 0, 0
  end
  local p, s = string.match(v, '^(%d+):(%d+)$')
  if not p then
    wrong(key or 'a semaphore', 'a holder record')
  end
  return tonumber(p), tonumber(s)
end

-- sem_size returns the size stored for the semaphore, or nil when none
-- is, failing the script when the record is not a size. A size written in
-- another layout (SEM_LAYOUT) fails it too while the semaphore
-- has holders or waiters; once idle, it counts as none (and is written
-- anew in this layout).
local function sem_size(k)
  local v = redis.call('GET', k.size)
  if not v then
    -- Holders without a size record (it was evicted or deleted): their
    -- permits are counted (USED) only if this layout wrote them.
    if redis.call('HLEN', k.holders) > 0 and not redis.call('HGET', k.holders, USED) then
      other_layout(k.size, '2 or earlier', SEM_LAYOUT)
    end
    return nil
  end
  local n, layout = string.match(v, '^(%d+):?(%d*)$')
  if not n then
    wrong(k.size, 'a size')
  end
  if layout ~= SEM_LAYOUT then
    if redis.call('HLEN', k.holders) > 0 or redis.call('ZCARD', k.queue) > 0 then
      other_layout(k.size, layout ~= '' and layout or nil, SEM_LAYOUT)
    end
    return nil
  end
  return tonumber(n)
end

-- sem_store_size stores the semaphore's size, in this layout.
local function sem_store_size(k, size)
  redis.call('SET', k.size, size .. ':' .. SEM_LAYOUT)
end

-- sem_holder returns the holder id of a waiter id.
local function sem_holder(waiter)
  return string.match(waiter, '^(.*)#%d+$') or waiter
end

-- sem_load reads the permits in use (USED) into k.used, once per script:
-- a holders key of the wrong type, or a count that redisync did not
-- write, fails the script here, before it writes anything. k.held keeps
-- the records sem_mine has read (holder id -> {permits, call number});
-- sem_put and sem_reclaim keep both in step with the hash.
local function sem_load(k)
  local v = redis.call('HGET', k.holders, USED)
  local used = 0
  if v then
    used = tonumber(string.match(v, '^%d+$'))
    if not used then
      wrong(k.holders, 'a count of permits')
    end
  end
  k.used, k.held = used, {}
end

-- sem_count writes k.used into USED (removed at zero).
local function sem_count(k)
  if k.used > 0 then
    redis.call('HSET', k.holders, USED, string.format('%d', k.used))
  else
    redis.call('HDEL', k.holders, USED)
  end
end

-- sem_forget removes holders (a list of ids) whose records held permits
-- (their sum) from the hash and the expiry zset.
local function sem_forget(k, holders, permits)
  for _, h in ipairs(holders) do
    k.held[h] = {0, 0}
  end
  k.used = math.max(k.used - permits, 0)
  redis.call('HDEL', k.holders, unpack(holders))
  redis.call('ZREM', k.expiry, unpack(holders))
  sem_count(k)
end

-- sem_mine returns a holder's permits and call number (0, 0 for none),
-- reading its record once per script; with soft, nil for a record that
-- redisync did not write (which fails the script otherwise). After a
-- reclaim that stopped at reclaim_max (k.ended), a holder whose lease has
-- ended is reclaimed here.
local function sem_mine(k, holder, soft)
  local r = k.held[holder]
  if not r then
    local v = redis.call('HGET', k.holders, holder)
    if soft and v and not string.match(v, '^%d+:%d+$') then
      return nil
    end
    r = {sem_parse(v, k.holders)}
    k.held[holder] = r
    if k.ended and r[1] > 0 then
      local e = tonumber(redis.call('ZSCORE', k.expiry, holder))
      if e and e <= k.ended then
        sem_forget(k, {holder}, r[1])
        r = k.held[holder]
      end
    end
  end
  return r[1], r[2]
end

-- sem_put sets a holder's permits (removing it at zero) and call number.
local function sem_put(k, holder, permits, seq)
  local mine = sem_mine(k, holder)
  if permits > 0 then
    k.used = k.used + permits - mine
    redis.call('HSET', k.holders, holder, permits .. ':' .. seq, USED, string.format('%d', k.used))
    k.held[holder] = {permits, seq}
  else
    sem_forget(k, {holder}, mine)
  end
end

-- sem_keep makes the keys live at least ms (the size too), so that no
-- holder outlives its record. A grant to a waiter (granted) has the short
-- grant lease, which the keys, kept as long as the other holders' full
-- leases, usually outlive already: their TTL is read first (see lib.lua,
-- keep_longer).
local function sem_keep(k, ms, granted)
  local keep = granted and keep_longer or keep_alive
  keep(k.holders, ms)
  keep(k.expiry, ms)
  keep_longer(k.size, ms) -- kept an hour after the last Acquire: see sem_acquire.lua
end

-- sem_lease makes a holder's lease end no earlier than now + ms, and the
-- keys live at least as long (sem_keep), unless later: then the caller
-- keeps them alive once for all the leases it sets.
local function sem_lease(k, holder, now, ms, granted, later)
  local e = tonumber(redis.call('ZSCORE', k.expiry, holder))
  if not e or e < now + ms then
    redis.call('ZADD', k.expiry, now + ms, holder)
  end
  if not later then
    sem_keep(k, ms, granted)
  end
end

-- sem_rearm makes a holder's lease end at now + ms (a holder that keeps
-- permits after a release starts its lease anew), unless a longer lease
-- set by sem_lease.lua (Extend) is left, and the keys live at least as
-- long.
local function sem_rearm(k, holder, now, ms)
  local e = tonumber(redis.call('ZSCORE', k.expiry, holder))
  if not e or e < now + ms then
    redis.call('ZADD', k.expiry, now + ms, holder)
  end
  keep_alive(k.holders, ms)
  keep_alive(k.expiry, ms)
  keep_longer(k.size, ms) -- kept an hour after the last Acquire: see sem_acquire.lua
end

-- sem_reclaim removes the holders whose lease ended by now, the earliest
-- ended first, at most reclaim_max of them; when there may be more,
-- k.ended is now (see sem_mine), and their permits count as in use until
-- a later call reclaims them. It reads the expiry zset and the records
-- before it writes (a key of the wrong type, or a record that redisync
-- did not write, fails there).
local function sem_reclaim(k, now)
  local gone = redis.call('ZRANGEBYSCORE', k.expiry, '-inf', now, 'LIMIT', 0, reclaim_max)
  if #gone == 0 then
    return
  end
  local permits = 0
  for _, v in ipairs(redis.call('HMGET', k.holders, unpack(gone))) do
    permits = permits + sem_parse(v, k.holders)
  end
  sem_forget(k, gone, permits)
  if #gone == reclaim_max then
    k.ended, k.held = now, {} -- records read again are checked (sem_mine)
  end
end

-- sem_used returns the permits held, by all holders (see sem_load).
local function sem_used(k)
  return k.used
end

-- sem_peek reads the queue's head and the head's record (as sem_serve
-- does first), or, when nobody is queued, the length of the waiters hash:
-- a queue or waiters key of the wrong type fails the script here, before
-- it writes. The next sem_serve starts from what it read (k.first), and so
-- reads nothing twice; a script that changes the queue or a record in
-- between drops k.first first.
local function sem_peek(k)
  local head = redis.call('ZRANGE', k.queue, 0, 0)[1]
  if head then
    k.first = {head, redis.call('HMGET', k.waiters, head, client_field(head))}
  else
    redis.call('HLEN', k.waiters)
    k.first = {}
  end
end

-- sem_next_waiter returns the queue's head and its record and Client's
-- deadline (HMGET), or nil when nobody is queued: what sem_peek read, the
-- first time after it.
local function sem_next_waiter(k)
  local first = k.first
  if first then
    k.first = nil
    return first[1], first[2]
  end
  local head = redis.call('ZRANGE', k.queue, 0, 0)[1]
  if not head then
    return nil
  end
  return head, redis.call('HMGET', k.waiters, head, client_field(head))
end

-- sem_serve grants queued waiters from the head, as many as the free permits
-- cover, in order, dropping dead waiters (see lib.lua, alive) on the way; a
-- waiter that does not fit stops it (no overtaking). The granted waiters
-- other than self are named in one message "waiter:permits:ms ..." per
-- client, on its grant channel (see lib.lua, grant_channel; ms is the
-- server time of the grant).
-- self (a waiter id or false) is granted with lease selflease and call
-- number seq. A semaphore with a fencing token counter (k.fence: a
-- RWMutex's) mints a token for every waiter granted the whole size (a
-- write), sent in the message in place of the permits. It returns the
-- permits in use afterwards, whether self was granted, self's token (0
-- for none), whether a waiter that may be live is still queued (one that
-- does not fit, or one left for a later call; the queue is empty
-- otherwise), and whether self was dropped as dead.
-- It grants or drops at most serve_max waiters; then k.more is true, and
-- the live waiters among the next nudge_max are sent "waiter:0:ms", which
-- asks each to attempt again at once (an attempt serves the queue from
-- its head).
local function sem_serve(k, size, used, now, self, selflease, seq, channel, publish)
  local msgs, order = {}, {} -- grant channel -> its grants; channels in order
  local served, selftoken, waiting, dropped = false, 0, false, false
  local function send(head, grant)
    local ch = grant_channel(channel, head)
    if not msgs[ch] then
      msgs[ch], order[#order + 1] = {}, ch
    end
    table.insert(msgs[ch], head .. ':' .. grant .. ':' .. now)
  end
  local steps = 0
  local selfms, grantms -- the leases set: the keys live as long (sem_keep)
  while true do
    local head, v = sem_next_waiter(k)
    if not head then
      break
    end
    local d, l, w, q = string.match(v[1] or '', '^(%d+):(%d+):(%d+):(%d+)$')
    local lease, want = tonumber(l), tonumber(w)
    local live = want and alive(tonumber(d), v[2], now)
    if live and not sem_mine(k, sem_holder(head), true) then
      -- Its holder's record is not redisync's: served as a dead waiter,
      -- as its own next call fails on the record.
      live = false
    end
    if live and used + want > size then
      waiting = true
      break
    end
    if steps == serve_max then
      -- The next live waiters among the first nudge_max are asked to go
      -- on: the first of them to call serves the queue on from its head,
      -- whether or not the others answer.
      waiting, k.more = true, true
      for _, w in ipairs(redis.call('ZRANGE', k.queue, 0, nudge_max - 1)) do
        local r = w == head and v or redis.call('HMGET', k.waiters, w, client_field(w))
        if w ~= self and alive(tonumber(string.match(r[1] or '', '^(%d+):')), r[2], now) then
          send(w, '0')
        end
      end
      break
    end
    steps = steps + 1
    redis.call('ZREM', k.queue, head)
    redis.call('HDEL', k.waiters, head)
    if v[2] and not alive(false, v[2], now) then
      redis.call('HDEL', k.waiters, client_field(head)) -- as in lib.lua, hand_off
    end
    dropped = dropped or (head == self and not live)
    if live then
      local holder = sem_holder(head)
      local permits, s = sem_mine(k, holder)
      if head == self then
        lease, s, served = selflease, seq, true
      end
      local token = 0
      if k.fence and want == size then
        token = mint(k.fence, lease)
      end
      if head == self then
        selftoken = token
      else
        s = math.max(s, tonumber(q))
        send(head, string.format('%d', token > 0 and token or want))
      end
      sem_put(k, holder, permits + want, s)
      sem_lease(k, holder, now, lease, head ~= self, true)
      if head == self then
        selfms = lease
      else
        grantms = math.max(grantms or 0, lease)
      end
      used = used + want
    end
  end
  if grantms then
    sem_keep(k, grantms, true)
  end
  if selfms then
    sem_keep(k, selfms, false)
  end
  for _, ch in ipairs(order) do
    redis.call(publish, ch, table.concat(msgs[ch], ' '))
  end
  return used, served, selftoken, waiting, dropped
end

-- sem_next returns how long until the earliest lease ends, in ms (at least
-- 1), or -1 when nobody holds a permit.
local function sem_next(k, now)
  local first = redis.call('ZRANGE', k.expiry, 0, 0, 'WITHSCORES')[2]
  if not first then
    return -1
  end
  return math.max(tonumber(first) - now, 1)
end
