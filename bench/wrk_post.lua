-- wrk script: POST one JSON body over and over, then print one machine-readable summary line.
--
-- Environment (set by bench/run.py):
--   BENCH_BODY_FILE     path of the JSON request body
--   BENCH_KEY           bearer key
--   BENCH_COUNT_HEADER  optional: a response header to tally (e.g. x-gateway-attempts); only then is
--                       a response() callback defined, since it makes wrk parse every header into Lua
--   BENCH_KEYS_FILE     optional: bearer keys, one a line; each request takes one of them at random
--                       (make bench-scale's many keys); only then is a request() callback defined
--
-- Latency values are microseconds, from wrk's own histogram (the time is taken before response()).

local f = assert(io.open(os.getenv("BENCH_BODY_FILE"), "rb"))
local body = f:read("*a")
f:close()

wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("BENCH_KEY")

local keys_file = os.getenv("BENCH_KEYS_FILE")
if keys_file and keys_file ~= "" then
  local keys = {}
  for line in io.lines(keys_file) do
    table.insert(keys, line)
  end
  function request()
    wrk.headers["Authorization"] = "Bearer " .. keys[math.random(#keys)]
    return wrk.format()
  end
end

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

local count_header = os.getenv("BENCH_COUNT_HEADER")
if count_header and count_header ~= "" then
  count_header = string.lower(count_header)
  -- per-thread tallies, read back in done(); header_values is "value=count;value=count"
  tallies = {}
  function response(status, headers, _)
    local value = "absent"
    for k, v in pairs(headers) do
      if string.lower(k) == count_header then
        value = v
      end
    end
    local key = tostring(status) .. ":" .. string.gsub(value, "[^%w%-%._ ]", "?")
    tallies[key] = (tallies[key] or 0) + 1
  end
end

function done(summary, latency, _)
  local tally_parts = {}
  if count_header and count_header ~= "" then
    local merged = {}
    for _, t in ipairs(threads) do
      local tt = t:get("tallies") or {}
      for k, v in pairs(tt) do
        merged[k] = (merged[k] or 0) + v
      end
    end
    for k, v in pairs(merged) do
      table.insert(tally_parts, string.format('"%s":%d', k, v))
    end
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,'
      .. '"p999_us":%d,"mean_us":%.2f,"max_us":%d,"min_us":%d,'
      .. '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},"tallies":{%s}}\n',
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
    latency.mean, latency.max, latency.min,
    e.connect, e.read, e.write, e.status, e.timeout, table.concat(tally_parts, ",")))
end
