-- The keyspace check of the load benchmark's cells (exactness.py) and of
-- redis-limit.py's designs (checks.py). Read-only.
--
-- ARGV[1]: the counters' key prefix; ARGV[2]: `string` (counters are
-- integers in string keys) or `bitfield` (a u63 at offset 0).
-- Reply: {keys, keys without a TTL, keys gone between SCAN and PTTL, keys not
-- under the prefix, the counters' sum, the largest PTTL, the largest integer
-- counter or -1}.
local prefix, kind = ARGV[1], ARGV[2]
local cursor, keys, no_ttl, gone, stray, sum, max_ttl, max = '0', 0, 0, 0, 0, 0, -1, -1
repeat
  local page = redis.call('SCAN', cursor, 'COUNT', 1000)
  cursor = page[1]
  for _, key in ipairs(page[2]) do
    keys = keys + 1
    local ttl = redis.call('PTTL', key)
    if ttl == -2 then
      gone = gone + 1
    elseif ttl < 0 then
      no_ttl = no_ttl + 1
    end
    if ttl > max_ttl then max_ttl = ttl end
    if string.sub(key, 1, #prefix) ~= prefix then
      stray = stray + 1
    elseif kind == 'bitfield' then
      sum = sum + redis.call('BITFIELD_RO', key, 'GET', 'u63', 0)[1]
    elseif redis.call('TYPE', key).ok == 'string' then
      local n = tonumber(redis.call('GET', key))
      sum = sum + (n or 0)
      if n and n == math.floor(n) and n > max then
        max = n
      end
    end
  end
until cursor == '0'
return {keys, no_ttl, gone, stray, sum, max_ttl, max}
