-- queue_draw: a `lottery` room's draw. Fans who join an open lottery room wait in the pool (the pre-queue's set
-- and join-order list) instead of taking a place; every draw_every_seconds, by Redis's clock, everyone in the
-- pool gets a random place behind every place given before, by the same recorded, recomputable shuffle as the
-- pre-queue's opening (lib/queue_shuffle.lua, prepended): the pool in join order, shuffled from the seed
-- ARGV[1]. Each draw is recorded, so anyone can recompute every place it gave. Any node may run it on every tick: a draw is made once per interval. A room
-- that is open and no longer a lottery draws a pool left in it at once.
--
-- KEYS (the same twenty-nine for every queue script, built by gateway/src/store/keys.rs `QueueKeys`; this one uses):
--   1 settings (hash)     <p>queue:{evE}:settings  state, queueing, draw_every_seconds
--   2 seq (counter)       <p>queue:{evE}:seq       the last place given out (written)
--   4 places (hash)       <p>queue:{evE}:places    account -> place (written)
--   5 who (hash)          <p>queue:{evE}:who       place -> account (written)
--  11 stats (hash)        <p>queue:{evE}:stats     pool_from (where the pool starts in the join-order list),
--                                                   draws, last_draw_ms, next_draw_ms (written)
--  13 pre (set)           <p>queue:{evE}:pre       the accounts in the pool (emptied by a draw)
--  14 prelist (list)      <p>queue:{evE}:prelist   every account that entered a pool or the pre-queue, in order
--  27 draws (list)        <p>queue:{evE}:draws     one "seed:from:count:base:at_ms" per draw, oldest first
-- Time is Redis's own clock (TIME), never a node's.
-- ARGV[1]     seed of the draw, 1 .. 2147483646
-- Returns     {"idle"}                  the room is not open, or not a lottery and has no pool left
--             {"waiting", next_ms}      the next draw is due at next_ms
--             {"drawn", count, base}    drawn now: places base + 1 ..= base + count

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call('HMGET', KEYS[1], 'state', 'queueing', 'draw_every_seconds')
local lottery = s[2] == 'lottery'
-- A room that stopped being a lottery with fans in its pool draws them at once.
if s[1] ~= 'open' or (not lottery and redis.call('SCARD', KEYS[13]) == 0) then
  return {'idle'}
end
local every = (tonumber(s[3]) or 60) * 1000
local st = redis.call('HMGET', KEYS[11], 'next_draw_ms', 'pool_from')
local due = tonumber(st[1] or '')
if lottery and not due then
  -- The room has just become a lottery: its first draw is one interval away.
  redis.call('HSET', KEYS[11], 'next_draw_ms', now + every)
  return {'waiting', now + every}
end
if lottery and now < due then
  return {'waiting', due}
end
local from = tonumber(st[2] or '0') or 0
local order = redis.call('LRANGE', KEYS[14], from, -1)
local n = #order
local base = queue_shuffle_place(order, ARGV[1])
redis.call('DEL', KEYS[13])
redis.call('HSET', KEYS[11], 'pool_from', from + n, 'last_draw_ms', now)
if lottery then
  redis.call('HSET', KEYS[11], 'next_draw_ms', now + every)
else
  redis.call('HDEL', KEYS[11], 'next_draw_ms')
end
if n > 0 then
  redis.call('HINCRBY', KEYS[11], 'draws', 1)
  redis.call('RPUSH', KEYS[27], ARGV[1] .. ':' .. from .. ':' .. n .. ':' .. base .. ':' .. now)
end
return {'drawn', n, base}
