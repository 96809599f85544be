-- lib.lua: helpers shared by the scripts. scripts.go prepends this file to
-- each script before loading it, so every script stays one atomic unit.
--
-- Keys of the wrong type: every script reads each key it may write, or
-- writes it first, before any other write, so that a key of the wrong type,
-- or a value that is not what redisync stores, fails the script before it
-- has changed anything. Such errors carry the word WRONGTYPE. No read is
-- made only to check a type where the first write checks it.
--
-- Waiter records live in a hash (ticket -> "deadline:handoff", and
-- "{meta}ticket" -> its metadata when it has any: see set_waiter), where
-- deadline is the server time in ms until which the waiter is alive on its
-- own (set by its attempts) and handoff is the lease in ms it is given when
-- the lock is handed to it. Beyond its own deadline a waiter lives as long
-- as its Client's: see CLIENT_FIELD.

-- LAYOUT is the version of the stored layout that these scripts read and
-- write (internal/schema.Layout). A lock's hash carries it in the field
-- LAYOUT_FIELD (no hold id has braces), a semaphore's size record after
-- the size ("size:layout"): the places every script reads before it acts.
-- State without it was written before layouts were numbered (layout 1).
-- A script that meets a held lock or a busy semaphore of another layout
-- fails with a LAYOUT error rather than misread it: during a rolling
-- deploy, mixed versions fail loudly instead of letting two holders in.
local LAYOUT = '2'
local LAYOUT_FIELD = '{layout}'

-- META_FIELD is the field of a lock's hash that holds its holder's
-- metadata (WithMetadata), when it has any.
local META_FIELD = '{meta}'

-- PROCLAIM_FIELD is the field of an election's lock hash that holds the
-- number of the last Proclaim applied to its hold (see proclaim.lua).
local PROCLAIM_FIELD = '{proclaim}'

-- other_layout fails the script: key was written in another layout.
local function other_layout(key, found)
  error('LAYOUT redisync: ' .. key .. ' was written in layout ' .. (found or '1') .. ', this redisync reads layout ' .. LAYOUT)
end

-- now_us returns the server clock in microseconds, as read by the
-- script's first call: a script reads the clock once (TIME is among the
-- dearest calls a script makes), and runs in a few microseconds.
local clock_us = nil
local function now_us()
  if not clock_us then
    local t = redis.call('TIME')
    clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return clock_us
end

-- now_ms returns the server clock in milliseconds (see now_us).
local function now_ms()
  return math.floor(now_us() / 1000)
end

-- wrong fails the script with a WRONGTYPE error about key.
local function wrong(key, what)
  error('WRONGTYPE redisync: ' .. key .. ' does not hold ' .. what)
end

-- integer returns v as a number when it is a base-10 integer, else nil.
local function integer(v)
  if type(v) == 'string' and string.match(v, '^%-?%d+$') then
    return tonumber(v)
  end
  return nil
end

-- parse_waiter splits a waiter record, "deadline:handoff", into its
-- deadline, hand-off lease and metadata ('' for none). A record of
-- 8f61dc3, "deadline:handoff:metadata", is read too.
local function parse_waiter(v)
  local deadline, handoff, meta = string.match(v, '^(%d+):(%d+):?(.*)$')
  return tonumber(deadline), tonumber(handoff), meta
end

-- A waiter's metadata is kept in the waiters hash under its own field,
-- META_FIELD .. ticket (no ticket starts with '{'), and never in its
-- record: every earlier version parses a record with '^(%d+):(%d+)$', and
-- would take a waiter whose record had more for a dead one, skipping it.
-- An earlier version's hand-off leaves the field behind; it goes with the
-- waiters hash, whose TTL only queued waiters keep alive.
local function waiter_meta_field(ticket)
  return META_FIELD .. ticket
end

