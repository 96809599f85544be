-- acquire.lua: take a lock for one Lock or TryLock call, or queue the call.
--
-- KEYS[1] lock hash (hold id -> hold count), with the lease as its TTL
-- KEYS[2] fencing token counter (see lib.lua, mint)
-- KEYS[3] queue: zset of fair waiters (see lib.lua, join_queue)
-- KEYS[4] waiters: hash of fair waiters' records (ticket -> "deadline:handoff";
--         "{meta}ticket" -> metadata: see lib.lua, set_waiter)
-- KEYS[5] the ticket's tombstone (see lib.lua, ended): a ticket whose hold
--         was released, or whose call was withdrawn, takes nothing again
--         (a late copy of its call)
-- ARGV[1] ticket: the call's own id, unique per call; the hold it takes is
--         stored under it. A call that finds its ticket holding the lock was
--         handed it (or is a retry of a call that took it) and adopts it.
-- ARGV[2] lease in ms
-- ARGV[3] mode: "barge" takes a free lock whatever the queue; "queue" respects
--         the queue and joins it when the lock is not granted; "try" respects
--         the queue but never joins it
-- ARGV[4] heartbeat ttl in ms (mode "queue")
-- ARGV[5] hand-off lease in ms (mode "queue")
-- ARGV[6] channel, ARGV[7] publish command (PUBLISH or SPUBLISH)
-- ARGV[8] "1" when an earlier attempt of this call queued the ticket (mode
--         "queue"). A ticket that left the queue (handed the lock, whose
--         hold has gone since; or dropped as dead) is never queued again:
--         a grant message to it may still be on its way, and must not be
--         taken for a grant after a later attempt. The call goes on under a
--         new ticket.
-- ARGV[9] the caller's metadata (WithMetadata), stored with its hold; ''
--         for none. A queued call keeps it in its waiter record, for the
--         hand-off.
-- KEYS[6] the Clients with plain waiters (see lib.lua, record_barger)
-- ARGV[10] mode "barge": how long in ms the caller's Client is recorded as
--         having a plain waiter, when the call waits and finds the lock
--         taken ('0': a TryLock, which does not wait)
-- ARGV[11] mode "barge": "1" when other plain waiters of the caller's
--         Client wait for the lock: taking it records the Client again
-- KEYS[7], ARGV[12] an election's revision key and channel of changes
--         (absent for a plain lock): a new holder is announced there (see
--         lib.lua, announce)
--
-- Reply: {1, token}   held by the ticket; token of the hold
--        {0, pttl}    held by another owner; pttl is the lock's PTTL
--                     (-1: no TTL; -2: none, the lock was handed to another)
--        {-2, 0}      the ticket was withdrawn, or its hold released: nothing
--                     done
--        {-3, 0}      the ticket left the queue (ARGV[8]); it is withdrawn now
local lock, token, queue, waiters, tomb = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local ticket, lease, mode = ARGV[1], tonumber(ARGV[2]), ARGV[3]

local t = check_counter(token)
elect(KEYS[7], ARGV[12], ARGV[7])
local count, layout = read_hold(lock, ticket)
if count > 0 then
  -- Never shorten it: a late copy of this call must not cut a lease that
  -- Mutex.Extend has made longer since.
  keep_alive(lock, lease)
  keep_longer(token, lease) -- as long as the lease: see lib.lua, mint
  if not layout then
    redis.call('HSET', lock, LAYOUT_FIELD, LAYOUT) -- handed over by layout 1 (see renew.lua)
  end
  return {1, t}
end
if ended(tomb) then
  return {-2, 0}
end

local pttl = redis.call('PTTL', lock)
if pttl ~= -2 and layout ~= LAYOUT then
  other_layout(lock, layout)
end
if mode == 'barge' then
  -- Recorded before the grant's first write: a key of the wrong type
  -- fails the script having changed nothing.
  local record = tonumber(ARGV[10])
  if pttl ~= -2 then
    record_barger(KEYS[6], ticket, record)
    return {0, pttl}
  end
  if ARGV[11] == '1' then
    record_barger(KEYS[6], ticket, record)
  end
  return {1, grant(lock, token, ticket, lease, ARGV[9])}
end

-- An attempt after one that queued the ticket reads whether it is still
-- queued (a queue of the wrong type fails here). A first attempt does not
-- ask: join_queue keeps the place of a ticket queued already (a copy of
-- the attempt that applied), and reads the queue before it writes. The
-- hand-off reads before it writes too (see lib.lua, hand_off), and
-- withdraw_ticket writes a key of any type.
local queued = false
if ARGV[8] == '1' then
  queued = redis.call('ZSCORE', queue, ticket)
  if not queued then
    withdraw_ticket(tomb)
    return {-3, 0}
  end
end
if pttl == -2 then
  local head, ht = hand_off(lock, token, queue, waiters, ARGV[6], ARGV[7], ticket, false)
  if head == nil then
    return {1, grant(lock, token, ticket, lease, ARGV[9])}
  end
  if head == ticket then
    redis.call('PEXPIRE', lock, lease)
    keep_longer(token, lease) -- minted for the hand-off lease
    return {1, ht}
  end
  pttl = redis.call('PTTL', lock)
  queued = false -- the hand-off may have dropped it as dead: join again
end
if mode == 'queue' then
  local ttl, us = tonumber(ARGV[4]), now_us()
  local function record()
    set_waiter(waiters, ticket, math.floor(us / 1000) + ttl, ARGV[5], ARGV[9])
  end
  if queued then
    record()
    keep_alive(queue, 2 * ttl)
  else
    join_queue(queue, ticket, us, record, 2 * ttl)
  end
  keep_alive(waiters, 2 * ttl)
end
return {0, pttl}
