-- acquire_hold: grant a basket of seats to one new hold token, all or nothing.
--
-- KEYS[1]     hold record (hash)            <p>hold:{evE}:token:<token>   fields account, seats, n, created, expires
-- KEYS[2]     account seats (sorted set)    <p>hold:{evE}:account:<id>    member "<token>:<n>", score = expiry
--                                                                          of the hold, or of the order's payment
--                                                                          deadline (ms); +inf once paid
-- KEYS[3]     seat map version (counter)    <p>seatmap:{evE}:version
-- KEYS[4]     seat map log (stream)         <p>seatmap:{evE}:log          (see lib/seatmap_log.lua)
-- KEYS[5]     seat map lapses (sorted set)  <p>seatmap:{evE}:lapses       member "h:<token>:<ARGV[6]>"
-- KEYS[6]     seat map taken (set)          <p>seatmap:{evE}:taken
-- KEYS[7..]   seat keys, in basket order    <p>hold:{evE}:seat:<seat>     value = hold token, or "sold:<token>"
-- ARGV[1]     hold token
-- ARGV[2]     account id
-- ARGV[3]     hold time to live (ms)
-- ARGV[4]     most seats one account may hold and buy per event (Postgres enforces it again at checkout)
-- ARGV[5]     how long the record outlives the hold (ms), so a late caller learns "expired", not "unknown"
-- ARGV[6]     the seat ids, comma-joined, in basket order
-- Returns     {1, expires_at_ms}   granted
--             {0, i}               refused: the i-th seat of the basket (1-based) is held or sold
--             {-1, counted}        refused: the account would exceed its cap (counted = held + bought now)
-- Time is Redis's own clock (TIME), never the caller's. The log gets every seat as held.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
local n = #KEYS - 6

for i = 7, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    return {0, i - 6}
  end
end

redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local counted = 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  counted = counted + tonumber(string.match(member, ':(%d+)$'))
end
-- A set without expiry that exists holds a paid order (reserve_seats persisted it).
local bought = redis.call('PTTL', KEYS[2]) == -1
if counted + n > tonumber(ARGV[4]) then
  return {-1, counted}
end

local expires = now + ttl
local changes = {}
for i = 7, #KEYS do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ttl)
  changes[#changes + 1] = seatmap_seat_of(KEYS[i]) .. ':h'
end
local keep = ttl + tonumber(ARGV[5])
redis.call('HSET', KEYS[1], 'account', ARGV[2], 'seats', ARGV[6], 'n', n, 'created', now, 'expires', expires)
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('ZADD', KEYS[2], expires, ARGV[1] .. ':' .. n)
-- An account that bought keeps its set for good (its count must survive); otherwise the set lives as long as
-- its longest hold.
if not bought and redis.call('PTTL', KEYS[2]) < keep then
  redis.call('PEXPIRE', KEYS[2], keep)
end
redis.call('ZADD', KEYS[5], expires, 'h:' .. ARGV[1] .. ':' .. ARGV[6])
seatmap_publish(KEYS[3], KEYS[4], KEYS[6], changes)
return {1, expires}
