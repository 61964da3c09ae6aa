-- decide.lua: one atomic, all-or-nothing decision over one or more limits.
-- It runs after lib.lua and the algorithm modules (fixed_window.lua,
-- sliding_window.lua, gcra.lua), joined into one script by store/scripts.rs,
-- and builds a module only when a request of the call needs it (module
-- below). A module has check (a limit's state; it may spend already), then
-- commit (spend, or keep the spend) or undo (take back what check spent).
-- Only the fixed window writes in check, and its spend is its first write;
-- the others write in commit and undo (the spend, a healed TTL). A call whose
-- limits are all fixed windows runs decide_fixed.lua instead.
--
-- Redis refuses a write (out of memory, a read-only replica) only while a
-- script has written nothing: such a refusal is raised (lib.lua's
-- corruption) and fails the whole call with every key as it was. Only a
-- corrupt value (the wrong type, not a number) is reset.
--
-- One call decides a batch of independent requests (often one); each
-- request's limits are decided all or nothing. The Redis store batches
-- concurrent requests into one call; on a cluster, only requests whose keys
-- share a hash slot (every request's keys share a hash tag).
--
-- KEYS     every limit's key: request 1's limits in order, then request 2's...
-- ARGV[1]  the number of requests in the batch, >= 1
-- then per request:
--   cost     integer >= 0, the units it spends (0 only looks)
--   limits   integer >= 1, how many limits (keys) it has
--   then per limit, five integers:
--     algorithm  1 fixed window, 2 sliding window, 3 GCRA
--     limit      >= 1, units per window
--     window_ms  >= 1
--     burst      GCRA burst >= 1 (0 for the other algorithms); a GCRA limit
--                must be one Quota::gcra accepts (see gcra.lua's header)
--     shadow     1 if the limit only observes (dry run), else 0
--
-- Reply: one MessagePack array (cmsgpack.pack) of integers, flat: first
-- Redis's clock when the call read it (TIME, in µs; 0 if it never did, in a
-- call of fixed windows only), then per request: allowed, then per limit:
-- allowed_i, remaining_i, reset_i, retry_ms_i. Packed, it is one bulk
-- string: redis-rs parses an array reply element by element through its
-- combinator parser, which cost the server more per request than the rest
-- of the decision.
--   now_us       Redis's clock: a GCRA limit's state resets reset_i after it
--                (its spend's end, to the µs, which bounds a refund of the
--                spend on Redis's own clock: refund.lua)
--   allowed      1 if every enforced (non-shadow) limit admitted the cost, and
--                then every limit that admitted it spent it; 0 if any
--                enforced limit denied, and then none spent anything. A
--                shadow limit that denies never blocks the others.
--   allowed_i    whether limit i alone would admit the cost
--   remaining_i  units left in limit i after this decision
--   reset_i      until limit i is fully available again: in ms, but for a
--                GCRA limit in µs (both rounded up)
--   retry_ms_i   ms until limit i would admit the cost (when it denies)
--
-- The compact form, for the commonest call that is not a fixed window's (one
-- limiter's requests, each with one sliding-window or GCRA limit and the
-- same cost above 0), marked by a first argument of 0 (no request, which the
-- form above never has):
-- ARGV[1]  0
-- ARGV[2]  algorithm  2 sliding window, 3 GCRA
-- ARGV[3]  limit      >= 1
-- ARGV[4]  window_ms  >= 1
-- ARGV[5]  burst      as above: >= 1 for GCRA (a quota Quota::gcra
--                     accepts), 0 for a sliding window
-- ARGV[6]  cost       >= 1, the units each request spends
-- then the keys carried after KEYS on a Redis Cluster, if any
-- (decide_fixed.lua's "A batch per node": a call may touch keys of other
-- slots of the node it runs on; a key of a slot the node does not hold fails
-- the call when first touched, the requests decided before it keeping their
-- spends). Every key, declared or carried, is one request. Whether the limit
-- is a shadow's does not matter to a request of one limit (its caller reads
-- the denial), so it is not sent. The reply is the one above, request by
-- request.
-- An admitted request is decided inline, as the module's check and commit
-- would, with no table and one argument a request where the form above
-- takes seven: GCRA in one GET and one SET PX, which also sets the TTL (no
-- PTTL); a sliding window in HMGET, HSET and PEXPIRE (no PTTL). Redis's
-- work per decision (benches/script-cost.sh, 8 a call): GCRA from about
-- 85,700 instructions to about 45,300, a sliding window from about 93,800
-- to about 60,100. Anything else (a denial, which may heal a TTL; a value
-- that is not what we write; an error reply; a peek) goes through the
-- module's check, commit and undo, as in the form above.
--
-- Peek: joined after `local peek = true` (store/scripts.rs's PEEK_LUA), the
-- same script decides and replies as ever but keeps no spend: every limit is
-- settled with undo, and reports its state before spending. Its heals (a
-- TTL missing or too long) are best effort: a write Redis refuses (a
-- replica's READONLY, whose PTTLs run long by as much as its clock is
-- behind its master's) is let go, and the peek answers as the heal would
-- leave the key, as the master's next check does. Only a value that is not
-- what we write, which a GCRA or sliding-window peek deletes, fails it.
--
-- Time is Redis's own (TIME, PTTL), never the caller's. Every argument of
-- every request is validated before the first write; every key written gets
-- a TTL. A TTL computed from TIME never ends early: from Redis 7.2, TIME and
-- PEXPIRE read one snapshot, the script's start (redis#10300); before it,
-- TIME advances inside a script and PEXPIRE counts from its own later
-- clock, so a key lives longer by the script's run so far (seen on 7.0.15:
-- TIME 291 ms apart across a busy loop, PEXPIRETIME from the second).

local function bad(what)
  return redis.error_reply('ERR decide: ' .. what)
end

if ARGV[1] == '0' then
  local algorithm, limit, window = whole(ARGV[2], 2), whole(ARGV[3], 1), whole(ARGV[4], 1)
  local burst, cost = whole(ARGV[5], 0), whole(ARGV[6], 1)
  local gcra = algorithm == 3 and gcra_module()
  local s = gcra and limit and window and burst and gcra.shape(limit, window, burst)
  if not algorithm or algorithm > 3 or not limit or not window or not burst or not cost
    or (algorithm == 3 and not s) or #ARGV < 6 or #KEYS < 1 then
    return bad('compact call: bad algorithm, limit, window_ms, burst or cost')
  end
  -- The keys: KEYS, then those carried after the cost (a cluster node's
  -- batch).
  local key_of = KEYS
  if #ARGV > 6 then
    key_of = {}
    for i = 1, #KEYS do
      key_of[i] = KEYS[i]
    end
    for i = 7, #ARGV do
      key_of[#key_of + 1] = ARGV[i]
    end
  end
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local reply, at = { now }, 1
  -- A request the inline path does not take: the module's way.
  local function settle(st, module)
    local spends = st.allowed and not peek
    local remaining, reset, retry = st.remaining, st.reset_us or st.reset, st.retry
    if spends then
      module.commit(st, cost)
      remaining, reset, retry = st.remaining_after, st.reset_after_us or st.reset_after, 0
    else
      module.undo(st, cost, peek)
      if st.allowed then
        retry = 0
      end
    end
    local ok = st.allowed and 1 or 0
    reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4], reply[at + 5] =
      ok, ok, remaining, reset, retry
  end
  if algorithm == 3 then
    local divmod, ceil_div, ahead_of = gcra.divmod, gcra.ceil_div, gcra.ahead_of
    local step, per_us, cap = s.step, s.per_us, s.cap
    local spend = cost * step
    local fits = cost <= burst and not peek
    for i = 1, #key_of do
      local k = key_of[i]
      -- The TAT as gcra.check reads it, when it is absent or "a:b" of
      -- whole numbers; anything else (a table: an error reply) is left to
      -- it.
      local raw, a, b = redis.pcall('GET', k), nil, 0
      local plain = raw == false
      if type(raw) == 'string' then
        local colon = string.find(raw, ':', 1, true)
        if colon then
          a, b = stored(string.sub(raw, 1, colon - 1)), stored(string.sub(raw, colon + 1))
          plain = a ~= nil and b ~= nil
        end
      end
      local ahead = plain and ahead_of(s, a, b, now)
      if plain and fits and spend <= cap - ahead then
        local after = ahead + spend
        local q, r = divmod(after, per_us)
        local reset_us = q + (r > 0 and 1 or 0)
        redis.call('SET', k, string.format('%d:%d', now + q, r), 'PX', int(ceil_div(reset_us, 1000) + 1))
        reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4], reply[at + 5] =
          1, 1, divmod(cap - after, step), reset_us, 0
      else
        settle(gcra.check(k, s, cost, now), gcra)
      end
      at = at + 5
    end
  else
    local sliding_window = sliding_window_module()
    local roll = sliding_window.roll
    local now_ms = math.floor(now / 1000)
    for i = 1, #key_of do
      local k = key_of[i]
      -- The counts as sliding_window.check reads them, when the hash is
      -- absent or holds three whole numbers; anything else is left to it.
      local raw = redis.pcall('HMGET', k, 's', 'c', 'p')
      local st, c, p, plain
      if not raw.err then
        st, c, p = stored(raw[1]), stored(raw[2]), stored(raw[3])
        plain = st ~= nil and c ~= nil and p ~= nil
        if not (plain or raw[1] or raw[2] or raw[3]) then
          st, c, p, plain = now_ms, 0, 0, true
        end
      end
      local admit = false
      if plain and not peek then
        local elapsed
        st, c, p, elapsed = roll(st, c, p, now_ms, window)
        local left = window - elapsed
        local weighted = p * left / window
        if c + cost + weighted <= limit then
          admit = true
          redis.call('HSET', k, 's', int(st), 'c', int(c + cost), 'p', int(p))
          redis.call('PEXPIRE', k, int(st + 2 * window - now_ms))
          local remaining = math.floor(limit - (c + cost) - weighted)
          reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4], reply[at + 5] =
            1, 1, remaining > 0 and remaining or 0, left + window, 0
        end
      end
      if not admit then
        settle(sliding_window.check(k, limit, window, cost, now_ms), sliding_window)
      end
      at = at + 5
    end
  end
  return cmsgpack.pack(reply)
