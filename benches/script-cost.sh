#!/usr/bin/env bash
# Redis's own work per decision, in instructions (valgrind's callgrind), which
# unlike seconds does not depend on what else the machine is doing.
#
#   bash benches/script-cost.sh [CALLS]      (default 2000 calls of 8 decisions)
#
# For each script below, a redis-server runs under callgrind on a free port;
# 2000 calls (redis-benchmark, 4 connections) first create the counters
# untimed, then instrumentation is switched on for CALLS more calls. Every
# call decides 8 allowed requests on existing counters (keys k:0..k:99 with a
# suffix per request, a quota of a billion an hour), as a batch from
# RedisStore does. Printed: instructions per call and per decision. Each
# call is first made once with redis-cli: a reply that is an error (which
# redis-benchmark would count as a call done) stops the run.
#
#   general      lua/lib.lua + fixed_window.lua + sliding_window.lua +
#                gcra.lua + decide.lua (DECIDE_LUA), fixed-window limits
#   general sw   the same script, sliding-window limits, spelled out request
#                by request
#   compact sw   the same script and requests in its compact form (0, the
#                algorithm, the limit, the window, the burst and the cost):
#                what a batch of one sliding-window limiter's requests sends
#   general gcra the same script, GCRA limits (a burst of 1000), spelled out
#                request by request
#   compact gcra the same for GCRA
#   bare sw,     benches/bare_sliding.lua and bare_gcra.lua: the Redis calls
#   bare gcra    of each algorithm alone (HMGET, PTTL, HSET, PEXPIRE; GET,
#                PTTL, SET PX), floors for the two
#   fast path    lua/lib.lua + fixed_window.lua + decide_fixed.lua
#                (DECIDE_FIXED_LUA) in its compact form (0, limit, window,
#                cost): what a batch of one limiter's requests sends
#   spelled out  the same script and requests as one policy and one run:
#                what a batch of several limiters' or costs' requests sends
#   bare         INCRBY and PTTL per key and a reply of the same shape, with
#                no validation, no healing, no settling: the cost of the Redis
#                calls through Lua alone, a floor for any such script (its
#                counters are given a TTL after the warm-up, as ours have)
#   return 1     an EVALSHA that does nothing: the per-call cost
#
# Then the fast path again at 1, 8 and 32 decisions a call, and what a call
# costs by itself and each decision in it (a line through the three
# points): the share a batch's size spreads, and the share it cannot.
#
# Last, the fast path as a Redis 7 function (FUNCTION LOAD, then FCALL), at
# 1 and 8 decisions a call: what a function library would save Redis. Not
# what the store sends (it sends EVALSHA; docs/performance-notes.md says why):
#   function        the same code, run as a function: lib.lua's and
#                   fixed_window.lua's closures made once, at load, and no
#                   script looked up by its SHA1; lib.lua's `parsed` emptied
#                   at every call, as a script's is
#   function, kept  the same with `parsed` kept from call to call, so a
#                   policy's limit and window are parsed and checked once
#                   per load, not once per call
#
# Needs redis-server, redis-cli, redis-benchmark and valgrind
# (apt-get install -y redis-server redis-tools valgrind).
set -euo pipefail

calls=${1:-2000}
root=$(cd "$(dirname "$0")/.." && pwd)
lua=$root/lua
work=$(mktemp -d)
# Also kills a redis-server still running when a check below exits.
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

for tool in redis-server redis-cli redis-benchmark valgrind callgrind_control callgrind_annotate; do
  command -v "$tool" >/dev/null || { echo "$tool not found: apt-get install -y redis-server redis-tools valgrind" >&2; exit 1; }
done

