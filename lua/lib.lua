-- lib.lua: helpers shared by the scripts. Not a script by itself:
-- store/scripts.rs joins lib.lua, fixed_window.lua, sliding_window.lua,
-- gcra.lua and decide.lua (in that order) into the one script that decides a
-- request (decide.lua documents its KEYS, ARGV and reply), and
-- store/redis_lease.rs puts it before concurrency_acquire.lua and
-- concurrency_renew.lua.

-- A whole number >= min (and exactly representable), or nil.
local function whole(v, min)
  local n = tonumber(v)
  if n == nil or n ~= math.floor(n) or n < min or n > 2^53 then
    return nil
  end
  return n
end

-- The number stored at key (GET), or nil when there is none. A value of the
-- wrong type, or one that is not a number >= 0, is corrupt: it is deleted
-- and reads as nil, rather than wedging the key.
local function read_number(key, integer)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' and raw.err then
    redis.call('DEL', key)
    return nil
  end
  if not raw then
    return nil
  end
  local n = tonumber(raw)
  if n == nil or n < 0 or n ~= n or (integer and n ~= math.floor(n)) then
    redis.call('DEL', key)
    return nil
  end
  return n
end

-- An integer argument for redis.call, as a string: how Redis formats a Lua
-- number is version-dependent (%.14g loses digits above 10^14).
local function int(n)
  return string.format('%d', n)
end
