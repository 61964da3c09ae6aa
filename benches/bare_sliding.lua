-- The bare sliding-window decision, for benches/script-cost.sh: HMGET,
-- PTTL, HSET and PEXPIRE for every key, each value formatted as
-- sliding_window.lua formats it, with no arithmetic, validation or healing.
-- A floor for the Redis calls of any script that keeps the same hash.
-- KEYS: the counters. ARGV[1]: the expiry (ms).
-- Reply: cmsgpack of {count, pttl} per key.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reply = {}
for i = 1, #KEYS do
  local k = KEYS[i]
  local raw = redis.call('HMGET', k, 's', 'c', 'p')
  local s, c, p = tonumber(raw[1]) or now, tonumber(raw[2]) or 0, tonumber(raw[3]) or 0
  local ttl = redis.call('PTTL', k)
  redis.call('HSET', k, 's', string.format('%d', s), 'c', string.format('%d', c + 1), 'p', string.format('%d', p))
  redis.call('PEXPIRE', k, ARGV[1])
  reply[2 * i - 1], reply[2 * i] = c + 1, ttl
end
return cmsgpack.pack(reply)
