-- Shared by the wrk scripts of `booking bench` (put in front of each when the bench writes it out): counting
-- the answers, and the BENCH line the bench reads.

-- Answers other than the counted 201 (a 200 is /healthz, asked once a script runs out of work): reported, so a
-- run that went wrong does not pass for a slow one.
other, first_other = 0, 0

-- True for the answer the phase counts (201); tallies any other but a 200.
function counted(status)
  if status == 201 then return true end
  if status ~= 200 then
    other = other + 1
    if first_other == 0 then first_other = status end
  end
  return false
end

-- Prints "BENCH <name>=<total over threads> other=... first_other=... p50_us=... p99_us=...".
function report(threads, name, latency)
  local total, others, first = 0, 0, 0
  for _, t in ipairs(threads) do
    total = total + t:get(name)
    others = others + t:get("other")
    if first == 0 then first = t:get("first_other") end
  end
  io.write(string.format("BENCH %s=%d other=%d first_other=%d p50_us=%d p99_us=%d\n", name, total, others, first,
    latency:percentile(50), latency:percentile(99)))
end
