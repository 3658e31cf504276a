-- verify_hold: a checkout's first gate, read-only, in one round trip. The hold must be the caller's, not past its
-- expiry by Redis's clock, and every seat it lists must still carry its token.
--
-- KEYS[1]     hold record (hash)            <p>hold:{evE}:token:<token>
-- ARGV[1]     hold token
-- ARGV[2]     account id of the caller
-- ARGV[3]     the event's seat key prefix   <p>hold:{evE}:seat:
-- Returns     {1, seats}            live: the record's seat list, comma-joined
--             {0, 0}                the hold's time ran out
--             {0, i}                the i-th seat (1-based) of the list no longer carries the token
--             {-1}                  the hold belongs to another account
--             {-2}                  no such hold (never existed, released, checked out, or long expired)
--
-- The seat keys are not in KEYS: the record names them, and the caller has not read it (reading it first cost a
-- second round trip on every checkout). They carry the record's hash tag, so they are in its slot, on a single
-- Redis and on a cluster alike; a prefix without the record's tag is refused.

local record = redis.call('HMGET', KEYS[1], 'account', 'seats', 'expires')
local account, seats, expires = record[1], record[2], record[3]
if not account or not seats or not expires then
  return {-2}
end
if account ~= ARGV[2] then
  return {-1}
end
local tag = string.match(KEYS[1], '{[^}]*}')
if not tag or not string.find(ARGV[3], tag, 1, true) then
  return redis.error_reply('verify_hold: the seat key prefix does not carry the record\'s hash tag')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(expires) <= now then
  return {0, 0}
end
local i = 0
for seat in string.gmatch(seats, '[^,]+') do
  i = i + 1
  if redis.call('GET', ARGV[3] .. seat) ~= ARGV[1] then
    return {0, i}
  end
end
return {1, seats}
