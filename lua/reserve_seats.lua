-- reserve_seats: after Postgres wrote an order, mark its seats taken in Redis so later holds are refused
-- without a database round trip: at checkout (until the payment deadline), when the deadline is extended, and
-- when the order is paid (for good). Postgres stays the guarantee if this never runs (Redis flushed,
-- restarted or failed over); a marker only ever lapses early, never late.
--
-- KEYS[1]     hold record (hash)            <p>hold:{evE}:token:<token>   deleted: the hold became an order
-- KEYS[2]     account seats (sorted set)    <p>hold:{evE}:account:<id>    member "<token>:<n>", score = the
--                                                                          deadline (ms), or +inf once paid
-- KEYS[3]     seat map version (counter)    <p>seatmap:{evE}:version
-- KEYS[4..]   seat keys of the order
-- ARGV[1]     hold token of the order
-- ARGV[2]     seats in the order (n)
-- ARGV[3]     the payment deadline (unix ms), or 0 when paid: the markers never lapse
-- ARGV[4]     1 to mark every seat whatever it holds now (Postgres just gave the seats to this order, e.g. a
--             late payment); 0 to mark only seats still carrying the hold's token or this order's marker
-- ARGV[5]     how long the account set outlives its last deadline (ms)
-- Returns     the number of seats marked
-- Marker value: "sold:<token>", so releasing the order later deletes only its own markers.

local marker = 'sold:' .. ARGV[1]
local due = tonumber(ARGV[3])
local force = ARGV[4] == '1'
local marked = 0
for i = 4, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if force or v == ARGV[1] or v == marker then
    if due > 0 then
      redis.call('SET', KEYS[i], marker, 'PXAT', due)
    else
      redis.call('SET', KEYS[i], marker)
    end
    marked = marked + 1
  end
end
-- The account's count follows the order: it lapses with the deadline and stays for good once paid.
local member = ARGV[1] .. ':' .. ARGV[2]
if due > 0 then
  redis.call('ZADD', KEYS[2], due, member)
  local pttl = redis.call('PTTL', KEYS[2])
  local keep_until = due + tonumber(ARGV[5])
  if pttl ~= -1 then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if pttl < keep_until - now then
      redis.call('PEXPIREAT', KEYS[2], keep_until)
    end
  end
else
  redis.call('ZADD', KEYS[2], '+inf', member)
  redis.call('PERSIST', KEYS[2])
end
redis.call('DEL', KEYS[1])
redis.call('INCR', KEYS[3])
return marked
