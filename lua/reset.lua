-- reset.lua: forgets a client's counters, every limit's at once.
-- store/scripts.rs puts once.lua before it.
--
-- KEYS   every limit's key of the client (with several limits they share a
--        hash tag, so one call serves a cluster too), then the call's marker
-- ARGV   the call's id (once.lua)
-- Reply  the number of keys deleted; 0 when the call ran before (once.lua:
--        a reset sent again, its first reply lost, deletes nothing more, so
--        what was charged since its first run stays charged).
--
-- One DEL: atomic with respect to every decision, which sees the counters
-- either all as they were or all gone. The marker is the one key written,
-- with a TTL, after the DEL: out of memory (`noeviction`), a reset still
-- runs, since the DEL frees memory and a script that wrote may go on.

local marker = call_marker('rs')
if not marker or #ARGV ~= 1 then
  return redis.error_reply('ERR reset: KEYS must end with the first key, "#rs:" and the call id, ARGV[1]')
end
if ran_before(marker) then
  return 0
end
local deleted = redis.call('DEL', unpack(KEYS, 1, #KEYS - 1))
mark(marker)
return deleted
