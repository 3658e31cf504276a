-- release_seats: after Postgres took an order's seats off it (payment failed, cancelled, refunded), put them
-- back on sale in Redis: compare-and-delete, so only this order's own markers go, never a later sale's.
--
-- KEYS[1]     account seats (sorted set)    <p>hold:{evE}:account:<id>    the order's member "<token>:<n>" goes
-- KEYS[2]     seat map version (counter)    <p>seatmap:{evE}:version
-- KEYS[3..]   seat keys of the order
-- ARGV[1]     hold token of the order
-- ARGV[2]     seats in the order (n)
-- Returns     the number of seats put back on sale

local marker = 'sold:' .. ARGV[1]
local freed = 0
for i = 3, #KEYS do
  if redis.call('GET', KEYS[i]) == marker then
    redis.call('DEL', KEYS[i])
    freed = freed + 1
  end
end
local uncounted = redis.call('ZREM', KEYS[1], ARGV[1] .. ':' .. ARGV[2])
-- Run again (the sweeper's repair pass), it changes nothing and says so: the map version moves only on change.
if freed > 0 or uncounted > 0 then
  redis.call('INCR', KEYS[2])
end
return freed
