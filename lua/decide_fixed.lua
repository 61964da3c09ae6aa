-- decide_fixed.lua: the fast path of decide.lua, for calls whose every limit
-- is a fixed window (the default algorithm). store/scripts.rs puts lib.lua
-- and fixed_window.lua before it, and nothing else: it decides exactly as the
-- general script does (fixed_window.lua documents the algorithm) and replies
-- exactly as decide.lua does, in less work. Lua's own time (converting
-- arguments, calling functions, building tables) was most of Redis's CPU per
-- decision, far more than the Redis commands it ran; each argument alone
-- cost Redis about 1,000 instructions (callgrind, benches/script-cost.sh).
--
-- One call decides a batch of independent requests (often one), each all or
-- nothing. The limits of a batch (often one limiter's) are sent once, as
-- policies, and consecutive requests alike (the same cost and the same
-- policies, as a batch from one limiter almost always is) are sent once, as
-- a run: such a request costs one argument, its key.
--
-- KEYS     every limit's key: request 1's limits in order, then request 2's...
--          On a Redis Cluster a call may hold requests of several hash
--          slots of one node: then KEYS holds only the first request's keys
--          (they route the call) and the others follow the last run in ARGV,
--          in the same order (see "A batch per node" below).
-- ARGV[1]  P, the number of policies, >= 1
-- then per policy, three integers:
--   limit      >= 1, units per window
--   window_ms  >= 1
--   shadow     1 if the limit only observes (dry run), else 0
-- then the number of runs, >= 1, and per run:
--   requests   integer >= 1, how many requests the run holds
--   cost       integer >= 0, the units each spends (0 only looks)
--   limits     integer >= 1, how many limits (keys) each has
--   then per limit: its policy, 1..P
-- Every integer is plain decimal ("1000", not "1e3"): some go to Redis as
-- they are.
--
-- The compact form, for the commonest call by far (one limiter's requests,
-- each with one limit and the same cost above 0), marked by a first
-- argument of 0 (no policy, which the form above never has):
-- ARGV[1]  0
-- ARGV[2]  limit      >= 1
-- ARGV[3]  window_ms  >= 1
-- ARGV[4]  cost       >= 1, the units each request spends
-- then the keys carried after KEYS on a Redis Cluster, if any. Every key,
-- declared or carried, is one request. Whether the limit is a shadow's does
-- not matter to a request of one limit (its caller reads the denial), so it
-- is not sent. Against the same requests spelled out as one policy and one
-- run, this form saves Redis five arguments (four, not nine) and their
-- checks: about 22,000 of 172,000 instructions for a call of 8, 18,000 of
-- 76,000 for a call of 1 (benches/script-cost.sh). Its reply is the same.
--
-- Reply: one MessagePack array (cmsgpack.pack), flat, request by request.
-- A request of a run with one limit and a cost above 0 (nearly every
-- request) takes two integers:
--   r          what remains after it, >= 0, if its limit admitted it;
--              -1 - what remains, if its limit denied it
--   reset_ms   until the window resets (when denied, also the retry time)
-- The caller knows the limit's policy, so whether a denial is a shadow's
-- (the request admitted all the same). Packing five numbers per request,
-- as decide.lua does, cost Redis 3,700 more instructions per decision
-- (benches/script-cost.sh), 14% of it. A request of any other run takes
-- decide.lua's: allowed, then per limit allowed_i, remaining_i, reset_ms_i,
-- retry_ms_i.
--
-- Every argument is validated before the first write; every key written gets
-- a TTL.
--
-- A batch per node: Redis Cluster routes a call by its declared keys, which
-- must share a hash slot; a script without a shebang (this one) may still
-- touch keys of other slots on the same node. So a batch of a node's
-- requests declares the first request's keys and carries the rest in ARGV.
-- A key of a slot the node does not hold (a map gone stale: resharding, a
-- failover) fails the call with Redis's "non local key" error when the
-- script first touches it: requests decided before it keep their spends
-- (counted, never over-admitted), and every request of the call gets the
-- error, which follows the store-error policy.

-- What the loops read, held in locals: a global (ARGV, redis.call, type)
-- is a lookup in Lua's table of globals at every use, and the loop below
-- made four a decision (about 600 instructions; benches/script-cost.sh).
local ARGV, KEYS, type = ARGV, KEYS, type
local rcall, rpcall = redis.call, redis.pcall
-- No local functions here: Redis runs the whole script at every call, and
-- each closure it builds cost about 1,250 instructions (benches/script-cost.sh).

-- Validation, before any write, keeping every number once parsed.
local compact = ARGV[1] == '0'
-- The compact form's limit and window.
local c_limit, c_window
-- The other form's policies (nil in the compact form), and the number of
-- runs (the compact form's is 1).
local policies, limit, window, expire, shadow, first, runs
local arg, keys -- the ARGV index after the runs, the number of keys
if compact then
  c_limit, c_window = whole(ARGV[2], 1), whole(ARGV[3], 1)
  if not c_limit or not c_window or not whole(ARGV[4], 1) then
    return redis.error_reply('ERR decide_fixed: compact call: bad limit, window_ms or cost')
  end
  arg, runs = 5, 1
else
  policies = whole(ARGV[1], 1)
  if not policies then
    return redis.error_reply('ERR decide_fixed: ARGV[1] must be the number of policies (>= 1)')
  end
  -- A slot each from the start, for the one policy of nearly every call: an
  -- empty table's first insert costs Lua a rehash.
  limit, window, expire, shadow = { false }, { false }, { false }, { false }
  for p = 1, policies do
    local a = 2 + (p - 1) * 3
    limit[p], window[p], shadow[p] = whole(ARGV[a], 1), whole(ARGV[a + 1], 1), whole(ARGV[a + 2], 0)
    if not limit[p] or not window[p] or not shadow[p] or shadow[p] > 1 then
      return redis.error_reply('ERR decide_fixed: policy ' .. p .. ': bad limit, window_ms or shadow')
    end
    -- A new counter's PEXPIRE: window_ms - 1 (fixed_window.lua's header).
    expire[p] = window[p] > 1 and window[p] - 1 or 1
  end
  first = 2 + policies * 3 -- ARGV index of the number of runs
  runs = whole(ARGV[first], 1)
  if not runs then
    return redis.error_reply('ERR decide_fixed: the number of runs (>= 1) expected after the policies')
  end
  arg, keys = first + 1, 0
  for r = 1, runs do
    local count, cost, n = whole(ARGV[arg], 1), whole(ARGV[arg + 1], 0), whole(ARGV[arg + 2], 1)
    if not count or not cost or not n then
      return redis.error_reply('ERR decide_fixed: run ' .. r .. ': requests (>= 1), cost (>= 0) and number of limits (>= 1) expected')
    end
    for j = arg + 3, arg + 2 + n do
      local p = whole(ARGV[j], 1)
      if not p or p > policies then
        return redis.error_reply('ERR decide_fixed: run ' .. r .. ': a policy number in 1..' .. policies .. ' expected')
      end
    end
    arg, keys = arg + 3 + n, keys + count * n
  end
end
-- The keys: KEYS, then those carried after the runs (or the compact
-- form's cost).
local key_of = KEYS
if #ARGV >= arg then
  key_of = {}
  for i = 1, #KEYS do
    key_of[i] = KEYS[i]
  end
  for i = arg, #ARGV do
    key_of[#key_of + 1] = ARGV[i]
  end
end
if compact then
  keys = #key_of -- every key is a request
end
if #KEYS < 1 or keys ~= #key_of then
  return redis.error_reply('ERR decide_fixed: ARGV and KEYS do not match the requests they describe')
end

-- Every argument is valid now, and `parsed` holds its number (a lookup,
-- cheaper than a table of its own or a call of whole()).
-- The reply, with room for 8 requests of the common run from the start, as
-- with the policies: growing from empty to 16 slots took five rehashes
-- (1.9% of a call of 8). Slots left over are cleared before it is packed.
local reply, at = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }, 0
local key = 0 -- KEYS index before the request being decided

-- The fixed-window module (fixed_window.lua), built on first use: the
-- common run below needs none of it.
local fw
local before, ttls, fresh

arg = first and first + 1 -- the first run's arguments (none in the compact form)
for _ = 1, runs do
  -- The run: its requests, cost and number of limits, and the first
  -- limit's policy; the compact form's one run is every key.
  local count, cost_s, n, lim, win, exp
  if compact then
    count, cost_s, n, lim, win = keys, ARGV[4], 1, c_limit, c_window
    exp = win > 1 and win - 1 or 1 -- a new counter's PEXPIRE (fixed_window.lua)
  else
    local p = parsed[ARGV[arg + 3]]
    count, cost_s, n = parsed[ARGV[arg]], ARGV[arg + 1], parsed[ARGV[arg + 2]]
    lim, win, exp = limit[p], window[p], expire[p]
  end
  local cost = parsed[cost_s]
  if n == 1 and cost > 0 then
    -- The common run, one limit and a cost, decided inline, exactly as
    -- fixed_window.spend and settle would: function calls and table
    -- accesses were most of what a decision cost Redis.
    -- A count above 2^53 is corrupt (no spend reaches it; compared after
    -- the spend, alone: a sum with the cost would round in Lua's doubles),
    -- and reset as any other corrupt value is.
    for i = key + 1, key + count do
      local k = key_of[i]
      local total = rpcall('INCRBY', k, cost_s)
      if type(total) ~= 'number' or total < cost or total > 9007199254740992 then
        fw = fw or fixed_window_module((value_helpers()))
        total = fw.respend(k, total, cost_s)
      end
      local ttl = exp + 1 -- a counter the spend created: a whole window
      if total ~= cost then
        -- Its PTTL + 1: fixed_window.lua's header says why.
        ttl = rcall('PTTL', k)
        if ttl < 0 or ttl > exp then
          fw = fw or fixed_window_module((value_helpers()))
          ttl = fw.heal(k, ttl, win, exp)
        else
          ttl = ttl + 1
        end
      end
      if total <= lim then
        if total == cost then
          rcall('PEXPIRE', k, exp)
        end
        reply[at + 1], reply[at + 2] = lim - total, ttl
      else
        if total == cost then
          rcall('DEL', k)
        else
          rcall('DECRBY', k, cost_s)
        end
        local left = lim - total + cost
        if left < 0 then
          left = 0 -- a lowered limit can be passed
        end
        reply[at + 1], reply[at + 2] = -1 - left, ttl
      end
      at = at + 2
    end
    key = key + count
  else
    -- Any other run (several limits, or a cost of 0 that only looks):
    -- each request all or nothing across its limits.
    fw = fw or fixed_window_module((value_helpers()))
    before, ttls, fresh = before or {}, ttls or {}, fresh or {}
    local first_policy = arg + 3
    for _ = 1, count do
      local all = true
      for i = 1, n do
        local p, k = parsed[ARGV[first_policy + i - 1]], key_of[key + i]
        if cost == 0 then
          before[i], ttls[i] = fw.look(k, window[p], expire[p])
          fresh[i] = false
        else
          before[i], ttls[i], fresh[i] = fw.spend(k, cost, cost_s, window[p], expire[p])
        end
        if before[i] + cost > limit[p] and shadow[p] == 0 then
          all = false
        end
      end
      reply[at + 1] = all and 1 or 0
      at = at + 1
      -- Settled last limit first, as decide.lua does (a key listed twice
      -- is undone in the reverse of its spends).
      if cost > 0 then
        for i = n, 1, -1 do
          local p = parsed[ARGV[first_policy + i - 1]]
          local keep = all and before[i] + cost <= limit[p]
          fw.settle(key_of[key + i], keep, before[i], fresh[i], cost_s, expire[p])
        end
      end
      for i = 1, n do
        local p = parsed[ARGV[first_policy + i - 1]]
        local spent, ttl = before[i], ttls[i]
        local allowed = spent + cost <= limit[p]
        local left = limit[p] - spent
        if all and allowed then
          left = left - cost
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
      key = key + n
    end
  end
  if not compact then
    arg = arg + 3 + n
  end
end
for i = at + 1, 16 do
  reply[i] = nil -- the room not used (cmsgpack packs 1..at, the rest nil)
end
return cmsgpack.pack(reply)
