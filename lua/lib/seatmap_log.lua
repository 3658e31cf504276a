-- seatmap_log: not a script of its own. It is prepended to every script that changes a seat's state, so each
-- change reaches the event's change log in the same atomic step that makes it.
--
-- The log       <p>seatmap:{evE}:log       a Redis Stream; entry id "<version>-0", field "c" = the changes,
--                                          "seat:status,seat:status", status a (available), h (held), s (sold);
--                                          field "t" = when, by Redis's clock (unix ms)
-- The version   <p>seatmap:{evE}:version   moves by exactly one per entry: versions in the log have no gaps
-- The taken     <p>seatmap:{evE}:taken     set of the seats the log last said were held or sold: its size is what
--                                          is not available, read in O(1) (the waiting room stops admitting
--                                          when nothing is left)
-- The lapses    <p>seatmap:{evE}:lapses    sorted set of what lapses by time to live: member
--                                          "h:<hold token>:<seats>" (a hold) or "s:<hold token>:<seats>" (an
--                                          unpaid order's markers), score = when it lapses (unix ms);
--                                          seatmap_lapse.lua turns the passed ones into log entries
--
-- A missing version counter (a new event, or Redis lost its data) starts at Redis's clock in microseconds, so
-- versions keep growing across a data loss: a client that resumes from before it finds that the log does not
-- reach back that far, and reloads the map.

local SEATMAP_LOG_MAXLEN = 50000

-- Appends one entry of changes (a list of "seat:status") and returns its version, and keeps the taken set in
-- step; nothing, and nil, when the list is empty.
local function seatmap_publish(version_key, log_key, taken_key, changes)
  if #changes == 0 then
    return nil
  end
  for _, change in ipairs(changes) do
    local seat, status = string.match(change, '^(%d+):(%a)$')
    if status == 'a' then
      redis.call('SREM', taken_key, seat)
    else
      redis.call('SADD', taken_key, seat)
    end
  end
  local t = redis.call('TIME')
  local v = redis.call('INCR', version_key)
  if v == 1 then
    v = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', version_key, string.format('%d', v))
  end
  local at = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  redis.call('XADD', log_key, 'MAXLEN', '~', SEATMAP_LOG_MAXLEN, string.format('%d-0', v), 'c',
    table.concat(changes, ','), 't', at)
  return v
end

-- The seat id at the end of a seat key (<p>hold:{evE}:seat:<id>).
local function seatmap_seat_of(key)
  return string.match(key, ':(%d+)$')
end

-- The lapse member of an order's markers: its seats sorted, so every caller names it alike whatever order it
-- lists the seats in.
local function seatmap_sold_member(token, seat_keys)
  local ids = {}
  for i, key in ipairs(seat_keys) do
    ids[i] = tonumber(seatmap_seat_of(key))
  end
  table.sort(ids)
  for i, id in ipairs(ids) do
    ids[i] = string.format('%d', id)
  end
  return 's:' .. token .. ':' .. table.concat(ids, ',')
end

