-- queue_join: give an account its one place in an event's queue, or in its pre-queue before the opening.
--
-- KEYS (the same seventeen for every queue script, built by gateway/src/store.rs `QueueKeys`):
--   1 settings (hash)     <p>queue:{evE}:settings  state, admit_per_minute, max_active, session_seconds,
--                                                   abandon_after_seconds, opens_at (Unix ms, 0 = none), version,
--                                                   challenge (on, auto: a new place costs a solved challenge),
--                                                   places_per_network (0 = no cap)
--   2 seq (counter)       <p>queue:{evE}:seq       the last place given out (places count from 1)
--   3 head (counter)      <p>queue:{evE}:head      the last place the admission step has passed
--   4 places (hash)       <p>queue:{evE}:places    account -> place
--   5 who (hash)          <p>queue:{evE}:who       place -> account
--   6 joined (hash)       <p>queue:{evE}:joined    account -> when it joined (ms)
--   7 seen (sorted set)   <p>queue:{evE}:seen      account, score = when it last joined or polled (ms)
--   8 active (sorted set) <p>queue:{evE}:active    account, score = when it was admitted (ms)
--   9 skipped (zset)      <p>queue:{evE}:skipped   place (score = place) of each fan skipped as abandoned
--  10 batches (zset)      <p>queue:{evE}:batches   "from:to:at_ms:admitted", score = to: each step that moved head
--  11 stats (hash)        <p>queue:{evE}:stats     credit, last_ms, admitted_total, abandoned_total
--  12 waits (list)        <p>queue:{evE}:waits     the waits (ms) of the last 1000 admitted fans, newest first
--  13 pre (set)           <p>queue:{evE}:pre       accounts in the pre-queue
--  14 prelist (list)      <p>queue:{evE}:prelist   the same accounts in join order (kept after opening, for audit)
--  15 shuffle (hash)      <p>queue:{evE}:shuffle   seed, count, base, at_ms of the pre-queue draw
--  16 spent (zset)        <p>queue:{evE}:spent     nonce of each challenge a join was paid with, score = its expiry (ms)
--  17 networks (hash)     <p>queue:{evE}:networks  client network (address prefix) -> places it was given
-- Time is Redis's own clock (TIME), never a node's.
-- ARGV[1]     account id
-- ARGV[2]     the highest place the calling node knows was given out (0: none): a new place is above it
-- ARGV[3]     the nonce of the challenge the join solved, checked by the gateway ("" when none was sent)
-- ARGV[4]     when that challenge expires, Unix ms (its nonce is remembered until then)
-- ARGV[5]     the client's network (its address prefix, as the gateway reads the client's address; "" unknown)
-- Returns     {"unknown"}                       no waiting room is configured for this event
--             {"challenge"}                     the room's challenge is on and the join solved none: nothing done
--             {"spent"}                         that challenge already paid for a join: nothing done
--             {"network_full", cap}             the client's network was given places_per_network places already
--             {"closed", state}                 the queue takes nobody (state closed or sold_out)
--             {"opening"}                       the pre-queue's opening time has passed: open it, then join again
--             {"pre", count}                    in the pre-queue (count = how many are in it)
--             {"place", place, head, fresh}     the account's place (fresh = 1 if given now)
-- Joining again returns the same place while the fan waits or is admitted within its session; a fan skipped as
-- abandoned, or whose session ended, gets a new place at the back. With the challenge on, a join that sends
-- none is answered only with a place the account already holds; a solved challenge is spent by the first join
-- that gives or returns a place with it (a refusal spends nothing). Each network (address prefix) is given at
-- most places_per_network places in a room, counted as they are given.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call('HMGET', KEYS[1], 'state', 'session_seconds', 'opens_at', 'challenge', 'places_per_network')
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
if state == 'prequeue' then
  local member = redis.call('SISMEMBER', KEYS[13], account) == 1
  if not member then
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
  redis.call('ZADD', KEYS[7], now, account)
  if not member then
    redis.call('SADD', KEYS[13], account)
    redis.call('RPUSH', KEYS[14], account)
    redis.call('HSET', KEYS[6], account, now)
    counted()
  end
  return {'pre', redis.call('SCARD', KEYS[13])}
end

local head = tonumber(redis.call('GET', KEYS[3]) or '0')
local place = tonumber(redis.call('HGET', KEYS[4], account) or '0')
if held(place, head) then
  if not pay() then
    return {'spent'}
  end
  redis.call('ZADD', KEYS[7], now, account)
  return {'place', place, head, 0}
end
if gated and nonce == '' then
  return {'challenge'}
end
if full() then
  return {'network_full', cap}
end
if not pay() then
  return {'spent'}
end
redis.call('ZADD', KEYS[7], now, account)
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
