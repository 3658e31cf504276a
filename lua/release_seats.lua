-- release_seats: after Postgres took an order's seats off it (payment failed, cancelled, refunded), put them
-- back on sale in Redis: compare-and-delete, so only this order's own markers go, never a later sale's.
--
-- KEYS[1]     account seats (sorted set)    <p>hold:{evE}:account:<id>    the order's member "<token>:<n>" goes
-- KEYS[2]     seat map version (counter)    <p>seatmap:{evE}:version
-- KEYS[3]     seat map log (stream)         <p>seatmap:{evE}:log          every seat freed, as available
-- KEYS[4]     seat map lapses (sorted set)  <p>seatmap:{evE}:lapses       the order's member goes
-- KEYS[5]     seat map taken (set)          <p>seatmap:{evE}:taken
-- KEYS[6..]   seat keys of the order
-- ARGV[1]     hold token of the order
-- ARGV[2]     seats in the order (n)
-- Returns     the number of seats put back on sale

local marker = 'sold:' .. ARGV[1]
local seat_keys = {}
for i = 6, #KEYS do
  seat_keys[#seat_keys + 1] = KEYS[i]
end
-- Still in the lapse index: a marker that ran out at the deadline has not been logged as available yet. The
-- index forgets the order here, so its lapsed seats (free now) are logged here.
local unlogged = redis.call('ZREM', KEYS[4], seatmap_sold_member(ARGV[1], seat_keys)) == 1
local freed = 0
local changes = {}
for i = 6, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v == marker then
    redis.call('DEL', KEYS[i])
    freed = freed + 1
    changes[#changes + 1] = seatmap_seat_of(KEYS[i]) .. ':a'
  elseif not v and unlogged then
    changes[#changes + 1] = seatmap_seat_of(KEYS[i]) .. ':a'
  end
end
redis.call('ZREM', KEYS[1], ARGV[1] .. ':' .. ARGV[2])
-- Run again (the sweeper's repair pass), it frees nothing and logs nothing: the map version moves only when a
-- seat changes.
seatmap_publish(KEYS[2], KEYS[3], KEYS[5], changes)
return freed
