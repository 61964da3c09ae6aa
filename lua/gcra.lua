-- gcra.lua: the GCRA (generic cell rate algorithm) module, a token bucket
-- kept as one timestamp (see lib.lua for how modules become the decide
-- script).
--
-- Key     a string "{prefix}:gcra:{policy}:..." holding the theoretical
--         arrival time (TAT) in Redis-time microseconds; it expires (PX,
--         integer ms) when the bucket is full again, so an idle key vanishes.
-- Args    limit, window_ms, burst, cost, now_us (from Redis TIME).
--         interval = window_ms * 1000 / limit microseconds per unit;
--         capacity = burst * interval.
--         Exact when the interval is a whole number of microseconds (every
--         value an integer); otherwise a fraction's rounding is allowed half
--         a microsecond, less than one interval, so it never admits an extra
--         unit.
-- Result  allowed when max(TAT, now) + cost * interval - now <= capacity;
--         remaining = units that would still fit now; retry = the exact wait
--         until cost fits; reset = the wait until the bucket is full.
--
-- A TAT further ahead than the capacity (a burst lowered since, or a corrupt
-- value) is clamped to now + capacity instead of being obeyed. A value that
-- is not a number >= 0, or of the wrong type, is deleted; any other error is
-- raised (lib.lua's corruption). check only reads (but for deleting a corrupt
-- value); commit writes the spend (SET PX) and undo heals a missing or
-- over-long TTL, so the spend is the first write and a Redis that refuses
-- writes fails the call with the key as it was.

local gcra = {}

function gcra.check(key, limit, window, burst, cost, now)
  local interval = window * 1000 / limit
  local capacity = burst * interval
  -- Rounding slack, in microseconds. None when the interval is a whole number
  -- of microseconds: every value is then an integer below 2^53, exact. Half
  -- a microsecond otherwise, for the rounding of fractions: less than any
  -- interval (> 1 us), so a full bucket never fits one more unit.
  local slack = 0
  if (window * 1000) % limit ~= 0 then
    slack = 0.5
  end
  -- How far the key runs ahead of now, in microseconds. Relative values keep
  -- the arithmetic exact enough; absolute ones are ~10^15.
  local ahead = 0
  local tat = read_number(key, false)
  if tat ~= nil then
    ahead = math.min(math.max(tat - now, 0), capacity)
  end
  local ttl = redis.call('PTTL', key)
  local after = ahead + cost * interval
  local st = { key = key, at = now + after, after = after, ahead = ahead }
  -- A key without (a sane) TTL is healed by commit or undo, not here: the
  -- spend must be the first write (see the header).
  st.heal = ttl == -1 or ttl > math.ceil(capacity / 1000)
  st.allowed = after <= capacity + slack
  local function fits(a)
    return math.max(0, math.floor((capacity - a + slack) / interval))
  end
  st.remaining = fits(ahead)
  st.remaining_after = fits(after)
  st.reset = math.ceil(ahead / 1000)
  st.reset_after = math.ceil(after / 1000)
  st.retry = math.max(1, math.ceil((after - capacity) / 1000))
  return st
end

-- Nothing to take back (check never writes a spend): only a TTL to heal.
function gcra.undo(st)
  if st.heal then
    if st.ahead > 0 then
      redis.call('PEXPIRE', st.key, int(math.max(1, math.ceil(st.ahead / 1000))))
    else
      redis.call('DEL', st.key)
    end
  end
end

function gcra.commit(st, cost)
  if cost > 0 then
    local ttl = math.max(1, math.ceil(st.after / 1000))
    redis.call('SET', st.key, string.format('%.17g', st.at), 'PX', int(ttl))
  else
    gcra.undo(st)
  end
end
