-- Shared by the wrk scripts of `booking-bench` (put in front of each when the bench writes it out).
--
-- The client is part of what is measured (it shares the 2-core box with the servers), so the scripts keep it
-- cheap, as redis-benchmark and pgbench are:
-- * every request is built in init(), before wrk starts its clock; request() only hands the next one out;
-- * no response() callback: with one, wrk hands every response's headers and body to Lua. The counts come from
--   wrk's own summary instead: the phases' requests answer 201 or an error status, never another 2xx.
-- Together they halve the client's CPU per checkout, which the servers would otherwise lose to it.
--
-- wrk runs these scripts in one thread (`-t 1`). wrk starts each thread as soon as its init() has run and its
-- clock only once the last thread has started, and counts every answer: with two threads, the first sent
-- requests, counted in the totals, while the second built its own (about 0.6 s of an 8 s phase).

-- The requests to send, in order, and the next one's index.
prepared, next_prepared = {}, 1

function request()
  local r = prepared[next_prepared]
  if r == nil then
    -- Out of prepared work: ask for something cheap that answers 404, so it is never counted.
    return wrk.format("GET", "/bench-ran-out")
  end
  prepared[next_prepared] = false
  next_prepared = next_prepared + 1
  return r
end

-- Prints "BENCH <name>=<2xx answers> other=<error statuses> p50_us=... p99_us=...".
function done(summary, latency, requests)
  io.write(string.format("BENCH %s=%d other=%d p50_us=%d p99_us=%d\n", counted_name,
    summary.requests - summary.errors.status, summary.errors.status,
    latency:percentile(50), latency:percentile(99)))
end
