-- fixed_window.lua: one atomic fixed-window rate-limit decision.
--
-- KEYS[1]  the counter key ("{prefix}:fw:{policy}:{<client>}")
-- ARGV[1]  limit      integer >= 1: units admitted per window
-- ARGV[2]  window_ms  integer >= 1: window length in milliseconds
-- ARGV[3]  cost       integer >= 0: units this request spends (0 only peeks)
--
-- Reply: { allowed (1|0), count, ttl_ms }
--   allowed  1 if the cost fit and was counted, 0 if denied (nothing counted)
--   count    units counted in the current window after this call
--   ttl_ms   the key's PTTL: milliseconds until the window resets
--
-- Guarantees:
--   * the counter only grows when count + cost <= limit, so it never passes
--     the limit and a denied request consumes nothing;
--   * every key left behind has a TTL of at most window_ms. A key found with no
--     TTL (left by a non-atomic client, e.g. SET NX then DECR, or INCR then a
--     lost EXPIRE) or with a TTL longer than the window is healed, not obeyed;
--   * a value that is not a non-negative integer is treated as corrupt and
--     reset, rather than wedging the key;
--   * time is Redis's own (PTTL), never the caller's clock;
--   * arguments are validated before the first write.

local function whole(v, min)
  local n = tonumber(v)
  if n == nil or n ~= math.floor(n) or n < min or n > 2^53 then
    return nil
  end
  return n
end

local limit = whole(ARGV[1], 1)
local window = whole(ARGV[2], 1)
local cost = whole(ARGV[3], 0)
if not limit or not window or not cost then
  return redis.error_reply('ERR fixed_window: limit, window_ms and cost must be integers (>=1, >=1, >=0)')
end

local key = KEYS[1]
local raw = redis.pcall('GET', key)
local count = 0
if type(raw) == 'table' and raw.err then
  -- Wrong type under our key: not ours to honour.
  redis.call('DEL', key)
elseif raw then
  count = whole(raw, 0)
  if count == nil then
    redis.call('DEL', key)
    count = 0
  end
end

local ttl = redis.call('PTTL', key)
if ttl == -1 or ttl > window then
  -- Heal: a counter without a TTL (or an over-long one) would block forever.
  redis.call('PEXPIRE', key, window)
  ttl = window
end

local allowed = 0
if count + cost <= limit then
  allowed = 1
  if cost > 0 then
    count = redis.call('INCRBY', key, cost)
    if ttl < 0 then
      redis.call('PEXPIRE', key, window)
      ttl = window
    end
  end
end

if ttl < 0 then
  -- No key exists (peek, or denied on an empty key): a window would start now.
  ttl = window
end

return { allowed, count, ttl }
