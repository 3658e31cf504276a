-- wrk script for `booking-bench`: POST one-seat holds, one request per bench seat, in seat order.
-- Arguments (after --): event id, first seat id, seat count, path of a file of admission proofs (one per line;
-- request k uses proof floor(k / 8), so no account holds more than 8 seats, as in a real sale).
counted_name = "granted"

function init(args)
  local path = "/events/" .. args[1] .. "/holds"
  local first, count = tonumber(args[2]), tonumber(args[3])
  local proofs = {}
  for line in io.lines(args[4]) do table.insert(proofs, line) end
  for k = 0, count - 1 do
    local proof = proofs[math.floor(k / 8) % #proofs + 1]
    local headers = { ["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. proof }
    table.insert(prepared, wrk.format("POST", path, headers, '{"seat_ids":[' .. (first + k) .. ']}'))
  end
end
