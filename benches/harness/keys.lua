-- Per-request `x-api-key` headers, and pacing, for wrk (benches/load.py).
--
--   wrk ... -s keys.lua URL -- cycle N NONCE [DELAY]
--       every request: key k<j mod N>, j counting requests: N keys in turn
--   wrk ... -s keys.lua URL -- mixed N NONCE [DELAY]
--       9 of 10 requests: k<j mod N>, j counting only these (keys the
--       warm-up spent); every 10th: f-NONCE-THREAD-I, a key that no earlier
--       request sent, in this run or another (NONCE differs per wrk run)
--   wrk ... -s keys.lua URL -- fresh N NONCE [DELAY]
--       every request: f-NONCE-THREAD-I, a key no earlier request sent (a
--       flood of new keys; N unused)
--   wrk ... -s keys.lua URL -- plain N NONCE [DELAY]
--       wrk's own static `GET /` with no x-api-key header, byte for byte
--       what wrk sends without a script (N and NONCE unused): for pacing
--       the workloads that send no key
--
-- DELAY, if given and above 0: every connection waits DELAY ms after each
-- answer before it sends its next request (wrk's delay(); the wait is not
-- part of the latency wrk records), so C connections offer at most
-- C * 1000 / DELAY requests per second: a paced run, every server at the
-- same load. Without it, wrk sends as fast as the server answers.
--
-- Each wrk thread runs its own copy of this script; setup() numbers the
-- threads so that their fresh keys never collide. The cycle's requests are
-- formatted once, in init(), so request() costs wrk little.

local threads = 0
function setup(thread)
  thread:set("id", threads)
  threads = threads + 1
end

local mode, n, nonce
local cycle = {}
local i, j = 0, 0

function init(args)
  mode = args[1]
  n = tonumber(args[2]) or 0
  nonce = args[3] or "0"
  for k = 0, n - 1 do
    cycle[k] = wrk.format(nil, nil, { ["x-api-key"] = "k" .. k })
  end
  -- wrk looks for request() and delay() after init(): without request()
  -- it sends its static request; without delay(), it does not pace.
  if mode == "plain" then
    request = nil
  end
  local pause = tonumber(args[4])
  if pause and pause > 0 then
    function delay()
      return pause
    end
  end
end

function request()
  i = i + 1
  if mode == "fresh" or (mode == "mixed" and i % 10 == 0) then
    local fresh = "f-" .. nonce .. "-" .. (id or 0) .. "-" .. i
    return wrk.format(nil, nil, { ["x-api-key"] = fresh })
  end
  j = j + 1
  return cycle[j % n]
end
