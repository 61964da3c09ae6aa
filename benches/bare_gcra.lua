-- The bare GCRA decision, for benches/script-cost.sh: GET, PTTL and SET PX
-- of an "a:b" TAT for every key, with no arithmetic, validation or healing.
-- A floor for the Redis calls of any script that keeps gcra.lua's value.
-- KEYS: the buckets. ARGV[1]: the expiry (ms).
-- Reply: cmsgpack of {1, pttl} per key.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local reply = {}
for i = 1, #KEYS do
  local k = KEYS[i]
  redis.call('GET', k)
  local ttl = redis.call('PTTL', k)
  redis.call('SET', k, string.format('%d:%d', now + 3600, 0), 'PX', ARGV[1])
  reply[2 * i - 1], reply[2 * i] = 1, ttl
end
return cmsgpack.pack(reply)
