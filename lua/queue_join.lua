-- queue_join: give an account its one place in an event's queue, or in its pre-queue before the opening.
--
-- KEYS (the same twenty-nine for every queue script, built by gateway/src/store/keys.rs `QueueKeys`):
--   1 settings (hash)     <p>queue:{evE}:settings  state, admit_per_minute, max_active, session_seconds,
--                                                   abandon_after_seconds, opens_at (Unix ms, 0 = none), version,
--                                                   challenge (on, auto: a new place costs a solved challenge),
--                                                   places_per_network (0 = no cap), access (public,
--                                                   code_required, codes_first), queueing, queue_all
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
-- ARGV[1]     account id
-- ARGV[2]     the highest place the calling node knows was given out (0: none): a new place is above it
-- ARGV[3]     the nonce of the challenge the join solved, checked by the gateway ("" when none was sent)
-- ARGV[4]     when that challenge expires, Unix ms (its nonce is remembered until then)
-- ARGV[5]     the client's network (its address prefix, as the gateway reads the client's address; "" unknown)
-- ARGV[6]     the presale code the join sent, normalised by the gateway ("" when none)
-- Returns     {"unknown"}                       no waiting room is configured for this event
--             {"challenge"}                     the room's challenge is on and the join solved none: nothing done
--             {"spent"}                         that challenge already paid for a join: nothing done
--             {"network_full", cap}             the client's network was given places_per_network places already
--             {"closed", state}                 the queue takes nobody (state closed or sold_out)
--             {"opening"}                       the pre-queue's opening time has passed: open it, then join again
--             {"pre", count}                    in the pre-queue (count = how many are in it)
--             {"pool", count}                   in a lottery room's pool for its next draw (count in it)
--             {"place", place, head, fresh}     the account's place (fresh = 1 if given now)
--             {"later", number, position}       in the line behind the code holders: number in that line, and
--                                               the position (every queue place waiting comes first)
--             {"code_required"}                 the room takes code holders only and the join sent no code
--             {"code_unknown"}                  no such code in this room
--             {"code_spent"}                    the code was redeemed by as many accounts as it allows
--             {"code_not_yet", starts_ms}       the code's window has not begun
--             {"code_ended", ends_ms}           the code's window is over
--             {"no_places"}                     a `reject` room cannot let the fan in now: turned away
-- Joining again returns the same place while the fan waits or is admitted within its session; a fan skipped as
-- abandoned, or whose session ended, gets a new place at the back. With the challenge on, a join that sends
-- none is answered only with a place the account already holds; a solved challenge is spent by the first join
-- that gives or returns a place with it (a refusal spends nothing). Each network (address prefix) is given at
-- most places_per_network places in a room, counted as they are given.
-- A `lottery` room gives no place at the join: the fan enters the pool its next draw places (queue_draw.lua).
-- A `reject` room gives a new place only to a fan who can go in at once (open, a free slot, nobody waiting);
-- any other is turned away ({"no_places"}), before anything is spent.
-- Presale codes (access code_required or codes_first): a code is redeemed by the join that gives or returns a
-- place with it, once per account; an account that redeemed one here is a code holder for good, and joins again
-- without sending it. Code holders get places in the queue itself. Under codes_first, a fan without one gets a
-- number in the line behind them (KEYS 21, 22), which the admission step moves into the queue only when no
-- code holder is waiting; that line is kept, first come first served, until it is empty, whatever the access
-- is meanwhile. A refused code changes nothing. In the pre-queue, code holders and the others are drawn
-- together.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call('HMGET', KEYS[1], 'state', 'session_seconds', 'opens_at', 'challenge', 'places_per_network',
  'access', 'queueing', 'max_active', 'queue_all')
local state = s[1]
if not state then
  return {'unknown'}
end
if state == 'closed' or state == 'sold_out' then
  return {'closed', state}
end
local account = ARGV[1]
local gated = s[4] == 'on' or s[4] == 'auto'
local nonce = ARGV[3] or ''
local network = ARGV[5] or ''
local cap = tonumber(s[5] or '0') or 0
local access = s[6] or 'public'
local code = ARGV[6] or ''
-- Whether the account redeemed a code in this room before.
local holder = redis.call('HEXISTS', KEYS[20], account) == 1
-- The code to redeem when the join gives or returns a place ("" none).
local redeem = ''
if access ~= 'public' and not holder then
  if code ~= '' then
    local meta = redis.call('HGET', KEYS[18], code)
    if not meta then
      return {'code_unknown'}
    end
    local _, uses_cap, starts, ends = string.match(meta, '^([^:]*):(%d+):(%d+):(%d+)$')
    starts, ends = tonumber(starts), tonumber(ends)
    if now < starts then
      return {'code_not_yet', starts}
    end
    if ends > 0 and now >= ends then
      return {'code_ended', ends}
    end
    if tonumber(redis.call('HGET', KEYS[19], code) or '0') >= tonumber(uses_cap) then
      return {'code_spent'}
    end
    redeem = code
  end
end
local coded = holder or redeem ~= ''
-- A room that takes code holders only gives no new place without a code (a place held is returned).
local required = access == 'code_required' and not coded
if state == 'prequeue' then
  local opens = tonumber(s[3] or '0') or 0
  if opens > 0 and now >= opens then
    return {'opening'}
  end
