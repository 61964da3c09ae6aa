#!/usr/bin/env python3
"""A/B of the Redis store when Redis is the bottleneck: a fleet of servers
of each revision on one redis-server that a cgroup caps to a share of one
core, as when a fleet outgrows its Redis.

    python3 benches/fleet.py 3552110 HEAD --rounds 6
    python3 benches/fleet.py HEAD --servers 8 --connections 16 --redis-cpu 10

Each revision's examples/axum.rs is built as ab.py builds it (target/ab).
Per cell: FLUSHALL; `--servers` servers of one build on the run's Redis
(`allowed, 100k keys`: every decision allowed, over 100,000 keys, with
RATE_LIMIT_ON_ERROR=deny, so a store error or timeout shows as a non-2xx
answer); a 1 s warm-up of each; then every server under its own
`wrk -t1 -c<connections>` at once for `--seconds`. Printed per build, medians
of the rounds: the fleet's decisions per second (its req/s), Redis's CPU per
decision (INFO cpu), decisions per script call (INFO commandstats), non-2xx
answers and the worst p99; and per cell how often the cgroup throttled
Redis, which shows that Redis was the bottleneck. Builds are interleaved in
a shuffled order every round. The run exits 1 if a cell answered non-2xx
or left a key without a TTL.

Redis's share is CFS bandwidth: `--redis-cpu` percent of a core in every
`--period-ms` (the kernel stops Redis for the rest of each period once it
has used its share, so keep the period well under the limiter's timeout,
200 ms by default). Needs root, a cgroup `cpu` controller (v1 at
/sys/fs/cgroup/cpu, or v2), redis-server, wrk, git and cargo.
"""

import argparse
import contextlib
import os
import random
import statistics
import sys
import threading

import ab
from harness import catalog, exactness, procs, redisstats, wrk

WORKLOAD = "allowed, 100k keys"


class Capped:
    """A cgroup of its own that holds a process to `percent` of one core."""

    def __init__(self, percent, period_ms):
        name = f"fleet-{os.getpid()}"
        period = int(period_ms * 1000)
        quota = max(1000, int(period * percent / 100))
        if os.path.isdir("/sys/fs/cgroup/cpu"):
            self.dir = f"/sys/fs/cgroup/cpu/{name}"
            os.mkdir(self.dir)
            self._write("cpu.cfs_period_us", period)
            self._write("cpu.cfs_quota_us", quota)
            self.stat = "cpu.stat"
        elif "cpu" in self._read("/sys/fs/cgroup/cgroup.controllers").split():
            self.dir = f"/sys/fs/cgroup/{name}"
            os.mkdir(self.dir)
            self._write("cpu.max", f"{quota} {period}")
            self.stat = "cpu.stat"
        else:
            sys.exit("fleet.py: no cgroup cpu controller (/sys/fs/cgroup/cpu or v2's cpu)")

    @staticmethod
    def _read(path):
        with contextlib.suppress(OSError), open(path) as f:
            return f.read()
        return ""

    def _write(self, file, value):
        with open(os.path.join(self.dir, file), "w") as f:
            f.write(str(value))

    def hold(self, pid):
        self._write("cgroup.procs", pid)

    def throttled(self):
        """(periods, periods throttled) so far."""
        stat = dict(line.split() for line in self._read(os.path.join(self.dir, self.stat))
                    .splitlines() if line.strip())
        return int(stat.get("nr_periods", 0)), int(stat.get("nr_throttled", 0))

    def remove(self):
        with contextlib.suppress(OSError):
            os.rmdir(self.dir)


