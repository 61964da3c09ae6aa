#!/usr/bin/env python3
"""Load benchmark: the axum example server under wrk, with and without the limiter.

Starts its own redis-server on a free port, builds `examples/axum.rs` in
release mode, and for each round runs every (server, workload) pair once, in
an order shuffled per round, so that the machine's drift hits all alike. It
reports requests/s, p50/p99 latency, and the median over rounds of each
server's per-round ratio to the no-limiter baseline.

    python3 benches/load.py [--rounds 5] [--seconds 5] [--connections 32]

Needs wrk (apt-get install -y wrk) and redis-server on PATH.
"""

import argparse
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SERVERS = {
    # name: extra environment
    "no limiter": {"RATE_LIMIT": "off"},
    "memory store": {},
    "redis (ConnectionManager)": {"REDIS": "1"},
    "redis (bb8 pool of 32)": {"REDIS": "1", "REDIS_POOL": "32"},
}
WORKLOADS = {
    # name: quota; every request comes from 127.0.0.1, so one key
    "allowed, one hot key": "1000000000/1h",
    "denied, one key": "1/1h",
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what):
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not listen on {port}")


def wrk(url, seconds, connections):
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", url],
        check=True, capture_output=True, text=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))

    def pct(p):
        m = re.search(rf"\s{p}%\s+([\d.]+)(us|ms|s)", out)
        scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
        return float(m.group(1)) * scale

    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, pct(50), pct(99), int(non2xx.group(1)) if non2xx else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=32)
    args = ap.parse_args()
    for tool in ("wrk", "redis-server", "cargo"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found on PATH (apt-get install -y wrk redis-server)")

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(["cargo", "build", "--release", "--example", "axum"], cwd=root, check=True)
    binary = os.path.join(root, "target", "release", "examples", "axum")

    tmp = tempfile.mkdtemp()
    rport = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(rport), "--save", "", "--appendonly", "no",
         "--dir", tmp, "--logfile", os.path.join(tmp, "redis.log")])
    wait_port(rport, redis, "redis-server")
    results = {}  # (server, workload) -> list of (rps, p50, p99, non2xx)
    try:
        for rnd in range(args.rounds):
            pairs = [(s, w) for s in SERVERS for w in WORKLOADS]
            random.shuffle(pairs)
            for server, workload in pairs:
                subprocess.run(["redis-cli", "-p", str(rport), "FLUSHALL"],
                               check=True, capture_output=True)
                port = free_port()
                env = dict(os.environ, BIND=f"127.0.0.1:{port}", RUST_LOG="warn",
                           RATE_LIMIT=WORKLOADS[workload])
                extra = dict(SERVERS[server])
                if extra.pop("REDIS", None):
                    env["REDIS_URL"] = f"redis://127.0.0.1:{rport}"
                env.update(extra)
                proc = subprocess.Popen([binary], env=env)
                try:
                    wait_port(port, proc, server)
                    r = wrk(f"http://127.0.0.1:{port}/", args.seconds, args.connections)
                finally:
                    proc.terminate()
                    proc.wait()
                results.setdefault((server, workload), []).append(r)
                print(f"round {rnd + 1}: {server:28} {workload:22} {r[0]:>10.0f} req/s "
                      f"p50 {r[1]:.2f} ms p99 {r[2]:.2f} ms non-2xx {r[3]}", file=sys.stderr)
        stats = subprocess.run(["redis-cli", "-p", str(rport), "INFO", "commandstats"],
                               check=True, capture_output=True, text=True).stdout
    finally:
        redis.terminate()
        redis.wait()

    print(f"\nwrk -t1 -c{args.connections} -d{args.seconds}s, {args.rounds} rounds; "
          "medians; ratio = median of per-round req/s ratios to 'no limiter'\n")
    print("| server | workload | req/s | p50 ms | p99 ms | ratio |")
    print("|---|---|---|---|---|---|")
    for workload in WORKLOADS:
        base = results[("no limiter", workload)]
        for server in SERVERS:
            rs = results[(server, workload)]
            ratio = statistics.median(r[0] / b[0] for r, b in zip(rs, base))
            med = [statistics.median(r[i] for r in rs) for i in range(3)]
            print(f"| {server} | {workload} | {med[0]:.0f} | {med[1]:.2f} | {med[2]:.2f} "
                  f"| {ratio:.2f}x |")


    print("\nRedis's own cost per command over the whole run (INFO commandstats):\n")
    for line in stats.splitlines():
        if line.startswith("cmdstat_"):
            name, fields = line.split(":", 1)
            f = dict(kv.split("=") for kv in fields.split(","))
            print(f"- {name[8:]}: {f['calls']} calls, {f['usec_per_call']} usec per call")


if __name__ == "__main__":
    main()
