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
-- Returns     {lapses taken, seats logged as available, the version logged or 0, ms until the next lapse is
--             due (-1: none waits)}
-- Time is Redis's clock. A member is taken once its score is in the past and none of its seats still carries
-- its token with an expiry set (that key's expiry equals the instant the script started: it has not expired
-- yet, and the member waits for the next run).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now, 'LIMIT', 0, tonumber(ARGV[2]))
-- How long until the earliest lapse left is due, so that the caller steps an event with nothing due seldom.
local function next_due()
  local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if #first == 0 then
    return -1
  end
  return math.max(0, tonumber(first[2]) - now)
end
if #due == 0 then
  return {0, 0, 0, next_due()}
end
local changes = {}
local taken = {}
local seen = {}
for _, member in ipairs(due) do
  local kind, token, seats = string.match(member, '^([hs]):([^:]+):(.*)$')
  if kind then
    -- A key expires once Redis's clock is past its expiry, and a script reads keys at the instant it started:
    -- a seat due at that very millisecond still carries its own token here although TIME is past it. Such a
    -- lapse waits for the next run whole, so the log never says available what Redis still holds.
    local own = token
    if kind == 's' then
      own = 'sold:' .. token
    end
    local free = {}
    local waits = false
    for seat in string.gmatch(seats, '%d+') do
      local key = ARGV[1] .. seat
      local v = redis.call('GET', key)
      if not v then
        free[#free + 1] = seat
      elseif v == own and redis.call('PTTL', key) ~= -1 then
        waits = true
        break
      end
      -- Otherwise held again, or sold (for good), since: the log already says so.
    end
    if not waits then
      taken[#taken + 1] = member
      for _, seat in ipairs(free) do
        if not seen[seat] then
          seen[seat] = true
          changes[#changes + 1] = seat .. ':a'
        end
      end
    end
  else
    taken[#taken + 1] = member
  end
end
if #taken > 0 then
  redis.call('ZREM', KEYS[3], unpack(taken))
end
local v = seatmap_publish(KEYS[1], KEYS[2], KEYS[4], changes)
return {#taken, #changes, v or 0, next_due()}
