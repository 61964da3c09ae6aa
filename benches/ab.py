#!/usr/bin/env python3
"""A/B of the memory store (or, with --redis, the Redis store) across
commits: examples/axum.rs built at each git revision given, and plain axum
(RATE_LIMIT=off, built at the last revision), run in one session,
interleaved in a shuffled order every round.

    python3 benches/ab.py c5f20ab 0513b34 924daf4 --workload 100k --rounds 6
    python3 benches/ab.py 270989e 3e7f198 --redis --workload 100k --rounds 8

Each revision is exported with `git archive` into a temporary directory and
built there with a shared target directory (target/ab), so only the crate
itself is rebuilt per revision. Per cell: a fresh server, the workload's
warm-up (load.py's), 1 s of wrk, then `wrk -t1 -c32 -d<seconds>s`.
Printed per build: median req/s, its median ratio to the plain cell of
the same round, and the median of the server's own CPU time per request
(user + system, from /proc), which the VM's drift moves less than req/s.
With --redis, every limited cell uses one redis-server of the run's own
(REDIS_URL, the ConnectionManager), and its CPU per request is printed too.

Needs git, cargo, wrk (apt-get install -y wrk) and python3; redis-server
for --redis.
"""

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile

from harness import catalog, procs, wrk

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(rev, target):
    """examples/axum at `rev`; returns the binary's path."""
    src = tempfile.mkdtemp(prefix=f"ab-{rev}-")
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
    env = dict(os.environ, CARGO_TARGET_DIR=target)
    try:
        subprocess.run(["cargo", "build", "--release", "--example", "axum"], cwd=src,
                       env=env, check=True)
    finally:
        shutil.rmtree(src)
    binary = os.path.join(target, f"axum-{rev}")
    os.replace(os.path.join(target, "release", "examples", "axum"), binary)
    return binary


def cell(binary, workload, limited, seconds, log, redis=None):
    env = {"RATE_LIMIT": workload.quota if limited else "off",
           "RATE_LIMIT_KEY": workload.key}
    if redis and limited:
        env["REDIS_URL"] = redis.url
    with procs.serving(binary, env, log) as (port, _, pid):
        problem = procs.prepare(port, workload, limited)
        if problem:
            sys.exit(f"ab.py: {os.path.basename(binary)}: {problem}")
        url = f"http://127.0.0.1:{port}/"
        wrk.run(url, 1, 32, script=workload.script)
        before = procs.cpu_seconds(pid)
        redis_before = procs.cpu_seconds(redis.proc.pid) if redis else 0.0
        result = wrk.run(url, seconds, 32, script=workload.script)
        cpu = procs.cpu_seconds(pid) - before
        redis_cpu = procs.cpu_seconds(redis.proc.pid) - redis_before if redis else 0.0
    per = 1e6 / result["requests"]
    return result["rps"], cpu * per, redis_cpu * per


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("revs", nargs="+", help="git revisions to compare")
    p.add_argument("--workload", default="100k", help="substring of a load.py workload name")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--redis", action="store_true",
                   help="the limited cells on a redis-server of the run's own")
    args = p.parse_args()
    procs.require("git", "cargo", "wrk", *(["redis-server"] if args.redis else []))
    workload = next(w for w in catalog.WORKLOADS if args.workload in w.name)
    target = os.path.join(ROOT, "target", "ab")
    builds = {rev: build(rev, target) for rev in args.revs}
    log = os.path.join(target, "server.log")
    redis = procs.Redis() if args.redis else None
    plain, rows = "plain axum", {name: [] for name in ["plain axum", *builds]}
    try:
        for r in range(args.rounds):
            base_rps, base_cpu, _ = cell(builds[args.revs[-1]], workload, False, args.seconds, log)
            rows[plain].append((base_rps, 1.0, base_cpu, 0.0))
            for rev in random.sample(list(builds), len(builds)):
                rps, cpu, redis_cpu = cell(builds[rev], workload, True, args.seconds, log, redis)
                rows[rev].append((rps, rps / base_rps, cpu, redis_cpu))
                print(f"round {r + 1}: {rev:12s} {rps:9.0f} req/s, {rps / base_rps:.2f}x, "
                      f"server {cpu:.2f} µs/req, Redis {redis_cpu:.2f} µs/req", file=sys.stderr)
    finally:
        if redis:
            redis.stop()
    print(f"{workload.name}{', Redis' if redis else ''}, {args.rounds} rounds of "
          f"{args.seconds} s, medians:")
    for name, cells in rows.items():
        rps, ratio, cpu, redis_cpu = (statistics.median(c[i] for c in cells) for i in range(4))
        more = f", Redis {redis_cpu:.2f} µs/req" if redis and name != plain else ""
        print(f"  {name:12s} {rps:9.0f} req/s  {ratio:.2f}x  server {cpu:.2f} µs/req{more}")


if __name__ == "__main__":
    main()
