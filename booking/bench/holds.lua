-- wrk script for `booking bench`: POST one-seat holds, each thread walking its own slice of the bench seats.
-- Arguments (after --): event id, first seat id, seat count, path of a file of admission proofs (one per line;
-- request k of a thread uses proof floor(k / 8), so no account holds more than 8 seats, as in a real sale).
counted_name = "granted"

function init(args)
  local path = "/events/" .. args[1] .. "/holds"
  local first, count, nthreads = tonumber(args[2]), tonumber(args[3]), threads_total()
  local proofs, i = {}, 0
  for line in io.lines(args[4]) do
    if i % nthreads == tid then table.insert(proofs, line) end
    i = i + 1
  end
  -- Every thread strides over the seats from its own offset, so no two requests ask for the same seat.
  local k = 0
  while tid + k * nthreads < count do
    local seat = first + tid + k * nthreads
    local proof = proofs[math.floor(k / 8) % #proofs + 1]
    local headers = { ["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. proof }
    table.insert(prepared, wrk.format("POST", path, headers, '{"seat_ids":[' .. seat .. ']}'))
    k = k + 1
  end
end
