-- queue_retire: delete a retired room's keys, all but its place counter. The gateway marks the room retired and
-- takes it off the list of rooms first, so no node writes it back. Any node may run it any number of times.
--
-- KEYS (the twenty-nine of every queue script, built by gateway/src/store/keys.rs `QueueKeys`, then one more):
--   2 seq (string)        <p>queue:{evE}:seq       the highest place given out: kept
--   3 head (string)       <p>queue:{evE}:head      set to seq
--   every other key of the twenty-nine, and
--  30 codebatches (hash)  <p>queue:{evE}:codebatches   deleted
-- A room made again by an operator gives places above every place given before, with nobody ahead of the first:
-- a ticket of the retired room names a place at or below the head, which no admission of the new room matches,
-- so it can never pass for a new fan's.
-- Returns     1 if the room had settings (there was a room to retire), 0 if not

local existed = redis.call('EXISTS', KEYS[1])
local seq = redis.call('GET', KEYS[2])
local doomed = {}
for i, key in ipairs(KEYS) do
  if i ~= 2 then
    doomed[#doomed + 1] = key
  end
end
redis.call('UNLINK', unpack(doomed))
if seq then
  redis.call('SET', KEYS[3], seq)
end
return existed
