-- probe_writes.lua: the startup check's probe of the writes the limiter's
-- scripts make (`RedisStore::self_test`), so that a user whose ACL denies
-- one of them fails at startup, naming its ACL, instead of failing every
-- check into the store-error policy (under `Allow`, no limit at all).
--
-- KEYS[1]  a key of the check's own, never otherwise set
--
-- Reply: 1 if every write was allowed; else the first refusal, as an error
-- reply: `OOM` for a Redis out of memory under `noeviction` (which startup
-- does not hold against it), `NOPERM` for an ACL's denial.
--
-- Guarantees:
--   * nothing is left: every write is made on KEYS[1], which is deleted
--     after each kind (a string, a hash, a sorted set) and before the
--     reply, and a script runs atomically, so no other client sees it;
--   * each write is made with `redis.pcall`, so a refused one does not
--     stop the script before its `DEL`: a refused write writes nothing,
--     and the writes before it are deleted;
--   * KEYS[1] gets a TTL first, where it can, and is deleted whatever
--     follows, so no key without a TTL outlives the script.

local key = KEYS[1]
local refused

local function try(...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err and not refused then
    refused = reply.err
  end
end

-- Counters: fixed windows, GCRA's values, refunds' and resets' markers.
try('SET', key, '0', 'PX', 60000)
try('INCRBY', key, 0)
try('DECRBY', key, 0)
try('PEXPIRE', key, 60000)
redis.call('DEL', key)

-- Sliding windows.
try('HSET', key, 'c', 0)
try('PEXPIRE', key, 60000)
redis.call('DEL', key)

-- The concurrency limiter's lease sets.
try('ZADD', key, 0, 'probe')
try('PEXPIRE', key, 60000)
try('ZREMRANGEBYSCORE', key, '-inf', '(0')
try('ZREM', key, 'probe')
redis.call('DEL', key)

if refused then
  -- Redis 7.0 words an ACL's denial inside a script without its code
  -- ("The user executing the script can't run this command or
  -- subcommand"): it is given `NOPERM`, as outside a script. Any other
  -- refusal a write can meet here (`READONLY`, `MISCONF`) was met first by
  -- the check's plain `DEL`, so only `OOM` keeps a code of its own.
  -- (Redis 6 put the script's line before an error's code: an `OOM` is
  -- found by its text too.)
  if refused:find('OOM command not allowed', 1, true) then
    if not refused:find('^OOM') then
      refused = 'OOM ' .. refused
    end
  elseif not refused:find('^NOPERM') then
    refused = 'NOPERM ' .. refused
  end
  return redis.error_reply(refused)
end
return 1
