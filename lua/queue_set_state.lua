-- queue_set_state: change an event's queue state, opening the pre-queue when it leaves `prequeue`.
--
-- Opening draws the pre-queue's order: the shuffle of lib/queue_shuffle.lua (prepended) over the accounts in
-- join order (KEYS[14]) from the seed ARGV[2]; place base + k goes to order[k]. The seed, count and base are
-- recorded (KEYS[15]) and the join order is kept, so anyone can recompute every place (gateway/src/room/shuffle.rs
-- does, and a test checks it against this script).
-- Live joiners get places after the drawn ones, because joins see `prequeue` until this script has run.
--
-- KEYS (the same twenty-nine for every queue script, built by gateway/src/store/keys.rs `QueueKeys`):
--   1 settings (hash)     <p>queue:{evE}:settings  state, admit_per_minute, max_active, session_seconds,
--                                                   abandon_after_seconds, opens_at (Unix ms, 0 = none), version
--   2 seq (counter)       <p>queue:{evE}:seq       the last place given out (places count from 1)
--   3 head (counter)      <p>queue:{evE}:head      the last place the admission step has passed
--   4 places (hash)       <p>queue:{evE}:places    account -> place
--   5 who (hash)          <p>queue:{evE}:who       place -> account
--   6 joined (hash)       <p>queue:{evE}:joined    account -> when it joined (ms)
--   7 seen (sorted set)   <p>queue:{evE}:seen      account, score = when it last joined or polled (ms)
--   8 active (sorted set) <p>queue:{evE}:active    account, score = when it was admitted (ms)
--   9 skipped (zset)      <p>queue:{evE}:skipped   place (score = place) of each fan skipped as abandoned
--  10 batches (zset)      <p>queue:{evE}:batches   "from:to:at_ms:admitted", score = to: each step that moved head
--  11 stats (hash)        <p>queue:{evE}:stats     credit, last_ms, admitted_total, abandoned_total, later_seq,
--                                                   later_head, later_promoted (places given from that line)
--  12 waits (list)        <p>queue:{evE}:waits     the waits (ms) of the last 1000 admitted fans, newest first
--  13 pre (set)           <p>queue:{evE}:pre       accounts in the pre-queue
--  14 prelist (list)      <p>queue:{evE}:prelist   the same accounts in join order (kept after opening, for audit)
--  15 shuffle (hash)      <p>queue:{evE}:shuffle   seed, count, base, at_ms of the pre-queue draw
--  16 spent (zset)        <p>queue:{evE}:spent     nonce of each challenge a join was paid with, score = its expiry (ms)
--  17 networks (hash)     <p>queue:{evE}:networks  client network (address prefix) -> places it was given
--  18 codes (hash)       <p>queue:{evE}:codes     presale code -> "batch:uses_cap:starts_ms:ends_ms" (ends 0 = none)
--  19 uses (hash)        <p>queue:{evE}:uses      presale code -> how many accounts redeemed it
--  20 holders (hash)     <p>queue:{evE}:holders   account -> "code:at_ms": the code it redeemed here, and when
--  21 later (hash)       <p>queue:{evE}:later     account -> its number in the line of fans who joined without
--                                                   a code while code holders go first (stats later_seq/_head)
--  22 laterwho (hash)    <p>queue:{evE}:laterwho  number -> account, for that line
--  23 left (zset)         <p>queue:{evE}:left      account, score = when it left the room (ms): admissions issued
--                                                   before then are over (kept for a session)
-- Time is Redis's own clock (TIME), never a node's.
-- ARGV[1]     the new state: prequeue, open, paused or closed (sold_out is set by the gateway itself)
-- ARGV[2]     seed of the draw, 1 .. 2147483646
-- ARGV[3]     the state the caller expects now, or "" for any (the timed opening passes "prequeue", so it
--             never overrides an operator's later change)
-- Returns     {"unknown"}                       no waiting room is configured for this event
--             {"changed", state}                the state was not ARGV[3]; nothing done
--             {"refused", state}                back to prequeue once places were given out: refused
--             {"ok", state, drawn}              done; drawn = how many pre-queue places were drawn now

local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return {'unknown'}
end
local target = ARGV[1]
if ARGV[3] ~= '' and state ~= ARGV[3] then
  return {'changed', state}
end
local given = tonumber(redis.call('GET', KEYS[2]) or '0') + (tonumber(redis.call('HGET', KEYS[11], 'later_seq')) or 0)
if target == 'prequeue' and state ~= 'prequeue' and given > 0 then
  return {'refused', state}
end

local drawn = 0
if state == 'prequeue' and (target == 'open' or target == 'paused') then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local order = redis.call('LRANGE', KEYS[14], 0, -1)
  local n = #order
  local base = queue_shuffle_place(order, ARGV[2])
  redis.call('HSET', KEYS[15], 'seed', ARGV[2], 'count', n, 'base', base, 'at_ms', now)
  -- A lottery's pool starts after the accounts drawn here.
  redis.call('HSET', KEYS[11], 'pool_from', n)
  redis.call('DEL', KEYS[13])
  drawn = n
end
redis.call('HSET', KEYS[1], 'state', target)
redis.call('HINCRBY', KEYS[1], 'version', 1)
return {'ok', target, drawn}
