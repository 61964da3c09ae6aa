-- concurrency_acquire.lua: take one of a key's `limit` concurrent slots.
--
-- KEYS[1]  the lease set ("{prefix}:cc:{policy}:{<client>}"): a ZSET whose
--          members are owner tokens, each scored by the Redis time (ms) at
--          which its lease expires
-- ARGV[1]  limit     integer >= 1: leases the key may hold at once
-- ARGV[2]  lease_ms  integer >= 1: how long a lease lives unless renewed
-- ARGV[3]  token     the caller's owner token: 1 to 128 bytes, new for every
--                    acquire (random per process, plus a counter), ending
--                    with '/<lease_ms>', the lease it is for
--
-- Reply: { acquired (1|0), held }
--   acquired  1 if `token` now holds a lease expiring lease_ms from now
--   held      live leases on the key after this call, this one included
--
-- Guarantees:
--   * expired leases are dropped before counting, so a crashed holder's slot
--     comes back lease_ms after its last acquire or renewal, at the latest;
--   * a lease is added only while fewer than `limit` live leases remain, so
--     concurrent callers on any number of replicas never exceed `limit`;
--   * acquiring with a token that already holds a lease renews it: a retried
--     call never takes a second slot;
--   * the key's TTL is the expiry of its last lease, so an abandoned set
--     disappears, and a set left with no TTL is healed. A lease that outlives
--     lease_ms from now (left by a clock that moved backwards, or written by
--     hand) is cut to its own length from now, which its token names (ARGV[3]
--     below), or to lease_ms if its token names none or more than 366 days;
--     a non-ZSET value under the key is deleted: neither wedges a slot for
--     longer than the lease it names, and a limiter of a shorter lease never
--     cuts a longer one's;
--   * time is Redis's own (TIME), never the caller's clock;
--   * arguments are validated before the first write, and the lease is the
--     first write (after deleting a non-ZSET value): when Redis refuses
--     writes (out of memory, a read-only replica), an acquire that would take
--     a slot fails with Redis's error and changes nothing. Out of memory, a
--     full key is still answered (acquired 0): dropping expired leases frees
--     memory, which Redis allows; a read-only replica refuses that too.

-- `whole` comes from lib.lua, which store/redis_lease.rs puts before this.

local limit = whole(ARGV[1], 1)
local lease = whole(ARGV[2], 1)
local token = ARGV[3]
if not limit or not lease then
  return redis.error_reply('ERR concurrency_acquire: limit and lease_ms must be integers >= 1')
end
if not token or #token == 0 or #token > 128 then
  return redis.error_reply('ERR concurrency_acquire: token must be 1 to 128 bytes')
end

-- The longest lease a limiter takes (MAX_WINDOW, 366 days), in ms.
local MAX_LEASE_MS = 31622400000

local key = KEYS[1]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local expiry = now + lease

local kind = redis.call('TYPE', key).ok
if kind ~= 'zset' and kind ~= 'none' then
  -- Not ours to honour.
  redis.call('DEL', key)
end

-- Decide by reading, then write, the lease first: Redis refuses a write (out
-- of memory, a read-only replica) only before a script's first one, so a
-- refused lease fails the call with nothing changed. Dropping expired leases
-- first would make the lease a second write, which Redis lets through.
local held = redis.call('ZCOUNT', key, '(' .. now, '+inf')
local mine = redis.call('ZSCORE', key, token)
local acquired = 0
if mine and tonumber(mine) > now then
  acquired = 1 -- a retry: renew, taking no second slot
elseif held < limit then
  held = held + 1
  acquired = 1
end
if acquired == 1 then
  redis.call('ZADD', key, expiry, token)
end

redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
-- Leases that outlive lease_ms from now: each is cut to its own length from
-- now, which its token ends with ('/<lease_ms>', up to 366 days), or to
-- lease_ms for a token that says none. Never to the caller's length alone:
-- limiters sharing the key with different leases would cut a longer
-- holder's lease short and let another in while it still runs.
local stale = redis.call('ZRANGEBYSCORE', key, '(' .. expiry, '+inf', 'WITHSCORES')
for i = 1, #stale, 2 do
  local own = whole(string.match(stale[i], '/(%d+)$') or '', 1)
  local cap = expiry
  if own and own <= MAX_LEASE_MS then
    cap = now + own
  end
  if tonumber(stale[i + 1]) > cap then
    redis.call('ZADD', key, 'XX', cap, stale[i])
  end
end

if held > 0 then
  -- The set lives exactly as long as its last lease.
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', key, math.max(1, tonumber(last[2]) - now))
end

return { acquired, held }
