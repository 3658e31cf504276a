-- extend_hold: compare-and-set. Pushes the expiry of a live hold, never past its absolute cap.
--
-- KEYS[1]     hold record (hash)            <p>hold:{evE}:token:<token>
-- KEYS[2]     account holds (sorted set)    <p>hold:{evE}:account:<id>
-- KEYS[3]     seat map version (counter)    <p>seatmap:{evE}:version      (not used: the map does not change)
-- KEYS[4]     seat map log (stream)         <p>seatmap:{evE}:log          (not used)
-- KEYS[5]     seat map lapses (sorted set)  <p>seatmap:{evE}:lapses       the hold's member moves to the new
--                                                                          expiry
-- KEYS[6]     seat map taken (set)          <p>seatmap:{evE}:taken        (not used)
-- KEYS[7..]   seat keys of the hold, as its record lists them
-- ARGV[1]     hold token
-- ARGV[2]     account id of the caller
-- ARGV[3]     the record's seat list, comma-joined, as read by the caller
-- ARGV[4]     extension: new expiry = now + this (ms)
-- ARGV[5]     absolute cap: expiry never passes created + this (ms)
-- ARGV[6]     how long the record outlives the hold (ms)
-- Returns     {1, expires_at_ms}   extended (or already at the cap: the unchanged expiry)
--             {0, i}               refused: the hold expired, or its i-th seat (1-based) is no longer its own
--                                  (i = 0 when the hold's own expiry has passed)
--             {-1}                 another account's hold
--             {-2}                 no such hold
--             {-3}                 the record changed since the caller read it

local account = redis.call('HGET', KEYS[1], 'account')
if not account then
  return {-2}
end
if account ~= ARGV[2] then
  return {-1}
end
if redis.call('HGET', KEYS[1], 'seats') ~= ARGV[3] then
  return {-3}
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expires = tonumber(redis.call('HGET', KEYS[1], 'expires'))
if expires <= now then
  return {0, 0}
end
for i = 7, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then
    return {0, i - 6}
  end
end

local cap = tonumber(redis.call('HGET', KEYS[1], 'created')) + tonumber(ARGV[5])
local wanted = math.min(now + tonumber(ARGV[4]), cap)
if wanted <= expires then
  return {1, expires}
end
for i = 7, #KEYS do
  redis.call('PEXPIREAT', KEYS[i], wanted)
end
redis.call('ZADD', KEYS[5], wanted, 'h:' .. ARGV[1] .. ':' .. ARGV[3])
redis.call('HSET', KEYS[1], 'expires', wanted)
redis.call('PEXPIREAT', KEYS[1], wanted + tonumber(ARGV[6]))
local n = redis.call('HGET', KEYS[1], 'n')
redis.call('ZADD', KEYS[2], wanted, ARGV[1] .. ':' .. n)
local pttl = redis.call('PTTL', KEYS[2])
if pttl >= 0 and pttl < wanted - now + tonumber(ARGV[6]) then
  redis.call('PEXPIREAT', KEYS[2], wanted + tonumber(ARGV[6]))
end
return {1, wanted}
