-- fixed_window.lua: the fixed-window algorithm, the one implementation both
-- decide scripts use: the general one and decide_fixed.lua, the fast path
-- for calls whose every limit is a fixed window (see lib.lua for how the
-- scripts are joined).
--
-- Key     a string counter "{prefix}:fw:{policy}:..." whose PTTL is the time
--         left in the window; the window starts at the key's first admitted
--         request.
-- Args    limit (units per window), window_ms, cost; time is the key's PTTL.
-- Result  allowed when count + cost <= limit; remaining = limit - count;
--         reset = retry = the key's PTTL + 1 (a whole window for a new key).
--
-- Redis keeps a key through the millisecond its expiry names (it drops it
-- once its clock is past it), so a key given PEXPIRE k lives k + 1 ticks,
-- and one whose PTTL is k lives until k + 1 ms from the tick now, no
-- sooner. So a new counter gets PEXPIRE window_ms - 1 (its `expire`
-- argument below): it lives window_ms ticks, as the memory store's window
-- does. And a window's time left is its PTTL + 1: a client told to retry
-- after it finds the counter gone. (It was the PTTL, and a window lived
-- window_ms + 1 ticks: a client that retried exactly when told was denied
-- once more, 1 ms before the counter went.) A window of 1 ms gets PEXPIRE 1,
-- as PEXPIRE 0 deletes: it lives 2 ticks, and says so (a wait of 2 ms),
-- where the memory store's lives 1. A counter set by a version before
-- this (PEXPIRE window_ms) is given window_ms - 1 when next seen.
--
-- Order of work: a spend is made first (INCRBY, then PTTL for an existing
-- key) and settled once the request is decided: kept (a new counter gets its
-- PEXPIRE) or taken back (DECRBY, or DEL for a counter the spend created).
-- An allowed decision costs two Redis calls; checking first (GET, PTTL, then
-- INCRBY) would cost three, or four for a new key. The script is atomic, so
-- no other client ever sees a spend that was taken back. A cost of 0 only
-- looks (GET, PTTL).
--
-- Guarantees:
--   * a denied request leaves the counter as it was, so the counter never
--     passes the limit through this script and a denial consumes nothing;
--   * every key left behind has a TTL of at most window_ms. A key found with
--     no TTL (left by a non-atomic client: SET NX then DECR, or INCR then a
--     lost EXPIRE) or with a TTL longer than the window is healed, not obeyed;
--   * a value that is not an integer >= 0 (in plain decimal, at most 2^53),
--     or of the wrong type, is reset; a counter at 0 counts as absent, so
--     its window starts afresh;
--   * the window left is at least 1 ms while the key lives (a PTTL of 0 is
--     its last millisecond), so a denial never says to retry at once;
--   * any other error of Redis (OOM, READONLY, MISCONF...) is raised to the
--     caller, never taken for a corrupt value: the spend is the first write,
--     and Redis refuses writes only before a script's first one, so a
--     refused spend leaves the counter exactly as it was.
--
-- Numbers may be given to Redis as Lua numbers (Redis formats them with
-- %.17g, exact for every integer up to 2^53) or as the caller's decimal
-- strings, which spares that formatting: `cost_arg` below.
--
-- The module is built by calling fixed_window_module(corruption), which
-- returns its table (corruption is lib.lua's, from value_helpers()): a
-- script builds it only when it needs it. Each function defined is a
-- closure that Redis's Lua creates, and collects, at every call of the
-- script, about 1,300 instructions of Redis's each (callgrind); the fast
-- path (decide_fixed.lua) decides its common requests without it.

local function fixed_window_module(corruption)
  local fixed_window = {}

  -- The window left at key (its PTTL + 1, above), healing a missing or
  -- over-long TTL (for a peek, `best_effort`, as well as Redis lets it:
  -- see `look`). At least 1 while the key lives, so that a denial never
  -- says to retry at once, as the memory store's never does.
  function fixed_window.left(key, window, expire, best_effort)
    local ttl = redis.call('PTTL', key)
    if ttl < 0 or ttl > expire then
      return fixed_window.heal(key, ttl, window, expire, best_effort)
    end
    return ttl + 1
  end

  -- The window left at key whose PTTL is ttl, outside 0..expire: a key with
  -- no TTL, or one longer than a new counter's (set by a version before
  -- `expire`, PEXPIRE window_ms; a window since shortened), gets a new
  -- counter's expiry, and says so: `expire` + 1. A key that is gone (-2,
  -- a look) is left so. With `best_effort` (a peek), a write Redis
  -- refuses is let go (pcall), and the window is what the heal would leave.
  function fixed_window.heal(key, ttl, window, expire, best_effort)
    if ttl == -1 or ttl > expire then
      (best_effort and redis.pcall or redis.call)('PEXPIRE', key, expire)
    end
    return expire + 1
  end

  -- What a new counter gets: PEXPIRE `expire` (above).
  function fixed_window.expire(window)
    if window > 1 then
      return window - 1
    end
    return 1
  end

  -- Looks without spending: the count and the window left. A count is a
  -- plain decimal from 0 to 2^53, as INCRBY writes it; any other value
  -- ("7.0", " 7", "1e3", "inf", "-1") is reset, as a spend would reset it,
  -- rather than read as a number here and refused by the INCRBY of a
  -- caller that then spends (reserve.lua), which would fail every call on
  -- the key until its window ended. A peek (`best_effort`) resets and
  -- heals as well as Redis lets it: a write refused (a replica's READONLY)
  -- is let go (pcall), and the peek answers as the write would leave the
  -- key, which the master's next check does. So Redis answers a peek on a
  -- replica, out of memory, and whatever the clocks of the replica and its
  -- master (a replica's PTTL of a key is longer by as much as its clock is
  -- behind its master's).
  function fixed_window.look(key, window, expire, best_effort)
    local raw = redis.pcall('GET', key)
    local count = 0
    if raw then
      count = type(raw) == 'string' and tonumber(raw)
      if not count or count < 0 or count > 2^53 or count % 1 ~= 0
          or string.format('%d', count) ~= raw then
        if type(raw) == 'table' then
          corruption(raw) -- raises any error but a wrong type
        end
        -- corrupt: start afresh, a whole window (where Redis refuses the
        -- DEL, the key still there must not say its own TTL)
        (best_effort and redis.pcall or redis.call)('DEL', key)
        return 0, expire + 1
      end
    end
    return count, fixed_window.left(key, window, expire, best_effort)
  end

  -- Spends cost (> 0) at once: the count before it, the window left, and
  -- whether the spend created the counter (which then has no TTL yet).
  -- The count after a spend whose INCRBY replied `count`, which was not an
  -- integer from cost to 2^53: raises every error but a corrupt value (a write Redis
  -- refused, out of memory or on a read-only replica, is the caller's error,
  -- and the key is left as it was); a corrupt value (not an integer >= 0, or
  -- the wrong type) starts afresh.
  function fixed_window.respend(key, count, cost_arg)
    if type(count) == 'table' then
      corruption(count)
    end
    redis.call('DEL', key)
    return redis.call('INCRBY', key, cost_arg)
  end

  function fixed_window.spend(key, cost, cost_arg, window, expire)
    local count = redis.pcall('INCRBY', key, cost_arg)
    -- Above 2^53: corrupt, as `look` reads it (compared alone: a sum with
    -- the cost would round in Lua's doubles).
    if type(count) ~= 'number' or count < cost or count > 2^53 then
      count = fixed_window.respend(key, count, cost_arg)
    end
    if count == cost then
      return 0, expire + 1, true -- a new counter: a whole window
    end
    return count - cost, fixed_window.left(key, window, expire), false
  end

  -- Keeps a spend (a new counter gets its TTL) or takes it back.
  function fixed_window.settle(key, keep, before, fresh, cost_arg, expire)
    if keep then
      if fresh then
        redis.call('PEXPIRE', key, expire)
      end
    elseif before == 0 then
      redis.call('DEL', key)
    else
      redis.call('DECRBY', key, cost_arg)
    end
  end

  -- decide.lua's module interface: check (which spends already, but for a
  -- cost of 0 or a peek, which only look: a peek's writes, its heals, are
  -- best effort, so Redis answers it on a replica or out of memory), then
  -- commit or undo.
  function fixed_window.check(key, limit, window, cost, peek)
    local before, ttl, fresh
    local spent = cost > 0 and not peek
    local expire = window > 1 and window - 1 or 1 -- fixed_window.expire, inline
    if spent then
      before, ttl, fresh = fixed_window.spend(key, cost, cost, window, expire)
    else
      before, ttl = fixed_window.look(key, window, expire, peek)
    end
    -- One constructor: the table is allocated once, at its final size.
    return {
      key = key,
      expire = expire,
      fresh = fresh,
      spent = spent,
      before = before,
      allowed = before + cost <= limit,
      reset = ttl,
      retry = ttl,
      remaining = math.max(0, limit - before), -- a lowered limit can be passed
      remaining_after = math.max(0, limit - before - cost),
      reset_after = ttl,
    }
  end

  function fixed_window.commit(st, cost)
    if st.spent then
      fixed_window.settle(st.key, true, st.before, st.fresh, cost, st.expire)
    end
  end

  function fixed_window.undo(st, cost)
    if st.spent then
      fixed_window.settle(st.key, false, st.before, st.fresh, cost, st.expire)
    end
  end

  return fixed_window
end
