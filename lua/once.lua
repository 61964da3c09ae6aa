-- once.lua: makes a call that must take effect once (a refund, a reset)
-- safe to send again. store/scripts.rs puts it before refund.lua and
-- reset.lua.
--
-- A call whose reply was lost (its connection dropped after Redis ran it, a
-- response timeout) may have run, and redis-rs's cluster connection, the
-- pool and the Sentinel store send it again. Run twice, a refund would give
-- its cost back twice, and a reset would forget what was charged in
-- between: either lifts a limit. So the caller gives each call an id of its
-- own and declares a marker key after the call's own keys:
--
-- KEYS[#KEYS]  KEYS[1] .. ':' .. kind .. ':' .. id: the first key's hash tag,
--              so the same Redis Cluster slot
-- ARGV[#ARGV]  id, 1 to 64 of [0-9a-f-] (the caller's is
--              `<96 random bits>-<counter>`, unique across processes)
--
-- The call's first run sets the marker (SET NX PX, one atomic step with the
-- call's writes: the script replicates as a whole); a run that finds it set
-- does nothing. The marker outlives the call only as long as it must: a
-- resend comes within the sender's retries (seconds), so markers live at
-- most a minute, and a call sent again later than that would run again.

-- The call's marker key, checked against KEYS[1] and the id, or nil.
local function call_marker(kind)
  local id = ARGV[#ARGV]
  if #KEYS < 2 or type(id) ~= 'string' or #id < 1 or #id > 64
    or not string.find(id, '^[0-9a-f%-]+$') then
    return nil
  end
  local marker = KEYS[1] .. ':' .. kind .. ':' .. id
  if KEYS[#KEYS] ~= marker then
    return nil
  end
  return marker
end

-- Whether this is the call's first run; sets the marker for ttl_ms (at
-- most a minute) if so. The first write of the call.
local function first_run(marker, ttl_ms)
  ttl_ms = math.max(1, math.min(ttl_ms, 60000))
  return redis.call('SET', marker, '1', 'NX', 'PX', string.format('%d', ttl_ms)) ~= false
end
