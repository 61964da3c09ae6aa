-- gcra.lua: the GCRA (generic cell rate algorithm) module, a token bucket
-- kept as one timestamp (see lib.lua for how modules become the decide
-- script).
--
-- Exact: every value is an integer below 2^53, so Lua's doubles hold it
-- exactly. The emission interval window_ms * 1000 / limit microseconds is
-- the fraction step / per_us in lowest terms, and time is counted in units
-- of 1/per_us microsecond: a unit costs step of them, the bucket holds
-- cap = burst * step. Quota::gcra (and gcra.shape here) accepts a quota only
-- if cap <= 2^52; then every sum below stays <= 2^53.
--
-- Key     a string "{prefix}:gcra:{policy}:..." holding the theoretical
--         arrival time (TAT) as "a:b": a whole Redis-time microseconds plus
--         b/per_us of one (0 <= b < per_us), both plain decimals. It expires
--         (PX, integer ms) when the bucket is full again, plus one ms, so
--         an idle key vanishes, but never before its TAT: Redis counts PX
--         from its own millisecond clock, which can run up to 1 ms behind
--         TIME's microseconds (and, in a script, from the script's start). The format before exact GCRA, a float of microseconds
--         ("1763912345678901.5"), is still read, rounded up to the next
--         whole microsecond (b = 0): later, never earlier; one that is not a
--         number from 0 to below 2^53 ("nan", "inf") is corrupt.
-- Args    shape = gcra.shape(limit, window_ms, burst), cost, now_us (from
--         Redis TIME).
-- Result  ahead = how far the TAT runs ahead of now, clamped to [0, cap];
--         allowed when cost <= burst and ahead + cost * step <= cap;
--         remaining = units that would still fit now; retry = the exact wait
--         until cost fits (for a cost above the burst, which never fits: the
--         wait until the bucket is full); reset = the wait until the bucket
--         is full. Waits are in ms, rounded up; reset_us and reset_after_us
--         are reset before and after the spend in µs, rounded up, which
--         decide.lua replies (a refund is bounded by the spend's end to the
--         µs: refund.lua).
--
-- A TAT further ahead than the capacity (booked by a wider burst: one
-- lowered since, or a replica still on the old quota during a deploy) is
-- obeyed, never rewritten: the key admits again once the booking has drained
-- to within this quota's bucket, so old and new replicas together admit no
-- more than the wider one alone would (booked). Its waits are capped by the
-- key's TTL, which every writer sets to its TAT's end: a corrupt value far
-- ahead lasts no longer than its TTL, and one without a TTL gets a full
-- bucket's (undo's heal). A remainder b >= per_us (a limit changed since)
-- rounds the TAT up to a + 1. A value that is
-- neither format, or of the wrong type, is deleted; any other error is
-- raised (lib.lua's corruption). check only reads (but for deleting a corrupt
-- value); commit writes the spend (SET PX) and undo heals a missing or
-- over-long TTL, so the spend is the first write and a Redis that refuses
-- writes fails the call with the key as it was.

