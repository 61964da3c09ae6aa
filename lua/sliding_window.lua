-- sliding_window.lua: the sliding-window-counter algorithm module (see
-- lib.lua for how modules become the decide script).
--
-- Key     a hash "{prefix}:sw:{policy}:..." with fields
--           s  start of the current window (Redis time, ms)
--           c  units admitted in the current window
--           p  units admitted in the previous window
--         Windows start at the key's first request and follow each other.
--         The key expires when both counts stop mattering: 2 windows after s.
-- Args    limit, window_ms, cost, now_ms (from Redis TIME).
-- Result  used = c + p * (window - elapsed) / window, the previous window
--         weighted by the share of it the rolling window still covers;
--         allowed when used + cost <= limit; remaining = floor(limit - used);
--         retry = the exact wait until cost fits; reset = the wait until used
--         is 0.
--
-- A value of the wrong type, or fields that are not whole numbers, are reset;
-- any other error is raised (lib.lua's corruption). check only reads (but for
-- deleting a corrupt value); commit writes the spend (HSET, PEXPIRE) and undo
-- heals a missing or over-long TTL. So the spend is the first write, which
-- Redis refuses when out of memory or a read-only replica: the caller gets
-- the error and the key is left as it was. (Once a script has written,
-- Redis lets its later writes through.)
--
-- Bound: over any span of length d <= window, at most limit * (1 + d/window)
-- units are admitted (a fixed window admits 2 * limit within 2 ms).

-- The module is built by calling sliding_window_module(), which returns its
-- table (roll among its functions, for decide.lua's compact form), as
-- fixed_window_module() does: a script builds it only when a request needs
-- it. Each function defined is a closure that Redis's Lua creates, and
-- collects, at every call of the script (about 1,300 instructions of
-- Redis's each), so a call that has no sliding-window limit saves about
-- 9,300 instructions (benches/script-cost.sh's method).

local function sliding_window_module()
  local sliding_window = {}

  -- How long until a window of count units (and a previous window of p)
  -- weighs nothing: left of this window and a whole one if it holds any,
  -- left if only the previous one does.
  local function drain(count, p, left, window)
    if count > 0 then
      return left + window
    end
    if p > 0 then
      return left
    end
    return 0
  end

  -- Stored counts (s, c, p) as they stand at now: a start after now (Redis
  -- time went back: a failover to another host) is taken as now, keeping the
  -- counts; windows that ended since roll over. Returns s, c, p and the time
  -- elapsed in the current window. Also decide.lua's compact form's.
  local function roll(s, c, p, now, window)
    if s > now then
      s = now
    end
    local elapsed = now - s
    if elapsed >= window then
      local k = math.floor(elapsed / window)
      if k == 1 then p = c else p = 0 end
      c = 0
      s = s + k * window
      elapsed = now - s
    end
    return s, c, p, elapsed
  end

  function sliding_window.check(key, limit, window, cost, now)
    local s, c, p
    local raw = redis.pcall('HMGET', key, 's', 'c', 'p')
    if raw.err then
      corruption(raw) -- raises any error but a wrong type
      redis.call('DEL', key)
    else
      s, c, p = stored(raw[1]), stored(raw[2]), stored(raw[3])
      if (s == nil or c == nil or p == nil) and (raw[1] or raw[2] or raw[3]) then
        redis.call('DEL', key) -- corrupt: start afresh
      end
    end
    if s == nil or c == nil or p == nil then
      s, c, p = now, 0, 0
    end
    local elapsed
    s, c, p, elapsed = roll(s, c, p, now, window)
    local ttl = redis.call('PTTL', key)
    local expiry = s + 2 * window - now

    local left = window - elapsed
    local weighted = p * left / window
    local retry
    if c + cost <= limit then
      -- Fits in this window once the previous one's weight has shrunk enough.
      retry = math.ceil(window - (limit - c - cost) * window / p - elapsed)
    else
      -- Next window: this window's count becomes the weighted one. Never
      -- past its end, when no count is left to weigh (and a cost beyond the
      -- limit, which never fits, waits no longer: not +inf, for c = 0).
      local at = window - (limit - cost) * window / c
      if not (at > 0) then
        at = 0
      elseif at > window then
        at = window
      end
      retry = left + math.ceil(at)
    end
    if not (retry >= 1) then
      retry = 1 -- also for NaN (0 / 0 with no previous window), as math.max did
    end
    local remaining = math.floor(limit - c - weighted)
    local remaining_after = math.floor(limit - (c + cost) - weighted)
    -- One constructor: a table grown field by field rehashes as it goes.
    -- A hash without (a sane) TTL is healed by commit or undo, not here: the
    -- spend must be the first write (see the header). A TTL up to 1 s longer
    -- than the expiry is sane: PTTL counts from the script's start and the
    -- expiry from TIME, read after it, so the two differ by a millisecond
    -- boundary, and more across hosts (a replica whose clock is behind its
    -- master's); healed, it was a write that a peek on a replica, or out of
    -- memory, failed on now and then.
    return {
      key = key, s = s, c = c, p = p, expiry = expiry,
      heal = ttl == -1 or ttl > expiry + 1000,
      allowed = c + cost + weighted <= limit,
      remaining = remaining > 0 and remaining or 0,
      remaining_after = remaining_after > 0 and remaining_after or 0,
      reset = drain(c, p, left, window),
      reset_after = drain(c + cost, p, left, window),
      retry = retry,
    }
  end

  -- Nothing to take back (check never writes a spend): only a TTL to heal;
  -- for a peek (`best_effort`), as well as Redis lets it (pcall: a
  -- replica's READONLY is let go).
  function sliding_window.undo(st, _, best_effort)
    if st.heal then
      (best_effort and redis.pcall or redis.call)('PEXPIRE', st.key, int(st.expiry))
    end
  end

  function sliding_window.commit(st, cost)
    if cost > 0 then
      redis.call('HSET', st.key, 's', int(st.s), 'c', int(st.c + cost), 'p', int(st.p))
      redis.call('PEXPIRE', st.key, int(st.expiry))
    else
      sliding_window.undo(st)
    end
  end

  sliding_window.roll = roll
  return sliding_window
end
