-- decide.lua: one atomic, all-or-nothing decision over one or more limits.
-- It runs after lib.lua and the algorithm modules (fixed_window.lua,
-- sliding_window.lua, gcra.lua), joined into one script by store/scripts.rs.
--
-- KEYS[i]  the key of limit i. All keys of one decision share a hash tag, so
--          the script works on Redis Cluster.
-- ARGV[1]  cost: integer >= 0, the units this request spends (0 only looks)
-- ARGV[2 + 5(i-1) ..]  limit i, five integers:
--          algorithm  1 fixed window, 2 sliding window, 3 GCRA
--          limit      >= 1, units per window
--          window_ms  >= 1
--          burst      GCRA burst >= 1 (0 for the other algorithms)
--          shadow     1 if the limit only observes (dry run), else 0
--
-- Reply: { allowed, then for each limit i: allowed_i, remaining_i, reset_ms_i, retry_ms_i }
--   allowed      1 if every enforced (non-shadow) limit admitted the cost, and
--                then every limit that admitted it spent it; 0 if any
--                enforced limit denied, and then none spent anything. A
--                shadow limit that denies never blocks the others.
--   allowed_i    whether limit i alone would admit the cost
--   remaining_i  units left in limit i after this decision
--   reset_ms_i   ms until limit i is fully available again
--   retry_ms_i   ms until limit i would admit the cost (when it denies)
--
-- Time is Redis's own (TIME, PTTL), never the caller's. Every argument is
-- validated before the first write; every key written gets a TTL.

local n = #KEYS
local cost = whole(ARGV[1], 0)
if n < 1 or #ARGV ~= 1 + 5 * n or not cost then
  return redis.error_reply('ERR decide: expected ARGV cost, then 5 integers per key')
end
local limits = {}
for i = 1, n do
  local at = 2 + 5 * (i - 1)
  local l = {
    algorithm = whole(ARGV[at], 1),
    limit = whole(ARGV[at + 1], 1),
    window = whole(ARGV[at + 2], 1),
    burst = whole(ARGV[at + 3], 0),
    shadow = whole(ARGV[at + 4], 0),
  }
  if not l.algorithm or l.algorithm > 3 or not l.limit or not l.window or not l.burst
    or (l.algorithm == 3 and l.burst < 1) or not l.shadow or l.shadow > 1 then
    return redis.error_reply('ERR decide: bad algorithm, limit, window_ms or burst for key ' .. i)
  end
  limits[i] = l
end

local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now_ms = math.floor(now_us / 1000)

local modules = { fixed_window, sliding_window, gcra }
local states = {}
local all = true
for i, l in ipairs(limits) do
  local st
  if l.algorithm == 1 then
    st = fixed_window.check(KEYS[i], l.limit, l.window, cost)
  elseif l.algorithm == 2 then
    st = sliding_window.check(KEYS[i], l.limit, l.window, cost, now_ms)
  else
    st = gcra.check(KEYS[i], l.limit, l.window, l.burst, cost, now_us)
  end
  states[i] = st
  all = all and (st.allowed or l.shadow == 1)
end

local reply = { all and 1 or 0 }
for i, st in ipairs(states) do
  local spends = all and st.allowed
  if spends then
    modules[limits[i].algorithm].commit(st, cost)
  end
  local remaining, reset = st.remaining, st.reset
  if spends then
    remaining, reset = st.remaining_after, st.reset_after
  end
  local retry = 0
  if not st.allowed then
    retry = st.retry
  end
  local at = 2 + 4 * (i - 1)
  reply[at], reply[at + 1], reply[at + 2], reply[at + 3] =
    st.allowed and 1 or 0, remaining, reset, retry
end
return reply
