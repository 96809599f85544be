-- sem_lib.lua: a semaphore's state and the steps the semaphore scripts
-- take on it. scripts.go prepends lib.lua and this file to each semaphore
-- script.
--
-- A semaphore's state lives in keys under the hash tag {name}:
--   holders: hash holder id -> "permits:seq", where seq is the highest call
--            number of the holder applied to it: a call numbered seq again
--            is a retry (of a call that was applied), one numbered lower a
--            stale copy; neither changes anything. Its fields with braces
--            (no holder id has one) are the semaphore's own:
--              {size}    "size:layout" (see sem_open)
--              {used}    the permits in use, the sum of the records'
--                        permits; absent while nobody holds one
--              {keep}    server ms until which every key of the semaphore
--                        lives at least (see sem_keep)
--              {gone}    server ms until which a holder id in the released
--                        zset may be refused (see sem_retire)
--              {refuse}  server ms until which the withdrawn zset may
--                        refuse a waiter id (see mark_withdrawn)
--              {prune}   server ms when the released zset is next pruned
--   expiry:  zset holder id -> end of the holder's lease, ms of server time
--   size:    string "size:layout", the {size} field's copy, which tells a
--            version of redisync that reads another layout that this one
--            is in use (see lib.lua, Layouts)
--   queue:   zset waiter id -> when it joined (join_queue); a waiter id is
--            "holder id#call number", one per blocked Acquire
--   waiters: hash waiter id -> "deadline:lease:permits:seq": the deadline
--            (ms of server time) until which it is alive on its own, the
--            lease its permits get when granted, how many it wants, and the
--            number of the call that queued it (or last found it queued): a
--            grant applies that call; and a Client's liveness deadline (see
--            lib.lua, CLIENT_FIELD)
--   released: zset "holder id:seq" and "holder id" -> server ms until
--            which a release that emptied the record is remembered (see
--            sem_retire)
--   withdrawn: zset waiter id -> server ms of its withdrawal
-- Holders whose lease has ended are removed by every acquire, release and
-- resize before it does anything else, at most reclaim_max of them.
--
-- A script reads the holders hash once (sem_open), and records its
-- changes to the holders hash and the expiry zset in k, which sem_flush
-- writes in one call each at its end. The keys live an hour past their
-- last use at least, and their TTLs are pushed out only when they run low
-- (sem_keep): no call pays a PEXPIRE per key.
--
-- The work of one call is bounded by constants, whatever the number of
-- holders, waiters and withdrawn calls: no call reads every record.

-- SEM_LAYOUT is the version of the semaphore's stored layout that these
-- scripts read and write (internal/schema.SemLayout), carried in its size
-- record after the size ("size:layout").
local SEM_LAYOUT = '4'

local USED, F_SIZE, F_KEEP, F_GONE, F_REFUSE, F_PRUNE = '{used}', '{size}', '{keep}', '{gone}', '{refuse}', '{prune}'

-- reclaim_max bounds the holders whose lease ended that one call removes;
-- serve_max the waiters one call grants or drops as dead, and nudge_max
-- the waiters after them that it asks to go on (see sem_serve); prune_max
-- the entries one call forgets from the zset of withdrawn calls. A
-- reclaim costs about 4 us of the server's time (the holder's record read,
-- parsed and removed, with its lease end: 10,000 holders, Redis 7.0), so
-- that a call stays well within 1 ms on a busy server
-- (bounded_test.go).
local reclaim_max, serve_max, nudge_max, prune_max = 32, 8, 2, 64

-- withdrawn_ms is how long a withdrawn call (one that gave up) stays
-- refused: a copy of one of its calls still in flight when it was withdrawn
-- (a stalled connection, a retry by the client library) must not take
-- anything on its late arrival.
local withdrawn_ms = 120000

-- prune_ms is how often the released zset is pruned (see sem_retire): a
-- prune removes the entries of the releases of one such period, ten
-- seconds earlier.
local prune_ms = 100

-- sem_int returns the stored number v (0 for none), failing the script
-- when it is not one redisync writes.
local function sem_int(k, v)
  if not v then
    return 0
  end
  return integer(v) or wrong(k.holders, 'a semaphore of this layout')
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

-- pending records in w (k.hw or k.ew: the writes of the holders hash and
-- of the expiry zset that sem_flush makes) that name gets v (false
-- removes it); w lists the names in the order of their first write.
local function pending(w, name, v)
  if w[name] == nil then
    w[#w + 1] = name
  end
  w[name] = v
end

-- sem_hset records a write of the holders hash's field (false deletes
-- it); sem_zset, of a holder's lease end (false removes it).
local function sem_hset(k, field, v)
  pending(k.hw, field, v)
