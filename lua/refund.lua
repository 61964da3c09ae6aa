-- refund.lua: gives back what an admitted decision spent, to the window it
-- was spent in and to no other. store/scripts.rs puts lib.lua and the
-- algorithm modules (fixed_window.lua, sliding_window.lua, gcra.lua) before
-- it, for GCRA's helpers (shape, read_tat, divmod, ceil_div): the GCRA module
-- is built only if a refund is a GCRA limit's.
--
-- KEYS     every refunded limit's key, then the call's marker (once.lua)
-- ARGV     per refunded key, seven integers:
--   algorithm       1 fixed window, 2 sliding window, 3 GCRA
--   limit           >= 1, units per window
--   window_ms       >= 1
--   burst           GCRA burst >= 1 (0 for the other algorithms)
--   cost            >= 1, the units to give back
--   window_end_in   ms from now until the spent window ends, as the caller
--                   measured it (may be negative): the fixed window's end,
--                   the sliding window's (the bucket the cost went to), or
--                   the TAT the GCRA spend left
--   spend_ends_at   GCRA: that TAT on Redis's clock (TIME), in µs rounded
--                   up, as decide.lua's reply gives it; 0 when the
--                   caller does not know it (another algorithm, or a store
--                   call that did not report Redis's clock)
--          then the call's id (once.lua)
-- Reply    the number of keys credited; 0 when the call ran before (once.lua:
--          a call sent again, its first reply lost, credits nothing more).
--
-- Windows of one key follow each other a whole window apart, so the spent
-- window is the one that ends within half a window of window_end_in (which
-- is late by the answer's and this call's way: a call more than half a
-- window late, or a window begun by a reset, or after a key was lost,
-- within half a window of the spent one's start, is credited in its place;
-- Limiter::refund documents it):
--   * fixed window: the key's PTTL + 1, as decisions report it
--     (fixed_window.lua); a window that ended and restarted ends a
--     whole window later, and is not credited;
--   * sliding window: the stored window (field c) or the one before it
--     (field p), whichever the spend went to; otherwise nothing;
--   * GCRA: the TAT moves back by cost * step, but by no more than is still
--     outstanding of the spend and never before now. What is outstanding
--     is read on Redis's own clock from spend_ends_at when it is given:
--     window_end_in, measured by the caller, is later by the decision's
--     answer and this call's request on their way, and a refund bounded by
--     it could credit a spend already drained (a unit admitted early).
-- Counts never drop below zero; a count back at zero is deleted (it counts
-- as absent anyway). Keys keep their expiry (GCRA's follows its TAT, as
-- commit sets it); a key that is gone is left alone, so nothing is created.
-- Every argument is validated before the first write.

local function bad(what)
  return redis.error_reply('ERR refund: ' .. what)
end

-- A signed whole number (window_end_in), or nil.
local function signed(v)
  if type(v) ~= 'string' then
    return nil
  end
  if string.sub(v, 1, 1) == '-' then
    local n = whole(string.sub(v, 2), 1)
    return n and -n
  end
  return whole(v, 0)
end

local marker = call_marker('rf')
if not marker then
  return bad('the last key must be the first key, "#rf:" and the call id, the last argument')
end
local n = #KEYS - 1 -- the refunded keys
if #ARGV ~= n * 7 + 1 then
  return bad('ARGV does not match KEYS')
end

local gcra -- gcra_module(), once a GCRA refund needs it
local refunds = {}
for i = 1, n do
  local a = (i - 1) * 7
  local r = {
    key = KEYS[i],
    algorithm = whole(ARGV[a + 1], 1),
    limit = whole(ARGV[a + 2], 1),
    window = whole(ARGV[a + 3], 1),
    burst = whole(ARGV[a + 4], 0),
    cost = whole(ARGV[a + 5], 1),
    ends = signed(ARGV[a + 6]),
    ends_at = whole(ARGV[a + 7], 0),
  }
  if r.algorithm == 3 and r.limit and r.window and r.burst then
    gcra = gcra or gcra_module()
    r.shape = gcra.shape(r.limit, r.window, r.burst)
  end
  if not r.algorithm or r.algorithm > 3 or not r.limit or not r.window or not r.burst
    or not r.cost or not r.ends or not r.ends_at or (r.algorithm == 3 and not r.shape) then
    return bad('refund ' .. i .. ': bad algorithm, limit, window_ms, burst, cost, window_end_in or spend_ends_at')
  end
  refunds[i] = r
end

if ran_before(marker) then
  return 0
end

local now_us
local function clock()
  if not now_us then
    local time = redis.call('TIME')
    now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
  end
  return now_us
end

-- Whether a window ending at `ends` (ms from now) is the spent one.
local function same(r, ends)
  return math.abs(ends - r.ends) < math.max(1, math.floor(r.window / 2))
end

local function fixed(r)
  -- Its window's end as a decision reports it: the PTTL + 1
  -- (fixed_window.lua's header).
  local ttl = redis.call('PTTL', r.key)
  if ttl < 0 or not same(r, ttl + 1) then
    return 0 -- gone, without a TTL (healed by the next check), or a later window
  end
  local raw = read_string(r.key)
  local count = raw and whole(raw, 0)
  if not count then
    return 0 -- a corrupt value is the next check's to reset
  end
  if count <= r.cost then
    redis.call('DEL', r.key)
  else
    redis.call('DECRBY', r.key, int(r.cost))
  end
  return 1
end

local function sliding(r)
  local raw = redis.pcall('HMGET', r.key, 's', 'c', 'p')
  if raw.err then
    return 0
  end
  local s, c, p = whole(raw[1], 0), whole(raw[2], 0), whole(raw[3], 0)
  if not s or not c or not p then
    return 0
  end
  local now_ms = math.floor(clock() / 1000)
  local ends = s + r.window - now_ms -- the stored window's end, from now
  local field, count
  if same(r, ends) then
    field, count = 'c', c
  elseif same(r, ends - r.window) then
    field, count = 'p', p
  else
    return 0
  end
  redis.call('HSET', r.key, field, int(math.max(0, count - r.cost)))
  if redis.call('PTTL', r.key) == -1 then
    redis.call('PEXPIRE', r.key, int(math.max(1, s + 2 * r.window - now_ms)))
  end
  return 1
end

local function cell(r)
  local s = r.shape
  local a, b = gcra.read_tat(r.key)
  if a == nil then
    return 0
  end
  local now = clock()
  if b >= s.per_us then
    a, b = a + 1, 0
  end
  local d = a - now
  -- What is still outstanding of the spend, in µs from now.
  local left = r.ends * 1000
  if r.ends_at > 0 then
    left = r.ends_at - now
  end
  if d < 0 or left <= 0 then
    return 0 -- the bucket is full again, or the spend is no longer outstanding
  end
  local back = r.cost * s.step
  local outstanding = s.cap
  if left <= s.cap_us then
    -- The spend's end is its TAT rounded up to the whole µs: more than
    -- left - 1 µs of it is outstanding, and perhaps not all of left.
    -- Crediting left whole gave back up to per_us - 1 units too many
    -- (under 1 µs), moving every spend behind it that much earlier.
    outstanding = (left - 1) * s.per_us + 1
  end
  back = math.min(back, outstanding)
  if d > s.cap_us or d * s.per_us + b > s.cap then
    -- Booked beyond a full bucket (a wider quota's replica: gcra.lua's
    -- header): the credit comes off the booking as it stands, which stays
    -- ahead of now (back <= cap), so a refund never frees what the wider
    -- quota booked.
    local q, rem = gcra.divmod(back, s.per_us)
    a, b = a - q, b - rem
    if b < 0 then
      a, b = a - 1, b + s.per_us
    end
    local until_us = a - now + (b > 0 and 1 or 0)
    redis.call('SET', r.key, int(a) .. ':' .. int(b), 'PX', int(gcra.ceil_div(until_us, 1000) + 1))
    return 1
  end
  local ahead = d * s.per_us + b - back
  if ahead <= 0 then
    redis.call('DEL', r.key)
    return 1
  end
  local q, rem = gcra.divmod(ahead, s.per_us)
  local ttl = gcra.ceil_div(gcra.ceil_div(ahead, s.per_us), 1000) + 1
  redis.call('SET', r.key, int(now + q) .. ':' .. int(rem), 'PX', int(ttl))
  return 1
end

local credited = 0
for _, r in ipairs(refunds) do
  if r.algorithm == 1 then
    credited = credited + fixed(r)
  elseif r.algorithm == 2 then
    credited = credited + sliding(r)
  else
    credited = credited + cell(r)
  end
end
mark(marker)
return credited
