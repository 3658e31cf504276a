-- queue_tune_challenge: the difficulty of a room whose challenge is `auto` follows the surge. Once a window has
-- passed since the last decision, the joins made in it (places given, and pre-queue entries) are set against
-- the fans the room admits in that time at its rate: more joins than that, and the difficulty doubles; fewer
-- than half, and it halves; always within the room's bounds. Any gateway node may run it on every tick: the
-- window is measured on Redis's clock and the decision is recorded, so it is made once per window, not once
-- per node.
--
-- KEYS (the same twenty-nine for every queue script, built by gateway/src/store/keys.rs `QueueKeys`; this one reads):
--   1 settings (hash)     <p>queue:{evE}:settings  challenge, challenge_difficulty, challenge_min_difficulty,
--                                                   challenge_max_difficulty, challenge_window_seconds,
--                                                   admit_per_minute, rate_mode, rate_in_force (the rate in force)
--                                                   (written: challenge_difficulty, version)
--   2 seq (counter)       <p>queue:{evE}:seq       the last place given out
--  11 stats (hash)        <p>queue:{evE}:stats     tune_ms, tune_joins: when the last decision was made, and the
--                                                   joins counted then (written); later_seq, later_promoted
--  13 pre (set)           <p>queue:{evE}:pre       accounts in the pre-queue
-- Time is Redis's own clock (TIME), never a node's.
-- ARGV        none
-- Returns     {"manual"}                              the room's challenge is not `auto`: nothing done
--             {"waiting", difficulty}                 the window is not over (or has just begun)
--             {"tuned", difficulty, joins, capacity}  a decision: the difficulty now, and what it was made on

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call('HMGET', KEYS[1], 'challenge', 'challenge_difficulty', 'challenge_min_difficulty',
  'challenge_max_difficulty', 'challenge_window_seconds', 'admit_per_minute', 'rate_mode', 'rate_in_force')
if s[1] ~= 'auto' then
  return {'manual'}
end
local difficulty = tonumber(s[2]) or 60000
local lowest = tonumber(s[3]) or difficulty
local highest = tonumber(s[4]) or difficulty
local window = (tonumber(s[5]) or 10) * 1000
local rate = tonumber(s[6]) or 0
if s[7] == 'adaptive' then
  rate = tonumber(s[8]) or rate
end
-- Places given, pre-queue entries, and numbers in the line behind the code holders (a number moved into the
-- queue is one join, not two).
local counters = redis.call('HMGET', KEYS[11], 'later_seq', 'later_promoted')
local joins = tonumber(redis.call('GET', KEYS[2]) or '0') + redis.call('SCARD', KEYS[13])
  + (tonumber(counters[1]) or 0) - (tonumber(counters[2]) or 0)
local last = redis.call('HMGET', KEYS[11], 'tune_ms', 'tune_joins')
local since = tonumber(last[1] or '')
if not since or now < since then
  redis.call('HSET', KEYS[11], 'tune_ms', now, 'tune_joins', joins)
  return {'waiting', difficulty}
end
if now - since < window then
  return {'waiting', difficulty}
end
local made = joins - (tonumber(last[2]) or joins)
local capacity = rate * (now - since) / 60000
local next = difficulty
if made > capacity then
  next = difficulty * 2
elseif made * 2 < capacity then
  next = math.floor(difficulty / 2)
end
next = math.max(lowest, math.min(highest, next))
redis.call('HSET', KEYS[11], 'tune_ms', now, 'tune_joins', joins)
if next ~= difficulty then
  redis.call('HSET', KEYS[1], 'challenge_difficulty', next)
  redis.call('HINCRBY', KEYS[1], 'version', 1)
end
return {'tuned', next, made, math.floor(capacity)}
