-- release_seats: after Postgres took an order's seats off it (payment failed, cancelled, refunded), put them
-- back on sale in Redis: compare-and-delete, so only this order's own markers go, never a later sale's.
--
-- KEYS[1]     account seats (sorted set)    <p>hold:{evE}:account:<id>    the order's member "<token>:<n>" goes
-- KEYS[2]     seat map version (counter)    <p>seatmap:{evE}:version
-- KEYS[3]     seat map log (stream)         <p>seatmap:{evE}:log          every seat freed, as available
-- KEYS[4]     seat map lapses (sorted set)  <p>seatmap:{evE}:lapses       the order's member goes
-- KEYS[5..]   seat keys of the order
-- ARGV[1]     hold token of the order
-- ARGV[2]     seats in the order (n)
-- Returns     the number of seats put back on sale

local marker = 'sold:' .. ARGV[1]
local freed = 0
local changes = {}
local seat_keys = {}
for i = 5, #KEYS do
  if redis.call('GET', KEYS[i]) == marker then
    redis.call('DEL', KEYS[i])
    freed = freed + 1
    changes[#changes + 1] = seatmap_seat_of(KEYS[i]) .. ':a'
  end
  seat_keys[#seat_keys + 1] = KEYS[i]
end
redis.call('ZREM', KEYS[1], ARGV[1] .. ':' .. ARGV[2])
redis.call('ZREM', KEYS[4], seatmap_sold_member(ARGV[1], seat_keys))
-- Run again (the sweeper's repair pass), it frees nothing and logs nothing: the map version moves only when a
-- seat changes.
seatmap_publish(KEYS[2], KEYS[3], changes)
return freed
