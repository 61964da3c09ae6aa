#!/usr/bin/env python3
"""The in-memory store under a flood of new keys, against one key, interleaved.

    python3 benches/flood.py                   # p99: flood vs one key, 5 rounds
    python3 benches/flood.py --rss             # RSS: bytes per key, two floods
    python3 benches/flood.py --growth --rate 20000   # p99 while the store grows to 1M keys
    python3 benches/flood.py --binary /tmp/old-axum --rss   # another build

Latency: two example servers (`examples/axum.rs`, in-memory store, keyed by
`x-api-key`, a quota no key exhausts), F and O. F is first filled with
`--fill` new keys at saturation (not measured); then each round runs, in a
shuffled order, a paced wrk run of new keys (keys.lua `fresh`) on F and one
of a single key (keys.lua `cycle 1`) on O, at the same offered rate, and
prints both p99s and maxima: the flood's p99 at and past the store's bound
against one key's at the same load.

RSS (`--rss`): a server with room for 2M keys takes `--fill` new keys of a
fixed window, then of a sliding window (two servers), and reports RSS growth
per key; then a server with the default bound and 20 s windows takes a
flood, waits for its windows to end, takes a second flood, and reports RSS
after each.
"""

import argparse
import os
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import procs, wrk  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYED = {"RATE_LIMIT_KEY": "header:x-api-key"}


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def flood(port, keys, connections=64, threads=2):
    """About `keys` new keys at saturation: wrk runs of 5 s until sent."""
    url, sent = f"http://127.0.0.1:{port}/", 0
    while sent < keys:
        r = wrk.run(url, 5, connections, threads, ("fresh", 0))
        sent += r["requests"]
    return sent


def round_of(rnd, cells, args, rows):
    """One round: each (name, port, keys.lua script) cell paced at `--rate`,
    in a shuffled order; results appended to `rows[name]` and printed.
    Returns the requests each cell sent, by name."""
    rate_delay = args.connections * 1000 / args.rate
    random.shuffle(cells)
    sent = {}
    for name, port, script in cells:
        r = wrk.paced(f"http://127.0.0.1:{port}/", args.seconds, args.connections, 1,
                      script, rate_delay)
        rows[name].append(r)
        sent[name] = r["requests"]
        print(f"round {rnd} {name:14} {r['rps']:7.0f} req/s  p99 {r['p99']:6.2f} ms"
              f"  max {r['max']:7.2f} ms  non-2xx {r['non2xx']}", file=sys.stderr)
    return sent


def latency(args):
    env = dict(KEYED, RATE_LIMIT="1000000000/1h")
    rows = {"flood": [], "one key": []}
    with procs.serving(args.binary, env, "/tmp/flood-F.log") as (fport, startup, fpid), \
            procs.serving(args.binary, env, "/tmp/flood-O.log") as (oport, _, _):
        print(startup, file=sys.stderr)
        sent = flood(fport, args.fill)
        print(f"filled: {sent} keys, RSS {rss_mb(fpid):.0f} MB", file=sys.stderr)
        for rnd in range(args.rounds):
            cells = [("flood", fport, ("fresh", 0)), ("one key", oport, ("cycle", 1))]
            round_of(rnd + 1, cells, args, rows)
        print(f"flood server: RSS {rss_mb(fpid):.0f} MB at the end", file=sys.stderr)
    report(rows, args.rate)


def growth(args):
    """p99 while the store grows: F starts empty (room for 2M keys) and each
    of its cells sends new keys only, so its table grows through `--fill`
    keys over the rounds, every resize and reclaim on some request's time;
    O answers one key. Both paced at the same rate, interleaved."""
    env = dict(KEYED, RATE_LIMIT="1000000000/1h", RATE_LIMIT_MEMORY_MAX_KEYS="2000000")
    rows = {"flood, growing": [], "one key": []}
    with procs.serving(args.binary, env, "/tmp/flood-F.log") as (fport, startup, fpid), \
            procs.serving(args.binary, env, "/tmp/flood-O.log") as (oport, _, _):
        print(startup, file=sys.stderr)
        sent, rnd = 0, 0
        while sent < args.fill:
            rnd += 1
            cells = [("flood, growing", fport, ("fresh", 0)), ("one key", oport, ("cycle", 1))]
            sent += round_of(rnd, cells, args, rows)["flood, growing"]
            print(f"  the flood server holds ~{sent} keys", file=sys.stderr)
        print(f"flood server: {sent} new keys, RSS {rss_mb(fpid):.0f} MB", file=sys.stderr)
    report(rows, args.rate)


def report(rows, rate):
    print("| run | req/s offered | p99 median (range) ms | max median (range) ms |")
    print("|---|---|---|---|")
    for name, rs in rows.items():
        p99, mx = [r["p99"] for r in rs], [r["max"] for r in rs]
        print(f"| {name} | {rate} | {statistics.median(p99):.2f} ({min(p99):.2f}–{max(p99):.2f})"
              f" | {statistics.median(mx):.1f} ({min(mx):.1f}–{max(mx):.1f}) |")


def rss(args):
    for algorithm in ("fixed-window", "sliding-window"):
        env = dict(KEYED, RATE_LIMIT="1000000000/1h", RATE_LIMIT_ALGORITHM=algorithm,
                   RATE_LIMIT_MEMORY_MAX_KEYS="2000000")
        with procs.serving(args.binary, env, "/tmp/flood-rss.log") as (port, _, pid):
            wrk.run(f"http://127.0.0.1:{port}/", 1, 8, 1, ("cycle", 1))
            before = rss_mb(pid)
            sent = flood(port, args.fill)
            after = rss_mb(pid)
            print(f"| {algorithm} | {sent} | {before:.0f} → {after:.0f} MB | "
                  f"{(after - before) * 1024 * 1024 / sent:.0f} |")
    env = dict(KEYED, RATE_LIMIT="1000000000/20s")
    with procs.serving(args.binary, env, "/tmp/flood-rss.log") as (port, _, pid):
        start = rss_mb(pid)
        first = flood(port, args.fill)
        one = rss_mb(pid)
        time.sleep(21)
        second = flood(port, args.fill)
        two = rss_mb(pid)
        print(f"two floods of {first} and {second} new keys (20 s windows, waiting them out): "
              f"RSS {start:.0f} → {one:.0f} → {two:.0f} MB")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/examples/axum"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=10, help="paced seconds per cell")
    ap.add_argument("--rate", type=int, default=4000, help="req/s offered in each paced run")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--fill", type=int, default=1_000_000, help="new keys sent before measuring")
    ap.add_argument("--rss", action="store_true", help="measure memory instead of latency")
    ap.add_argument("--growth", action="store_true",
                    help="p99 while an empty store grows through --fill new keys")
    args = ap.parse_args()
    procs.require("wrk")
    if not os.environ.get("FLOOD_NO_BUILD") and args.binary.startswith(ROOT):
        subprocess.run(["cargo", "build", "--release", "--example", "axum"], cwd=ROOT, check=True)
    if args.rss:
        rss(args)
    elif args.growth:
        growth(args)
    else:
        latency(args)


if __name__ == "__main__":
    main()
