-- sell_hold: after the Postgres checkout committed, turn the hold's seats into "sold" markers so later holds
-- are refused without a database round trip. Only seats still carrying this token are marked; Postgres stays
-- the guarantee if this never runs (Redis flushed, restarted, or failed over).
--
-- KEYS[1]     hold record (hash)            <p>hold:{evE}:token:<token>
-- KEYS[2]     account seats (sorted set)    <p>hold:{evE}:account:<id>    the hold's member becomes part of the
--                                                                          account's "sold:<n>" member (score +inf)
-- KEYS[3]     seat map version (counter)    <p>seatmap:{evE}:version
-- KEYS[4..]   seat keys of the hold
-- ARGV[1]     hold token
-- ARGV[2]     seats in the hold (n), to find the account-set member
-- Returns     the number of seats marked sold

local marked = 0
for i = 4, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('SET', KEYS[i], 'sold')
    marked = marked + 1
  end
end
-- The seats were bought whether or not the hold's member is still there (an acquire may have swept it as
-- expired a moment ago): count them either way. This runs once per committed checkout.
redis.call('ZREM', KEYS[2], ARGV[1] .. ':' .. ARGV[2])
local bought = tonumber(ARGV[2])
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '+inf', '+inf')) do
  bought = bought + tonumber(string.match(member, ':(%d+)$'))
  redis.call('ZREM', KEYS[2], member)
end
redis.call('ZADD', KEYS[2], '+inf', 'sold:' .. bought)
redis.call('PERSIST', KEYS[2])
redis.call('DEL', KEYS[1])
redis.call('INCR', KEYS[3])
return marked
