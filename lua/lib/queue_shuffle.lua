-- queue_shuffle: not a script of its own. It is prepended to the scripts that draw places at random
-- (queue_set_state.lua at a pre-queue's opening, queue_draw.lua for a lottery), so both draw alike and anyone
-- can recompute a draw (gateway/src/room/shuffle.rs).
--
-- The draw: a Fisher-Yates shuffle of `order` (accounts in join order), driven by the Park-Miller generator
-- x <- x * 48271 mod 2147483647 from `seed`:
--   for i = n down to 2: x <- next(x); j <- (x mod i) + 1; swap order[i], order[j]
-- Place base + k goes to order[k], base being the last place given out (KEYS[2]); the places (KEYS[4], account
-- -> place, and KEYS[5], place -> account) and the counter are written. Returns base.

local function queue_shuffle_place(order, seed)
  local n = #order
  local x = tonumber(seed)
  for i = n, 2, -1 do
    x = (x * 48271) % 2147483647
    local j = (x % i) + 1
    order[i], order[j] = order[j], order[i]
  end
  local base = tonumber(redis.call('GET', KEYS[2]) or '0')
  for k = 1, n do
    redis.call('HSET', KEYS[4], order[k], base + k)
    redis.call('HSET', KEYS[5], base + k, order[k])
  end
  redis.call('SET', KEYS[2], base + n)
  return base
end

