-- seatmap_lapse: a time to live makes no sound, so this step turns the holds and unpaid orders whose time ran
-- out into log entries: every seat of theirs that is free now goes in the log as available. Any node may run
-- it at any time: it is atomic, and a lapse it has logged is gone from the index, so a second run logs nothing.
--
-- KEYS[1]     seat map version (counter)    <p>seatmap:{evE}:version
-- KEYS[2]     seat map log (stream)         <p>seatmap:{evE}:log
-- KEYS[3]     seat map lapses (sorted set)  <p>seatmap:{evE}:lapses       (see lib/seatmap_log.lua)
-- KEYS[4]     seat map taken (set)          <p>seatmap:{evE}:taken
-- ARGV[1]     the prefix of every seat key of the event, <p>hold:{evE}:seat: (the seats are read from the
--             members, so they are not in KEYS; they share the event's hash slot)
-- ARGV[2]     most lapses taken in one run (the rest wait for the next)
-- Returns     {lapses taken, seats logged as available, the version logged or 0}
-- Time is Redis's clock. A member is taken once its score is in the past: a key whose expiry equals now has
-- not expired yet.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now, 'LIMIT', 0, tonumber(ARGV[2]))
if #due == 0 then
  return {0, 0, 0}
end
local changes = {}
local seen = {}
for _, member in ipairs(due) do
  local seats = string.match(member, '^[hs]:[^:]+:(.*)$')
  if seats then
    for seat in string.gmatch(seats, '%d+') do
      if not seen[seat] then
        seen[seat] = true
        -- Held again, or sold, since: the log already says so.
        if redis.call('EXISTS', ARGV[1] .. seat) == 0 then
          changes[#changes + 1] = seat .. ':a'
        end
      end
    end
  end
end
redis.call('ZREM', KEYS[3], unpack(due))
local v = seatmap_publish(KEYS[1], KEYS[2], KEYS[4], changes)
return {#due, #changes, v or 0}
