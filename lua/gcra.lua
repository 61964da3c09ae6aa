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
-- Result  allowed when max(TAT, now) + cost * interval - now <= capacity;
--         remaining = units that would still fit now; retry = the exact wait
--         until cost fits; reset = the wait until the bucket is full.
--
-- A TAT further ahead than the capacity (a burst lowered since, or a corrupt
-- value) is clamped to now + capacity instead of being obeyed.

local gcra = {}

-- Float rounding tolerance, in microseconds.
local EPSILON = 1

function gcra.check(key, limit, window, burst, cost, now)
  local interval = window * 1000 / limit
  local capacity = burst * interval
  local tat = read_number(key, false)
  if tat == nil or tat < now then
    tat = now
  elseif tat > now + capacity then
    tat = now + capacity
  end
  local ttl = redis.call('PTTL', key)
  if ttl == -1 or ttl > math.ceil(capacity / 1000) then
    if tat > now then
      redis.call('PEXPIRE', key, int(math.max(1, math.ceil((tat - now) / 1000))))
    else
      redis.call('DEL', key)
    end
  end
  local new_tat = tat + cost * interval
  local st = { key = key, new_tat = new_tat, now = now }
  st.allowed = new_tat - now <= capacity + EPSILON
  local function fits(t)
    return math.max(0, math.floor((capacity - (t - now)) / interval + 1e-9))
  end
  st.remaining = fits(tat)
  st.remaining_after = fits(new_tat)
  st.reset = math.ceil((tat - now) / 1000)
  st.reset_after = math.ceil((new_tat - now) / 1000)
  st.retry = math.max(1, math.ceil((new_tat - capacity - now) / 1000))
  return st
end

function gcra.commit(st, cost)
  if cost > 0 then
    local ttl = math.max(1, math.ceil((st.new_tat - st.now) / 1000))
    redis.call('SET', st.key, string.format('%.17g', st.new_tat), 'PX', int(ttl))
  end
end
