-- The bare per-key decision, for benches/script-cost.sh and redis-limit.py:
-- INCRBY and PTTL for every key, with no validation, healing or take-back,
-- replying as decide_fixed.lua does. A floor for any script of its kind;
-- it sets no TTL (the benchmarks create its counters with one).
-- KEYS: the counters. ARGV[1]: the cost.
-- Reply: cmsgpack of {1, count, pttl, 0, 0} per key.
local reply = {}
for i = 1, #KEYS do
  local count = redis.call('INCRBY', KEYS[i], ARGV[1])
  local ttl = redis.call('PTTL', KEYS[i])
  local at = #reply
  reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4], reply[at + 5] = 1, count, ttl, 0, 0
end
return cmsgpack.pack(reply)