-- CLIENT_FIELD starts the field of a waiters hash (a lock's, or a
-- semaphore's) that holds a Client's liveness deadline there:
-- CLIENT_FIELD .. client -> server time in ms. The Client's watchdog moves
-- it forward (renew.lua), once per lock or semaphore on which it has
-- waiters, whatever their number: a waiter is alive while its own deadline
-- or its Client's has not passed. No ticket or waiter id starts with '{'.
local CLIENT_FIELD = '{client}'

-- client_of returns the client id in a ticket ("label/client-n"), a hold
-- id, or a semaphore waiter id ("label/client-n#m") (internal/schema,
-- Client).
local function client_of(id)
  local c = string.match(id, '[^/]*$')
  c = string.match(c, '^(.*)#') or c
  return string.match(c, '^(.*)%-') or c
end

-- client_field returns the field of the waiters hash that holds the
-- liveness deadline of id's Client.
local function client_field(id)
  return CLIENT_FIELD .. client_of(id)
end

-- deadline_of returns the deadline in a Client's field ("ms", or "ms:L"
-- while a lapse is being reported: see renew.lua), or nil.
local function deadline_of(v)
  local ms = type(v) == 'string' and string.match(v, '^(%d+)')
  return ms and tonumber(ms) or nil
end

-- alive reports whether a waiter is alive at now (ms): its own deadline,
-- or its Client's (a value read from client_field, or false), has not
-- passed.
local function alive(deadline, client, now)
  return (deadline and deadline >= now) or (deadline_of(client) or -1) >= now
end

-- set_waiter writes a waiter's record and its metadata ('' for none), in
-- one call. A call's metadata does not change between its attempts, so a
-- record written again never leaves a stale metadata field behind.
local function set_waiter(waiters, ticket, deadline, handoff, meta)
  if meta == '' then
    redis.call('HSET', waiters, ticket, deadline .. ':' .. handoff)
  else
    redis.call('HSET', waiters, ticket, deadline .. ':' .. handoff, waiter_meta_field(ticket), meta)
  end
end

-- del_waiter removes a waiter's record and its metadata.
local function del_waiter(waiters, ticket)
  redis.call('HDEL', waiters, ticket, waiter_meta_field(ticket))
end

-- set_meta stores the holder's metadata in the lock hash, or removes it.
local function set_meta(lock, meta)
  if meta == '' then
    redis.call('HDEL', lock, META_FIELD)
  else
    redis.call('HSET', lock, META_FIELD, meta)
  end
end

-- keep_longer extends a key's TTL to at least ms, never shortening it,
-- reading the TTL first: one call when it is long enough already. It
-- suits a key whose TTL is usually longer than ms, as a fencing token
-- counter's (kept an hour after its mint: see mint); keep_alive suits the
-- others.
local function keep_longer(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- keep_alive extends a key's TTL to at least ms, never shortening it. A
-- key that has a TTL shorter than ms takes one call (PEXPIRE GT, Redis 7);
-- one that has none yet (GT leaves it as it is) or a longer one takes two,
-- the second PEXPIRE NX, which sets a TTL only where there is none. Before
-- Redis 7 (PEXPIRE has no GT), the script reads the TTL first from then on
-- (keep_longer). An ms below 1 asks for nothing (a PEXPIRE in the past
-- would delete the key).
local expire_gt = true
local function keep_alive(key, ms)
  if ms < 1 then
    return
  end
  if expire_gt then
    local set = redis.pcall('PEXPIRE', key, ms, 'GT')
    if set == 1 then
      return
    end
    expire_gt = type(set) == 'number'
    if expire_gt then
      redis.call('PEXPIRE', key, ms, 'NX')
      return
    end
  end
  keep_longer(key, ms)
end

-- check_counter returns the fencing token counter's value (0 when absent)
-- and fails the script, before it writes anything, when the key holds
-- something other than an integer. The value is read once per script (see
-- counters; mint keeps it current).
local counters = {}
local function check_counter(token)
  local c = counters[token]
  if c == nil then
    local v = redis.call('GET', token)
    c = v and (integer(v) or wrong(token, 'a counter')) or 0
    counters[token] = c
  end
  return c
end

-- count_of returns a hold count read from the lock hash (0 for none),
-- failing the script when it is not a positive integer.
local function count_of(lock, id, v)
  if not v then
    return 0
  end
  local n = integer(v)
  if not n or n < 1 then
    wrong(lock, 'a hold count for ' .. id)
  end
  return n
end

-- hold_count returns the count stored for a hold's field in the lock hash
-- (0 when absent), failing the script when it is not a positive integer.
local function hold_count(lock, id)
  return count_of(lock, id, redis.call('HGET', lock, id))
end

-- read_hold returns hold_count(lock, id) and the lock hash's layout mark
-- (false when the hash is absent or has none), in one call.
local function read_hold(lock, id)
  local v = redis.call('HMGET', lock, id, LAYOUT_FIELD)
  return count_of(lock, id, v[1]), v[2]
end

-- state_memory_ms is how long redisync's record of an idle lock or
-- semaphore (a lock's fencing token counter, a semaphore's size) outlives
-- its last use: nothing redisync writes stays in Redis for good.
local state_memory_ms = 3600000

-- mint returns a new fencing token of the lock whose counter is the key
-- token, for a hold of lease ms: the server clock in microseconds, or the
-- last token issued plus one when that is larger. The counter remembers
-- the last token for state_memory_ms, or as long as the hold's lease when
-- that is longer (renewals and extensions keep it as long as the lease):
-- so the counter is the holder's token while the lock is held, tokens
-- strictly increase while it is stored, and after it expired unless the
-- server clock stepped back by more than the time since the last token (at
-- least state_memory_ms).
local function mint(token, lease)
  local t = math.max(now_us(), check_counter(token) + 1)
  redis.call('SET', token, string.format('%d', t), 'PX', math.max(state_memory_ms, lease))
  counters[token] = t
  return t
end

-- election is set (by elect) when the script runs for an election, whose
-- leader is its lock's holder: every change of holder, and of the
-- holder's metadata (its value), is then announced. It stays false for a
-- plain lock, which pays nothing for it.
local election = false

-- elect makes the script one of an election when rev (its revision key:
-- internal/schema, ElectionKeys) is given: changes are published on
-- channel with the command publish. It reads the revision first, so that a
-- key of the wrong type fails the script before it writes.
local function elect(rev, channel, publish)
  if rev then
    election = {rev = rev, channel = channel, publish = publish}
    check_counter(rev)
  end
end

-- announce tells an election's observers that the leader is now the
-- holder of token t with the value meta and a lease of ms (t = 0: no
-- leader). The change gets a new revision, minted as a fencing token is
-- (see mint): larger than the last, even after the key was forgotten; and
-- it is published as "revision:previous:token:ms:value", previous being
-- the revision it follows (0 when forgotten), so that an observer that
-- missed one sees the gap, and ms telling it when to look whether the
-- leader's lease ran out unrenewed, which nothing announces.
local function announce(t, meta, ms)
  if election then
    local prev = check_counter(election.rev)
    local r = mint(election.rev, 0)
    redis.call(election.publish, election.channel, string.format('%d:%d:%d:%d:', r, prev, t, ms) .. meta)
  end
end

-- grant makes owner the holder of the free lock for lease ms, with its
-- metadata meta ('' for none), and returns its new fencing token. The
-- token is minted first: a token key of the wrong type fails the script
-- before the lock is written.
local function grant(lock, token, owner, lease, meta)
  local t = mint(token, lease)
  if meta == '' then
    redis.call('HSET', lock, owner, 1, LAYOUT_FIELD, LAYOUT)
  else
    redis.call('HSET', lock, owner, 1, LAYOUT_FIELD, LAYOUT, META_FIELD, meta)
  end
  redis.call('PEXPIRE', lock, lease)
  announce(t, meta, lease)
  return t
end

-- grant_channel returns the channel on which a grant to id (a ticket, or a
-- semaphore waiter id, "label/client-n#m") is published: channel, ':' and
-- the id's client (internal/schema, Client). Only the grantee's process
-- subscribes to it, so only it is woken.
local function grant_channel(channel, id)
  return channel .. ':' .. client_of(id)
end

-- hand_off gives the free lock to the first live waiter of the queue (see
-- alive). Dead waiters met on the way are dropped, with their Client's
-- deadline. The new owner gets a
-- hold count of 1, its hand-off lease and a fresh fencing token, and
-- "ticket:token:ms" (ms: the server time of the hand-off, which tells the
-- grantee which of its Client's heartbeats ran before it) is published on
-- its client's grant channel (see grant_channel) unless the new owner is
-- self (the caller, who reads the token from the reply). With vacate set
-- the lock still holds the caller's hold, which goes just before the grant
-- (and stays when nobody live is waiting). It returns the new owner and its token, or nil when nobody
-- live is waiting.
--
-- It reads before it writes: the queue's head (a queue of the wrong type
-- fails here), the token counter and the head's record, and only then
-- takes the head out of the queue. (ZPOPMIN would save a call, but the
-- ACL in docs/acl.md does not list it, and a pop put back when a later
-- read fails loses the queue's TTL.)
local function hand_off(lock, token, queue, waiters, channel, publish, self, vacate)
  while true do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then
      return nil
    end
    check_counter(token)
    local v = redis.call('HMGET', waiters, head, waiter_meta_field(head), client_field(head))
    redis.call('ZREM', queue, head)
    local rec = v[1]
    del_waiter(waiters, head)
    if rec then
      local deadline, handoff, meta = parse_waiter(rec)
      meta = v[2] or meta
      if handoff and alive(deadline, v[3], now_ms()) then
        if vacate then
          redis.call('DEL', lock)
        end
        local t = grant(lock, token, head, handoff, meta)
        if head ~= self then
          redis.call(publish, grant_channel(channel, head), head .. ':' .. string.format('%d', t) .. ':' .. now_ms())
        end
        return head, t
      end
    end
    if v[3] and not alive(false, v[3], now_ms()) then
      -- Its Client's deadline has passed: that Client is dead, or its
      -- heartbeats stalled (its next one finds the deadline gone, which
      -- tells the same as passed). Either way it goes with its waiter.
      redis.call('HDEL', waiters, client_field(head))
    end
  end
end

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

-- withdrawn_ms is how long a withdrawn call (one that gave up) stays
-- refused: a copy of one of its calls still in flight when it was withdrawn
-- (a stalled connection, a retry by the client library) must not take
-- anything on its late arrival.
local withdrawn_ms = 120000

-- A lock's ticket has a tombstone (internal/schema, Lock.Tombstone), a
-- string that exists once the ticket's call has ended: its hold was
-- released (the hold's token, for the tombstone TTL: see release_hold) or
-- it was withdrawn (see withdraw_ticket). A ticket whose tombstone exists
-- takes nothing again (ended), so one EXISTS refuses a late copy of either.
-- Only the process whose call owns a ticket reads its tombstone.

-- ended reports whether the ticket whose tombstone is tomb has ended.
local function ended(tomb)
  return redis.call('EXISTS', tomb) == 1
end

-- withdraw_ticket refuses the ticket whose tombstone is tomb for
-- withdrawn_ms from now. A tombstone that exists already (the hold's
-- release) keeps its value, which a retried release compares with its
-- token, and lives at least withdrawn_ms. SET replaces no key here: one of
-- the wrong type only gets the TTL.
local function withdraw_ticket(tomb)
  if not redis.call('SET', tomb, 'withdrawn', 'NX', 'PX', withdrawn_ms) then
    keep_alive(tomb, withdrawn_ms)
  end
end

-- A lock's plain (barging) waiters are recorded per Client, in a zset
-- (internal/schema, Lock.Bargers) of client id -> the server time in ms
-- until which the record stands. A waiter records its Client when it finds
-- the lock taken (record_barger), and again when it takes the lock while
-- other plain waiters of its Client wait. A release that hands the lock to
-- nobody wakes one recorded Client (wake_barger), not every process.

-- record_barger records the Client of id (a ticket) as having a plain
-- waiter that attempts again within ms (nothing when ms < 1). A record is
-- never shortened (ZADD GT; before Redis 6.2, which has no GT, the script
-- reads the record first from then on): a Client's waiters may recheck at
-- different intervals. Records that have run out are dropped first, so
-- that Clients that gave up do not pile up while the lock stays taken.
-- That first call fails on a key of the wrong type: the caller records
-- before its first write.
local zadd_gt = true
local function record_barger(bargers, id, ms)
  if ms < 1 then
    return
  end
  local now, client = now_ms(), client_of(id)
  redis.call('ZREMRANGEBYSCORE', bargers, '-inf', '(' .. string.format('%d', now))
  local until_ms = string.format('%d', now + ms)
  if zadd_gt then
    -- The key is a zset or absent by now: an error can only be a GT
    -- this server does not know.
    zadd_gt = type(redis.pcall('ZADD', bargers, 'GT', until_ms, client)) == 'number'
  end
  if not zadd_gt then
    local was = tonumber(redis.call('ZSCORE', bargers, client))
    if not was or was < now + ms then
      redis.call('ZADD', bargers, until_ms, client)
    end
  end
  keep_alive(bargers, ms)
end

-- wake_barger takes out the record of bargers that runs out first (made
-- longest ago) and wakes that Client's plain waiters with an empty message
-- on its grant channel (see grant_channel); one of them attempts again,
-- and records its Client again if it finds the lock taken. Records that
-- have run out, and Clients that no longer listen (the message reaches
-- nobody), are dropped on the way to the first that hears it. A key of the
-- wrong type wakes nobody (the caller has written already; the next
-- barging attempt fails on it): plain waiters then look again when their
-- sleep ends.
local function wake_barger(bargers, channel, publish)
  while true do
    local first = redis.pcall('ZRANGE', bargers, 0, 0, 'WITHSCORES')
    if type(first) ~= 'table' or not first[1] then
      return
    end
    redis.call('ZREM', bargers, first[1])
    if tonumber(first[2]) >= now_ms() and redis.call(publish, channel .. ':' .. first[1], '') > 0 then
      return
    end
  end
end

-- release_hold ends a hold of count levels (read by the caller: 0 when the
-- hold id does not hold the lock), whatever its count (the holder keeps
-- the count of levels): the lock goes to the first live fair waiter (see
-- hand_off), or is deleted and one Client's plain waiters are woken (see
-- wake_barger). A hold with a token (mytoken, a
-- string; '0' when unknown) leaves a tombstone holding it for tomb_ms, so
-- that a retried release knows it applied. It returns 1 when released
-- (now or by an earlier try of the call), 0 when not held by the hold id.
-- The hand-off reads what it writes before its first write; the
-- tombstone's SET replaces a key of any type.
local function release_hold(count, lock, token, queue, waiters, bargers, tomb, mytoken, tomb_ms, channel, publish)
  local fenced = tonumber(mytoken) > 0
  if count == 0 then
    if fenced and redis.call('GET', tomb) == mytoken then
      return 1
    end
    return 0
  end
  if not hand_off(lock, token, queue, waiters, channel, publish, nil, true) then
    redis.call('DEL', lock)
    wake_barger(bargers, channel, publish)
    announce(0, '', 0)
  end
  if fenced then
    redis.call('SET', tomb, mytoken, 'PX', tonumber(tomb_ms))
  end
  return 1
end
