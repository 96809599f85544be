-- lock_lib.lua: a lock's state and the steps the lock scripts take on it.
-- scripts.go prepends lib.lua and this file to each lock script.
--
-- A lock's state is one hash (internal/schema, Lock.Hash), which a release
-- never deletes; its fields all have braces (no ticket has one):
--   {layout}  LAYOUT
--   {owner}   the holder's ticket (or a hand-off's handle); '' when free
--   {end}     the end of the holder's lease, in ms of server time: the
--             lock is held while {owner} is set and {end} has not passed
--   {token}   the last fencing token issued (see mint_token)
--   {meta}    the holder's metadata; '' for none
--   {queue}   how many records the fair queue holds (see join)
--   {seq}     the number of the last record that joined the queue
--   {popped}  the number of the last record taken from its head
--   {wake}    '1' while plain waiters may be recorded (see record_barger)
--   {refuse}  server ms until which withdrawn tickets may be refused (see
--             withdraw)
--   {expires} server ms when the hash runs out (see keep_state)
--   {freed}   the token of the last hold a release ended (see release)
--   {rev}, {proclaim}  an election's: the revision of its last change and
--             the number of the holder's last Proclaim
--   {client}<id>  a Client's liveness deadline for its fair waiters (lib.lua,
--             CLIENT_FIELD), which its watchdog moves forward
-- The hash outlives every hold by an hour at least (state_memory_ms), and
-- its TTL is pushed out only when it runs low: the last token, and the
-- refusal of withdrawn tickets, last as long as the state.
--
-- The fair queue (Lock.Queue) is a list of records, "seq ticket joined
-- deadline handoff metadata", in the order of arrival: seq the record's
-- number, joined the server time in ms when it joined, deadline the server
-- time in ms until which the waiter is alive on its own
-- (beyond it, as long as its Client: see lib.lua, alive), handoff the lease
-- in ms it gets when the lock is handed to it. A record numbered above
-- {popped} is still queued unless its own call withdrew it: a waiter learns
-- whether it left the queue without reading the list.

-- LAYOUT is the version of the lock's stored layout that these scripts
-- read and write (internal/schema.Layout). Layout 2 kept the hold in the
-- hash's fields and the lease as its TTL, and deleted it on release.
local LAYOUT = '3'

local F_LAYOUT, F_OWNER, F_END, F_TOKEN, F_META = '{layout}', '{owner}', '{end}', '{token}', '{meta}'
local F_QUEUE, F_SEQ, F_POPPED, F_WAKE, F_REFUSE = '{queue}', '{seq}', '{popped}', '{wake}', '{refuse}'
local F_EXPIRES, F_REV, F_PROCLAIM, F_FREED = '{expires}', '{rev}', '{proclaim}', '{freed}'

-- drop_max bounds the records of dead or withdrawn waiters one call drops
-- from the queue's head: the next call, or the next waiter to look again,
-- goes on (see hand_off). Each costs about 5 us of the server's time (the
-- LPOP, the record's match, its Client's field: tickets of 80 bytes, Redis
-- 7.0), so that a call stays well within 1 ms on a busy server
-- (integration/slowlog_test.go).
local drop_max = 32

-- MAX_MULTI is the most locks that one multi_acquire.lua or
-- multi_release.lua call takes or releases (redisync.MaxMultiNames): the
-- call's time grows with them, and Redis serves nobody else meanwhile.
local MAX_MULTI = 32

-- multi_count returns the number of locks of a multi_acquire.lua or
-- multi_release.lua call given keys keys, three per lock, failing the
-- script, before it reads or writes anything, when there are more than
-- MAX_MULTI.
local function multi_count(keys)
  local n = math.floor(keys / 3)
  limit(n <= MAX_MULTI, 'a call takes or releases at most ', MAX_MULTI, ' locks, not ', n)
  return n
end

-- number returns v as an integer, 0 for none, failing the script when v
-- is not one.
local function number(lock, v)
  if not v or v == '' then
    return 0
  end
  return integer(v) or wrong(lock, 'a lock of this layout')
end

