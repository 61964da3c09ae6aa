#!/usr/bin/env bash
# What the layer adds to a whole server, in user-space instructions per
# request (valgrind's callgrind), which unlike req/s does not move with what
# else the VM is doing.
#
#   bash benches/server-cost.sh [SECONDS]      (default 10 s of wrk per case)
#
# For each case, examples/axum.rs (release) runs under callgrind with
# instrumentation off on a free port; wrk warms it up for 2 s; then
# instrumentation is switched on for SECONDS of wrk (1 thread, 32
# connections) and off again. Printed: the server's instructions (all its
# threads) divided by the requests wrk completed; a case whose wrk report
# shows socket errors, or answers other than it is designed to give (2xx,
# or for `memory, denied` all 429), stops the run. Kernel time (the TCP
# stack) is not counted; it is about the same in every case, so the difference
# between a case and `plain` is what the limiter costs in the process.
#
#   plain, 100k keys    RATE_LIMIT=off, wrk sending x-api-key k0..k99999
#   memory, 100k keys   the memory store keyed by x-api-key, every request
#                       allowed (a quota no run exhausts)
#   plain, 1 key        RATE_LIMIT=off, plain GET /
#   memory, 1 key       the memory store keyed by peer IP, every request
#                       allowed (one hot counter)
#   memory, denied      the memory store keyed by peer IP, quota 1/1h, spent
#                       by the warm-up: every measured request is a 429
#   redis, 100k keys    as "memory, 100k keys", on a redis-server of its own
#                       through the ConnectionManager (Redis's own work is
#                       not counted: see script-cost.sh)
#   reserve 1000, 1 key as "memory, 1 key", on that Redis with a local
#                       reservation of 1000 units (RATE_LIMIT_RESERVE): the
#                       hot key spent from units reserved 1000 at a time
#   floor, 100k keys    benches/peers' redis-floor (one PING per request,
#                       no limiter), when it has been built
#
# Needs valgrind, wrk, curl and cargo (apt-get install -y valgrind wrk curl),
# and redis-server for the Redis cases.
set -euo pipefail

seconds=${1:-10}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
for tool in valgrind callgrind_control wrk curl cargo python3; do
  command -v "$tool" >/dev/null || { echo "server-cost.sh: $tool not found" >&2; exit 1; }
done
cargo build --release --example axum >&2
server=${CARGO_TARGET_DIR:-$root/target}/release/examples/axum
keys=$root/benches/harness/keys.lua
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# The harness's free port (benches/harness/procs.py).
free_port() {
  PYTHONPATH="$root/benches" python3 -c 'from harness.procs import free_port; print(free_port())'
}

# wrk DURATION URL [KEYS_LUA_ARGS...]: wrk, with keys.lua when given
# arguments; a 10 s timeout, as the harness's (wrk's 2 s would count a slow
# answer under callgrind as a socket error)
load() {
  local duration=$1 url=$2
  shift 2
  if [ $# -gt 0 ]; then
    wrk -t1 -c32 -d"$duration" --timeout 10s -s "$keys" "$url" -- "$@"
  else
    wrk -t1 -c32 -d"$duration" --timeout 10s "$url"
  fi
}

# case_cost NAME EXPECT BINARY REDIS_URL RATE_LIMIT RATE_LIMIT_KEY [KEYS_LUA_ARGS...]
# (REDIS_URL "" for the memory store; EXPECT: 2xx, every answer 2xx, or
# 429, every one denied)
case_cost() {
  local name=$1 expect=$2 binary=$3 redis=$4 limit=$5 key=$6
  shift 6
  local port out on_error=
  port=$(free_port)
  out=$work/callgrind.out
  # Our limiter answers a store error 503, not a fail-open 200 that would
  # pass for a decision (RATE_LIMIT=off refuses the variable).
  [ "$limit" = off ] || on_error=RATE_LIMIT_ON_ERROR=deny
  env ${redis:+REDIS_URL=$redis} ${on_error:+$on_error} ${reserve:+RATE_LIMIT_RESERVE=$reserve} \
    BIND=127.0.0.1:$port \
    RATE_LIMIT=$limit RATE_LIMIT_KEY=$key \
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
    "$binary" >"$work/server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do
    curl -s -o /dev/null "http://127.0.0.1:$port/" && break
    sleep 0.1
  done
  load 2s "http://127.0.0.1:$port/" "$@" >/dev/null
  callgrind_control -i on "$pid" >/dev/null 2>&1
  local report
  report=$(load "${seconds}s" "http://127.0.0.1:$port/" "$@")
  callgrind_control -i off "$pid" >/dev/null 2>&1
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  local requests instructions non2xx errors
  requests=$(awk '/requests in/ {print $1}' <<<"$report")
  # wrk prints these lines only when not zero.
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' <<<"$report")
  errors=$(awk '/Socket errors:/ {gsub(",", ""); print $4 + $6 + $8 + $10}' <<<"$report")
  non2xx=${non2xx:-0} errors=${errors:-0}
  if [ "$errors" -gt 0 ] || { [ "$expect" = 2xx ] && [ "$non2xx" -gt 0 ]; } \
      || { [ "$expect" = 429 ] && [ "$non2xx" -ne "$requests" ]; }; then
    echo "server-cost.sh: $name: $non2xx of $requests answers not 2xx (designed: all" \
      "$expect), $errors socket errors; not a measure of the layer. wrk:" >&2
    echo "$report" >&2
    echo "server log:" >&2
    tail -n 20 "$work/server.log" >&2
    exit 1
  fi
  instructions=$(cat "$out".* | awk '/^totals:/ {sum += $2} END {print sum}')
  rm -f "$out" "$out".*
  printf '%-20s %8d requests %12d instructions per request\n' \
    "$name" "$requests" $((instructions / requests))
}

huge=1000000000/1h
case_cost "plain, 100k keys" 2xx "$server" "" off "header:x-api-key" cycle 100000
case_cost "memory, 100k keys" 2xx "$server" "" $huge "header:x-api-key" cycle 100000
case_cost "plain, 1 key" 2xx "$server" "" off ip
case_cost "memory, 1 key" 2xx "$server" "" $huge ip
case_cost "memory, denied" 429 "$server" "" 1/1h ip

# With Redis: a redis-server of our own on a free port.
if ! command -v redis-server >/dev/null; then
  echo "redis-server not found (apt-get install -y redis-server): Redis cases skipped" >&2
  exit 0
fi
command -v redis-cli >/dev/null || { echo "server-cost.sh: redis-cli not found" >&2; exit 1; }
redis_port=$(free_port)
redis-server --port "$redis_port" --save '' --appendonly no >"$work/redis.log" 2>&1 &
# Listening before the first case: a server that starts before Redis exits.
pong() { [ "$(redis-cli -p "$redis_port" PING 2>/dev/null)" = PONG ]; }
for _ in $(seq 100); do
  pong && break
  sleep 0.1
done
pong || {
  echo "server-cost.sh: redis-server on port $redis_port did not answer PING within 10 s:" >&2
  cat "$work/redis.log" >&2
  exit 1
}
redis=redis://127.0.0.1:$redis_port/
case_cost "redis, 100k keys" 2xx "$server" "$redis" $huge "header:x-api-key" cycle 100000
reserve=1000 case_cost "reserve 1000, 1 key" 2xx "$server" "$redis" $huge ip
floor=$root/benches/peers/target/release/redis-floor
if [ -x "$floor" ]; then
  case_cost "floor, 100k keys" 2xx "$floor" "$redis" off "header:x-api-key" cycle 100000
else
  echo "no $floor (cargo build --release in benches/peers): floor skipped" >&2
fi
