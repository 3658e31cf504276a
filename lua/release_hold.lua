-- release_hold: compare-and-delete. Frees only the seats that still carry this hold token.
--
-- KEYS[1]     hold record (hash)            <p>hold:{evE}:token:<token>
-- KEYS[2]     account holds (sorted set)    <p>hold:{evE}:account:<id>
-- KEYS[3]     seat map version (counter)    <p>seatmap:{evE}:version
-- KEYS[4]     seat map log (stream)         <p>seatmap:{evE}:log
-- KEYS[5]     seat map lapses (sorted set)  <p>seatmap:{evE}:lapses
-- KEYS[6]     seat map taken (set)          <p>seatmap:{evE}:taken
-- KEYS[7..]   seat keys of the hold, as its record lists them
-- ARGV[1]     hold token
-- ARGV[2]     account id of the caller
-- ARGV[3]     the record's seat list, comma-joined, as read by the caller
-- Returns     {1, released}   the record is gone; released = seats that were still this token's
--             {-1}            the hold belongs to another account: nothing changed
--             {-2}            no such hold (never existed, released, or long expired)
--             {-3}            the record changed since the caller read it: nothing changed, read again

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

-- Still in the lapse index: a seat of the hold that ran out has not been logged as available yet. The index
-- forgets the hold here, so its lapsed seats (free now) are logged here.
local unlogged = redis.call('ZREM', KEYS[5], 'h:' .. ARGV[1] .. ':' .. ARGV[3]) == 1
local released = 0
local changes = {}
for i = 7, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v == ARGV[1] then
    redis.call('DEL', KEYS[i])
    released = released + 1
    changes[#changes + 1] = seatmap_seat_of(KEYS[i]) .. ':a'
  elseif not v and unlogged then
    changes[#changes + 1] = seatmap_seat_of(KEYS[i]) .. ':a'
  end
end
local n = redis.call('HGET', KEYS[1], 'n')
redis.call('ZREM', KEYS[2], ARGV[1] .. ':' .. n)
redis.call('DEL', KEYS[1])
seatmap_publish(KEYS[3], KEYS[4], KEYS[6], changes)
return {1, released}
