-- seatmap_server: whether the Redis that keeps the event's keys is still the server it was at the last call,
-- with the same data. It says no after a restart (which may lose the last second of the append-only file), a
-- failover (what the old master had not passed to its replica is gone), or a flush; the caller then writes
-- the markers of recent orders again.
--
-- KEYS[1]  <p>seatmap:{evE}:server   the run id of the server that answered the last call (it travels with the
--                                    data: a replica has its master's, and a restart reads the old one back)
-- Returns  1 if the same server answered the last call, 0 if not (or there was no last call)

local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
local was = redis.call('GET', KEYS[1])
if was == run_id then
  return 1
end
redis.call('SET', KEYS[1], run_id)
return 0