end
-- Spends the challenge the join sent, if it is to pay: false if it already paid for a join.
local function pay()
  if not gated or nonce == '' then
    return true
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[16], '-inf', now)
  return redis.call('ZADD', KEYS[16], 'NX', tonumber(ARGV[4]) or now, nonce) == 1
end
-- Whether the client's network has had its share of places.
local function full()
  return cap > 0 and network ~= '' and tonumber(redis.call('HGET', KEYS[17], network) or '0') >= cap
end
local function counted()
  if network ~= '' then
    redis.call('HINCRBY', KEYS[17], network, 1)
  end
end
-- Records the code's redemption by this account, if the join sent one to redeem.
local function redeemed()
  if redeem ~= '' then
    redis.call('HINCRBY', KEYS[19], redeem, 1)
    redis.call('HSET', KEYS[20], account, redeem .. ':' .. now)
  end
end
-- The position of number n in the line behind the code holders.
local function later_position(n, head)
  local seq = tonumber(redis.call('GET', KEYS[2]) or '0')
  local lhead = tonumber(redis.call('HGET', KEYS[11], 'later_head') or '0')
  return math.max(0, seq - head) + n - lhead
end
-- Whether the account holds a place that joining again returns as it is (waiting, or admitted within its
-- session).
local function held(place, head)
  if place == 0 then
    return false
  end
  if place > head then
    return true
  end
  local admitted = tonumber(redis.call('ZSCORE', KEYS[8], account) or '0')
  return admitted > now - tonumber(s[2] or '0') * 1000
end
-- Into the unordered pool (the pre-queue's, or a lottery's next draw), or already in it: answered as `kind`.
local function enter_pool(kind)
  local member = redis.call('SISMEMBER', KEYS[13], account) == 1
  if not member then
    if required then
      return {'code_required'}
    end
    if gated and nonce == '' then
      return {'challenge'}
    end
    if full() then
      return {'network_full', cap}
    end
  end
  if not pay() then
    return {'spent'}
  end
  redeemed()
  redis.call('ZADD', KEYS[7], now, account)
  if not member then
    redis.call('SADD', KEYS[13], account)
    redis.call('RPUSH', KEYS[14], account)
    redis.call('HSET', KEYS[6], account, now)
    counted()
  end
  return {kind, redis.call('SCARD', KEYS[13])}
end
if state == 'prequeue' then
  return enter_pool('pre')
end

local head = tonumber(redis.call('GET', KEYS[3]) or '0')
local place = tonumber(redis.call('HGET', KEYS[4], account) or '0')
if held(place, head) then
  if not pay() then
    return {'spent'}
  end
  redeemed()
  redis.call('ZADD', KEYS[7], now, account)
  return {'place', place, head, 0}
end
if s[7] == 'lottery' then
  -- The pool for the next draw (queue_draw.lua).
  return enter_pool('pool')
end
local lhead = tonumber(redis.call('HGET', KEYS[11], 'later_head') or '0')
local later = tonumber(redis.call('HGET', KEYS[21], account) or '0')
if later > lhead and not coded then
  -- Waiting behind the code holders already: the same number.
  if not pay() then
    return {'spent'}
  end
  redis.call('ZADD', KEYS[7], now, account)
  return {'later', later, later_position(later, head)}
end
if required then
  return {'code_required'}
end
if gated and nonce == '' then
  return {'challenge'}
end
if full() then
  return {'network_full', cap}
end
if s[7] == 'reject' then
  -- A new place only for a fan who goes in at once: the room is open and letting fans in, has a free slot,
  -- and nobody waits.
  local waiting = tonumber(redis.call('GET', KEYS[2]) or '0') > head
    or tonumber(redis.call('HGET', KEYS[11], 'later_seq') or '0') > lhead
  local inside = redis.call('ZCOUNT', KEYS[8], '(' .. (now - tonumber(s[2] or '0') * 1000), '+inf')
  if state ~= 'open' or s[9] == '1' or waiting or inside >= (tonumber(s[8]) or 0) then
    return {'no_places'}
  end
end
if not pay() then
  return {'spent'}
end
redeemed()
redis.call('ZADD', KEYS[7], now, account)
if later > lhead then
  -- Moving from the line behind the code holders into the queue: the number is given up.
  redis.call('HDEL', KEYS[21], account)
end
if not coded and (access == 'codes_first' or tonumber(redis.call('HGET', KEYS[11], 'later_seq') or '0') > lhead) then
  -- Behind every code holder, and behind everyone already in this line.
  local n = redis.call('HINCRBY', KEYS[11], 'later_seq', 1)
  redis.call('HSET', KEYS[21], account, n)
  redis.call('HSET', KEYS[22], n, account)
  redis.call('HSET', KEYS[6], account, now)
  counted()
  return {'later', n, later_position(n, head)}
end
place = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[2] or '0') or 0
if place <= floor then
  -- The counter is behind a place already given out: Redis lost writes (a failover, a restart, a flush). Go on
  -- from beyond it, so that nobody joining now is put ahead of a fan who holds a later place.
  place = floor + 1
  redis.call('SET', KEYS[2], place)
end
redis.call('HSET', KEYS[4], account, place)
redis.call('HSET', KEYS[5], place, account)
redis.call('HSET', KEYS[6], account, now)
counted()
return {'place', place, head, 1}