end

local function sem_zset(k, holder, v)
  pending(k.ew, holder, v)
end

-- sem_open reads the semaphore's own fields and the records of the holder
-- ids ids (a list; nil entries are skipped) in one call; a holders key of
-- the wrong type, or a field that redisync did not write, fails the
-- script here, before it writes anything. It sets k.size (nil when none
-- is stored), k.used, k.keep, k.gone, k.refuse, k.prune, and k.held, the
-- records read (holder id -> {permits, call number}), which sem_put and
-- sem_reclaim keep in step with the writes they record.
--
-- A semaphore whose hash has no size is fresh: its size key is read then.
-- A size of another layout fails the script while the semaphore has
-- holders or waiters; once idle, it counts as none (and is written anew in
-- this layout).
local function sem_open(k, ids)
  local fields = {USED, F_SIZE, F_KEEP, F_GONE, F_REFUSE, F_PRUNE}
  local asked = {}
  for _, id in pairs(ids) do
    if not asked[id] then
      asked[id] = true
      fields[#fields + 1] = id
    end
  end
  local v = redis.call('HMGET', k.holders, unpack(fields))
  k.used, k.keep, k.gone = sem_int(k, v[1]), sem_int(k, v[3]), sem_int(k, v[4])
  k.refuse, k.prune = sem_int(k, v[5]), sem_int(k, v[6])
  k.used0, k.held, k.hw, k.ew = k.used, {}, {}, {}
  for i = 7, #fields do
    k.held[fields[i]] = {sem_parse(v[i], k.holders)}
  end
  local rec = v[2]
  if not rec then
    rec = redis.call('GET', k.size_name)
    local own = 0
    for i = 1, 6 do
      own = own + (v[i] and 1 or 0)
    end
    if not rec and not v[1] and redis.call('HLEN', k.holders) > own then
      -- Holder records without a count or a size: written before layout 3.
      other_layout(k.size_name, '2 or earlier', SEM_LAYOUT)
    end
  end
  if not rec then
    return
  end
  local n, layout = string.match(rec, '^(%d+):?(%d*)$')
  if not n then
    wrong(v[2] and k.holders or k.size_name, 'a size')
  end
  if layout ~= SEM_LAYOUT then
    if redis.call('HLEN', k.holders) > 0 or redis.call('ZCARD', k.queue) > 0 then
      other_layout(k.size_name, layout ~= '' and layout or nil, SEM_LAYOUT)
    end
    return
  end
  k.size = tonumber(n)
  if not v[2] then
    sem_hset(k, F_SIZE, rec) -- the hash was gone, the size key was not
  end
end

-- sem_keep has every key of the semaphore live at least state_memory_ms
-- past until_ms (server ms), pushing their TTLs out to twice that only
-- when less is left: sem_flush then sets them, once per hour of use.
local function sem_keep(k, until_ms)
  if k.keep < until_ms + state_memory_ms then
    k.keep = until_ms + 2 * state_memory_ms
    sem_hset(k, F_KEEP, string.format('%d', k.keep))
    k.push = true
  end
end

-- sem_store_size stores the semaphore's size, in this layout, in the hash
-- and in the size key.
local function sem_store_size(k, size)
  k.size = size
  local rec = string.format('%d', size) .. ':' .. SEM_LAYOUT
  sem_hset(k, F_SIZE, rec)
  sem_keep(k, now_ms())
  redis.call('SET', k.size_name, rec, 'PX', string.format('%d', k.keep - now_ms()))
end

-- sem_flush writes what the script recorded: the holders hash's fields,
-- then the expiry zset's adds before its removes (a zset that keeps
-- members keeps its TTL); then the TTLs that sem_keep asked for, or, for
-- a key that this script may have made, its TTL.
local function sem_flush(k)
  if k.used ~= k.used0 then
    sem_hset(k, USED, k.used > 0 and string.format('%d', k.used) or false)
    k.used0 = k.used
  end
  local set, del = {}, {}
  for _, f in ipairs(k.hw) do
    local v = k.hw[f]
    if v then
      set[#set + 1], set[#set + 2] = f, v
    else
      del[#del + 1] = f
    end
  end
  if #set > 0 then
    redis.call('HSET', k.holders, unpack(set))
  end
  if #del > 0 then
    redis.call('HDEL', k.holders, unpack(del))
  end
  local add, rem = {}, {}
  for _, h in ipairs(k.ew) do
    local e = k.ew[h]
    if e then
      add[#add + 1], add[#add + 2] = string.format('%d', e), h
    else
      rem[#rem + 1] = h
    end
  end
  if #add > 0 then
    redis.call('ZADD', k.expiry, unpack(add))
  end
  if #rem > 0 then
    redis.call('ZREM', k.expiry, unpack(rem))
  end
  k.hw, k.ew = {}, {}
  local ttl = string.format('%d', k.keep - now_ms())
  if k.push then
    k.push = false
    for _, key in ipairs({k.holders, k.expiry, k.queue, k.waiters}) do
      redis.call('PEXPIRE', key, ttl)
    end
    if k.size then
      -- Written anew, in case it was evicted or deleted: it is what tells
      -- older versions that this one is in use.
      redis.call('SET', k.size_name, string.format('%d', k.size) .. ':' .. SEM_LAYOUT, 'PX', ttl)
    else
      redis.call('PEXPIRE', k.size_name, ttl)
    end
    return
  end
  if #add > 0 and k.expiry_empty then
    redis.call('PEXPIRE', k.expiry, ttl)
  end
  if k.queue_new then
    redis.call('PEXPIRE', k.queue, ttl)
  end
  if k.waiters_wrote and (k.waiters_new or k.waiters_cut) then
    redis.call('PEXPIRE', k.waiters, ttl)
  end
end

-- sem_holder returns the holder id of a waiter id.
local function sem_holder(waiter)
  return string.match(waiter, '^(.*)#%d+$') or waiter
end

-- sem_mine returns a holder's permits and call number (0, 0 for none),
-- reading a record that sem_open did not once per script; with soft, nil
-- for a record that redisync did not write (which fails the script
-- otherwise). After a reclaim that stopped at reclaim_max (k.ended), a
-- holder whose lease has ended is reclaimed here.
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
        k.used = math.max(k.used - r[1], 0)
        r = {0, 0}
        k.held[holder] = r
        sem_hset(k, holder, false)
        sem_zset(k, holder, false)
      end
    end
  end
  return r[1], r[2]
end

-- sem_put sets a holder's permits (removing it at zero) and call number.
local function sem_put(k, holder, permits, seq)
  local mine = sem_mine(k, holder)
  k.used = math.max(k.used + permits - mine, 0)
  if permits > 0 then
    k.held[holder] = {permits, seq}
    sem_hset(k, holder, permits .. ':' .. seq)
  else
    k.held[holder] = {0, 0}
    sem_hset(k, holder, false)
    sem_zset(k, holder, false)
  end
end

-- sem_lease makes a holder's lease end no earlier than now + ms (held:
-- whether it held permits before this call, whose lease is read first),
-- and the keys live at least as long (sem_keep).
local function sem_lease(k, holder, now, ms, held)
  local e = k.ew[holder]
  if held and e == nil then
    e = tonumber(redis.call('ZSCORE', k.expiry, holder))
  end
  if not e or e < now + ms then
    sem_zset(k, holder, now + ms)
  end
  sem_keep(k, now + ms)
end

-- sem_reclaim removes the holders whose lease ended by now, the earliest
-- ended first, at most reclaim_max of them; when there may be more,
-- k.ended is now (see sem_mine), and their permits count as in use until
-- a later call reclaims them. It reads the earliest lease end first
-- (k.next, nil when nobody holds), and the ended ones only when it has
-- passed; a key of the wrong type, or a record that redisync did not
-- write, fails there, before any write.
local function sem_reclaim(k, now)
  local first = redis.call('ZRANGE', k.expiry, 0, 0, 'WITHSCORES')
  k.expiry_empty = not first[1]
  k.first_holder, k.next = first[1] or '', tonumber(first[2])
  if not k.next or k.next > now then
    return
  end
  local gone = redis.call('ZRANGEBYSCORE', k.expiry, '-inf', now, 'LIMIT', 0, reclaim_max)
  local v = redis.call('HMGET', k.holders, unpack(gone))
  local removed = {}
  for i, h in ipairs(gone) do
    local permits = sem_parse(v[i], k.holders)
    k.used = math.max(k.used - permits, 0)
    removed[h] = {0, 0}
    sem_hset(k, h, false)
    sem_zset(k, h, false)
  end
  k.next, k.reclaimed = nil, true -- unknown now (see sem_next)
  if #gone == reclaim_max then
    -- Records read again are checked (sem_mine); those removed here, whose
    -- removal sem_flush has yet to write, stay known as removed.
    k.ended, k.held = now, removed
  else
    for h, r in pairs(removed) do
      k.held[h] = r
    end
  end
end

-- sem_next returns how long until the earliest lease ends, in ms (at least
-- 1), or -1 when nobody holds a permit: from what sem_reclaim read and
-- the leases the script set, so call it before sem_flush.
local function sem_next(k, now)
  if k.used == 0 then
    return -1
  end
  local e = k.next
  if k.reclaimed or k.ew[k.first_holder] ~= nil then
    -- The earliest lease read first has ended or changed: the first that
    -- has not ended, among those this script leaves as they were.
    e = nil
    local z = redis.call('ZRANGEBYSCORE', k.expiry, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, #k.ew + 1)
    for i = 1, #z, 2 do
      if k.ew[z[i]] == nil then
        e = tonumber(z[i + 1])
        break
      end
    end
  end
  for _, h in ipairs(k.ew) do
    if k.ew[h] and (not e or k.ew[h] < e) then
      e = k.ew[h]
    end
  end
  if not e then
    return -1
  end
  return math.max(e - now, 1)
end

-- sem_retire remembers that the release numbered seq emptied holder's
-- record, for memory ms: "holder:seq", so that a retry of it knows it was
-- applied, and "holder", the id retired. An acquire looks for a retired
-- id only while {gone} says so, which a release with refuse (a call of
-- the holding may still be on its way) pushes out: then a late copy of
-- the holding's first call takes nothing (sem_acquire.lua). The zset is
-- pruned once per prune_ms. It is the script's first write: a released key
-- of the wrong type fails here, having changed nothing.
local function sem_retire(k, released, holder, seq, now, memory, refuse)
  local e = string.format('%d', now + memory)
  if k.prune <= now then
    redis.call('ZREMRANGEBYSCORE', released, '-inf', now)
  end
  redis.call('ZADD', released, e, holder .. ':' .. seq, e, holder)
  if k.prune <= now then
    redis.call('PEXPIRE', released, memory + 2 * prune_ms)
    sem_hset(k, F_PRUNE, string.format('%d', now + prune_ms))
  end
  if refuse and k.gone < now + memory then
    k.gone = now + memory
    sem_hset(k, F_GONE, string.format('%d', k.gone))
  end
  sem_keep(k, now + memory)
end

-- retired reports whether holder's holding was ended by a release that
-- refused the id (see sem_retire); applied, whether the release numbered
-- seq emptied its record. An entry whose time is over counts as none,
-- pruned or not.
local function retired(k, released, holder, now)
  return k.gone > now and (tonumber(redis.call('ZSCORE', released, holder)) or 0) > now
end

local function applied(released, holder, seq, now)
  return (tonumber(redis.call('ZSCORE', released, holder .. ':' .. seq)) or 0) > now
end

-- sem_put_waiter writes waiter's record (see the header); sem_flush gives
-- a waiters hash that it makes its TTL.
local function sem_put_waiter(k, waiter, rec)
  redis.call('HSET', k.waiters, waiter, rec)
  k.waiters_wrote = true
end

-- join_queue appends id to a fair queue (a zset) unless it is queued
-- already (ZADD NX: it keeps its place), with its record rec (see
-- sem_put_waiter). Its score is the server time in microseconds when it
-- joined (now_us), or the last member's plus one when that is larger: the
-- order of the queue is the order of arrival even if the clock steps back,
-- and the score tells how long a waiter has waited. It reads the queue's
-- tail, then writes the record, then the queue: a key of the wrong type
-- fails the script before it writes. A queue that it makes, or a waiters
-- hash that it may make (one read by nobody in this call whose queue was
-- empty), gets its TTL from sem_flush.
local function join_queue(k, id, us, rec)
  local tail = redis.call('ZRANGE', k.queue, -1, -1, 'WITHSCORES')
  if k.waiters_new == nil then
    k.waiters_new = not tail[1]
  end
  sem_put_waiter(k, id, rec)
  redis.call('ZADD', k.queue, 'NX', string.format('%d', math.max(us, (tonumber(tail[2]) or 0) + 1)), id)
  if not tail[1] then
    k.queue_new = true
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

-- mark_withdrawn refuses a waiter id from now on (see withdrawn_ms), in a
-- zset waiter id -> server time of the withdrawal, pruned as it goes;
-- the holders hash's {refuse} says until when the zset is to be read.
local function mark_withdrawn(k, gone, waiter)
  local now = now_ms()
  prune(gone, now - withdrawn_ms)
  redis.call('ZADD', gone, now, waiter)
  redis.call('PEXPIRE', gone, withdrawn_ms)
  k.refuse = now + withdrawn_ms
  sem_hset(k, F_REFUSE, string.format('%d', k.refuse))
  sem_keep(k, k.refuse)
end

-- is_withdrawn reports whether a waiter id was withdrawn in the last
-- withdrawn_ms (see mark_withdrawn), pruned or not: the zset is read only
-- while a withdrawal may be in it.
local function is_withdrawn(k, gone, waiter)
  return k.refuse > now_ms() and (tonumber(redis.call('ZSCORE', gone, waiter)) or 0) > now_ms() - withdrawn_ms
end

-- sem_check_fence reads the fencing token counter of a RWMutex (k.fence)
-- when this call may mint a token, before it writes anything: when the
-- whole size may be granted now (no permit stays in use once the call has
-- given back free permits), to the caller (n) or to the queue's head (as
-- sem_peek read it). A write further back in the queue is left to its own
-- call (see sem_serve). A counter of the wrong type fails the script here.
local function sem_check_fence(k, n, size, free)
  if not k.fence or k.used - free > 0 then
    return
  end
  local head = k.first and k.first[2] and k.first[2][1]
  local want = string.match(head or '', '^%d+:%d+:(%d+):%d+$')
  if n == size or (want and tonumber(want) == size) then
    check_counter(k.fence)
    k.checked = true
  end
end

-- sem_peek reads the queue's head and the head's record (as sem_serve
-- does first), or, when nobody is queued, the length of the waiters hash:
-- a queue or waiters key of the wrong type fails the script here, before
-- it writes. The next sem_serve starts from what it read (k.first), and so
-- reads nothing twice; a script that changes the queue or a record in
-- between drops k.first first. It returns the head's holder id (nil when
-- nobody is queued), whose record sem_open is to read.
local function sem_peek(k)
  local head = redis.call('ZRANGE', k.queue, 0, 0)[1]
  if head then
    k.first = {head, redis.call('HMGET', k.waiters, head, client_field(head))}
    k.waiters_new = not k.first[2][1]
    return sem_holder(head)
  end
  k.waiters_new = redis.call('HLEN', k.waiters) == 0
  k.first = {}
  return nil
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
-- It stops once the permits are all in use after a grant (nobody live
-- fits then), and grants or drops at most serve_max waiters; then k.more
-- is true, and
-- the live waiters among the next nudge_max are sent "waiter:0:ms", which
-- asks each to attempt again at once (an attempt serves the queue from
-- its head). The messages are published after sem_flush (the caller's).
local function sem_serve(k, size, now, self, selflease, seq, channel)
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
  while true do
    local head, v = sem_next_waiter(k)
    if not head then
      break
    end
    local d, l, w, q = string.match(v[1] or '', '^(%d+):(%d+):(%d+):(%d+)$')
    local lease, want = tonumber(l), tonumber(w)
    local live = want and alive(tonumber(d), v[2], now)
    if live and k.used + want > size then
      waiting = true
      break
    end
    if live and not sem_mine(k, sem_holder(head), true) then
      -- Its holder's record is not redisync's: served as a dead waiter,
      -- as its own next call fails on the record.
      live = false
    end
    if live and k.fence and want == size and not k.checked then
      -- A write whose token counter this call did not read before its
      -- first write (see sem_check_fence): asked to attempt again, and
      -- granted by its own call, which reads the counter first.
      waiting, k.more = true, true
      if head ~= self then
        send(head, '0')
      end
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
    k.waiters_cut = true
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
      sem_lease(k, holder, now, lease, permits > 0)
      if k.used >= size then
        -- Full: no live waiter fits (dead ones at the head are dropped
        -- by a call that finds room).
        waiting = true
        break
      end
    end
  end
  k.publish = {msgs = msgs, order = order}
  return k.used, served, selftoken, waiting, dropped
end

-- sem_publish sends the grants of the last sem_serve (after sem_flush, so
-- that a grantee that calls at once finds its permits written).
local function sem_publish(k, publish)
  local p = k.publish
  if not p then
    return
  end
  k.publish = nil
  for _, ch in ipairs(p.order) do
    redis.call(publish, ch, table.concat(p.msgs[ch], ' '))
  end
end

-- sem_keys returns the state k of the semaphore whose keys are named in
-- keys (holders, expiry, size, queue, waiters).
local function sem_keys(holders, expiry, size, queue, waiters)
  return {holders = holders, expiry = expiry, size_name = size, queue = queue, waiters = waiters}
end
