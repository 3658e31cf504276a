-- queue_adapt: an `adaptive` room's admission rate follows how booking answers. Every gateway node adds what it
-- saw of booking's answers for the event since its last call (one bucket per second of Redis's clock, shared by
-- all nodes); then, at most once a second whichever node runs it, the rate is decided from the buckets of the
-- last five seconds (only those after the last cut, so one bad spell is not counted twice):
--   * trouble: some requests are waiting with nothing answered for twice target_p99_ms and at least a second
--     (booking stalled: a node says so, gateway/src/health.rs), or, over at least MIN_ANSWERS answers, more than 1% were slower than target_p99_ms (the 99th
--     percentile is over the target) or more than target_503_percent were 503s: the rate is halved, not below
--     rate_floor (multiplicative decrease);
--   * too few answers to judge, some of them slow or 503s: the rate stays;
--   * within five seconds of the last cut: the rate stays (a window that short says little);
--   * otherwise: the rate rises by a tenth of the range between floor and ceiling, not above rate_ceiling
--     (additive increase: from the floor to the ceiling in ten seconds).
-- The rate in force and the reason are written to the settings, where queue_admit reads them at its next step.
--
-- KEYS (the same twenty-nine for every queue script, built by gateway/src/store/keys.rs `QueueKeys`; this one uses):
--   1 settings (hash)     <p>queue:{evE}:settings  rate_mode, admit_per_minute, rate_floor, rate_ceiling,
--                                                   target_p99_ms, target_503_percent (read); rate_in_force,
--                                                   rate_reason (written)
--  11 stats (hash)        <p>queue:{evE}:stats     adapt_ms (the last decision), adapt_cut_ms (the last cut)
--  24 health (hash)       <p>queue:{evE}:health    "<second>:n|s|u|x" -> answers, slow ones, 503s, stalled requests
--                                                   seen in that second (Unix seconds); older than 10 s: removed
-- Time is Redis's own clock (TIME), never a node's.
-- ARGV[1..4]  this node's answers, slow answers, 503s since its last call, and requests stalled now
-- Returns     {"fixed"}                      the room's rate is not adaptive: nothing recorded
--             {"waiting", rate}              recorded; a decision was made less than a second ago
--             {"decided", rate, reason}      recorded, and the rate in force now, and why

local MIN_ANSWERS = 20
local WINDOW_MS = 5000

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call('HMGET', KEYS[1], 'rate_mode', 'admit_per_minute', 'rate_floor', 'rate_ceiling',
  'target_p99_ms', 'target_503_percent', 'rate_in_force')
if s[1] ~= 'adaptive' then
  return {'fixed'}
end
local ceiling = tonumber(s[4]) or 6000
local floor = math.min(tonumber(s[3]) or 60, ceiling)
local target_ms = tonumber(s[5]) or 1000
local target_503 = tonumber(s[6]) or 1
local rate = tonumber(s[7]) or tonumber(s[2]) or floor
rate = math.max(floor, math.min(ceiling, rate))

local sec = math.floor(now / 1000)
local add = {n = tonumber(ARGV[1]), s = tonumber(ARGV[2]), u = tonumber(ARGV[3]), x = tonumber(ARGV[4])}
for kind, count in pairs(add) do
  if count > 0 then
    redis.call('HINCRBY', KEYS[24], sec .. ':' .. kind, count)
  end
end
redis.call('PEXPIRE', KEYS[24], 60000)

local last = redis.call('HMGET', KEYS[11], 'adapt_ms', 'adapt_cut_ms')
local last_ms = tonumber(last[1] or '')
if last_ms and now >= last_ms and now - last_ms < 1000 then
  return {'waiting', rate}
end
local cut = tonumber(last[2] or '0') or 0
local from = math.max(now - WINDOW_MS, cut)
local from_sec = math.floor(from / 1000)
if from > now - WINDOW_MS then
  -- After a cut: the second it was made in holds answers from before it.
  from_sec = from_sec + 1
end
local sum = {n = 0, s = 0, u = 0, x = 0}
local fields = redis.call('HGETALL', KEYS[24])
local old = {}
for i = 1, #fields, 2 do
  local at, kind = string.match(fields[i], '^(%d+):(%a)$')
  at = tonumber(at)
  if at and at < sec - 10 then
    old[#old + 1] = fields[i]
  elseif at and at >= from_sec and sum[kind] then
    sum[kind] = sum[kind] + tonumber(fields[i + 1])
  end
end
if #old > 0 then
  redis.call('HDEL', KEYS[24], unpack(old))
end

local answers = sum.n
local reason
local next = rate
if sum.x > 0 then
  next = math.max(floor, math.floor(rate / 2))
  reason = 'booking stalled: requests waiting with nothing answered'
elseif answers >= MIN_ANSWERS and sum.s * 100 > answers then
  next = math.max(floor, math.floor(rate / 2))
  reason = string.format('p99 over %d ms: %d of %d answers slower', target_ms, sum.s, answers)
elseif answers >= MIN_ANSWERS and sum.u * 100 > answers * target_503 then
  next = math.max(floor, math.floor(rate / 2))
  reason = string.format('503s over %d%%: %d of %d answers', target_503, sum.u, answers)
elseif answers < MIN_ANSWERS and (sum.s > 0 or sum.u > 0) then
  reason = string.format('too few answers to judge (%d, %d slow, %d 503s): holding', answers, sum.s, sum.u)
elseif now - cut < WINDOW_MS then
  -- Right after a cut the window holds only a moment of answers: a stall that comes and goes (requests given up
  -- on, new ones sent) must not read as health. The rate rises again after a whole window without trouble.
  reason = string.format('holding: cut %.1f s ago', (now - cut) / 1000)
else
  next = math.min(ceiling, rate + math.max(1, math.ceil((ceiling - floor) / 10)))
  reason = string.format('booking within targets: %d answers, %d slower than %d ms, %d 503s', answers, sum.s,
    target_ms, sum.u)
end
if next < rate then
  redis.call('HSET', KEYS[11], 'adapt_cut_ms', now)
end
redis.call('HSET', KEYS[11], 'adapt_ms', now)
redis.call('HSET', KEYS[1], 'rate_in_force', next, 'rate_reason', reason)
return {'decided', next, reason}
