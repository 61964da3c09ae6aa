-- concurrency_release.lua: give back a lease, if the caller still holds it.
--
-- KEYS[1]  the lease set (see concurrency_acquire.lua)
-- ARGV[1]  token  the owner token the lease was acquired with
--
-- Reply: 1 if `token` held a live lease, now released; 0 if it held none (it
-- had expired, perhaps been taken over, or was never granted).
--
-- Guarantees:
--   * owner-checked, compare-and-delete: only `token` is removed, so a slow
--     holder whose lease expired and was taken over cannot free the new
--     holder's slot;
--   * releasing twice, or releasing a token whose acquire never ran, is
--     harmless; this is what makes releasing after an ambiguous (timed-out)
--     acquire safe;
--   * Redis deletes a ZSET when its last member goes, so nothing is left
--     without a TTL; a set left with leases lives as long as its last one;
--   * the argument is validated before the first write.

local token = ARGV[1]
if not token or #token == 0 or #token > 128 then
  return redis.error_reply('ERR concurrency_release: token must be 1 to 128 bytes')
end

local key = KEYS[1]
if redis.call('TYPE', key).ok ~= 'zset' then
  return 0
end
local score = redis.call('ZSCORE', key, token)
if not score then
  return 0
end
redis.call('ZREM', key, token)

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- The set lives exactly as long as its last lease left (the one released
-- may have been the last).
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if last[2] then
  redis.call('PEXPIRE', key, math.max(1, tonumber(last[2]) - now))
end
if tonumber(score) > now then
  return 1
end
return 0