def cell(binary, redis, capped, args, workload, log):
    redis.cli("FLUSHALL")
    env = {"RATE_LIMIT": workload.quota, "RATE_LIMIT_KEY": workload.key,
           "REDIS_URL": redis.url, "RATE_LIMIT_ON_ERROR": "deny"}
    with contextlib.ExitStack() as servers:
        ports = [servers.enter_context(procs.serving(binary, env, f"{log}.{i}"))[0]
                 for i in range(args.servers)]
        urls = [f"http://127.0.0.1:{port}/" for port in ports]
        for url in urls:
            wrk.run(url, 1, args.connections, script=workload.script)
        cpu_before = redisstats.reset(redis)
        periods, throttled = capped.throttled()
        results = [None] * len(urls)

        def load(i):
            results[i] = wrk.run(urls[i], args.seconds, args.connections,
                                 script=workload.script)

        threads = [threading.Thread(target=load, args=(i,)) for i in range(len(urls))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = redisstats.collect(redis, cpu_before)
        periods2, throttled2 = capped.throttled()
    n = sum(r["requests"] for r in results)
    calls = sum(f["calls"] for name, f in stats["commands"].items()
                if name.split("|")[0] == "evalsha")
    keys, no_ttl, _ = exactness.scan(redis)
    return {
        "rps": sum(r["rps"] for r in results),
        "cpu": stats["cpu_us"] / n,
        "batch": n / calls if calls else float("nan"),
        "bad": sum(r["non2xx"] + r["socket_errors"] for r in results),
        "p99": max(r["p99"] for r in results),
        "throttled": (throttled2 - throttled) / max(periods2 - periods, 1),
        "no_ttl": no_ttl,
        "keys": keys,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("revs", nargs="+", help="git revisions to compare")
    p.add_argument("--servers", type=int, default=4, help="servers per build (default 4)")
    p.add_argument("--connections", type=int, default=32, help="wrk connections per server")
    p.add_argument("--redis-cpu", type=float, default=15,
                   help="Redis's share of one core, in percent (default 15)")
    p.add_argument("--period-ms", type=float, default=20, help="the cgroup's period (default 20)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seconds", type=int, default=5)
    args = p.parse_args()
    procs.require("git", "cargo", "wrk", "redis-server", "redis-cli")
    if min(args.servers, args.connections, args.rounds, args.seconds) < 1:
        sys.exit("fleet.py: --servers, --connections, --rounds and --seconds need >= 1")
    if not 0 < args.redis_cpu <= 100 or not args.period_ms >= 1:
        sys.exit("fleet.py: --redis-cpu needs 0 < percent <= 100, --period-ms >= 1")
    workload = next(w for w in catalog.WORKLOADS if w.name == WORKLOAD)
    target = os.path.join(ab.ROOT, "target", "ab")
    builds = {rev: ab.build(rev, target) for rev in args.revs}
    log = os.path.join(target, "fleet.log")
    capped = Capped(args.redis_cpu, args.period_ms)
    redis = procs.Redis()
    failed = []
    try:
        capped.hold(redis.proc.pid)
        print(f"{WORKLOAD}: {args.servers} servers x {args.connections} connections a build, "
              f"Redis capped to {args.redis_cpu:g}% of a core (period {args.period_ms:g} ms)",
              file=sys.stderr)
        cells = {rev: [] for rev in builds}
        for round_ in range(1, args.rounds + 1):
            for rev in random.sample(list(builds), len(builds)):
                c = cell(builds[rev], redis, capped, args, workload, log)
                cells[rev].append(c)
                print(f"round {round_}: {rev:<12} {c['rps']:8.0f} decisions/s, Redis "
                      f"{c['cpu']:.2f} µs/decision, {c['batch']:.1f} decisions/call, "
                      f"non-2xx {c['bad']}, p99 {c['p99']:.1f} ms, Redis throttled in "
                      f"{c['throttled']:.0%} of periods, {c['keys']} keys, "
                      f"{c['no_ttl']} without a TTL", file=sys.stderr, flush=True)
                if c["bad"] or c["no_ttl"]:
                    failed.append(f"round {round_}: {rev}")
    finally:
        redis.stop()
        capped.remove()
    print(f"{WORKLOAD}, a fleet of {args.servers} servers x {args.connections} connections, "
          f"Redis at {args.redis_cpu:g}% of a core, {args.rounds} rounds of {args.seconds} s, "
          f"medians:")
    for rev, cs in cells.items():
        med = lambda k: statistics.median(c[k] for c in cs)  # noqa: E731
        print(f"  {rev:<12} {med('rps'):8.0f} decisions/s  Redis {med('cpu'):.2f} µs/decision  "
              f"{med('batch'):.1f} decisions/call  p99 {med('p99'):.1f} ms")
    if failed:
        print("cells with non-2xx answers or keys without a TTL: " + ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