-- The module is built by calling gcra_module(), which returns its table
-- (divmod, ceil_div, read_tat and ahead_of among its functions, for
-- decide.lua's compact form and refund.lua), as fixed_window_module() does:
-- a script builds it only when a request needs it, which spares a call that
-- has no GCRA limit about 10,700 instructions of Redis's.

local function gcra_module()
  local gcra = {}

  -- Quotient and remainder of whole numbers a >= 0 and b >= 1, exact when
  -- a + b <= 2^53: a % b is a - floor(a / b) * b in doubles, whose quotient
  -- is off by at most one, and corrected; a - r is then a multiple of b. (No
  -- math.floor: a call into C costs Redis's Lua about 500 instructions, an
  -- operator a few.)
  local function divmod(a, b)
    local r = a % b
    local q = (a - r) / b
    if r < 0 then
      q, r = q - 1, r + b
    elseif r >= b then
      q, r = q + 1, r - b
    end
    return q, r
  end

  local function ceil_div(a, b)
    local q, r = divmod(a, b)
    if r > 0 then
      q = q + 1
    end
    return q
  end

  -- The GCRA units of a quota (see the header), or nil if it cannot be
  -- decided exactly (too fast, or cap above 2^52): what Quota::gcra rejects.
  function gcra.shape(limit, window, burst)
    local span = window * 1000
    if burst < 1 or span > 2^52 or limit > span then
      return nil
    end
    local a, b = span, limit
    while b > 0 do
      local _, r = divmod(a, b)
      a, b = b, r
    end
    local step, per_us = span / a, limit / a
    local cap = burst * step
    if cap > 2^52 then
      return nil
    end
    return { burst = burst, step = step, per_us = per_us, cap = cap,
      cap_us = divmod(cap, per_us) }
  end

  -- The TAT stored at key as (a, b), or nil when there is none; a value in
  -- neither format is deleted (see the header).
  local function read_tat(key)
    local raw = read_string(key)
    if raw == nil then
      return nil
    end
    local colon = string.find(raw, ':', 1, true)
    if colon then
      local a, b = stored(string.sub(raw, 1, colon - 1)), stored(string.sub(raw, colon + 1))
      if a and b then
        return a, b
      end
    else
      local n = tonumber(raw)
      if n ~= nil and n >= 0 and n < 2^53 then
        return math.ceil(n), 0
      end
    end
    redis.call('DEL', key)
    return nil
  end

  -- x units of 1/per_us microsecond, in ms, rounded up.
  local function ms(x, per_us)
    return ceil_div(ceil_div(x, per_us), 1000)
  end

  -- How far a stored TAT (a, b) runs ahead of now, in units, clamped to
  -- [0, cap] (see the header); 0 when there is none (a is nil). Also
  -- decide.lua's compact form's. A second result, the whole µs until the
  -- TAT (rounded up), says it runs beyond cap (booked).
  local function ahead_of(s, a, b, now)
    if a == nil then
      return 0
    end
    if b >= s.per_us then
      a, b = a + 1, 0
    end
    local d = a - now
    if d < 0 then
      return 0
    end
    if d > s.cap_us then
      return s.cap, d + (b > 0 and 1 or 0)
    end
    local ahead = d * s.per_us + b
    if ahead > s.cap then
      return s.cap, d + (b > 0 and 1 or 0)
    end
    return ahead
  end

  -- A key booked beyond cap (see the header): denied, nothing left, waits
  -- from the booking's end (in whole µs from now, until_us), capped by the
  -- key's life: a key whose PTTL is k lives through the ms k from now and
  -- is gone the ms after, so k + 1 (a PTTL of 0 is its last ms). A TTL
  -- beyond the booking's end is healed (undo: PEXPIRE reset + 1); one with
  -- none gets a full bucket's, PEXPIRE h - 1, so that it is gone by h.
  local function booked(key, s, cost, until_us, ttl)
    local per_us = s.per_us
    local tat_ms = ceil_div(until_us, 1000)
    local heal, horizon, heal_px = false, tat_ms, nil
    if ttl == -1 then
      horizon = math.min(tat_ms, ms(s.cap, per_us))
      heal, heal_px = true, horizon - 1
    elseif ttl > tat_ms + 1 then
      heal = true
    elseif ttl >= 0 then
      horizon = math.min(tat_ms, ttl + 1)
    end
    local retry = horizon
    if cost <= s.burst then
      -- Until the TAT is within what admits cost: cap - cost * step units
      -- ahead, in whole µs rounded down (a wait never early).
      local fit_us = divmod(s.cap - cost * s.step, per_us)
      retry = math.min(horizon, ceil_div(until_us - fit_us, 1000))
    end
    local reset_us = math.min(until_us, horizon * 1000)
    return {
      key = key, per_us = per_us, ahead = s.cap, after = s.cap, heal = heal, heal_px = heal_px,
      allowed = false, remaining = 0, remaining_after = 0,
      reset = horizon, reset_after = horizon, ttl = horizon + 1, retry = math.max(1, retry),
      reset_us = reset_us, reset_after_us = reset_us,
    }
  end

  function gcra.check(key, s, cost, now)
    local step, per_us, cap = s.step, s.per_us, s.cap
    local a, b = read_tat(key)
    local ahead, until_us = ahead_of(s, a, b, now)
    local ttl = redis.call('PTTL', key)
    if until_us then
      return booked(key, s, cost, until_us, ttl)
    end
    local room = cap - ahead
    local allowed = cost <= s.burst and cost * step <= room
    local after, remaining_after = ahead, 0
    if allowed then
      after = ahead + cost * step
      remaining_after = divmod(cap - after, step)
    end
    local reset_us, reset_after_us = ceil_div(ahead, per_us), ceil_div(after, per_us)
    local reset, reset_after = ceil_div(reset_us, 1000), ceil_div(reset_after_us, 1000)
    local retry = 0
    if not allowed then
      if cost <= s.burst then
        retry = math.max(1, ms(cost * step - room, per_us))
      else
        retry = math.max(1, reset)
      end
    end
    -- One constructor: a table grown field by field rehashes as it goes.
    -- A key without (a sane) TTL is healed by commit or undo, not here: the
    -- spend must be the first write (see the header).
    return {
      key = key, now = now, per_us = per_us, ahead = ahead, after = after,
      heal = ttl == -1 or ttl > ms(cap, per_us) + 1,
      allowed = allowed, remaining = divmod(room, step), remaining_after = remaining_after,
      reset = reset, reset_after = reset_after, ttl = reset_after + 1, retry = retry,
      reset_us = reset_us, reset_after_us = reset_after_us,
    }
  end

  -- Nothing to take back (check never writes a spend): only a TTL to heal;
  -- for a peek (`best_effort`), as well as Redis lets it (pcall: a
  -- replica's READONLY is let go).
  function gcra.undo(st, _, best_effort)
    if st.heal then
      local call = best_effort and redis.pcall or redis.call
      if st.heal_px then
        -- A booking without a TTL: gone by its horizon (PEXPIRE 0 deletes).
        call('PEXPIRE', st.key, int(st.heal_px))
      elseif st.ahead > 0 then
        call('PEXPIRE', st.key, int(st.reset + 1))
      else
        call('DEL', st.key)
      end
    end
  end

  function gcra.commit(st, cost)
    if cost > 0 then
      local q, r = divmod(st.after, st.per_us)
      redis.call('SET', st.key, string.format('%d:%d', st.now + q, r), 'PX', int(st.ttl))
    else
      gcra.undo(st)
    end
  end

  gcra.divmod, gcra.ceil_div, gcra.read_tat, gcra.ahead_of = divmod, ceil_div, read_tat, ahead_of
  return gcra
end
