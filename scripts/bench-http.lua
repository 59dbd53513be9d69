-- wrk's side of scripts/bench-http: the same HTTP checks as its load
-- generator, and one JSON result line in the generator's format at the end.
--
-- Configured by the environment (wrk reads the script before it runs `init`,
-- and only a `request` function defined by then makes it call one per
-- request): BENCH_SERVER (tollgate or throttlecrab), BENCH_KEYS, BENCH_LIMIT,
-- BENCH_BURST, BENCH_PERIOD (seconds), BENCH_CONNECTIONS (wrk's -c, for the
-- result line).
--
-- With one key the body is set once and wrk sends the same bytes each time;
-- with more, each request names a key drawn uniformly at random from a table
-- of requests formatted before the run (keys `bench-key-<n>`, as the load
-- generator names them).

local server = os.getenv("BENCH_SERVER")
local keys = tonumber(os.getenv("BENCH_KEYS"))
local limit = tonumber(os.getenv("BENCH_LIMIT"))
local burst = tonumber(os.getenv("BENCH_BURST"))
local period = tonumber(os.getenv("BENCH_PERIOD"))
local connections = tonumber(os.getenv("BENCH_CONNECTIONS"))

local function body(key)
  if server == "tollgate" then
    return string.format(
      '{"key":"%s","limit":%d,"period":"%ds","burst":%d,"algorithm":"gcra","cost":1}',
      key, limit, period, burst)
  end
  return string.format(
    '{"key":"%s","max_burst":%d,"count_per_period":%d,"period":%d,"quantity":1}',
    key, burst, limit, period)
end

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = body("bench-key-0")

if keys > 1 then
  local requests = {}

  function init(args)
    math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16))
    for i = 1, keys do
      requests[i] = wrk.format(nil, nil, nil, body("bench-key-" .. (i - 1)))
    end
  end

  function request()
    return requests[math.random(keys)]
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  local answered = summary.requests
  local refused = e.status
  -- Tollgate answers a deny with 429 (wrk counts every status >= 400), so
  -- its split is known; throttlecrab answers 200 either way, and wrk reads
  -- no body: its split is left at 0 / 0 ("n/a" in the report).
  local allowed, denied = 0, 0
  if server == "tollgate" then
    allowed, denied = answered - refused, refused
  end
  io.write(string.format(
    'RESULT {"api":"http","generator":"wrk","server":"%s","keys":%d,"concurrency":%d,'
      .. '"seconds":%.6f,"requests":%d,"rps":%.3f,"p50_us":%.1f,"p99_us":%.1f,"max_us":%.1f,'
      .. '"allowed":%d,"denied":%d,"errors":%d}\n',
    server, keys, connections, summary.duration / 1e6, answered,
    answered / (summary.duration / 1e6), latency:percentile(50), latency:percentile(99),
    latency.max, allowed, denied, e.connect + e.read + e.write + e.timeout))
end
