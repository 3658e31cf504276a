-- queue_schedule_take: claims the room's scheduled changes whose time has come, earliest first. Any gateway node
-- may run it on any tick: a change is removed as it is returned, so exactly one node applies it (and puts it
-- back if it cannot).
--
-- KEYS (the same twenty-nine for every queue script, built by gateway/src/store/keys.rs `QueueKeys`; this one uses):
--  25 schedule (zset)     <p>queue:{evE}:schedule  a change waiting (JSON: id, at, set), score = when it applies (ms)
-- Time is Redis's own clock (TIME), never a node's.
-- ARGV[1]     most changes claimed at once
-- Returns     the changes claimed (their JSON), earliest first; none when nothing is due

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[25], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, change in ipairs(due) do
  redis.call('ZREM', KEYS[25], change)
end
return due
