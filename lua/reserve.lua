-- reserve.lua: a local reservation of a fixed window's units (see
-- `LimiterBuilder::local_reservation`). store/scripts.rs puts lib.lua and
-- fixed_window.lua before it.
--
-- An instance takes up to `want` units of a counter at once, spending them
-- in Redis now, and then admits requests from them in process until they
-- run out or the window ends. The counter is the one decide.lua and
-- decide_fixed.lua keep for the same key (fixed_window.lua documents it), so
-- reserved units are counted exactly like admitted requests: the counter
-- never passes the limit, whatever mix of instances reserves and decides.
--
-- KEYS[1]  the counter "{prefix}:fw:{policy}:{key}"
-- ARGV[1]  limit   >= 1, units per window
-- ARGV[2]  window_ms >= 1
-- ARGV[3]  need    >= 1, the fewest units worth taking (the request's cost)
-- ARGV[4]  want    >= need, the most units to take
-- Every integer is plain decimal.
--
-- Reply: {granted, remaining, ttl_ms}
--   granted    the units taken: min(want, limit - count) when that is at
--              least `need`, else 0 (nothing is taken: a denial)
--   remaining  what the counter has left after the grant
--   ttl_ms     the window's time left (the key's PTTL after the call, + 1:
--              fixed_window.lua's header; a whole window for a counter this
--              call created), by Redis's clock. The caller must stop
--              spending the grant by then, less 1 ms: the window may end
--              that much sooner, from a moment within the tick.
--
-- Every argument is validated before the first write; the counter keeps or
-- gets a TTL of at most window_ms. Errors of Redis other than a corrupt
-- value (OOM, READONLY...) reach the caller; nothing is granted then.

local function bad(what)
  return redis.error_reply('ERR reserve: ' .. what)
end

local limit, window = whole(ARGV[1], 1), whole(ARGV[2], 1)
local need, want = whole(ARGV[3], 1), whole(ARGV[4], 1)
if #KEYS ~= 1 or #ARGV ~= 4 or not limit or not window or not need or not want or want < need then
  return bad('one key and ARGV limit, window_ms, need, want (1 <= need <= want) expected')
end

-- The count and window left, healing a corrupt value or a missing TTL.
local fixed_window = fixed_window_module((value_helpers()))
local expire = fixed_window.expire(window)
local count, ttl = fixed_window.look(KEYS[1], window, expire)
local left = limit - count
if left < need then
  return {0, math.max(0, left), ttl}
end
local granted = math.min(want, left)
redis.call('INCRBY', KEYS[1], granted)
if count == 0 then
  -- A new window (a counter at 0 counts as absent), as fixed_window.spend
  -- starts one.
  redis.call('PEXPIRE', KEYS[1], expire)
  ttl = expire + 1
end
return {granted, left - granted, ttl}
