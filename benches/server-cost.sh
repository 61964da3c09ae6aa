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
# threads) divided by the requests wrk completed. Kernel time (the TCP
# stack) is not counted; it is about the same in every case, so the difference
# between a case and `plain` is what the limiter costs in the process.
#
#   plain, 100k keys    RATE_LIMIT=off, wrk sending x-api-key k0..k99999
#   memory, 100k keys   the memory store keyed by x-api-key, every request
#                       allowed (a quota no run exhausts)
#   plain, 1 key        RATE_LIMIT=off, plain GET /
#   memory, denied      the memory store keyed by peer IP, quota 1/1h, spent
#                       by the warm-up: every measured request is a 429
#
# Needs valgrind, wrk, curl and cargo (apt-get install -y valgrind wrk curl).
set -euo pipefail

seconds=${1:-10}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
for tool in valgrind callgrind_control wrk curl cargo python3; do
  command -v "$tool" >/dev/null || { echo "server-cost.sh: $tool not found" >&2; exit 1; }
done
cargo build --release --example axum >&2
server=${CARGO_TARGET_DIR:-$root/target}/release/examples/axum
keys=$root/benches/loadbench/keys.lua
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wrk DURATION URL [KEYS_LUA_ARGS...]: wrk, with keys.lua when given arguments
load() {
  local duration=$1 url=$2
  shift 2
  if [ $# -gt 0 ]; then
    wrk -t1 -c32 -d"$duration" -s "$keys" "$url" -- "$@"
  else
    wrk -t1 -c32 -d"$duration" "$url"
  fi
}

# case_cost NAME RATE_LIMIT RATE_LIMIT_KEY [KEYS_LUA_ARGS...]
case_cost() {
  local name=$1 limit=$2 key=$3
  shift 3
  local port out
  port=$(free_port)
  out=$work/callgrind.out
  BIND=127.0.0.1:$port RATE_LIMIT=$limit RATE_LIMIT_KEY=$key \
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
    "$server" >"$work/server.log" 2>&1 &
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
  local requests instructions
  requests=$(awk '/requests in/ {print $1}' <<<"$report")
  instructions=$(cat "$out".* | awk '/^totals:/ {sum += $2} END {print sum}')
  rm -f "$out" "$out".*
  printf '%-20s %8d requests %12d instructions per request\n' \
    "$name" "$requests" $((instructions / requests))
}

case_cost "plain, 100k keys" off "header:x-api-key" cycle 100000
case_cost "memory, 100k keys" 1000000000/1h "header:x-api-key" cycle 100000
case_cost "plain, 1 key" off ip
case_cost "memory, denied" 1/1h ip
