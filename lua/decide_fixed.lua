-- decide_fixed.lua: the fast path of decide.lua, for calls whose every limit
-- is a fixed window (the default algorithm). store/scripts.rs puts lib.lua
-- and fixed_window.lua before it, and nothing else: it decides exactly as the
-- general script does (fixed_window.lua documents the algorithm) and replies
-- exactly as decide.lua does, in less work. Lua's own time (converting
-- arguments, calling functions, building tables) was most of Redis's CPU per
-- decision, far more than the Redis commands it ran.
--
-- One call decides a batch of independent requests (often one), each all or
-- nothing. The limits of a batch (often one limiter's) are sent once, as
-- policies, and each limit of a request names its policy by number.
--
-- KEYS     every limit's key: request 1's limits in order, then request 2's...
-- ARGV[1]  P, the number of policies, >= 1
-- then per policy, three integers:
--   limit      >= 1, units per window
--   window_ms  >= 1
--   shadow     1 if the limit only observes (dry run), else 0
-- then the number of requests, >= 1, and per request:
--   cost       integer >= 0, the units it spends (0 only looks)
--   limits     integer >= 1, how many limits (keys) it has
--   then per limit: its policy, 1..P
-- Every integer is plain decimal ("1000", not "1e3"): some go to Redis as
-- they are.
--
-- Reply: as decide.lua's, one MessagePack array (cmsgpack.pack), flat, per
-- request: allowed, then per limit: allowed_i, remaining_i, reset_ms_i,
-- retry_ms_i.
--
-- Every argument is validated before the first write; every key written gets
-- a TTL.

local function bad(what)
  return redis.error_reply('ERR decide_fixed: ' .. what)
end

-- Validation, before any write, keeping every number once parsed.
local policies = whole(ARGV[1], 1)
if not policies then
  return bad('ARGV[1] must be the number of policies (>= 1)')
end
local limit, window, window_s, shadow = {}, {}, {}, {}
for p = 1, policies do
  local a = 2 + (p - 1) * 3
  limit[p], window[p], shadow[p] = whole(ARGV[a], 1), whole(ARGV[a + 1], 1), whole(ARGV[a + 2], 0)
  window_s[p] = ARGV[a + 1]
  if not limit[p] or not window[p] or not shadow[p] or shadow[p] > 1 then
    return bad('policy ' .. p .. ': bad limit, window_ms or shadow')
  end
end
local first = 2 + policies * 3 -- ARGV index of the number of requests
local requests = whole(ARGV[first], 1)
if not requests then
  return bad('the number of requests (>= 1) expected after the policies')
end
local arg, keys = first + 1, 0
for r = 1, requests do
  local cost, n = whole(ARGV[arg], 0), whole(ARGV[arg + 1], 1)
  if not cost or not n then
    return bad('request ' .. r .. ': cost (>= 0) and number of limits (>= 1) expected')
  end
  for j = arg + 2, arg + 1 + n do
    local p = whole(ARGV[j], 1)
    if not p or p > policies then
      return bad('request ' .. r .. ': a policy number in 1..' .. policies .. ' expected')
    end
  end
  arg, keys = arg + 2 + n, keys + n
end
if arg ~= #ARGV + 1 or keys ~= #KEYS then
  return bad('ARGV and KEYS do not match the requests they describe')
end

-- Every argument is valid now, and `parsed` holds its number (a lookup,
-- cheaper than a table of its own). Scratch per limit of the request being
-- decided, reused across the batch.
local before, ttls, fresh = {}, {}, {}
local look, spend, settle = fixed_window.look, fixed_window.spend, fixed_window.settle
local reply, at = {}, 0
local key = 0
arg = first + 1
for _ = 1, requests do
  local cost_s = ARGV[arg]
  local cost, n = parsed[cost_s], parsed[ARGV[arg + 1]]
  local all = true
  for i = 1, n do
    local p, k = parsed[ARGV[arg + 1 + i]], KEYS[key + i]
    if cost == 0 then
      before[i], ttls[i] = look(k, window[p], window_s[p])
      fresh[i] = false
    else
      before[i], ttls[i], fresh[i] = spend(k, cost, cost_s, window[p], window_s[p])
    end
    if before[i] + cost > limit[p] and shadow[p] == 0 then
      all = false
    end
  end
  reply[at + 1] = all and 1 or 0
  at = at + 1
  for i = 1, n do
    local p = parsed[ARGV[arg + 1 + i]]
    local count, ttl = before[i], ttls[i]
    local allowed = count + cost <= limit[p]
    local left = limit[p] - count
    local keep = all and allowed
    if keep then
      left = left - cost
    end
    if cost > 0 then
      settle(KEYS[key + i], keep, count, fresh[i], cost_s, window_s[p])
    end
    if left < 0 then
      left = 0 -- a lowered limit can be passed
    end
    if allowed then
      reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] = 1, left, ttl, 0
    else
      reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] = 0, left, ttl, ttl
    end
    at = at + 4
  end
  arg, key = arg + 2 + n, key + n
end
return cmsgpack.pack(reply)
