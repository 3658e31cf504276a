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
  if counted(status) then created = created + 1 end
end

function done(summary, latency, requests)
  report(threads, "created", latency)
end