join() { for f in "$@"; do cat "$lua/$f"; echo; done; }
# As store/scripts.rs's DECIDE_LUA: decide.lua after `local peek = false`.
{ join lib.lua; echo 'local corruption, read_string, int, stored = value_helpers()'; join fixed_window.lua sliding_window.lua gcra.lua; echo 'local peek = false'; join decide.lua; } >"$work/general.lua"
join lib.lua fixed_window.lua decide_fixed.lua >"$work/fast.lua"
cp "$root/benches/bare.lua" "$work/bare.lua"
cp "$root/benches/bare_sliding.lua" "$work/bare_sw.lua"
cp "$root/benches/bare_gcra.lua" "$work/bare_gcra.lua"
echo 'return 1' >"$work/return1.lua"
# The fast path as a function library: decide_fixed.lua's body is the
# function's, with KEYS and ARGV its arguments.
as_function() {
  echo '#!lua name=script_cost'
  join lib.lua fixed_window.lua
  echo "redis.register_function('decide_fixed', function(KEYS, ARGV)"
  echo "$1"
  join decide_fixed.lua
  echo 'end)'
}
as_function "parsed = { ['0'] = 0, ['1'] = 1 }" >"$work/function.fn.lua"
as_function '' >"$work/kept.fn.lua"

keys=()
for i in 1 2 3 4 5 6 7 8; do keys+=("k:__rand_int__:$i"); done
# decide.lua: requests, then per request cost, limits, then per limit
# algorithm, limit, window_ms, burst, shadow.
general=(8)
# decide_fixed.lua: policies, one policy (limit, window_ms, shadow), then
# runs, then the run: 8 requests, cost 1, 1 limit, policy 1; or in the
# compact form, 0, the limit, the window and the cost.
spelled=(1 1000000000 3600000 0 1 8 1 1 1)
fast=(0 1000000000 3600000 1)
compact_sw=(0 2 1000000000 3600000 0 1)
compact_gcra=(0 3 1000000000 3600000 1000 1)
sliding=(8)
gcra=(8)
for _ in 1 2 3 4 5 6 7 8; do
  general+=(1 1 1 1000000000 3600000 0 0)
  sliding+=(1 1 2 1000000000 3600000 0 0)
  gcra+=(1 1 3 1000000000 3600000 1000 0)
done

# The harness's free port (benches/harness/procs.py).
free_port() { PYTHONPATH="$root/benches" python3 -c 'from harness.procs import free_port; print(free_port())'; }

# check_reply NAME PORT COMMAND...: the call redis-benchmark is about to
# time, once through redis-cli (__rand_int__ as one of the keys it will
# use), must answer a reply: redis-benchmark's output is discarded, and it
# counts an error reply as a completed call, so a script that fails on its
# arguments would be measured as a cheap one.
check_reply() {
  local name=$1 port=$2 reply
  shift 2
  if ! reply=$(redis-cli -e --no-raw -p "$port" "${@//__rand_int__/000000000000}" 2>&1) \
      || [[ -z $reply || $reply == "(error)"* || $reply == "(nil)" ]]; then
    echo "script-cost.sh: $name: the measured call does not answer a reply: ${reply:-(none)}" >&2
    exit 1
  fi
}

# measure NAME FILE DECISIONS ARGS...: prints instructions per call and decision.
measure() {
  local name=$1 file=$2 decisions=$3
  shift 3
  local port out pid sha=
  port=$(free_port)
  out=$work/$name.callgrind
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
    redis-server --port "$port" --save '' --appendonly no >"$work/$name.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.2; done
  local run=(EVALSHA)
  if [[ $file == *.fn.lua ]]; then
    redis-cli -p "$port" -x FUNCTION LOAD REPLACE <"$file" >/dev/null
    run=(FCALL decide_fixed)
  else
    sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$file")")
    run+=("$sha")
  fi
  check_reply "$name" "$port" "${run[@]}" "$@"
  redis-benchmark -p "$port" -n 2000 -c 4 -r 100 -q "${run[@]}" "$@" >/dev/null 2>&1
  # Every counter gets a TTL, as ours have: bare.lua sets none, and a key
  # with no TTL costs Redis less to find (no lookup in its expiry table).
  redis-cli -p "$port" EVAL "for _, k in ipairs(redis.call('KEYS', 'k:*')) do redis.call('PEXPIRE', k, 3600000) end" 0 >/dev/null
  callgrind_control -i on "$pid" >/dev/null 2>&1
  redis-benchmark -p "$port" -n "$calls" -c 4 -r 100 -q "${run[@]}" "$@" >/dev/null 2>&1
  callgrind_control -i off "$pid" >/dev/null 2>&1
  redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait "$pid" || true
  local total
  total=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done {gsub(",", "", $1); print $1; done = 1}')
  printf '%-12s %9d instructions per call  %7d per decision\n' \
    "$name" $((total / calls)) $((total / calls / decisions))
  last=$((total / calls))
}

