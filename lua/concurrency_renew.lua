-- concurrency_renew.lua: extend a lease, if the caller still holds it.
--
-- KEYS[1]  the lease set (see concurrency_acquire.lua)
-- ARGV[1]  lease_ms  integer >= 1: the lease's new length, from now
-- ARGV[2]  token     the owner token the lease was acquired with
--
-- Reply: 1 if the lease now expires lease_ms from now; 0 if `token` holds no
-- live lease (it expired, was released, or the key was flushed): the caller
-- has lost its slot, which someone else may hold by now.
--
-- Guarantees:
--   * owner-checked: only `token`'s own lease is touched, and a lease is never
--     created here, so a holder that lost its slot cannot take it back past
--     the limit;
--   * a lease found expired (but not yet dropped) counts as lost and is
--     removed;
--   * the key's TTL is refreshed to its last lease's expiry;
--   * a Redis out of memory (noeviction) still renews: the update grows
--     nothing (see below);
--   * time is Redis's own (TIME); arguments are validated before the first
--     write.

-- `whole` comes from lib.lua, which store/redis_lease.rs puts before this.
local lease = whole(ARGV[1], 1)
local token = ARGV[2]
if not lease then
  return redis.error_reply('ERR concurrency_renew: lease_ms must be an integer >= 1')
end
if not token or #token == 0 or #token > 128 then
  return redis.error_reply('ERR concurrency_renew: token must be 1 to 128 bytes')
end

local key = KEYS[1]
if redis.call('TYPE', key).ok ~= 'zset' then
  return 0
end
local score = redis.call('ZSCORE', key, token)
if not score then
  return 0
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if tonumber(score) <= now then
  redis.call('ZREM', key, token)
  return 0
end

-- Under `maxmemory` with `noeviction`, Redis refuses a script's first write
-- if that command may grow memory (ZADD may), but never a later one: so the
-- key's TTL is set again first, as it is (PEXPIRE may not grow memory), and
-- the score's update, which grows nothing, is let through. A full Redis would
-- otherwise fail every renewal, and every lease held would be lost one lease
-- time later.
redis.call('PEXPIRE', key, math.max(1, redis.call('PTTL', key)))
redis.call('ZADD', key, 'XX', now + lease, token)
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', key, math.max(1, tonumber(last[2]) - now))
return 1
