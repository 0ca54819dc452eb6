-- wrk script of scripts/bench-http.sh: one kind of request per run. Set by
-- the environment (wrk passes arguments only to the threads, but whether
-- `request` and `response` exist is decided when the script is loaded):
--
--   BENCH_MODE   get           GET the URL's path (/healthz, /health: the
--                              HTTP stack, no decision)
--                tollgate      POST /v1/request, namespace `bench`, resource
--                              `gcra` (scripts/bench-config/), domain user-N
--                throttlecrab  POST /throttle, key user-N, with the same limit
--   BENCH_KEYS   1: every request for user-0, prepared once (wrk's fast
--                path); more: user-N drawn uniformly per request
--   BENCH_BURST, BENCH_RATE, BENCH_PERIOD: throttlecrab's max_burst,
--                count_per_period and period (seconds)
--   BENCH_CHECK  lua: count every answer by status code and by decision
--                (`"allowed":true` / `"allowed":false` in the body) in a
--                `response` hook. It makes wrk read every header and body
--                into Lua (about 2.5 µs per request here, a third more of
--                wrk's CPU), so by default the script leaves it out and
--                bench-http.sh checks the servers' own counters instead.
--
-- `done` prints one JSON line, prefixed `RESULT `, with the throughput,
-- latency percentiles (µs), wrk's socket errors, the answers with a status
-- of 400 or more (`status_errors`, wrk's own count) and, with the hook,
-- the status codes and decisions.

local mode = os.getenv("BENCH_MODE") or "get"
local keys = tonumber(os.getenv("BENCH_KEYS") or "1")
local burst = os.getenv("BENCH_BURST") or "10"
local rate = os.getenv("BENCH_RATE") or "100"
local period = os.getenv("BENCH_PERIOD") or "1"
local check = os.getenv("BENCH_CHECK") == "lua"

local prefix, suffix
if mode == "get" then
   wrk.method = "GET"
elseif mode == "tollgate" then
   wrk.method = "POST"
   wrk.path = "/v1/request"
   prefix = '{"namespace":"bench","resource":"gcra","domain":"user-'
   suffix = '"}'
elseif mode == "throttlecrab" then
   wrk.method = "POST"
   wrk.path = "/throttle"
   prefix = '{"key":"user-'
   suffix = '","max_burst":' .. burst .. ',"count_per_period":' .. rate
      .. ',"period":' .. period .. '}'
else
   error("BENCH_MODE must be get, tollgate or throttlecrab, not " .. mode)
end
if prefix then
   -- axum's Json extractor (throttlecrab) insists on it; tollgate ignores it.
   wrk.headers["Content-Type"] = "application/json"
   wrk.body = prefix .. "0" .. suffix
   if keys > 1 then
      function request()
         return wrk.format(nil, nil, nil, prefix .. math.random(0, keys - 1) .. suffix)
      end
   end
end

-- Per thread (each has its own Lua state); `done` reads them back.
local threads = {}

function setup(thread)
   table.insert(threads, thread)
end

function init(args)
   math.randomseed(os.time())
   codes = {}
   granted = 0
   rejected = 0
end

if check then
   function response(status, headers, body)
      codes[status] = (codes[status] or 0) + 1
      if prefix then
         if string.find(body, '"allowed":true', 1, true) then
            granted = granted + 1
         elseif string.find(body, '"allowed":false', 1, true) then
            rejected = rejected + 1
         end
      end
   end
end

function done(summary, latency, requests)
   local all = {}
   local g, r = 0, 0
   for _, thread in ipairs(threads) do
      for code, n in pairs(thread:get("codes")) do
         all[code] = (all[code] or 0) + n
      end
      g = g + thread:get("granted")
      r = r + thread:get("rejected")
   end
   local parts = {}
   for code, n in pairs(all) do
      table.insert(parts, string.format('"%d":%d', code, n))
   end
   local e = summary.errors
   io.write(string.format(
      'RESULT {"requests":%d,"duration_us":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,'
         .. '"p999_us":%d,"max_us":%d,"socket_errors":{"connect":%d,"read":%d,"write":%d,'
         .. '"timeout":%d},"status_errors":%d,"checked":%s,"codes":{%s},"granted":%d,"rejected":%d}\n',
      summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
      latency:percentile(99), latency:percentile(99.9), latency.max,
      e.connect, e.read, e.write, e.timeout, e.status, tostring(check),
      table.concat(parts, ","), g, r))
end