# fast_args N: the fast path's KEYS and ARGV for a call of N decisions (compact form).
fast_args() {
  local n=$1 i
  fast_call=("$n")
  for i in $(seq "$n"); do fast_call+=("k:__rand_int__:$i"); done
  fast_call+=(0 1000000000 3600000 1)
}

echo "redis-server instructions, $calls calls of 8 allowed decisions each ($(redis-server --version | awk '{print $3}'))"
measure general "$work/general.lua" 8 8 "${keys[@]}" "${general[@]}"
measure "fast path" "$work/fast.lua" 8 8 "${keys[@]}" "${fast[@]}"
measure "spelled out" "$work/fast.lua" 8 8 "${keys[@]}" "${spelled[@]}"
measure bare "$work/bare.lua" 8 8 "${keys[@]}" 1
measure "return 1" "$work/return1.lua" 1 0
measure "general sw" "$work/general.lua" 8 8 "${keys[@]}" "${sliding[@]}"
measure "compact sw" "$work/general.lua" 8 8 "${keys[@]}" "${compact_sw[@]}"
measure "bare sw" "$work/bare_sw.lua" 8 8 "${keys[@]}" 7200000
measure "general gcra" "$work/general.lua" 8 8 "${keys[@]}" "${gcra[@]}"
measure "compact gcra" "$work/general.lua" 8 8 "${keys[@]}" "${compact_gcra[@]}"
measure "bare gcra" "$work/bare_gcra.lua" 8 8 "${keys[@]}" 7200000

# The fast path at 1, 8 and 32 decisions a call: a least-squares line
# through the three, its intercept what a call costs by itself.
declare -A per_call
for n in 1 8 32; do
  fast_args "$n"
  measure "fast, $n" "$work/fast.lua" "$n" "${fast_call[@]}" >/dev/null
  per_call[$n]=$last
done
python3 - "${per_call[1]}" "${per_call[8]}" "${per_call[32]}" <<'PY'
import sys
xs, ys = [1, 8, 32], [int(v) for v in sys.argv[1:]]
mx, my = sum(xs) / 3, sum(ys) / 3
slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
fixed = my - slope * mx
print(f"fast path at 1, 8, 32 a call: {', '.join(f'{y:,}' for y in ys)} instructions a call;")
print(f"  a call by itself about {fixed:,.0f}, each decision about {slope:,.0f} "
      f"(at 8 a call, the call's own share is {fixed / ys[1]:.0%})")
PY

# The fast path as a function, beside the script (measured above), at 1
# and 8 a call.
for n in 1 8; do
  fast_args "$n"
  script_total=${per_call[$n]}
  measure "fn, $n" "$work/function.fn.lua" "$n" "${fast_call[@]}" >/dev/null
  fn_total=$last
  measure "kept, $n" "$work/kept.fn.lua" "$n" "${fast_call[@]}" >/dev/null
  printf 'fast path, %2d a call: script %7d, function %7d (%+.1f%%), function with parsed kept %7d (%+.1f%%)\n' \
    "$n" "$script_total" "$fn_total" "$(python3 -c "print(100 * ($fn_total / $script_total - 1))")" \
    "$last" "$(python3 -c "print(100 * ($last / $script_total - 1))")"
done