end

local requests = whole(ARGV[1], 1)
if not requests then
  return bad('ARGV[1] must be the number of requests (>= 1)')
end

-- The algorithms' modules, by number (1 fixed window, 2 sliding window, 3
-- GCRA), each built when a request first needs it: a module's closures cost
-- Redis about 1,300 instructions each, at every call that builds them. A
-- built module is read from modules (a table read), not through module (a
-- Lua call, about 700 instructions).
local modules = {}
local function module(algorithm)
  local m = modules[algorithm]
  if not m then
    if algorithm == 1 then
      m = fixed_window_module(corruption)
    elseif algorithm == 2 then
      m = sliding_window_module()
    else
      m = gcra_module()
    end
    modules[algorithm] = m
  end
  return m
end

-- The GCRA shape of a quota: the last one made is kept, since a batch's
-- requests are mostly one limiter's and a shape costs a loop of divisions
-- and a table.
local shaped, shaped_limit, shaped_window, shaped_burst
local function shape_of(limit, window, burst)
  if not (shaped and limit == shaped_limit and window == shaped_window and burst == shaped_burst) then
    shaped = module(3).shape(limit, window, burst)
    shaped_limit, shaped_window, shaped_burst = limit, window, burst
  end
  return shaped
end

-- Every argument checked before anything is decided (and so written). No
-- table per request or limit is kept: deciding reads the arguments again,
-- each then a lookup in lib.lua's `parsed`.
local arg, key = 2, 1
for r = 1, requests do
  local cost, n = whole(ARGV[arg], 0), whole(ARGV[arg + 1], 1)
  if not cost or not n then
    return bad('request ' .. r .. ': cost (>= 0) and number of limits (>= 1) expected')
  end
  arg = arg + 2
  for i = 1, n do
    local algorithm, limit, window = whole(ARGV[arg], 1), whole(ARGV[arg + 1], 1), whole(ARGV[arg + 2], 1)
    local burst, shadow = whole(ARGV[arg + 3], 0), whole(ARGV[arg + 4], 0)
    if not KEYS[key] or not algorithm or algorithm > 3 or not limit or not window or not burst
      or not shadow or shadow > 1 or (algorithm == 3 and not shape_of(limit, window, burst)) then
      return bad('request ' .. r .. ', limit ' .. i .. ': bad key, algorithm, limit, window_ms, burst or shadow')
    end
    arg, key = arg + 5, key + 1
  end
