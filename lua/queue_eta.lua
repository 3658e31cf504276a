-- queue_eta: counts one admitted fan in the room's ETA error: how far the wait it was promised at its join was
-- from the wait it had. Every node that answers the fan's poll once it is admitted may run it, any number of
-- times: a fan counts once, on whichever node saw it first. The samples of the last 1000 counted fans are kept;
-- each node reads them when `eta_counted` moves and reports their p50 and p90 (the room's, not the node's).
--
-- KEYS (the same twenty-nine for every queue script, built by gateway/src/store/keys.rs `QueueKeys`; this one uses):
--  11 stats (hash)        <p>queue:{evE}:stats     eta_counted (written)
--  28 etas (sorted set)   <p>queue:{evE}:etas      account, score = when it was counted (ms): who counts
--                                                  already (kept an hour: long past any fan's last poll)
--  29 etaerrs (list)      <p>queue:{evE}:etaerrs   one "abs rel" per fan counted, newest first, at most 1000
--                                                  (abs: seconds off; rel: relative to its wait, "-" when it
--                                                  waited under a second)
-- Time is Redis's own clock (TIME), never a node's.
-- ARGV[1]     account id
-- ARGV[2]     the fan's sample, "abs rel"
-- Returns     1 when the fan was counted now, 0 when it counted before

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('ZADD', KEYS[28], 'NX', now, ARGV[1]) == 0 then
  return 0
end
redis.call('ZREMRANGEBYSCORE', KEYS[28], '-inf', '(' .. (now - 3600000))
redis.call('LPUSH', KEYS[29], ARGV[2])
redis.call('LTRIM', KEYS[29], 0, 999)
redis.call('HINCRBY', KEYS[11], 'eta_counted', 1)
return 1
