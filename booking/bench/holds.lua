-- wrk script for `booking bench`: POST one-seat holds, each thread walking its own slice of the bench seats.
-- Arguments (after --): event id, first seat id, seat count, path of a file of admission proofs (one per line;
-- request k of a thread uses proof floor(k / 8), so no account holds more than 8 seats, as in a real sale).
local threads = {}
local counter = 0

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  event, first, count = args[1], tonumber(args[2]), tonumber(args[3])
  proofs = {}
  local i = 0
  local nthreads = threads_total()
  for line in io.lines(args[4]) do
    if i % nthreads == tid then table.insert(proofs, line) end
    i = i + 1
  end
  next_seat = 0
  granted = 0
  path = "/events/" .. event .. "/holds"
end

function request()
  -- Every thread strides over the seats from its own offset, so no two requests ask for the same seat.
  local seat = first + (next_seat * threads_total() + tid) % count
  local proof = proofs[math.floor(next_seat / 8) % #proofs + 1]
  next_seat = next_seat + 1
  local headers = { ["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. proof }
  return wrk.format("POST", path, headers, '{"seat_ids":[' .. seat .. ']}')
end

function threads_total()
  return tonumber(os.getenv("WRK_THREADS") or "2")
end

function response(status, headers, body)
  if counted(status) then granted = granted + 1 end
end

function done(summary, latency, requests)
  report(threads, "granted", latency)
end
