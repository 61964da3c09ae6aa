-- Per-request `x-api-key` headers for wrk (benches/load.py).
--
--   wrk ... -s keys.lua URL -- cycle N NONCE
--       every request: key k<j mod N>, j counting requests: N keys in turn
--   wrk ... -s keys.lua URL -- mixed N NONCE
--       9 of 10 requests: k<j mod N>, j counting only these (keys the
--       warm-up spent); every 10th: f-NONCE-THREAD-I, a key that no earlier
--       request sent, in this run or another (NONCE differs per wrk run)
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
  n = tonumber(args[2])
  nonce = args[3] or "0"
  for k = 0, n - 1 do
    cycle[k] = wrk.format(nil, nil, { ["x-api-key"] = "k" .. k })
  end
end

function request()
  i = i + 1
  if mode == "mixed" and i % 10 == 0 then
    local fresh = "f-" .. nonce .. "-" .. (id or 0) .. "-" .. i
    return wrk.format(nil, nil, { ["x-api-key"] = fresh })
  end
  j = j + 1
  return cycle[j % n]
end
