-- queue_pass: admit an account at once on a sponsor pass, within the room's max_active, once per pass. The
-- gateway has checked the pass's signature, expiry, account and event; this spends it and counts the fan among
-- the room's active ones, as an admission step would, without a place in the queue.
--
-- KEYS (the same twenty-nine for every queue script, built by gateway/src/store/keys.rs `QueueKeys`; this one uses):
--   1 settings (hash)     <p>queue:{evE}:settings  state, max_active, session_seconds
--   8 active (sorted set) <p>queue:{evE}:active    account, score = when it was admitted (ms) (written)
--  11 stats (hash)        <p>queue:{evE}:stats     passes_total (written)
--  16 spent (zset)        <p>queue:{evE}:spent     "pass:<id>" of each pass used, score = its expiry (ms) (written)
-- Time is Redis's own clock (TIME), never a node's.
-- ARGV[1]     account id
-- ARGV[2]     the pass's id
-- ARGV[3]     when the pass expires, Unix ms (its id is remembered until then)
-- Returns     {"unknown"}                no waiting room is configured for this event
--             {"closed", state}          the room takes nobody (closed or sold_out)
--             {"spent"}                  the pass was used before: nothing done
--             {"full", max_active}       max_active fans are within their session: nothing done, the pass kept
--             {"admitted", at_ms, session_seconds}

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call('HMGET', KEYS[1], 'state', 'max_active', 'session_seconds')
local state = s[1]
if not state then
  return {'unknown'}
end
if state == 'closed' or state == 'sold_out' then
  return {'closed', state}
end
local id = 'pass:' .. ARGV[2]
redis.call('ZREMRANGEBYSCORE', KEYS[16], '-inf', now)
if redis.call('ZSCORE', KEYS[16], id) then
  return {'spent'}
end
local session = tonumber(s[3] or '0') * 1000
redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', '(' .. (now - session))
local max_active = tonumber(s[2] or '0') or 0
if redis.call('ZCARD', KEYS[8]) >= max_active and not redis.call('ZSCORE', KEYS[8], ARGV[1]) then
  return {'full', max_active}
end
redis.call('ZADD', KEYS[16], tonumber(ARGV[3]) or now, id)
redis.call('ZADD', KEYS[8], now, ARGV[1])
redis.call('HINCRBY', KEYS[11], 'passes_total', 1)
return {'admitted', now, s[3]}
