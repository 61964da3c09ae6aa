-- lib.lua: helpers shared by the scripts. Not a script by itself:
-- store/scripts.rs joins lib.lua, fixed_window.lua, sliding_window.lua,
-- gcra.lua and decide.lua (in that order) into the general script that
-- decides a request (decide.lua documents its KEYS, ARGV and reply); lib.lua,
-- fixed_window.lua and decide_fixed.lua into its fast path for fixed windows;
-- and lib.lua before concurrency_acquire.lua and concurrency_renew.lua.

-- The whole number >= min in string v (an argument, or a stored field), or
-- nil. Only plain decimals pass ("1000", not "1e3", "0x10" or " 7"), so a
-- string that passes can go to a Redis command as it is. Calls repeat the
-- same few strings ("1" above all) and tonumber parses each one twice with
-- strtod, so results are remembered for the rest of the call. "0" and "1",
-- in nearly every call, are known from the start: tonumber and the check
-- that the string is plain cost Redis about 2,500 instructions a string
-- (benches/script-cost.sh), and a decide call of 8 requests holds about 5.
-- Below 2^53 only: from there a double no longer tells n from n + 1, so a
-- cost of 2^53 spent on a count of 1 (INCRBY replies 2^53 + 1, which Lua
-- reads as 2^53) passed for a spend that created the counter, and its
-- denial deleted the count.
local parsed = { ['0'] = 0, ['1'] = 1 }
local function whole(v, min)
  local n = parsed[v]
  if n == nil then
    n = tonumber(v)
    -- n % 1: a whole number has no fraction (and math.floor is a C call,
    -- about 500 instructions in Redis's Lua, where % is an operator).
    if n == nil or n % 1 ~= 0 or n < 0 or n >= 2^53 or string.format('%d', n) ~= v then
      n = false
    end
    parsed[v or ''] = n
  end
  if not n or n < min then
    return nil
  end
  return n
end

-- The helpers for stored values: corruption, read_string, int and stored,
-- built by a call, value_helpers(), which returns the four. Redis runs a whole
-- script at every call and makes every closure it defines each time, about
-- 1,250 instructions of Redis's each (benches/script-cost.sh); the
-- fixed-window fast path and the concurrency scripts need none of these on
-- their common path, so they pay for one closure, this one, not four.
-- Scripts that use them throughout build them once at the top
-- (store/scripts.rs: `local corruption, read_string, int, stored =
-- value_helpers()`).
local function value_helpers()
  -- Takes an error reply of redis.pcall: returns if it is the one error a
  -- script expects, a value that is corrupt (of the wrong type, not an integer,
  -- or out of an integer's range), and raises it otherwise. Every other error
  -- (OOM, READONLY, MISCONF, BUSY, NOPERM...) reaches the caller as the error
  -- it is: it says nothing about the value, so nothing is repaired for it.
  -- Redis refuses a write only while a script has written nothing, so a refused
  -- write raised here leaves every key as it was.
  local function corruption(reply)
    local err = reply.err
    local corrupt = { -- built here, on this rare path, not at every call
      'WRONGTYPE ',
      'ERR value is not an integer',
      'ERR increment or decrement would overflow',
    }
    for _, prefix in ipairs(corrupt) do
      if string.sub(err, 1, #prefix) == prefix then
        return
      end
    end
    error(reply)
  end

  -- The string stored at key (GET), or nil when there is none. A value of the
  -- wrong type is corrupt: it is deleted and reads as nil, rather than wedging
  -- the key. Any other error is raised (see corruption). The caller parses the
  -- string, and deletes it if it is not what it wrote.
  local function read_string(key)
    local raw = redis.pcall('GET', key)
    if type(raw) == 'table' then
      corruption(raw)
      redis.call('DEL', key)
      return nil
    end
    return raw or nil
  end

  -- An integer argument for redis.call, as a string: how Redis formats a Lua
  -- number is version-dependent (%.14g loses digits above 10^14).
  local function int(n)
    return string.format('%d', n)
  end

  -- The whole number >= 0 in a stored field or value v (a string, or
  -- nil), or nil. Not whole(): a stored value differs from key to key, so
  -- remembering it would only grow `parsed` by a string a field, and the
  -- strict decimal form matters for arguments, which go to Redis as they
  -- are, not for what we parse and write back ourselves (a field reading
  -- "1e3" is 1000, as good as any other number someone wrote there).
  local function stored(v)
    local n = tonumber(v)
    if n ~= nil and n >= 0 and n <= 2^53 and n % 1 == 0 then
      return n
    end
    return nil
  end

  return corruption, read_string, int, stored
end
