-- acquire_hold: grant one block of seats to one new hold token, all or nothing. The caller names one block (a
-- fan's basket) or several candidate blocks of the same size, best first (best available): the first block
-- whose seats are all free is granted. Blocks are runs of the seat keys and may overlap; each seat is looked
-- up at most once.
--
-- KEYS[1]     hold record (hash)            <p>hold:{evE}:token:<token>   fields account, seats, n, created, expires
-- KEYS[2]     account seats (sorted set)    <p>hold:{evE}:account:<id>    member "<token>:<n>", score = expiry
--                                                                          of the hold, or of the order's payment
--                                                                          deadline (ms); +inf once paid
-- KEYS[3]     seat map version (counter)    <p>seatmap:{evE}:version
-- KEYS[4]     seat map log (stream)         <p>seatmap:{evE}:log          (see lib/seatmap_log.lua)
-- KEYS[5]     seat map lapses (sorted set)  <p>seatmap:{evE}:lapses       member "h:<token>:<record seats>"
-- KEYS[6]     seat map taken (set)          <p>seatmap:{evE}:taken
-- KEYS[7]     only when ARGV[7] is not empty: the request's idempotency key (string)
--                                           <p>hold:{evE}:idem:<len>:<account>:<key>
-- then        seat keys                     <p>hold:{evE}:seat:<seat>     value = hold token, or "sold:<token>"
-- ARGV[1]     hold token
-- ARGV[2]     account id
-- ARGV[3]     hold time to live (ms)
-- ARGV[4]     most seats one account may hold and buy per event (Postgres enforces it again at checkout)
-- ARGV[5]     how long the record outlives the hold (ms), so a late caller learns "expired", not "unknown"
-- ARGV[6]     seats per block
-- ARGV[7]     what to store under the idempotency key once granted, or empty
-- ARGV[8..]   the blocks, best first: where each starts among the seat keys (1 = the first seat key)
-- Returns     {1, expires_at_ms, version, block}   granted: the map version that shows it, the block (1-based)
--             {0, i}               refused, one block named: its i-th seat (1-based) is held or sold
--             {0, 0}               refused, several blocks named: none is wholly free
--             {-1, counted}        refused: the account would exceed its cap (counted = held + bought now)
-- Time is Redis's own clock (TIME), never the caller's. The log gets every seat as held.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
local n = tonumber(ARGV[6])
local first = 7
if ARGV[7] ~= '' then
  first = 8
end
local blocks = #ARGV - 7

local taken = {}
local function is_taken(i)
  local v = taken[i]
  if v == nil then
    v = redis.call('EXISTS', KEYS[i]) == 1
    taken[i] = v
  end
  return v
end

local chosen, block = nil, nil
for b = 1, blocks do
  local start = first + tonumber(ARGV[7 + b]) - 1
  if start < first or start + n - 1 > #KEYS then
    return redis.error_reply('acquire_hold: block ' .. b .. ' runs past the seat keys')
  end
  local free = true
  for i = start, start + n - 1 do
    if is_taken(i) then
      if blocks == 1 then
        return {0, i - start + 1}
      end
      free = false
      break
    end
  end
  if free then
    chosen, block = start, b
    break
  end
end
if not chosen then
  return {0, 0}
end

redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local counted = 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  counted = counted + tonumber(string.match(member, ':(%d+)$'))
end
-- A set without expiry that exists holds a paid order (reserve_seats persisted it).
local bought = redis.call('PTTL', KEYS[2]) == -1
if counted + n > tonumber(ARGV[4]) then
  return {-1, counted}
end

local expires = now + ttl
local changes = {}
local ids = {}
for i = chosen, chosen + n - 1 do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ttl)
  ids[#ids + 1] = seatmap_seat_of(KEYS[i])
  changes[#changes + 1] = ids[#ids] .. ':h'
end
local seats = table.concat(ids, ',')
local keep = ttl + tonumber(ARGV[5])
redis.call('HSET', KEYS[1], 'account', ARGV[2], 'seats', seats, 'n', n, 'created', now, 'expires', expires)
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('ZADD', KEYS[2], expires, ARGV[1] .. ':' .. n)
-- An account that bought keeps its set for good (its count must survive); otherwise the set lives as long as
-- its longest hold.
if not bought and redis.call('PTTL', KEYS[2]) < keep then
  redis.call('PEXPIRE', KEYS[2], keep)
end
if first == 8 then
  redis.call('SET', KEYS[7], ARGV[7], 'PX', keep)
end
redis.call('ZADD', KEYS[5], expires, 'h:' .. ARGV[1] .. ':' .. seats)
local version = seatmap_publish(KEYS[3], KEYS[4], KEYS[6], changes)
return {1, expires, version, block}
