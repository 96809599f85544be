-- sem_acquire.lua: take permits of a semaphore, or queue for them.
--
-- KEYS: the semaphore's four keys (sem_lib.lua)
-- ARGV[1] holder id
-- ARGV[2] waiter id ("holder#digits") of this Acquire or TryAcquire call
-- ARGV[3] "n:size:held:seq": the permits wanted; the size of the
--         semaphore as the caller knows it (stored when none is; a stored
--         size rules); the permits the caller believes it holds; and its
--         call number (>= 1, increasing): a retry of a call that was
--         applied (by this script, or by a release that granted the
--         waiter it queued) finds it in the holder record, and a stale
--         copy finds a higher one there
-- ARGV[4] "lease:heartbeat:grant", in ms: the lease of the permits; how
--         long a queued waiter lives on its own; the lease of a grant to a
--         waiter
-- ARGV[5] mode, then flags, separated by spaces. Modes: "queue" joins the
--         queue when not granted; "try" never does. Flags: "again" (an
--         earlier attempt of this Acquire queued it, or may have: its
--         reply was lost; finding its permits granted, and itself
--         dequeued, means another call granted them; finding itself
--         dequeued without them (granted, and lost since; or dropped as
--         dead) ends the waiter id: a grant message to it may still be on
--         its way and must not be taken for a later grant, so the call
--         goes on under a new waiter id), "rw" (a RWMutex's: a grant of
--         the whole size, a write, mints a fencing token: sem_lib.lua,
--         sem_serve), "sharded" (publish with SPUBLISH)
-- ARGV[6] the grant channels' prefix (lib.lua, grant_channel)
--
-- Permits are granted only when nobody is queued ahead: first the queue is
-- served (reclaimed permits may cover its head), then the caller.
--
-- Reply: {code, x, size}, where size is the size stored (or the caller's
-- when none is, and this call stored none):
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
--        {-4, 0}     the call left the queue ("again"); it is withdrawn now
local holder, waiter, flags = ARGV[1], ARGV[2], ARGV[5]
local n, size, held, seq = sem_args(ARGV[3], 4, 'the call')
local lease, ttl, grant = sem_args(ARGV[4], 3, 'the times')
limit(math.max(lease, ttl, grant) <= MAX_MS, 'the times must be at most ', MAX_MS, ' ms')
local mode, again = string.match(flags, '^%a+'), sem_flag(flags, 'again')
local k = sem_keys(KEYS, sem_flag(flags, 'rw'))
-- token returns the fencing token of a write applied earlier (the last
-- one minted: nobody else can have taken one since), else 0.
local function token()
  if k.fence and n == size then
    return k.token
  end
  return 0
end

-- Every key is read before anything is written: one of the wrong type
-- fails the script here, having changed nothing. (The ended zset is read
-- only while it may refuse something, and is written first where it is
-- written; the queue's head only when the queue may be served, below.)
sem_open(k, {holder})
local stored = k.size
-- reply returns {code, x, size} (see Reply above).
local function reply(code, x)
  return {code, x, stored or size}
end
if is_withdrawn(k, waiter) then
  return reply(-3, 0)
end
if held == 0 and not again and retired(k, holder, now_ms()) then
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
  mark_withdrawn(k, waiter)
  sem_hset(k, waiter, false) -- a record left by a version that drops waiters it cannot read
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
local rec = (now + ttl) .. ':' .. grant .. ':' .. n .. ':' .. seq
if queued then
  -- Alive: refresh the deadline so that serving does not drop us.
  sem_hset(k, waiter, rec)
end

-- Serving leaves a queued caller where it is unless it grants it: its
-- record, refreshed above, is alive. (Were it dropped as dead, it would
-- join the queue again, at the back, as a caller that was not queued.)
local used, served, t, waiting, dropped = k.used, false, 0, true, false
if serve then
  used, served, t, waiting, dropped = sem_serve(k, size, now, waiter, lease, seq, ARGV[6])
end
local publish = publish_cmd(flags)
if served then
  sem_flush(k)
  sem_publish(k, publish)
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
    tok = sem_mint(k)
  end
  sem_flush(k)
  sem_publish(k, publish)
  return reply(1, tok)
end
if mode == 'queue' and not queued then
  join_queue(k, waiter, now_us(), rec)
  sem_keep(k, now + 2 * ttl)
end
local hint = 0 -- a call at once serves the rest of the queue, or reclaims more
if not (k.more or k.ended_at) then
  hint = sem_next(k, now)
end
sem_flush(k)
sem_publish(k, publish)
return reply(0, hint)
