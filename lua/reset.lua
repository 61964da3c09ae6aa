-- reset.lua: forgets a client's counters, every limit's at once.
--
-- KEYS   every limit's key of the client (with several limits they share a
--        hash tag, so one call serves a cluster too)
-- ARGV   none
-- Reply  the number of keys deleted.
--
-- One DEL: atomic with respect to every decision, which sees the counters
-- either all as they were or all gone. Nothing is written, so nothing is
-- left without a TTL.

if #KEYS == 0 then
  return 0
end
return redis.call('DEL', unpack(KEYS))
