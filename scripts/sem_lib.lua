-- sem_lib.lua: a semaphore's state and the steps the semaphore scripts
-- take on it. scripts.go prepends lib.lua and this file to each semaphore
-- script.
--
-- A semaphore's state lives in four keys under the hash tag {name}, which
-- every semaphore script takes, in this order:
--   hash:    the semaphore's records, by field:
--              holder id -> "permits:seq", where seq is the highest call
--                number of the holder applied to it: a call numbered seq
--                again is a retry (of a call that was applied), one
--                numbered lower a stale copy; neither changes anything
--              waiter id -> "deadline:lease:permits:seq": the deadline (ms
--                of server time) until which the waiter is alive on its
--                own, the lease its permits get when granted, how many it
--                wants, and the number of the call that queued it (or last
--                found it queued): a grant applies that call. A waiter id
--                is "holder id#digits", one per blocked Acquire; no holder
--                id ends that way
--              {client}id -> a Client's liveness deadline (lib.lua,
--                CLIENT_FIELD)
--            and the semaphore's own fields, whose names start with '{':
--              {used}    "count:layout": the permits in use, the sum of
--                        the holder records' permits, and the layout
--                        (see sem_open)
--              {size}    "size:layout" (see sem_open)
--              {keep}    server ms until which every key of the semaphore
--                        lives at least (see sem_keep)
--              {gone}    server ms until which a holder id in the ended
--                        zset may be refused (see sem_retire)
--              {refuse}  server ms until which the ended zset may refuse a
--                        waiter id (see mark_withdrawn)
--              {prune}   server ms when the ended zset is next pruned
--              {token}   a RWMutex's last fencing token (see sem_mint)
--   expiry:  zset holder id -> end of the holder's lease, ms of server time
--   queue:   zset waiter id -> when it joined (join_queue)
--   ended:   zset of what a late copy of a call must not act on, member ->
--            server ms until which it is remembered: "holder id:seq" and
--            "holder id" for a release that emptied the holder's record
--            (sem_retire), and the waiter ids of withdrawn calls
--            (mark_withdrawn)
-- Holders whose lease has ended are removed by every acquire, release and
-- resize before it does anything else, at most reclaim_max of them.
--
-- A script reads the semaphore's own fields and the records it needs in
-- one HMGET (sem_open), and records its changes to the hash and the
-- expiry zset in k, which sem_flush writes in one call each at its end
-- (sem_read sees them before). The keys live an hour past their last use
-- at least, and their TTLs are pushed out only when they run low
-- (sem_keep): no call pays a PEXPIRE per key.
--
-- The work of one call is bounded by constants, whatever the number of
-- holders, waiters and withdrawn calls: no call reads every record.

-- SEM_LAYOUT is the version of the semaphore's stored layout that these
-- scripts read and write (internal/schema.SemLayout), carried in its size
-- record after the size ("size:layout").
local SEM_LAYOUT = '5'

local USED, F_SIZE, F_KEEP, F_GONE, F_REFUSE, F_PRUNE, F_TOKEN =
  '{used}', '{size}', '{keep}', '{gone}', '{refuse}', '{prune}', '{token}'

-- reclaim_max bounds the holders whose lease ended that one call removes;
-- serve_max the waiters one call grants or drops as dead, and nudge_max
-- the waiters after them that it asks to go on (see sem_serve);
-- prune_max the entries of the ended zset one call forgets. A
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

-- prune_ms is how often the ended zset is pruned (see sem_remember): a
-- prune removes the entries whose time is over.
local prune_ms = 100

-- sem_int returns the stored number v (0 for none), failing the script
-- when it is not one redisync writes.
local function sem_int(k, v)
  if not v then
    return 0
  end
  return integer(v) or wrong(k.hash, 'a semaphore of this layout')
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

-- pending records in w (k.hw or k.ew: the writes of the hash and of the
-- expiry zset that sem_flush makes) that name gets v (false removes it);
-- w lists the names in the order of their first write.
local function pending(w, name, v)
  if w[name] == nil then
    w[#w + 1] = name
  end
  w[name] = v
end

-- sem_hset records a write of the hash's field (false deletes it);
-- sem_zset, of a holder's lease end (false removes it).
local function sem_hset(k, field, v)
  pending(k.hw, field, v)
end

local function sem_zset(k, holder, v)
  pending(k.ew, holder, v)
end

-- sem_read returns the hash's fields (HMGET), as the writes the script has
-- recorded (sem_hset) make them: false for none.
local function sem_read(k, ...)
  local v = redis.call('HMGET', k.hash, ...)
  for i, f in ipairs({...}) do
    if k.hw[f] ~= nil then
      v[i] = k.hw[f]
    end
  end
  return v
end

-- in_use reports whether the semaphore has a holder whose lease has not
-- ended (the latest lease end is in the future).
local function in_use(k)
  local last = redis.call('ZRANGE', k.expiry, -1, -1, 'WITHSCORES')
  return last[2] ~= nil and tonumber(last[2]) > now_ms()
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

-- sem_open reads the semaphore's own fields and the records of the holder
-- ids ids (a list; nil entries are skipped) in one call, and the fields
-- extra (their values in k.extra, by name); a hash of the wrong type, or
-- a field that redisync did not write, fails the script here, before it
-- writes anything. It sets k.size (nil when none is stored), k.used,
-- k.keep, k.gone, k.refuse, k.prune, k.token, and k.held, the records
-- read (holder id -> {permits, call number}), which sem_put and
-- sem_reclaim keep in step with the writes they record.
--
-- The count {used} carries the layout ("count:layout"), and is kept while
-- the hash lives: every call reads it, so an older version fails on this
-- layout's state, and this one tells an older version's state by it: a
-- bare count (layout 3, redisync v1.0.0, which keeps its size in a key of
-- its own; or layout 4, whose size says 4). Another layout's state fails
-- the script while one of its holders' leases runs (a newer layout's
-- always); after that it is taken over: its holder records, which are
-- this layout's, are reclaimed as they end, and its waiters, whose
-- records this layout does not read, are dropped as dead when they head
-- the queue. The layouts before 3 (before v1.0.0) are not told apart.
local function sem_open(k, ids, extra)
  k.held, k.hw, k.ew, k.extra = {}, {}, {}, {}
  local fields = {USED, F_SIZE, F_KEEP, F_GONE, F_REFUSE, F_PRUNE, F_TOKEN}
  local asked = {}
  for _, id in pairs(ids) do
    if not asked[id] then
      asked[id] = true
      fields[#fields + 1] = id
    end
  end
  local last = #fields
  for _, f in ipairs(extra or {}) do
    fields[#fields + 1] = f
  end
  local v = redis.call('HMGET', k.hash, unpack(fields))
  k.keep, k.gone = sem_int(k, v[3]), sem_int(k, v[4])
  k.refuse, k.prune, k.token = sem_int(k, v[5]), sem_int(k, v[6]), sem_int(k, v[7])
  for i = 8, last do
    k.held[fields[i]] = {sem_parse(v[i], k.hash)}
  end
  for i = last + 1, #fields do
    k.extra[fields[i]] = v[i]
  end
  local count, found = string.match(v[1] or ('0:' .. SEM_LAYOUT), '^(%d+):?(%d*)$')
  if not count then
    wrong(k.hash, 'a count of permits')
  end
  k.used, k.used0, k.nocount = tonumber(count), tonumber(count), not v[1]
  local size, layout = nil, nil
  if v[2] then
    size, layout = string.match(v[2], '^(%d+):(%d+)$')
    if not size then
      wrong(k.hash, 'a size')
    end
  end
  if not v[1] then
    found = layout or SEM_LAYOUT -- no count: idle (or fresh)
  elseif found == '' then
    found = layout == '4' and '4' or '3' -- a bare count
  end
  if found == SEM_LAYOUT then
    if layout == SEM_LAYOUT then
      k.size = tonumber(size)
    end
    return
  end
  if tonumber(found) > tonumber(SEM_LAYOUT) or in_use(k) then
    other_layout(k.hash, found, SEM_LAYOUT)
  end
  -- Taken over: the count is written in this layout's form, and every
  -- key's TTL pushed (an older layout's may be short); its {prune} is not
  -- this layout's: the ended zset is pruned, and given its TTL, at its
  -- first write. The older layout's last token is in a key this script
  -- does not read: tokens go on from an hour past the server clock, as
  -- far ahead as that layout's counter outlived its last write.
  k.used0, k.keep, k.prune = -1, 0, 0
  k.token = math.max(k.token, now_us() + state_memory_ms * 1000)
  sem_hset(k, F_PRUNE, false)
  sem_keep(k, now_ms())
end

-- sem_store_size stores the semaphore's size, in this layout.
local function sem_store_size(k, size)
  k.size, k.used0 = size, -1 -- the count is written with it
  sem_hset(k, F_SIZE, string.format('%d', size) .. ':' .. SEM_LAYOUT)
  sem_keep(k, now_ms())
end

-- sem_flush writes what the script recorded: the hash's fields, then the
-- expiry zset's adds before its removes (a zset that keeps members keeps
-- its TTL); then the TTLs that sem_keep asked for, or, for a key that this
-- script may have made, its TTL.
local function sem_flush(k)
  if k.used ~= k.used0 then
    sem_hset(k, USED, string.format('%d', k.used) .. ':' .. SEM_LAYOUT)
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
  if #set > 0 and k.nocount and k.hw[USED] == nil then
    -- The hash is made, or written, without a count: it gets one, which
    -- every call of every layout reads (see sem_open).
    set[#set + 1], set[#set + 2] = USED, string.format('%d', k.used) .. ':' .. SEM_LAYOUT
  end
  if #set > 0 then
    k.nocount = false
    redis.call('HSET', k.hash, unpack(set))
  end
  if #del > 0 then
    redis.call('HDEL', k.hash, unpack(del))
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
    for _, key in ipairs({k.hash, k.expiry, k.queue, k.ended}) do
      redis.call('PEXPIRE', key, ttl)
    end
    return
  end
  if #add > 0 and k.expiry_empty then
    redis.call('PEXPIRE', k.expiry, ttl)
  end
  if k.queue_new then
    redis.call('PEXPIRE', k.queue, ttl)
  end
end

-- sem_holder returns the holder id of a waiter id.
local function sem_holder(waiter)
  return string.match(waiter, '^(.*)#%d+$') or waiter
end

-- sem_mine returns a holder's permits and call number (0, 0 for none),
-- reading a record that sem_open did not once per script; with soft, nil
-- for a record that redisync did not write (which fails the script
-- otherwise). After a reclaim that stopped at reclaim_max (k.ended_at), a
-- holder whose lease has ended is reclaimed here.
local function sem_mine(k, holder, soft)
  local r = k.held[holder]
  if not r then
    local v = redis.call('HGET', k.hash, holder)
    if soft and v and not string.match(v, '^%d+:%d+$') then
      return nil
    end
    r = {sem_parse(v, k.hash)}
    k.held[holder] = r
    if k.ended_at and r[1] > 0 then
      local e = tonumber(redis.call('ZSCORE', k.expiry, holder))
      if e and e <= k.ended_at then
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
-- k.ended_at is now (see sem_mine), and their permits count as in use
-- until a later call reclaims them. It reads the earliest lease end first
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
  local v = redis.call('HMGET', k.hash, unpack(gone))
  local removed = {}
  for i, h in ipairs(gone) do
    local permits = sem_parse(v[i], k.hash)
    k.used = math.max(k.used - permits, 0)
    removed[h] = {0, 0}
    sem_hset(k, h, false)
    sem_zset(k, h, false)
  end
  k.next, k.reclaimed = nil, true -- unknown now (see sem_next)
  if #gone == reclaim_max then
    -- Records read again are checked (sem_mine); those removed here, whose
    -- removal sem_flush has yet to write, stay known as removed.
    k.ended_at, k.held = now, removed
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

-- sem_remember adds members to the ended zset, remembered until the
-- server ms upto (see the header), and has the keys live as long
-- (sem_keep). Once per prune_ms it first removes the entries whose time is
-- over, at most prune_max of them (when there were more, the next call
-- prunes again), and gives the zset the TTL of the other keys: a zset that
-- it makes gets it then ({prune} is absent, or over, whenever the zset may
-- be gone). It is the script's first write there: an ended key of the wrong
-- type fails here, having changed nothing.
local function sem_remember(k, now, upto, ...)
  local due, full = k.prune <= now, false
  if due then
    local old = redis.call('ZRANGEBYSCORE', k.ended, '-inf', now, 'LIMIT', 0, prune_max)
    if #old > 0 then
      redis.call('ZREM', k.ended, unpack(old))
    end
    full = #old == prune_max
  end
  local e, add = string.format("%d", upto), {}
  for _, m in ipairs({...}) do
    add[#add + 1], add[#add + 2] = e, m
  end
  redis.call('ZADD', k.ended, unpack(add))
  sem_keep(k, upto)
  if due then
    redis.call('PEXPIRE', k.ended, k.keep - now)
  end
  if due and not full then
    k.prune = now + prune_ms
    sem_hset(k, F_PRUNE, string.format('%d', k.prune))
  end
end

-- sem_retire remembers that the release numbered seq emptied holder's
-- record, for memory ms: "holder:seq", so that a retry of it knows it was
-- applied, and "holder", the id retired. An acquire looks for a retired
-- id only while {gone} says so, which a release with refuse (a call of
-- the holding may still be on its way) pushes out: then a late copy of
-- the holding's first call takes nothing (sem_acquire.lua).
local function sem_retire(k, holder, seq, now, memory, refuse)
  sem_remember(k, now, now + memory, holder .. ':' .. seq, holder)
  if refuse and k.gone < now + memory then
    k.gone = now + memory
    sem_hset(k, F_GONE, string.format('%d', k.gone))
  end
end

-- retired reports whether holder's holding was ended by a release that
-- refused the id (see sem_retire); applied, whether the release numbered
-- seq emptied its record. An entry whose time is over counts as none,
-- pruned or not.
local function retired(k, holder, now)
  return k.gone > now and (tonumber(redis.call('ZSCORE', k.ended, holder)) or 0) > now
end

local function applied(k, holder, seq, now)
  return (tonumber(redis.call('ZSCORE', k.ended, holder .. ':' .. seq)) or 0) > now
end

-- mark_withdrawn refuses a waiter id for withdrawn_ms from now; the
-- hash's {refuse} says until when the ended zset is to be read for it.
local function mark_withdrawn(k, waiter)
  local now = now_ms()
  sem_remember(k, now, now + withdrawn_ms, waiter)
  k.refuse = now + withdrawn_ms
  sem_hset(k, F_REFUSE, string.format('%d', k.refuse))
end

-- is_withdrawn reports whether a waiter id was withdrawn in the last
-- withdrawn_ms (see mark_withdrawn), pruned or not: the zset is read only
-- while a withdrawal may be in it.
local function is_withdrawn(k, waiter)
  return k.refuse > now_ms() and (tonumber(redis.call('ZSCORE', k.ended, waiter)) or 0) > now_ms()
end

-- join_queue appends id to a fair queue (a zset) unless it is queued
-- already (ZADD NX: it keeps its place), with its record rec (see the
-- header). Its score is the server time in microseconds when it joined
-- (now_us), or the last member's plus one when that is larger: the order
-- of the queue is the order of arrival even if the clock steps back, and
-- the score tells how long a waiter has waited. It reads the queue's
-- tail, then writes the queue: a key of the wrong type fails the script
-- before it writes. A queue that it makes gets its TTL from sem_flush.
local function join_queue(k, id, us, rec)
  local tail = redis.call('ZRANGE', k.queue, -1, -1, 'WITHSCORES')
  sem_hset(k, id, rec)
  redis.call('ZADD', k.queue, 'NX', string.format('%d', math.max(us, (tonumber(tail[2]) or 0) + 1)), id)
  if not tail[1] then
    k.queue_new = true
  end
end

-- sem_mint returns a new fencing token for a RWMutex's write: the server
-- clock in microseconds, or the last token plus one when that is larger
-- (as a lock's, lock_lib.lua). The hash keeps the last token at least an
-- hour past the write's lease (sem_lease keeps the keys that long).
local function sem_mint(k)
  k.token = math.max(now_us(), k.token + 1)
  sem_hset(k, F_TOKEN, string.format('%d', k.token))
  return k.token
end

-- sem_peek reads the queue's head and the head's record (as sem_serve
-- does first): a queue key of the wrong type fails the script here, before
-- it writes. The next sem_serve starts from what it read (k.first), and so
-- reads nothing twice; a script that changes the queue in between drops
-- k.first first. It returns the head's holder id (nil when nobody is
-- queued), whose record sem_open is to read.
local function sem_peek(k)
  local head = redis.call('ZRANGE', k.queue, 0, 0)[1]
  if head then
    k.first = {head, redis.call('HMGET', k.hash, head, client_field(head))}
    return sem_holder(head)
  end
  k.first = {}
  return nil
end

-- sem_next_waiter returns the queue's head and its record and Client's
-- deadline, or nil when nobody is queued: what sem_peek read, the first
-- time after it, unless the script wrote the head's record since.
local function sem_next_waiter(k)
  local first = k.first
  k.first = nil
  if first and not first[1] then
    return nil
  end
  if first and k.hw[first[1]] == nil then
    return first[1], first[2]
  end
  local head = redis.call('ZRANGE', k.queue, 0, 0)[1]
  if not head then
    return nil
  end
  return head, sem_read(k, head, client_field(head))
end

-- sem_serve grants queued waiters from the head, as many as the free permits
-- cover, in order, dropping dead waiters (see lib.lua, alive) on the way; a
-- waiter that does not fit stops it (no overtaking). The granted waiters
-- other than self are named in one message "waiter:permits:ms ..." per
-- client, on its grant channel (see lib.lua, grant_channel; ms is the
-- server time of the grant).
-- self (a waiter id or false) is granted with lease selflease and call
-- number seq. A RWMutex's semaphore (k.fence) mints a token for every
-- waiter granted the whole size (a write), sent in the message in place
-- of the permits. It returns the permits in use afterwards, whether self
-- was granted, self's token (0 for none), whether a waiter that may be
-- live is still queued (one that does not fit, or one left for a later
-- call; the queue is empty otherwise), and whether self was dropped as
-- dead.
-- It stops once the permits are all in use after a grant (nobody live
-- fits then), and grants or drops at most serve_max waiters; then k.more
-- is true, and the live waiters among the next nudge_max are sent
-- "waiter:0:ms", which asks each to attempt again at once (an attempt
-- serves the queue from its head). The messages are published after
-- sem_flush (the caller's).
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
    if steps == serve_max then
      -- The next live waiters among the first nudge_max are asked to go
      -- on: the first of them to call serves the queue on from its head,
      -- whether or not the others answer.
      waiting, k.more = true, true
      for _, w in ipairs(redis.call('ZRANGE', k.queue, 0, nudge_max - 1)) do
        local r = w == head and v or sem_read(k, w, client_field(w))
        if w ~= self and alive(tonumber(string.match(r[1] or '', '^(%d+):')), r[2], now) then
          send(w, '0')
        end
      end
      break
    end
    steps = steps + 1
    redis.call('ZREM', k.queue, head)
    sem_hset(k, head, false)
    if v[2] and not alive(false, v[2], now) then
      sem_hset(k, client_field(head), false) -- as in lib.lua, hand_off
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
        token = sem_mint(k)
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

-- sem_args returns the numbers in the argument v, "n1:n2:...", count of
-- them, failing the script (LIMIT) unless each is a whole number from 0:
-- what names them.
local function sem_args(v, count, what)
  local out = {}
  for d in string.gmatch(v .. ':', '([^:]*):') do
    out[#out + 1] = integer(d)
    limit(out[#out] and out[#out] >= 0, what, ' must be ', count, ' whole numbers from 0, separated by colons')
  end
  limit(#out == count, what, ' must be ', count, ' whole numbers from 0, separated by colons')
  return unpack(out)
end

-- sem_flag reports whether the flags (words separated by spaces) hold f.
local function sem_flag(flags, f)
  return string.find(' ' .. flags .. ' ', ' ' .. f .. ' ', 1, true) ~= nil
end

-- sem_keys returns the state k of the semaphore whose keys are keys (a
-- script's KEYS: see the header); fence: a RWMutex's, whose writes get
-- fencing tokens.
local function sem_keys(keys, fence)
  return {hash = keys[1], expiry = keys[2], queue = keys[3], ended = keys[4], fence = fence}
end
