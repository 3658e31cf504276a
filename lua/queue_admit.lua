-- queue_admit: one admission step. Any gateway node may run it at any time, as often as it likes: the rate
-- comes from Redis's clock, not from how often or where the step runs, so there is no leader and no double
-- admission.
--
-- Credit accrues at the room's rate (admit_per_minute, or the adaptive rate in force) by the time elapsed since the previous step (of any node), capped at
-- ARGV[2] ms worth (at least one fan); a room that has just opened starts with that full burst. The step then walks the queue from the head in place order: a fan not
-- seen for abandon_after_seconds is skipped (counted, and its place released) without spending credit; any
-- other fan is admitted, spending one credit, while fewer than max_active fans were admitted within the last
-- session_seconds. When nobody waits in the queue itself, the next fan of the line behind the code holders
-- (a codes_first room's fans without a code) takes the next place first, or is skipped as abandoned (counted,
-- no place given).
--
-- KEYS (the same twenty-nine for every queue script, built by gateway/src/store/keys.rs `QueueKeys`):
--   1 settings (hash)     <p>queue:{evE}:settings  state, admit_per_minute, max_active, session_seconds,
--                                                   abandon_after_seconds, opens_at (Unix ms, 0 = none), version,
--                                                   all_held (1: every seat left is held; nobody is admitted),
--                                                   rate_mode, rate_in_force, rate_floor, rate_ceiling (adaptive:
--                                                   the rate is rate_in_force, see queue_adapt.lua), queueing
--                                                   (passthrough, reject: no rate, slots only), queue_all (1:
--                                                   nobody is admitted)
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
--  24 health (hash)       <p>queue:{evE}:health    booking's answers per second, as the nodes saw them (see
--                                                   queue_adapt.lua)
-- Time is Redis's own clock (TIME), never a node's.
-- ARGV[1]     most places one step may walk past (bounds the script's run time)
-- ARGV[2]     burst: the most credit that may accrue, in ms of the admission rate
-- Returns     {"idle", state}                   the queue is not open, every seat left is held (state
--                                               "all_held"), or the room queues all ("queue_all"): nothing
--                                               admitted (credit resets to a burst)
--             {"opening"}                       the pre-queue's opening time has passed: open it first
--             {"stepped", head, seq, admitted, skipped}

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call('HMGET', KEYS[1], 'state', 'admit_per_minute', 'max_active', 'session_seconds',
  'abandon_after_seconds', 'opens_at', 'all_held', 'rate_mode', 'rate_in_force', 'rate_floor', 'rate_ceiling',
  'queueing', 'queue_all')
local state = s[1]
if state == 'open' and (s[7] == '1' or s[13] == '1') then
  redis.call('HSET', KEYS[11], 'last_ms', now, 'credit', -1)
  return {'idle', s[7] == '1' and 'all_held' or 'queue_all'}
end
if state ~= 'open' then
  redis.call('HSET', KEYS[11], 'last_ms', now, 'credit', -1)
  if state == 'prequeue' then
    local opens = tonumber(s[6] or '0') or 0
    if opens > 0 and now >= opens then
      return {'opening'}
    end
  end
  return {'idle', state or 'unknown'}
end
local rate = tonumber(s[2])
if s[8] == 'adaptive' then
  -- The rate queue_adapt decided; before its first decision, the operators' rate within the bounds.
  local ceiling = tonumber(s[11]) or rate
  local floor = math.min(tonumber(s[10]) or rate, ceiling)
  rate = math.max(floor, math.min(ceiling, tonumber(s[9]) or rate))
end
local max_active = tonumber(s[3])
local session = tonumber(s[4]) * 1000
local abandon = tonumber(s[5]) * 1000

local st = redis.call('HMGET', KEYS[11], 'credit', 'last_ms')
local last = tonumber(st[2] or now) or now
local credit = tonumber(st[1] or '-1') or -1
local cap = math.max(1, rate * tonumber(ARGV[2]) / 60000)
if credit < 0 then
  -- Just opened (or resumed): a full burst, so the first fans in an empty room go in at once.
  credit = cap
else
  credit = math.min(credit + math.max(0, now - last) * rate / 60000, cap)
end

-- passthrough and reject let fans in as fast as slots allow: the rate does not count.
local unlimited = s[12] == 'passthrough' or s[12] == 'reject'
if unlimited then
  credit = tonumber(ARGV[1]) + 1
end

redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', '(' .. (now - session))
local room = max_active - redis.call('ZCARD', KEYS[8])
local head = tonumber(redis.call('GET', KEYS[3]) or '0')
local seq = tonumber(redis.call('GET', KEYS[2]) or '0')
local from = head
local admitted, skipped, walked = 0, 0, 0
local limit = tonumber(ARGV[1])
local lseq = tonumber(redis.call('HGET', KEYS[11], 'later_seq') or '0')
local lhead = tonumber(redis.call('HGET', KEYS[11], 'later_head') or '0')
local lfrom = lhead
local gone, promoted = 0, 0
while (head < seq or lhead < lseq) and admitted + 1 <= credit and admitted < room and walked < limit do
  if head == seq then
    -- Nobody waits in the queue itself: the next fan of the line behind the code holders takes the next place
    -- (unless gone, or moved into the queue on a code meanwhile).
    lhead = lhead + 1
    local account = redis.call('HGET', KEYS[22], lhead)
    redis.call('HDEL', KEYS[22], lhead)
    if account and tonumber(redis.call('HGET', KEYS[21], account) or '0') == lhead then
      redis.call('HDEL', KEYS[21], account)
      local seen = tonumber(redis.call('ZSCORE', KEYS[7], account) or '0')
      if now - seen > abandon then
        gone = gone + 1
      else
        seq = seq + 1
        promoted = promoted + 1
        redis.call('SET', KEYS[2], seq)
        redis.call('HSET', KEYS[4], account, seq)
        redis.call('HSET', KEYS[5], seq, account)
      end
    end
  else
    local place = head + 1
    local account = redis.call('HGET', KEYS[5], place)
    if account then
      local seen = tonumber(redis.call('ZSCORE', KEYS[7], account) or '0')
      if now - seen > abandon then
        redis.call('ZADD', KEYS[9], place, place)
        if tonumber(redis.call('HGET', KEYS[4], account) or '0') == place then
          redis.call('HDEL', KEYS[4], account)
        end
        skipped = skipped + 1
      else
        redis.call('ZADD', KEYS[8], now, account)
        local joined = tonumber(redis.call('HGET', KEYS[6], account) or now)
        redis.call('LPUSH', KEYS[12], now - joined)
        admitted = admitted + 1
      end
    end
    head = place
  end
  walked = walked + 1
end
if lhead > lfrom then
  redis.call('HSET', KEYS[11], 'later_head', lhead)
  redis.call('HINCRBY', KEYS[11], 'abandoned_total', gone)
  redis.call('HINCRBY', KEYS[11], 'later_promoted', promoted)
end

if unlimited then
  credit = cap + admitted
end
redis.call('HSET', KEYS[11], 'credit', tostring(credit - admitted), 'last_ms', now)
if head > from then
  redis.call('SET', KEYS[3], head)
  redis.call('ZADD', KEYS[10], head, from .. ':' .. head .. ':' .. now .. ':' .. admitted)
  redis.call('HINCRBY', KEYS[11], 'admitted_total', admitted)
  redis.call('HINCRBY', KEYS[11], 'abandoned_total', skipped)
  redis.call('LTRIM', KEYS[12], 0, 999)
end
return {'stepped', head, seq, admitted, skipped + gone}