-- The fields load_lock reads, in the order of its reply, for a lock and
-- for an election (which has a revision too).
local lock_fields = {F_LAYOUT, F_OWNER, F_END, F_TOKEN, F_QUEUE, F_SEQ, F_POPPED, F_WAKE, F_REFUSE, F_EXPIRES, F_META, F_FREED}
local election_fields = {F_LAYOUT, F_OWNER, F_END, F_TOKEN, F_QUEUE, F_SEQ, F_POPPED, F_WAKE, F_REFUSE, F_EXPIRES, F_META, F_FREED, F_REV}

-- load_lock reads the state of the lock whose hash is lock, and the fields of
-- extra (a list, or nil), in one call; a key of the wrong type fails here.
-- The state s has the hash's fields by name (numbers as numbers), the
-- extra fields' values in s.extra, and s.w, the writes that flush makes.
-- A hash of another layout fails the script; s.fresh is set when the hash
-- has no layout 3 state yet (see prepare). An election's hash is the one
-- whose name (before its braces) ends in ':elect:'.
local function load_lock(lock, queue, extra)
  local brace = string.find(lock, '{', 1, true) or 1
  local election = brace > 7 and string.sub(lock, brace - 7, brace - 1) == ':elect:'
  local fields = election and election_fields or lock_fields
  local v
  if extra then
    local all = {unpack(fields)}
    for _, f in ipairs(extra) do
      all[#all + 1] = f
    end
    v = redis.call('HMGET', lock, unpack(all))
  else
    v = redis.call('HMGET', lock, unpack(fields))
  end
  if v[1] and v[1] ~= LAYOUT then
    other_layout(lock, v[1], LAYOUT)
  end
  local s = {key = lock, queue_key = queue, fresh = not v[1], owner = v[2] or '',
    ['end'] = number(lock, v[3]), token = number(lock, v[4]), queue = number(lock, v[5]),
    seq = number(lock, v[6]), popped = number(lock, v[7]), wake = v[8] == '1',
    refuse = number(lock, v[9]), expires = number(lock, v[10]), meta = v[11] or '',
    freed = number(lock, v[12]), election = election, w = {}, extra = {}}
  if election then
    s.rev = number(lock, v[13])
  end
  local n = #fields
  for i = n + 1, #v do
    s.extra[i - n] = v[i]
  end
  return s
end

-- set records a write of field to v, made by flush.
local function set(s, field, v)
  s.w[#s.w + 1] = field
  s.w[#s.w + 1] = v
end

-- prepare readies a fresh state for its first write: a hash that exists
-- without a layout 3 mark was written before layouts were numbered (or by
-- something else), and fails the script; otherwise the state starts from
-- the last token and revision that layout 2 kept in keys of their own, so
-- that both go on increasing across an upgrade.
local function prepare(s)
  if not s.fresh then
    return
  end
  s.fresh = false
  if redis.call('EXISTS', s.key) == 1 then
    other_layout(s.key, nil, LAYOUT)
  end
  s.token = check_counter(s.key .. ':token')
  if s.election then
    s.rev = check_counter(s.key .. ':rev')
  end
  set(s, F_LAYOUT, LAYOUT)
end

-- keep_state has the hash live at least state_memory_ms past until (server
-- ms), pushing its TTL out to twice that only when less is left: one
-- PEXPIREAT per state_memory_ms (an hour) of use, not one per call. The
-- queue's list lives as long (see join).
local function keep_state(s, until_ms)
  if s.expires < until_ms + state_memory_ms then
    s.expires = until_ms + 2 * state_memory_ms
    set(s, F_EXPIRES, string.format('%d', s.expires))
    s.push = true
  end
end

-- flush makes the writes recorded by set, in one call, then pushes the
-- TTLs that keep_state asked for.
local function flush(s)
  if #s.w > 0 then
    redis.call('HSET', s.key, unpack(s.w))
    s.w = {}
  end
  if s.push then
    s.push = false
    local at = string.format('%d', s.expires)
    redis.call('PEXPIREAT', s.key, at)
    if s.queue > 0 then
      redis.call('PEXPIREAT', s.queue_key, at)
    end
  end
end

-- held reports whether someone holds the lock now (the server clock is read
-- only when the hash names an owner).
local function held(s)
  return s.owner ~= '' and s['end'] > now_ms()
end

-- remaining returns the holder's remaining lease in ms (0 when free).
local function remaining(s)
  if not held(s) then
    return 0
  end
  return s['end'] - now_ms()
end

-- mint_token returns a new fencing token: the server clock in
-- microseconds, or the last token plus one when that is larger. Tokens
-- strictly increase while the state lives, and after it ran out unless the
-- server clock stepped back by more than the time since (an hour at least).
local function mint_token(s)
  prepare(s)
  local t = math.max(now_us(), s.token + 1)
  s.token = t
  set(s, F_TOKEN, string.format('%d', t))
  return t
end

-- announce tells an election's observers that the leader is now the
-- holder of token t with the value meta and a lease of ms (t = 0: no
-- leader), with a new revision minted as a token is, published on its
-- channel of changes as "revision:previous:token:ms:value" (previous: the
-- revision it follows, 0 when forgotten). A plain lock announces nothing.
local function announce(s, t, meta, ms, publish)
  if not s.election then
    return
  end
  prepare(s)
  local prev = s.rev
  s.rev = math.max(now_us(), prev + 1)
  set(s, F_REV, string.format('%d', s.rev))
  redis.call(publish, s.key .. ':changes', string.format('%d:%d:%d:%d:', s.rev, prev, t, ms) .. meta)
end

-- grant makes owner the holder for lease ms with the metadata meta and
-- returns its new fencing token (written by flush).
local function grant(s, owner, lease, meta, publish)
  local t = mint_token(s)
  s.owner, s['end'] = owner, now_ms() + lease
  set(s, F_OWNER, owner)
  set(s, F_END, string.format('%d', s['end']))
  if meta ~= s.meta then
    s.meta = meta
    set(s, F_META, meta)
  end
  if s.election then
    set(s, F_PROCLAIM, '')
  end
  keep_state(s, s['end'])
  announce(s, t, meta, lease, publish)
  return t
end

-- vacate writes the lock free (the caller announces it).
local function vacate(s)
  s.owner = ''
  set(s, F_OWNER, '')
  if s.meta ~= '' then
    s.meta = ''
    set(s, F_META, '')
  end
end

-- record builds a queue record (see the header).
local function record(seq, ticket, joined, deadline, handoff, meta)
  return string.format('%d %s %d %d %d ', seq, ticket, joined, deadline, handoff) .. meta
end

-- join appends ticket's record to the queue and returns its number and
-- deadline (now plus ttl ms). The list, when this makes it, gets the hash's
-- expiry.
local function join(s, ticket, ttl, handoff, meta)
  prepare(s)
  keep_state(s, now_ms())
  s.seq, s.queue = s.seq + 1, s.queue + 1
  local deadline = now_ms() + ttl
  if redis.call('RPUSH', s.queue_key, record(s.seq, ticket, now_ms(), deadline, handoff, meta)) == 1 and not s.push then
    redis.call('PEXPIREAT', s.queue_key, string.format('%d', s.expires))
  end
  set(s, F_QUEUE, s.queue)
  set(s, F_SEQ, s.seq)
  return s.seq, deadline
end

-- tombstone returns the key that refuses ticket once its call withdrew
-- (see withdraw).
local function tombstone(s, ticket)
  return s.key .. ':released:' .. ticket
end

-- refused reports whether ticket's call withdrew (see withdraw): a call
-- of it still on its way takes nothing. Only a lock with a withdrawal in
-- the last state_memory_ms pays the read.
local function refused(s, ticket)
  return s.refuse > now_ms() and redis.call('EXISTS', tombstone(s, ticket)) == 1
end

-- refuse_ticket refuses ticket from now on for state_memory_ms (see
-- refused): a call of it may still be on its way. The key's SET replaces
-- a key of any type.
local function refuse_ticket(s, ticket)
  prepare(s)
  redis.call('SET', tombstone(s, ticket), 'withdrawn', 'PX', state_memory_ms)
  if s.refuse < now_ms() + state_memory_ms then
    s.refuse = now_ms() + state_memory_ms
    set(s, F_REFUSE, string.format('%d', s.refuse))
    keep_state(s, s.refuse)
  end
end

-- client_alive returns whether the Client whose field is field has a
-- deadline on the lock s that has not passed, reading it once per script.
local function client_alive(s, field)
  s.clients = s.clients or {}
  local d = s.clients[field]
  if d == nil then
    d = redis.call('HGET', s.key, field) or false
    s.clients[field] = d
  end
  return alive(false, d, now_ms()), d
end

-- hand_off gives the free lock to the first live waiter of the queue, and
-- returns its ticket and token, or nil when none is found. Records met on
-- the way of waiters that are dead (see lib.lua, alive), withdrawn (see
-- refused) or not redisync's are dropped, at most drop_max of them; a dead
-- waiter's Client, whose deadline has passed, goes with it. The grant is
-- published to the new owner's Client as "ticket:token:ms" (ms: the server
-- time of the hand-off, which tells the grantee which of its Client's
-- heartbeats ran before it) unless the new owner is self (the caller, who
-- reads the token from its reply).
local function hand_off(s, publish, self)
  local gone = {}
  for _ = 1, drop_max do
    if s.queue <= 0 then
      break
    end
    local rec = redis.call('LPOP', s.queue_key)
    if not rec then
      s.queue = 0
      break
    end
    s.queue = s.queue - 1
    local seq, ticket, deadline, handoff, meta = string.match(rec, '^(%d+) (%S+) %d+ (%d+) (%d+) (.*)$')
    if seq then
      seq, deadline, handoff = tonumber(seq), tonumber(deadline), tonumber(handoff)
      if seq > s.popped and seq <= s.seq then
        s.popped = seq
      end
      local field = client_field(ticket)
      local live = deadline >= now_ms()
      if not live then
        local d
        live, d = client_alive(s, field)
        if d and not live then
          gone[#gone + 1] = field
        end
      end
      if live and not refused(s, ticket) then
        set(s, F_QUEUE, s.queue)
        set(s, F_POPPED, s.popped)
        if #gone > 0 then
          redis.call('HDEL', s.key, unpack(gone))
        end
        local t = grant(s, ticket, handoff, meta, publish)
        if ticket ~= self then
          redis.call(publish, grant_channel(s.key .. ':ch', ticket), ticket .. ':' .. string.format('%d', t) .. ':' .. now_ms())
        end
        return ticket, t
      end
    end
  end
  set(s, F_QUEUE, s.queue)
  set(s, F_POPPED, s.popped)
  if #gone > 0 then
    redis.call('HDEL', s.key, unpack(gone))
  end
  return nil
end

-- scan_max bounds the records a withdrawal reads to find its own, when its
-- caller does not know it.
local scan_max = 256

-- wake_max bounds the records of plain waiters one release looks at.
local wake_max = 16

-- A lock's plain (barging) waiters are recorded per Client, in a zset
-- (internal/schema, Lock.Bargers) of client id -> the server time in ms
-- until which the record stands. A waiter records its Client when it finds
-- the lock taken (record_barger), and again when it takes the lock while
-- other plain waiters of its Client wait. A release that hands the lock to
-- nobody wakes one recorded Client (wake_barger), not every process. The
-- hash's {wake} says whether there may be records, so that a release
-- reads the zset only then.

-- record_barger records the Client of ticket as having a plain waiter that
-- attempts again within ms (nothing when ms < 1). A record is never
-- shortened (ZADD GT; before Redis 6.2, which has no GT, the script reads
-- the record first from then on). Records that have run out are dropped
-- first, so that Clients that gave up do not pile up while the lock stays
-- taken. That first call fails on a key of the wrong type: the caller
-- records before its first write.
local zadd_gt = true
local function record_barger(s, bargers, ticket, ms)
  if ms < 1 then
    return
  end
  local now, client = now_ms(), client_of(ticket)
  redis.call('ZREMRANGEBYSCORE', bargers, '-inf', '(' .. string.format('%d', now))
  local until_ms = string.format('%d', now + ms)
  if zadd_gt then
    -- The key is a zset or absent by now: an error is a GT this server
    -- does not know (or a refusal of this call, such as OOM). Either way
    -- the fallback below gives the same result with one read more, for
    -- the calls after it too (a function library keeps the flag).
    zadd_gt = type(redis.pcall('ZADD', bargers, 'GT', until_ms, client)) == 'number'
  end
  if not zadd_gt then
    local was = tonumber(redis.call('ZSCORE', bargers, client))
    if not was or was < now + ms then
      redis.call('ZADD', bargers, until_ms, client)
    end
  end
  keep_alive(bargers, ms)
  if not s.wake then
    s.wake = true
    prepare(s)
    set(s, F_WAKE, '1')
  end
end

-- wake_barger takes out the record of bargers that runs out first (made
-- longest ago) and wakes that Client's plain waiters with an empty message
-- on its grant channel; one of them attempts again, and records its
-- Client again if it finds the lock taken. Records that have run out, and
-- Clients that no longer listen (the message reaches nobody), are dropped
-- on the way to the first that hears it, at most wake_max of them. A key
-- of the wrong type wakes nobody (the caller has written already; the next
-- barging attempt fails on it): plain waiters then look again when their
-- sleep ends.
local function wake_barger(s, bargers, publish)
  if not s.wake then
    return
  end
  for _ = 1, wake_max do
    local first = redis.pcall('ZRANGE', bargers, 0, 0, 'WITHSCORES')
    if type(first) ~= 'table' then
      return
    end
    if not first[1] then
      s.wake = false
      set(s, F_WAKE, '')
      return
    end
    redis.call('ZREM', bargers, first[1])
    if tonumber(first[2]) >= now_ms() and redis.call(publish, s.key .. ':ch:' .. first[1], '') > 0 then
      return
    end
  end
end

-- free releases the lock, which the caller held: it goes to the first live
-- fair waiter (see hand_off), or is left free and one Client's plain
-- waiters are woken (see wake_barger).
local function free(s, bargers, publish)
  s.freed = s.token
  set(s, F_FREED, string.format('%d', s.token))
  if s.queue > 0 and hand_off(s, publish, nil) then
    return
  end
  vacate(s)
  if s.election then
    set(s, F_PROCLAIM, '')
  end
  wake_barger(s, bargers, publish)
  announce(s, 0, '', 0, publish)
end

-- release ends the hold of ticket id, whose token is mytoken ('0' when
-- unknown), whatever its count (the holder keeps the count of levels), as
-- free does. It returns 1 when released now, or by an earlier try (the
-- last release ended the hold of mytoken); 2 when not held, and a later
-- hold was taken since (its lease ran out, or a release of it was
-- followed by another); 0 when not held.
local function release(s, id, mytoken, bargers, publish)
  if s.owner == id then
    free(s, bargers, publish)
    return 1
  end
  local t = tonumber(mytoken)
  if t > 0 and (s.freed == t or (s.token == t and string.sub(s.owner, 1, 9) == '{handoff}')) then
    return 1
  elseif t > 0 and s.token > t then
    return 2
  end
  return 0
end

-- withdraw gives up ticket's call: its record (rec: '' when unknown)
-- leaves the queue, and the lock goes on when it was handed to it. With
-- refuse set (a call of it may still be on its way), the ticket is refused
-- from then on for state_memory_ms, by a key of its own (see refused); a
-- record that was not found is dropped when it reaches the head.
local function withdraw(s, ticket, rec, refuse, bargers, publish)
  if rec == '' and refuse and s.queue > 0 then
    -- Its record, if it has one, is unknown: look for it among the first
    -- scan_max records (a record not found is dropped when it reaches the
    -- head, refused).
    for _, r in ipairs(redis.call('LRANGE', s.queue_key, 0, scan_max - 1)) do
      if string.find(r, ' ' .. ticket .. ' ', 1, true) then
        rec = r
        break
      end
    end
  end
  if rec ~= '' and s.queue > 0 and redis.call('LREM', s.queue_key, 1, rec) == 1 then
    s.queue = s.queue - 1
    set(s, F_QUEUE, s.queue)
  end
  if refuse then
    refuse_ticket(s, ticket)
  end
  if s.owner == ticket then
    free(s, bargers, publish)
  end
end
