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
-- KEYS[#KEYS]  KEYS[1] .. '#' .. kind .. ':' .. id: the first key's hash tag,
--              so the same Redis Cluster slot. '#' is outside the
--              alphabet of a raw client part (src/keyspace.rs), and a
--              hashed one is '#' and 64 hex digits, so no client's counter
--              key spells another client's marker (with ':', a client named
--              "alice:rf:<id>" of a limiter of several limits, whose keys
--              end in the raw client part, did)
-- ARGV[#ARGV]  id, 1 to 64 of [0-9a-f-] (the caller's is
--              `<96 random bits>-<counter>`, unique across processes)
--
-- The call's first run sets the marker, as its last write (one atomic step
-- with the call's writes: the script replicates as a whole); a run that
-- finds it set does nothing. The marker is read first and written last, so
-- a call Redis lets run out of memory (`maxmemory` under `noeviction`: a
-- script may run until its first write that can grow memory, and on after
-- any write, such as a reset's DEL) is not refused for its marker: the SET
-- comes after the call's own first write, or, when the call wrote nothing,
-- is left out (a resend of a call that changed nothing changes nothing the
-- first did not).
--
-- The marker lives 10 s. A resend comes within the limiter's timeout (200 ms
-- by default): the pool and the Sentinel store resend while the caller
-- waits, and redis-rs's cluster connection drops a request whose caller has
-- gone. A call sent again more than 10 s after its first run would run
-- again (a late refund may credit a later window: a fixed window's key
-- looks the same a whole window later), so a limiter's build refuses a
-- timeout of 10 s or more (ConfigError::TimeoutTooLong). At a refund per
-- request, markers cost 10 s of the refund rate times about 100 bytes.

-- The call's marker key, checked against KEYS[1] and the id, or nil.
local function call_marker(kind)
  local id = ARGV[#ARGV]
  if #KEYS < 2 or type(id) ~= 'string' or #id < 1 or #id > 64
    or not string.find(id, '^[0-9a-f%-]+$') then
    return nil
  end
  local marker = KEYS[1] .. '#' .. kind .. ':' .. id
  if KEYS[#KEYS] ~= marker then
    return nil
  end
  return marker
end

-- Whether the call ran before: its marker is set.
local function ran_before(marker)
  return redis.call('EXISTS', marker) == 1
end

-- Sets the call's marker, for 10 s; the call's last write. Refused only
-- when the call wrote nothing before it (out of memory, above), and then
-- left out.
local function mark(marker)
  redis.pcall('SET', marker, '1', 'PX', '10000')
end
