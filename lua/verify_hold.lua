-- verify_hold: is every seat of this hold still held by its token, for this account? Read only.
--
-- KEYS[1]     hold record (hash)            <p>hold:{evE}:token:<token>
-- KEYS[2..]   seat keys of the hold, as its record lists them
-- ARGV[1]     hold token
-- ARGV[2]     account id of the caller
-- ARGV[3]     the record's seat list, comma-joined, as read by the caller
-- Returns     {1, expires_at_ms}   every seat is still this token's
--             {0, i}               the hold expired (i = 0) or its i-th seat (1-based) is no longer its own
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
for i = 2, #KEYS do
  if redis.call('GET', KEYS[i]) ~= ARGV[1] then
    return {0, i - 1}
  end
end
return {1, expires}
