-- Per-key requests, and one record per answer, for wrk (benches/chaos.py).
--
--   wrk -tT -cT --timeout 30s -s chaos.lua URL -- HEADER PREFIX KEYS OUT
--
-- Run it with as many threads as connections: each thread then has one
-- connection and one request in flight at a time, so the answer wrk hands to
-- response() is the answer to the request this thread's request() built
-- last, whose key and send time are kept here. (wrk tells response()
-- nothing about the request; with several connections per thread the key of
-- an answer would be unknown.) wrk calls request() again only when nothing
-- of the last request was sent (a first write that would block) or after a
-- failed connection, whose lost request cannot be answered on the new one:
-- either way the answer belongs to the request built last.
--
-- Thread i sends `HEADER: PREFIX<j>` with j = (n + 5 i) mod KEYS for its
-- n-th request: every thread cycles through all the keys, from its own
-- offset, so each key is hit by every thread.
--
-- Every answer appends one line to OUT/thread-<i>.events:
--
--   <answered at, ms> <latency, ms> <status> <store> <j>
--
-- `store` is 1 when the answer carries the `RateLimit` header, else 0: the
-- layer writes it on every decision the store made (200 allowed, 429
-- denied) and never on a store-error fallback (200 under Allow, 503 under
-- Deny). Times are CLOCK_MONOTONIC in ms, the clock of Python's
-- time.monotonic(), read through LuaJIT's ffi. The file is written through
-- stdio's buffer, which wrk's normal exit (also after SIGINT) flushes.

local ffi = require("ffi")
ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } chaos_timespec;
  int clock_gettime(int clock, chaos_timespec *ts);
]]
local CLOCK_MONOTONIC = 1
local ts = ffi.new("chaos_timespec")

local function now_ms()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end

local threads = 0
function setup(thread)
  thread:set("id", threads)
  threads = threads + 1
end

local header, prefix, keys, out
local requests = {}
local n, key, sent = 0, 0, 0
local file

function init(args)
  header, prefix, keys, out = args[1], args[2], tonumber(args[3]), args[4]
  local offset = 5 * (id or 0)
  for j = 0, keys - 1 do
    local k = (j + offset) % keys
    requests[j] = { k, wrk.format(nil, nil, { [header] = prefix .. k }) }
  end
  file = assert(io.open(out .. "/thread-" .. (id or 0) .. ".events", "w"))
  file:setvbuf("full")
end

function request()
  local r = requests[n % keys]
  n = n + 1
  key = r[1]
  sent = now_ms()
  return r[2]
end

function response(status, headers, body)
  local t = now_ms()
  local store = (headers["ratelimit"] or headers["RateLimit"]) and 1 or 0
  file:write(string.format("%.3f %.3f %d %d %d\n", t, t - sent, status, store, key))
end
