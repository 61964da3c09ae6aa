-- The bare per-key decision, for benches/script-cost.sh and redis-limit.py:
-- INCRBY and PTTL for every key, with no validation, healing or take-back,
-- replying in decide_fixed.lua's shape (two numbers per request). A floor
-- for any script of its kind; it sets no TTL (the benchmarks create its
-- counters with one).
-- KEYS: the counters. ARGV[1]: the cost.
-- Reply: cmsgpack of {count, pttl} per key.
local reply = {}
for i = 1, #KEYS do
  local count = redis.call('INCRBY', KEYS[i], ARGV[1])
  local ttl = redis.call('PTTL', KEYS[i])
  reply[2 * i - 1], reply[2 * i] = count, ttl
end
return cmsgpack.pack(reply)
