-- fixed_window.lua: the fixed-window algorithm module (see lib.lua for how
-- modules become the decide script).
--
-- Key     a string counter "{prefix}:fw:{policy}:..." whose PTTL is the time
--         left in the window; the window starts at the key's first admitted
--         request.
-- Args    limit (units per window), window_ms, cost; time is the key's PTTL.
-- Result  allowed when count + cost <= limit; remaining = limit - count;
--         reset = retry = the key's PTTL (a whole window for a new key).
--
-- Guarantees:
--   * the counter only grows when count + cost <= limit, so it never passes
--     the limit and a denied request consumes nothing;
--   * every key left behind has a TTL of at most window_ms. A key found with
--     no TTL (left by a non-atomic client: SET NX then DECR, or INCR then a
--     lost EXPIRE) or with a TTL longer than the window is healed, not obeyed;
--   * a value that is not a non-negative integer is reset.

local fixed_window = {}

function fixed_window.check(key, limit, window, cost)
  local count = read_number(key, true) or 0
  local ttl = redis.call('PTTL', key)
  if ttl == -1 or ttl > window then
    -- Heal: a counter without a TTL (or an over-long one) would block forever.
    redis.call('PEXPIRE', key, int(window))
    ttl = window
  end
  local fresh = ttl < 0
  if fresh then
    ttl = window
  end
  -- One constructor: the table is allocated once, at its final size.
  return {
    key = key,
    window = window,
    fresh = fresh,
    allowed = count + cost <= limit,
    reset = ttl,
    retry = ttl,
    remaining = math.max(0, limit - count), -- a lowered limit can be passed
    remaining_after = math.max(0, limit - count - cost),
    reset_after = ttl,
  }
end

function fixed_window.commit(st, cost)
  if cost > 0 then
    redis.call('INCRBY', st.key, int(cost))
    if st.fresh then
      redis.call('PEXPIRE', st.key, int(st.window))
    end
  end
end
