-- wrk script for `booking bench`: POST one checkout per prepared hold. Each line of the file is
-- "<admission proof> <hold token>"; thread k takes lines k, k + threads, ... and never repeats one.
-- Arguments (after --): event id, path of the holds file.
counted_name = "created"

function init(args)
  local path = "/events/" .. args[1] .. "/orders"
  local i, nthreads = 0, threads_total()
  for line in io.lines(args[2]) do
    if i % nthreads == tid then
      local proof, token = line:match("^(%S+) (%S+)$")
      local headers = {
        ["Content-Type"] = "application/json",
        ["Authorization"] = "Bearer " .. proof,
        ["Idempotency-Key"] = token,
      }
      table.insert(prepared, wrk.format("POST", path, headers, '{"hold_token":"' .. token .. '"}'))
    end
    i = i + 1
  end
end
