-- gateway_nodes: a gateway node says it is alive, and learns how many are.
--
-- KEYS[1]   the live nodes (sorted set)   <p>gateway:nodes   member = node id, score = when it last said so
--                                                             (unix ms, Redis's clock)
-- ARGV[1]   this node's id
-- ARGV[2]   how long a node counts as alive after it last said so (ms)
-- ARGV[3]   "1" when the node is leaving (it is taken off at once)
-- Returns   the number of live nodes, this one included unless it is leaving

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local alive = tonumber(ARGV[2])
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now, ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - alive)
redis.call('PEXPIRE', KEYS[1], alive * 2)
return redis.call('ZCARD', KEYS[1])
