#!/usr/bin/env python3
"""The physical limit of the allowed path with the Redis store on this machine.

    python3 benches/redis-limit.py                      # about 2 minutes
    python3 benches/redis-limit.py --decisions 50000 --shallow-decisions 20000 \\
        --repeats 1 --seconds 2                         # a short run, to see it work
    python3 benches/redis-limit.py --only tx --plain-us 22.0   # some designs, C_plain given
    python3 benches/redis-limit.py --out /tmp/redis-limit   # writes /tmp/redis-limit.{md,json}

Needs redis-server, redis-cli and wrk (apt-get install -y redis-server wrk),
and cargo for `examples/axum.rs`. Python 3.11, standard library only.

Why
---
Issue 8 asks for the allowed path with the Redis store at >= 0.8x a plain axum
server, on a 2-core machine where wrk, the server and Redis share the cores.
On such a machine the throughput is at most cores / (CPU time the whole
machine spends per request). A limiter adds at least Redis's own CPU time per
decision to plain axum's, so, even for a server that added no work at all of
its own (no client, no round trip, no headers),

    ratio <= C_plain / (C_plain + C_redis)

where C_plain is the whole machine's CPU time per request of plain axum
under wrk (server and wrk) and C_redis Redis's CPU time per decision. This
script measures both and prints that bound for several designs of an atomic
rate-limit decision, so the bound says what any design can reach here, ours
or another.

What it measures
----------------
1. Its own redis-server on a free port (never 6379), without persistence, in
   a temp dir.
2. For each design (below), Redis's CPU per decision in the best case for
   Redis: one client, a deep pipeline (pre-encoded RESP written in big
   chunks by one thread while the main thread reads the replies), so Redis
   reads 16 KiB of commands per read(2) and the per-call syscalls are
   amortised. N decisions (`--decisions`) on 100,000 existing counters
   `k:<i>` (created first, untimed, by the design itself: the load
   benchmark's `allowed, 100k keys`), in turn, with a quota of 1000000000
   per 3600000 ms, so every decision is allowed. Around the timed part:
   `INFO cpu` (used_cpu_user + used_cpu_sys, the whole Redis process:
   parsing, networking, scripts), so **Redis CPU us per decision**; and the
   wall time, so decisions/s and how busy Redis was (its CPU over the wall
   time: near 100% means Redis, not the client, set the pace).

   Then the same with a shallow pipeline (`--shallow-decisions`): 32
   connections (`--connections`), each with one call (or one transaction,
   sent in one write as redis-rs sends an atomic pipeline) in flight at a
   time, as a limiter that does not pipeline or batch would send them. The
   client is Python (a selector loop over the 32 sockets), slower than a
   Rust server: fewer replies are ready per turn of Redis's event loop than
   with a fast client, so these figures lean high, by little (each round
   trip costs Redis a read(2) and a write(2) whatever the client).

   Every reply is checked, after the timed part: its count, that no reply is
   an error, and that each says what an allowed decision on an existing
   counter should (e.g. our script: allowed, remaining below the quota, a
   reset within the window, no retry). `INFO commandstats` must count the
   calls sent. After each design one read-only script SCANs the keyspace:
   exactly 100,000 keys under the design's prefix, every one with a TTL
   within the window (the lone INCR excepted: it has none, by design), and
   the counters' sum equal to the decisions made. Any failure stops the run.

   Designs (each an atomic decision that leaves no key without a TTL, but
   PING and `return 1`, which write nothing, and the lone INCR):

   ping         PING: not a decision, the per-command floor
   return 1     EVALSHA of `return 1`, one per decision: a script's per-call floor
   ours xN      our fast path for fixed windows, lua/lib.lua + fixed_window.lua
                + decide_fixed.lua joined with newlines, exactly as
                benches/script-cost.sh builds fast.lua (and store/scripts.rs
                DECIDE_FIXED_LUA), with N = 8 decisions per EVALSHA (what
                RedisStore's batches reach under load), 32, 50 (near the most one
                batch holds, store/batch.rs MAX_BATCH) and 1
   function xN  ours as a Redis 7 function library (FUNCTION LOAD, then
                FCALL decide_fixed), N = 8 and 1: lib.lua and fixed_window.lua
                run once, at load, and a policy's limit and window are parsed
                once per load, not per call (harness/designs.py as_function).
                Not what RedisStore sends: docs/performance-notes.md says why
   bare x8      INCRBY + PTTL per key through Lua and the packed reply, nothing
                else (benches/bare.lua): a floor for any such script.
                It sets no TTL, so its counters are created with one
                (SET k 0 PX <window>, untimed), which INCRBY keeps
   native tx    MULTI, SET k 0 PX <window> NX, INCRBY k 1, PTTL k, EXEC: a
                fixed window without Lua (Redis 7 freezes time inside EXEC)
   actix tx     actix-extensible-rate-limit 0.4's RedisBackend: MULTI,
                BITFIELD k OVERFLOW SAT INCRBY u63 0 1 GET u63 0,
                EXPIRE k <secs> NX, TTL k, EXEC (its source, as in
                benches/peers); it counts denied requests too
   lone INCR    INCR on keys `incr:<i>`: not safe (no TTL), the cheapest
                possible write, a lower bound for any design

   Between designs: FLUSHALL.
3. Plain axum: `examples/axum.rs` (release) with RATE_LIMIT=off and
   RATE_LIMIT_KEY=header:x-api-key, driven by `wrk -t1 -c32` with
   benches/harness/keys.lua cycling x-api-key over 100,000 keys (the load
   benchmark's command line), after a warm-up. The server's CPU time
   (/proc/<pid>/stat utime + stime, all threads) plus wrk's
   (getrusage(RUSAGE_CHILDREN)) over the requests wrk counted: **C_plain, us
   per request, the whole machine**. Loopback TCP work runs mostly in the
   sending process's syscalls and softirqs, so it is charged to these two
   processes' system time, which is what we want. As a cross-check, the
   machine's busy time from /proc/stat per request (which also counts
   whatever else runs on the machine) is recorded. `--repeats` runs, the
   median.

Redis figures are medians over `--repeats` runs too. CPU times, unlike
req/s, move little when other work shares the machine (caches and the
hypervisor still move them some), so they are the figures to use on this VM;
the load average at the start and end is printed with the table.

Output: a markdown table (design, decisions per call, Redis CPU us per
decision, decisions/s, Redis busy, the best possible ratio; the same at
depth 1), the machine, C_plain, and what 0.8x would leave for Redis.
Writes `<out>.md` (also printed) and `<out>.json` (every raw figure);
`--out` is `benches/results/redis-limit` by default.

The parts are in `benches/harness/` (its `__init__.py` lists them); this
file parses the options, runs them in turn and prints the bound.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import RESULTS, bound, drive, plain, procs  # noqa: E402
from harness.designs import designs  # noqa: E402
from harness.resp import Conn  # noqa: E402


def arguments():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--decisions", type=int, default=400_000,
                   help="decisions per deep-pipeline run (default 400000)")
    p.add_argument("--shallow-decisions", type=int, default=100_000,
                   help="decisions per depth-1 run; 0 skips them (default 100000)")
    p.add_argument("--connections", type=int, default=32,
                   help="connections of the depth-1 runs (default 32)")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs per design and of plain axum; medians (default 3)")
    p.add_argument("--seconds", type=int, default=5, help="wrk's measured run (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="wrk's warm-up, s (default 1)")
    p.add_argument("--wrk-connections", type=int, default=32, help="default 32")
    p.add_argument("--only", action="append", default=[], metavar="SUBSTRING",
                   help="designs whose name contains it (repeatable)")
    p.add_argument("--plain-us", type=float,
                   help="take C_plain (µs) as given instead of measuring plain axum")
    p.add_argument("--no-build", action="store_true",
                   help="do not run cargo build; use target/release/examples/axum")
    p.add_argument("--out", default=os.path.join(RESULTS, "redis-limit"),
                   help="write <out>.md and <out>.json (default benches/results/redis-limit)")
    return p.parse_args()


def main():
    args = arguments()
    procs.require("redis-server", "redis-cli", *([] if args.plain_us else ["wrk", "cargo"]))
    chosen = [d for d in designs() if not args.only or any(s in d.name for s in args.only)]
    if not chosen:
        sys.exit("no design matches --only")

    meta = {"machine": bound.machine(), "load_start": procs.loadavg(),
            "options": vars(args), "date": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    print(f"load average at the start: {meta['load_start']}", file=sys.stderr)

    redis = procs.Redis()
    control = Conn(redis.port)
    results = []
    try:
        for d in chosen:
            print(f"{d.name} ...", file=sys.stderr, flush=True)
            results.append(drive.measure(redis.port, control, d, args))
            print(bound.progress(results[-1], procs.loadavg()), file=sys.stderr, flush=True)
    finally:
        control.close()
        redis.stop()

    if args.plain_us:
        baseline = plain.given(args.plain_us)
    else:
        print("plain axum ...", file=sys.stderr, flush=True)
        baseline = plain.measure_plain(args)
    meta["load_end"] = procs.loadavg()

    text = bound.markdown(meta, baseline, results)
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".md", "w") as f:
        f.write(text + "\n")
    bound.write_json(args.out + ".json", meta, baseline, results)
    print(f"wrote {args.out}.md and {args.out}.json", file=sys.stderr)


if __name__ == "__main__":
    main()
