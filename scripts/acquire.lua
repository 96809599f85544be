-- acquire.lua: take a lock for one Lock or TryLock call, or queue the call.
--
-- KEYS[1] the lock's hash, KEYS[2] its fair queue (see lock_lib.lua)
-- KEYS[3] the Clients with plain waiters (lock_lib.lua, record_barger)
-- KEYS[4] the ticket's tombstone (lock_lib.lua, refused)
-- ARGV[1] ticket: the call's own id, unique per call; the hold it takes is
--         stored under it. A call that finds its ticket holding the lock was
--         handed it (or is a retry of a call that took it) and adopts it.
-- ARGV[2] lease in ms
-- ARGV[3] mode, then flags, separated by spaces. Modes: "barge" takes a
--         free lock whatever the queue; "queue" respects the queue and joins
--         it when the lock is not granted; "again" is a later attempt of a
--         call that joined (it never joins again: a ticket that left the
--         queue may still have a grant message on its way, which must not
--         be taken for a later grant); "try" respects the queue but never
--         joins it. Flags: "others" (barge: other plain waiters of the
--         caller's Client wait: taking the lock records it again),
--         "sharded" (publish with SPUBLISH), "most=n" (queue: the call
--         joins only while the queue holds fewer than n records,
--         WithMaxWaiters; none: no limit)
-- ARGV[4] mode "queue": the heartbeat ttl in ms (how long the record lives
--         on its own); "again": the number of the call's record; "barge":
--         how long in ms the Client is recorded as having a plain waiter
--         when the call finds the lock taken ('0': a TryLock, which does not
--         wait)
-- ARGV[5] mode "queue": the lease in ms of a hold handed to the call
-- ARGV[6] the caller's metadata (WithMetadata), stored with its hold; ''
--         for none
--
-- A lease, heartbeat or hand-off lease beyond lib.lua's MAX_MS, metadata
-- longer than MAX_TEXT, or a "most=" that is not a whole number from 0,
-- fails the script with a LIMIT error, before it reads or writes anything.
--
-- Reply: {1, token}           held by the ticket; token of the hold
--        {0, ms}              held by another; ms its remaining lease (0:
--                             free, with waiters queued ahead)
--        {0, ms, seq, until}  mode "queue": queued, as record number seq,
--                             alive on its own until the server time until
--        {-2, 0}              the ticket was withdrawn: nothing done
--        {-3, 0}              mode "again": the ticket left the queue (it
--                             was handed the lock, whose hold has ended
--                             since; or dropped as dead)
--        {-4, most}           mode "queue": not queued, the queue holding
--                             most records ("most=") already; nothing of
--                             the call is stored
local ticket, lease, mode, arg = ARGV[1], ms_arg(ARGV[2], 1, 'the lease'), ARGV[3], tonumber(ARGV[4])
text_arg(ARGV[6], 'the metadata')
local most = 0
if string.sub(mode, 1, 5) == 'queue' then
  ms_arg(ARGV[4], 1, 'the heartbeat')
  ms_arg(ARGV[5], 1, 'the hand-off lease')
  local flag = string.match(mode, ' most=(%S*)')
  if flag then
    most = integer(flag)
  end
  limit(most and most >= 0, 'the most waiters must be a whole number from 0 (0: no limit)')
end
local publish = publish_cmd(mode)
mode = string.match(mode, '^%a+')
local s = load_lock(KEYS[1], KEYS[2])

if s.owner == ticket then
  if s['end'] > now_ms() then
    -- A retry of the call that took it, or a hand-off to it: as long as
    -- its lease, and never shorter (Mutex.Extend may have made it longer).
    if s['end'] < now_ms() + lease then
      s['end'] = now_ms() + lease
      set(s, F_END, string.format('%d', s['end']))
      keep_state(s, s['end'])
      flush(s)
    end
    return {1, s.token}
  end
  return mode == 'again' and {-3, 0} or {-2, 0}
end
if refused(s, ticket) then
  return {-2, 0}
end
if mode == 'again' and arg <= s.popped then
  return {-3, 0}
end

local taken = held(s)
if mode == 'barge' then
  -- Recorded before the first write: a key of the wrong type fails the
  -- script having changed nothing.
  if taken or string.find(ARGV[3], 'others', 1, true) then
    record_barger(s, KEYS[3], ticket, arg)
  end
  if taken then
    flush(s)
    return {0, remaining(s)}
  end
  local t = grant(s, ticket, lease, ARGV[6], publish)
  flush(s)
  return {1, t}
end

if not taken and s.queue > 0 then
  -- Free, with waiters queued: serve the queue (a waiter that looks again
  -- after its heartbeat found the lock free goes on where a release
  -- stopped).
  local head, t = hand_off(s, publish, ticket)
  if head == ticket then
    s['end'] = now_ms() + lease -- the caller's own lease, not a hand-off's
    set(s, F_END, string.format('%d', s['end']))
    keep_state(s, s['end'])
    flush(s)
    return {1, t}
  end
  taken = head ~= nil
end
if not taken and s.queue <= 0 then
  if mode == 'again' then
    return {-3, 0} -- the queue is gone (it ran out, or was deleted)
  end
  local t = grant(s, ticket, lease, ARGV[6], publish)
  flush(s)
  return {1, t}
end
if mode == 'queue' then
  if most > 0 and redis.call('LLEN', KEYS[2]) >= most then
    -- Full: the call does not join (what hand_off changed is written).
    flush(s)
    return {-4, most}
  end
  local seq, deadline = join(s, ticket, arg, tonumber(ARGV[5]), ARGV[6])
  flush(s)
  return {0, remaining(s), seq, deadline}
end
flush(s)
return {0, remaining(s)}
