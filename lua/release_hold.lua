-- release_hold: compare-and-delete. Frees only the seats that still carry this hold token.
--
-- KEYS[1]     hold record (hash)            <p>hold:{evE}:token:<token>
-- KEYS[2]     account holds (sorted set)    <p>hold:{evE}:account:<id>
-- KEYS[3]     seat map version (counter)    <p>seatmap:{evE}:version
-- KEYS[4..]   seat keys of the hold, as its record lists them
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

local released = 0
for i = 4, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    released = released + 1
  end
end
local n = redis.call('HGET', KEYS[1], 'n')
redis.call('ZREM', KEYS[2], ARGV[1] .. ':' .. n)
redis.call('DEL', KEYS[1])
if released > 0 then
  redis.call('INCR', KEYS[3])
end
return {1, released}
