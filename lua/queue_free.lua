-- queue_free: free an admitted fan's slot at once, for the next fan: its order was paid (booking's order event
-- stream says so), or it left (`POST /queue/{id}/leave`). A fan who leaves also gives up its admission (every
-- node refuses proofs issued before it left) and, if it was still waiting, its place (skipped as abandoned when
-- its turn comes). Any node may run it for the same fan any number of times: a slot is freed and counted once.
--
-- KEYS (the same twenty-nine for every queue script, built by gateway/src/store/keys.rs `QueueKeys`; this one uses):
--   1 settings (hash)     <p>queue:{evE}:settings  state, session_seconds
--   7 seen (sorted set)   <p>queue:{evE}:seen      account, score = when it last joined or polled (ms) (written)
--   8 active (sorted set) <p>queue:{evE}:active    account, score = when it was admitted (ms) (written)
--  11 stats (hash)        <p>queue:{evE}:stats     freed_total, freed_paid, freed_left (written)
--  23 left (zset)         <p>queue:{evE}:left      account, score = when it left the room (ms) (written)
-- Time is Redis's own clock (TIME), never a node's.
-- ARGV[1]     account id
-- ARGV[2]     why: "paid" or "left"
-- Returns     {"unknown"}                no waiting room is configured for this event
--             {"freed", at_ms}           the fan's slot was freed now
--             {"not_active", at_ms}      the fan held no slot (never admitted, its session over, or freed before)

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call('HMGET', KEYS[1], 'state', 'session_seconds')
if not s[1] then
  return {'unknown'}
end
local account, why = ARGV[1], ARGV[2]
local session = tonumber(s[2] or '0') * 1000
local admitted = tonumber(redis.call('ZSCORE', KEYS[8], account) or '0')
local freed = admitted > now - session and redis.call('ZREM', KEYS[8], account) == 1
if why == 'left' then
  redis.call('ZREMRANGEBYSCORE', KEYS[23], '-inf', '(' .. (now - session))
  redis.call('ZADD', KEYS[23], now, account)
  if redis.call('ZSCORE', KEYS[7], account) then
    redis.call('ZADD', KEYS[7], 0, account)
  end
end
if not freed then
  return {'not_active', now}
end
redis.call('HINCRBY', KEYS[11], 'freed_total', 1)
redis.call('HINCRBY', KEYS[11], 'freed_' .. why, 1)
return {'freed', now}
