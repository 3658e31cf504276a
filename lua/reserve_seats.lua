-- reserve_seats: after Postgres wrote orders, mark their seats taken in Redis so later holds are refused
-- without a database round trip: at checkout (until the payment deadline; a batch of checkouts in one call),
-- when the deadline is extended, and when the order is paid (for good). Postgres stays the guarantee if this
-- never runs (Redis flushed, restarted or failed over); a marker only ever lapses early, never late.
--
-- KEYS[1]     seat map version (counter)    <p>seatmap:{evE}:version
-- KEYS[2]     seat map log (stream)         <p>seatmap:{evE}:log          every seat newly marked, as sold
-- KEYS[3]     seat map lapses (sorted set)  <p>seatmap:{evE}:lapses       the hold's member goes; the order's
--                                                                          markers lapse at the deadline, or
--                                                                          never once paid
-- KEYS[4]     seat map taken (set)          <p>seatmap:{evE}:taken
-- then for each order, in turn:
--   its hold record (hash)                  <p>hold:{evE}:token:<token>   deleted: the hold became an order
--   its account's seats (sorted set)        <p>hold:{evE}:account:<id>    member "<token>:<n>", score = the
--                                                                          deadline (ms), or +inf once paid
--   its n seat keys
-- ARGV[1]     1 to mark every seat whatever it holds now (Postgres just gave the seats to this order, e.g. a
--             late payment it accepted); 0 to mark only seats still carrying the hold's token or this order's
--             marker; 2 to claim them all or none (a late payment, before Postgres is asked): every seat must
--             be free or carry the hold's token or this order's marker, else nothing is written (nor when
--             every seat carries the order's marker already)
-- ARGV[2]     how long an account set outlives its last deadline (ms)
-- then for each order, in turn: its hold token, its seat count n, its payment deadline (unix ms, or 0 when
-- paid: the markers never lapse)
-- Returns     the number of seats marked, one per order; with ARGV[1] = 2 and a seat another hold or order
--             has, -1 for every order and nothing written
-- Marker value: "sold:<token>", so releasing the order later deletes only its own markers.

local force = ARGV[1] == '1' or ARGV[1] == '2'
local retention = tonumber(ARGV[2])
-- Checked before anything is written: the keys are the map's four, then each order's two keys and n seats.
local expected = 4
if #ARGV < 2 or (#ARGV - 2) % 3 ~= 0 then
  return redis.error_reply('reserve_seats: ARGV is force, retention, then three values per order')
end
for a = 3, #ARGV, 3 do
  expected = expected + 2 + (tonumber(ARGV[a + 1]) or -1)
end
if expected ~= #KEYS then
  return redis.error_reply('reserve_seats: the keys do not match the orders and their seat counts')
end
-- A claim is all or nothing: refused whole if any seat has another hold or order's marker. Seats that all carry
-- their order's marker already (a payment applied meanwhile marked them sold for good) are left as they are.
if ARGV[1] == '2' then
  local k = 5
  local ours = {}
  local all_ours = true
  for a = 3, #ARGV, 3 do
    local token, n = ARGV[a], tonumber(ARGV[a + 1])
    for i = k + 2, k + 1 + n do
      local v = redis.call('GET', KEYS[i])
      if v and v ~= token and v ~= 'sold:' .. token then
        local refused = {}
        for _ = 3, #ARGV, 3 do
          refused[#refused + 1] = -1
        end
        return refused
      end
      all_ours = all_ours and v == 'sold:' .. token
    end
    ours[#ours + 1] = n
    k = k + 2 + n
  end
  if all_ours then
    return ours
  end
end
local now
local marked = {}
local changes = {}
local k = 5
for a = 3, #ARGV, 3 do
  local token, n, due = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local record, account = KEYS[k], KEYS[k + 1]
  local marker = 'sold:' .. token
  local count = 0
  local seat_keys = {}
  -- The hold leaves the lapse index; if it was still there, a seat of it that ran out and is not marked now
  -- is logged as available here (nothing else would).
  local hold_seats = redis.call('HGET', record, 'seats')
  local unlogged = hold_seats and redis.call('ZREM', KEYS[3], 'h:' .. token .. ':' .. hold_seats) == 1
  for i = k + 2, k + 1 + n do
    local v = redis.call('GET', KEYS[i])
    if force or v == token or v == marker then
      if due > 0 then
        redis.call('SET', KEYS[i], marker, 'PXAT', due)
      else
        redis.call('SET', KEYS[i], marker)
      end
      count = count + 1
      if v ~= marker then
        changes[#changes + 1] = seatmap_seat_of(KEYS[i]) .. ':s'
      end
    elseif not v and unlogged then
      changes[#changes + 1] = seatmap_seat_of(KEYS[i]) .. ':a'
    end
    seat_keys[#seat_keys + 1] = KEYS[i]
  end
  k = k + 2 + n
  if due > 0 then
    redis.call('ZADD', KEYS[3], due, seatmap_sold_member(token, seat_keys))
  else
    redis.call('ZREM', KEYS[3], seatmap_sold_member(token, seat_keys))
  end
  -- The account's count follows the order: it lapses with the deadline and stays for good once paid.
  local member = token .. ':' .. n
  if due > 0 then
    redis.call('ZADD', account, due, member)
    local pttl = redis.call('PTTL', account)
    local keep_until = due + retention
    if pttl ~= -1 then
      if not now then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      if pttl < keep_until - now then
        redis.call('PEXPIREAT', account, keep_until)
      end
    end
  else
    redis.call('ZADD', account, '+inf', member)
    redis.call('PERSIST', account)
  end
  redis.call('DEL', record)
  marked[#marked + 1] = count
end
seatmap_publish(KEYS[1], KEYS[2], KEYS[4], changes)
return marked
