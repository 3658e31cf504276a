-- wrk script for `booking-bench`: POST one checkout per prepared hold. Each line of the file is
-- "<admission proof> <hold token> <idempotency key>"; each is sent once.
-- Arguments (after --): event id, path of the holds file.
counted_name = "created"

function init(args)
  local path = "/events/" .. args[1] .. "/orders"
  for line in io.lines(args[2]) do
    local proof, token, key = line:match("^(%S+) (%S+) (%S+)$")
    local headers = {
      ["Content-Type"] = "application/json",
      ["Authorization"] = "Bearer " .. proof,
      ["Idempotency-Key"] = key,
    }
    table.insert(prepared, wrk.format("POST", path, headers, '{"hold_token":"' .. token .. '"}'))
  end
end
