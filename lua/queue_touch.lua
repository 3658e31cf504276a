-- queue_touch: record that fans are still there (they polled). Each gateway node buffers the accounts whose
-- polls it served and sends them in one call a few times a second, so polls never touch Redis one by one.
--
-- KEYS[1]     seen (sorted set)      <p>queue:{evE}:seen   account, score = when it last joined or polled (ms)
-- ARGV[1..]   account ids
-- Returns     how many accounts were touched
-- Time is Redis's own clock (TIME), never a node's.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 1, #ARGV do
  redis.call('ZADD', KEYS[1], now, ARGV[i])
end
return #ARGV
