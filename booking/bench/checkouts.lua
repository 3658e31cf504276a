-- wrk script for `booking bench`: POST one checkout per prepared hold. Each line of the file is
-- "<admission proof> <hold token>"; thread k takes lines k, k + threads, ... and never repeats one.
-- Arguments (after --): event id, path of the holds file.
local threads = {}
local counter = 0

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  event = args[1]
  local nthreads = tonumber(os.getenv("WRK_THREADS") or "2")
  mine = {}
  local i = 0
  for line in io.lines(args[2]) do
    if i % nthreads == tid then table.insert(mine, line) end
    i = i + 1
  end
  next_line = 1
  created = 0
  path = "/events/" .. event .. "/orders"
end

function request()
  local line = mine[next_line]
  if line == nil then
    -- Out of holds: ask for something cheap that is not counted.
    return wrk.format("GET", "/healthz")
  end
  next_line = next_line + 1
  local proof, token = line:match("^(%S+) (%S+)$")
  local headers = {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. proof,
    ["Idempotency-Key"] = token,
  }
  return wrk.format("POST", path, headers, '{"hold_token":"' .. token .. '"}')
end

function response(status, headers, body)
  if status == 201 then
    created = created + 1
  elseif status ~= 200 then
    -- Anything else (but a 200 from /healthz) is reported, so a run that went wrong does not pass for a
    -- slow one.
    other = (other or 0) + 1
    if (first_other or 0) == 0 then first_other = status end
  end
end

function done(summary, latency, requests)
  local total = 0
  local other, first_other = 0, 0
  for _, t in ipairs(threads) do
    total = total + t:get("created")
    other = other + (t:get("other") or 0)
    if first_other == 0 then first_other = t:get("first_other") or 0 end
  end
  io.write(string.format("BENCH created=%d other=%d first_other=%d p50_us=%d p99_us=%d\n", total, other, first_other,
    latency:percentile(50), latency:percentile(99)))
end