end
if arg ~= #ARGV + 1 or key ~= #KEYS + 1 then
  return bad('ARGV and KEYS do not match the requests they describe')
end

-- Redis time, read once and only if a sliding window or GCRA needs it (a
-- fixed window runs on its key's PTTL).
local now_us, now_ms

-- Each request in turn: its limits checked, then each settled (committed
-- or undone) once all are known, and its reply appended. states and algos
-- are reused from request to request.
local reply, at = { 0 }, 1
local states, algos = {}, {}
arg, key = 2, 1
for _ = 1, requests do
  local cost, n = whole(ARGV[arg], 0), whole(ARGV[arg + 1], 1)
  arg = arg + 2
  local all = true
  for i = 1, n do
    local algorithm, limit, window = parsed[ARGV[arg]], parsed[ARGV[arg + 1]], parsed[ARGV[arg + 2]]
    local st
    if algorithm == 1 then
      st = (modules[1] or module(1)).check(KEYS[key], limit, window, cost, peek)
    else
      if not now_us then
        local time = redis.call('TIME')
        now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
        now_ms = math.floor(now_us / 1000)
      end
      if algorithm == 2 then
        st = (modules[2] or module(2)).check(KEYS[key], limit, window, cost, now_ms)
      else
        local shape = shape_of(limit, window, parsed[ARGV[arg + 3]])
        st = (modules[3] or module(3)).check(KEYS[key], shape, cost, now_us)
      end
    end
    states[i], algos[i] = st, algorithm
    all = all and (st.allowed or parsed[ARGV[arg + 4]] == 1)
    arg, key = arg + 5, key + 1
  end
  reply[at + 1] = all and 1 or 0
  at = at + 1
  -- Settled last limit first: a key listed twice (which Store::decide's
  -- callers may send) was spent twice in order, so its spends are undone
  -- in reverse, and the first spend's undo, which deletes a counter it
  -- created, comes last. In order, that delete came first and the second
  -- undo's DECRBY made a counter of -cost with no TTL.
  for i = n, 1, -1 do
    local st = states[i]
    if all and st.allowed and not peek then
      modules[algos[i]].commit(st, cost)
    else
      modules[algos[i]].undo(st, cost, peek)
    end
  end
  for i = 1, n do
    local st = states[i]
    local spends = all and st.allowed and not peek
    local remaining, reset = st.remaining, st.reset_us or st.reset
    if spends then
      remaining, reset = st.remaining_after, st.reset_after_us or st.reset_after
    end
    local retry = 0
    if not st.allowed then
      retry = st.retry
    end
    reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] =
      st.allowed and 1 or 0, remaining, reset, retry
    at = at + 4
  end
end
reply[1] = now_us or 0
return cmsgpack.pack(reply)
