-- sem_acquire.lua: take permits of a semaphore, or queue for them.
--
-- KEYS[1] holders, KEYS[2] expiry, KEYS[3] size, KEYS[4] queue,
-- KEYS[5] waiters, KEYS[6] withdrawn calls, KEYS[7] released (see
-- sem_lib.lua), KEYS[8] the fencing token counter of a RWMutex's writes
-- (see lib.lua, mint; touched only with ARGV[14])
-- ARGV[1] holder id
-- ARGV[2] n: permits wanted
-- ARGV[3] size of the semaphore as the caller knows it: stored when none
--         is; a stored size rules
-- ARGV[4] held: the permits the caller believes it holds
-- ARGV[5] seq: the caller's call number (>= 1, increasing); a retry of a
--         call that was applied (by this script, or by a release that
--         granted the waiter it queued) finds it in the holder record, and
--         a stale copy finds a higher one there
-- ARGV[6] lease in ms
-- ARGV[7] mode: "queue" joins the queue when not granted; "try" never does
-- ARGV[8] waiter id ("holder#call") of this Acquire or TryAcquire call
-- ARGV[9] "1" when an earlier attempt of this Acquire queued it, or may
--         have (its reply was lost): finding its permits
--         granted (and itself dequeued) means another call granted them;
--         finding itself dequeued without them (granted, and lost since; or
--         dropped as dead) ends the waiter id: a grant message to it may
--         still be on its way and must not be taken for a later grant. The
--         call goes on under a new waiter id.
-- ARGV[10] heartbeat ttl in ms, ARGV[11] lease of a grant to a waiter in ms
-- ARGV[12] channel, ARGV[13] publish command (PUBLISH or SPUBLISH)
-- ARGV[14] "1" for a RWMutex: a grant of the whole size (a write) mints a
--          fencing token (sem_lib.lua, sem_serve)
--
-- Permits are granted only when nobody is queued ahead: first the queue is
-- served (reclaimed permits may cover its head), then the caller.
--
-- Reply: {code, x, size}, where size is the size stored (or ARGV[3] when
-- none is, and this call stored none):
--        {1, token}  the caller holds n more permits; token is the fencing
--                    token of a RWMutex's write, else 0
--        {0, ms}     not granted (queued in mode "queue"); ms until the
--                    earliest lease ends (-1: no holder), or 0 when the
--                    call stopped at a bound (sem_lib.lua: reclaim_max,
--                    serve_max) and a call at once is to go on
--        {-1, 0}     held > 0 but the caller's permits are gone (lost)
--        {-2, size}  n is more than the size: nothing written (unless
--                    this is a retry of a call applied already, which
--                    replies as above)
--        {-3, 0}     the call was withdrawn, or this is a stale copy of an
--                    earlier call (or of the first call of a holding that
--                    a release ended): nothing done
--        {-4, 0}     the call left the queue (ARGV[9]); it is withdrawn now
local k = sem_keys(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
local holder, n, size, held, seq = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local lease, mode, waiter, again = tonumber(ARGV[6]), ARGV[7], ARGV[8], ARGV[9] == '1'
if ARGV[14] == '1' then
  k.fence = KEYS[8]
end
-- token returns the fencing token of a write applied earlier (the
-- counter's value: nobody else can have taken one since), else 0.
local function token()
  if k.fence and n == size then
    return check_counter(k.fence)
  end
  return 0
end

-- Every key is read before anything is written: one of the wrong type
-- fails the script here, having changed nothing. (The withdrawn and
-- released zsets are read only while they may refuse something, and are
-- written first where they are written; the queue's head only when the
-- queue may be served, below.)
sem_open(k, {holder})
local stored = k.size
-- reply returns {code, x, size} (see Reply above).
local function reply(code, x)
  return {code, x, stored or size}
end
if is_withdrawn(k, KEYS[6], waiter) then
  return reply(-3, 0)
end
if held == 0 and not again and retired(k, KEYS[7], holder, now_ms()) then
  -- A late copy of the first call of a holding that a release ended since
  -- (it retired the id): a live call never starts a holding under an id
  -- that ended.
  return reply(-3, 0)
end
local queued = again and redis.call('ZSCORE', k.queue, waiter)
local mine, mseq = sem_mine(k, holder)
if n > (stored or size) and not (mine > 0 and mseq >= seq) then
  -- More than the size (a retry of a call applied before a shrink
  -- goes on below, and is answered as it was).
  return reply(-2, stored or size)
end

local now = now_ms()
sem_reclaim(k, now)
-- The queue is served when permits are free, and by a later attempt
-- (which drops the dead waiters at its head): only then is its head read.
-- A first attempt that finds every permit in use joins the queue at once.
local serve = again or k.used < (stored or size)
if serve then
  sem_peek(k)
end
sem_check_fence(k, n, stored or size, 0)
mine, mseq = sem_mine(k, holder)
if mine > 0 and mseq == seq then
  -- A retry: this call was applied, perhaps by a release that granted its
  -- waiter with the short grant lease; the caller counts on a full lease.
  local t = token()
  sem_lease(k, holder, now, lease, true)
  sem_flush(k)
  return reply(1, t)
end
-- The holders reclaimed above go whatever the reply.
if mine > 0 and mseq > seq then
  sem_flush(k)
  return reply(-3, 0) -- a stale copy: a later call of the holder was applied
end
if held > 0 and mine < held then
  sem_flush(k)
  return reply(-1, 0)
end
if again and not queued and mine >= held + n then
  -- Granted by another call (its message may be on the way) with the short
  -- grant lease: the caller counts on a full lease from now.
  local t = token()
  sem_put(k, holder, mine, seq)
  sem_lease(k, holder, now, lease, true)
  sem_flush(k)
  return reply(1, t)
end
if again and not queued then
  mark_withdrawn(k, KEYS[6], waiter)
  sem_flush(k)
  return reply(-4, 0)
end
if not stored then
  sem_store_size(k, size)
  stored = size
end
size = stored -- a new grant goes by the stored size
-- The state lives while the semaphore is in use and for an hour after its
-- last Acquire.
sem_keep(k, now)
local ttl = tonumber(ARGV[10])
local rec = (now + ttl) .. ':' .. ARGV[11] .. ':' .. n .. ':' .. seq
if queued then
  -- Alive: refresh the deadline so that serving does not drop us.
  sem_put_waiter(k, waiter, rec)
  if k.first[1] == waiter then
    k.first = nil -- its record changed: sem_serve reads it anew
  end
end

-- Serving leaves a queued caller where it is unless it grants it: its
-- record, refreshed above, is alive. (Were it dropped as dead, it would
-- join the queue again, at the back, as a caller that was not queued.)
local used, served, t, waiting, dropped = k.used, false, 0, true, false
if serve then
  used, served, t, waiting, dropped = sem_serve(k, size, now, waiter, lease, seq, ARGV[12])
end
if served then
  sem_flush(k)
  sem_publish(k, ARGV[13])
  return reply(1, t)
end
if dropped then
  queued = false
end
mine = sem_mine(k, holder) -- serving may have added to it
if not queued and used + n <= size and not waiting then
  sem_put(k, holder, mine + n, seq)
  sem_lease(k, holder, now, lease, mine > 0)
  local tok = 0
  if k.fence and n == size then
    tok = mint(k.fence, lease)
  end
  sem_flush(k)
  sem_publish(k, ARGV[13])
  return reply(1, tok)
end
if mode == 'queue' and not queued then
  join_queue(k, waiter, now_us(), rec)
  sem_keep(k, now + 2 * ttl)
end
local hint = 0 -- a call at once serves the rest of the queue, or reclaims more
if not (k.more or k.ended) then
  hint = sem_next(k, now)
end
sem_flush(k)
sem_publish(k, ARGV[13])
return reply(0, hint)
