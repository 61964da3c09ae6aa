#!/usr/bin/env python3
"""A/B of the memory store (or, with --redis, the Redis store) across
commits: examples/axum.rs built at each git revision given, and plain axum
(RATE_LIMIT=off, built at the last revision), run in one session. Every
round runs the plain cell first (the round's baseline, which its ratios are
taken against), then the others interleaved in a shuffled order.

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
(REDIS_URL, the ConnectionManager), and its CPU per request is printed too;
the run FLUSHALLs it before each cell that uses it, so that every cell
starts from no keys (and a denied workload's warm-up probe finds its key
unspent). The limited cells run with RATE_LIMIT_ON_ERROR=deny: a store error
is a 503, not a fail-open 200 counted as throughput, and a cell round with
any non-2xx answer where all should be 2xx prints a warning.
With --floor (and --redis), each round also runs benches/peers'
redis-floor (axum and one PING per request, no limiter) on that Redis, and
the summary sets each build's server CPU over plain beside the floor's: the
issue-19 target "server CPU per request over plain <= the floor's" in real
CPU time, kernel and scheduling included, which callgrind's instruction
counts (server-cost.sh) leave out. Every cell also prints the server's
context switches per request (every thread's, voluntary or not, from /proc)
and how much of its CPU time was the kernel's (system time, from /proc).
With --headers-floor, each round also runs benches/peers' headers-floor
(axum whose handler reads the key and writes the draft's `RateLimit` and
`RateLimit-Policy`, with the workload's quota, and limits nothing): what
any limiter that keeps our documented headers pays at least, the floor of
the issue-19 target "memory store >= 0.95x". It needs a workload whose
requests are all allowed (it never answers 429), and its CPU over plain is
printed beside each build's.
With --batch-floor [raw-|each-]WORK:IN_FLIGHT:FILL[+][:MAX] (and --redis; repeatable),
each round also runs benches/peers' redis-batch-floor with that policy:
axum whose requests wait for one batched Redis call (WORK `incr`: one
pipelined INCR per request; `ping`: one PING per call), at most IN_FLIGHT
calls out at once, a call beyond the first only once FILL requests wait
(with `+`, the first too, or once its oldest request has waited 1 ms;
at most MAX a call, default 256); `raw-` sends them on plain sockets
with RESP made by hand instead of through redis-rs, `each-` through one
redis-rs connection per call in flight instead of one shared. Nothing is limited and
no header is written: it bounds what any limiter that asks Redis before
each admission reaches with that policy, and a sweep of policies bounds
batched designs. With --redis, every cell also prints Redis's entry-point
calls per request (`INFO commandstats`: scripts, or else PING, or else
the top command), whose inverse is the mean batch.
With --syscalls, it prints too the server's syscalls per request, and of
them the `epoll_wait` and `futex` calls by which its Tokio workers sleep and
wake each other (`perf stat` on kernel tracepoints, during the measured run).
With --keys N, a workload that cycles keys (`allowed, 100k keys`) cycles N
keys instead: what the memory store's tables cost by their size.
With --algorithm sliding-window or gcra, every limited cell runs that
algorithm (RATE_LIMIT_ALGORITHM; GCRA with RATE_LIMIT_BURST=1000) instead
of the fixed window: what the sliding window's and GCRA's scripts cost a
whole server.
With --rtt MS (and --redis), every server reaches Redis through a proxy
that delays each chunk by half of MS each way (harness/delay.py): Redis as
if across a network, where loopback's round trip of microseconds hides
what a client's waits for acknowledgements (Nagle's algorithm) cost. Redis's
CPU is still read off redis-server; the proxy's own CPU is the machine's
and shows in no cell.
With --unix (and --redis), Redis listens on a Unix socket too, and every
cell on Redis (but `raw-` batch floors, which speak TCP) runs a second time
in each round over it (REDIS_URL=unix://..., the cell's name + " unix"):
what TCP loopback costs the Redis path, both sides, where Redis runs
beside the server.

Needs git, cargo, wrk (apt-get install -y wrk) and python3; redis-server
for --redis; for --floor, the peers built (cargo build --release in
benches/peers); for --syscalls, perf (apt-get install -y linux-perf) with
access to tracepoints (root).

    python3 benches/ab.py HEAD --redis --floor --syscalls --rounds 3
    python3 benches/ab.py HEAD --headers-floor --workload 100k --rounds 10
    python3 benches/ab.py HEAD --headers-floor --keys 50000 --rounds 10
    python3 benches/ab.py 92070f6 HEAD --redis --floor --rtt 1 --rounds 6
    python3 benches/ab.py 0e36529 HEAD --redis --algorithm gcra --rounds 6
    python3 benches/ab.py HEAD --redis --floor --batch-floor incr:2:1 --batch-floor raw-incr:1:8+
"""

import argparse
import contextlib
import dataclasses
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile

from harness import catalog, procs, redisstats, wrk
from harness.delay import DelayProxy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(rev, target):
    """examples/axum at `rev`; returns the binary's path."""
    src = tempfile.mkdtemp(prefix=f"ab-{rev}-")
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True,
                             capture_output=True).stdout
    # -m: every file gets the extraction's time, not the commit's. Cargo
    # takes a source older than the last build in target/ab for unchanged,
    # so with the commit's times a revision built after a newer one (with
    # the same Cargo.lock) came out as that one's binary, unrebuilt.
    subprocess.run(["tar", "-x", "-m", "-C", src], input=archive, check=True)
    env = dict(os.environ, CARGO_TARGET_DIR=target)
    try:
        subprocess.run(["cargo", "build", "--release", "--example", "axum"], cwd=src,
                       env=env, check=True)
    finally:
        shutil.rmtree(src)
    binary = os.path.join(target, f"axum-{rev}")
    os.replace(os.path.join(target, "release", "examples", "axum"), binary)
    return binary


PEERS = os.path.join(ROOT, "benches", "peers", "target", "release")
FLOOR = os.path.join(PEERS, "redis-floor")
HEADERS_FLOOR = os.path.join(PEERS, "headers-floor")
BATCH_FLOOR = os.path.join(PEERS, "redis-batch-floor")
@dataclasses.dataclass
class Route:
    """Where a cell's server finds Redis (`url`) and whose CPU is Redis's
    (`proc`): the proxy of --rtt in front of the run's redis-server."""
    url: str
    proc: subprocess.Popen


# A cell's `limited`: the workload's quota and key, and the warm-up's probe
# expects the limiter's answers; or FLOOR_OF_HEADERS: the quota and key, but
# the probe expects what an unlimited server answers (the headers floor).
FLOOR_OF_HEADERS = "headers"


def cell(binary, workload, limited, seconds, log, redis=None, syscalls=False, algorithm=None,
         extra=None):
    """One server under the workload: req/s, and per request the server's
    CPU µs, Redis's CPU µs (given `redis`), the server's context switches,
    its system CPU µs, (with `syscalls`) its syscalls, `epoll_wait`s and
    `futex`es (else None for each), Redis's entry-point calls (or None), and
    last the measured run's non-2xx answers and request count."""
    env = {"RATE_LIMIT": workload.quota if limited else "off",
           "RATE_LIMIT_KEY": workload.key}
    if limited is True:
        # A store error is then a 503, which the caller warns of, rather
        # than a 200 without a decision (the examples' default, allow).
        env["RATE_LIMIT_ON_ERROR"] = "deny"
    if limited is True and algorithm:
        env["RATE_LIMIT_ALGORITHM"] = algorithm
        if algorithm == "gcra":
            env["RATE_LIMIT_BURST"] = "1000"
    if redis:
        env["REDIS_URL"] = redis.url
    env.update(extra or {})
    with procs.serving(binary, env, log) as (port, _, pid):
        problem = procs.prepare(port, workload, limited is True)
        if problem:
            sys.exit(f"ab.py: {os.path.basename(binary)}: {problem}")
        url = f"http://127.0.0.1:{port}/"
        wrk.run(url, 1, 32, script=workload.script)
        counting = procs.syscall_counts(pid) if syscalls else contextlib.nullcontext({})
        with counting as counts:
            (user, system), switches = procs.cpu_split(pid), procs.context_switches(pid)
            redis_before = procs.cpu_seconds(redis.proc.pid) if redis else 0.0
            stats = isinstance(redis, procs.Redis)
            if stats:
                redisstats.reset(redis)
            result = wrk.run(url, seconds, 32, script=workload.script)
            user2, system2 = procs.cpu_split(pid)
            switches = procs.context_switches(pid) - switches
            redis_cpu = procs.cpu_seconds(redis.proc.pid) - redis_before if redis else 0.0
            commands = redisstats.collect(redis, 0.0)["commands"] if stats else {}
    errors = procs.store_errors_logged(log) if limited is True else 0
    if errors:
        # 503s (RATE_LIMIT_ON_ERROR=deny), which wrk counts with any 429s.
        print(f"ab.py: {os.path.basename(binary)}: WARNING: {errors} store error line(s) in "
              f"{log}: this cell's figures are not the limiter's", file=sys.stderr)
    n = result["requests"]
    per = 1e6 / n
    cpu, system = (user2 - user + system2 - system) * per, (system2 - system) * per
    calls = [counts[k] / n if counts else None for k in ("syscalls", "epoll_wait", "futex")]
    return result["rps"], cpu, redis_cpu * per, switches / n, system, *calls, \
        entry_calls(commands) / n if commands else None, result["non2xx"], n


def warn_non2xx(rnd, name, got, workload, limited):
    """A loud line for a cell round with non-2xx answers where every answer
    should be 2xx: an all-allowed workload, or a server that limits nothing.
    Its req/s then measured errors (a 503 is a store error), not the path."""
    non2xx, n = got[-2:]
    if non2xx and (not workload.denied or limited is not True):
        print(f"round {rnd}: {name}: WARNING: {non2xx} of {n} answers not 2xx where all "
              "should be (a 503 is a store error): this cell's figures are not the "
              "limiter's", file=sys.stderr)


def entry_calls(commands):
    """Redis's entry-point calls: scripts if any ran, else PINGs if any, else
    the most frequent command (a pipeline's commands count one each)."""
    for names in (redisstats.SCRIPTS, {"ping"}):
        calls = sum(f["calls"] for name, f in commands.items() if name in names)
        if calls:
            return calls
    return max((f["calls"] for f in commands.values()), default=0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("revs", nargs="+", help="git revisions to compare")
    p.add_argument("--workload", default="100k", help="substring of a load.py workload name")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--redis", action="store_true",
                   help="the limited cells on a redis-server of the run's own")
    p.add_argument("--floor", action="store_true",
                   help="with --redis: a cell of the PING floor every round")
    p.add_argument("--headers-floor", action="store_true",
                   help="a cell of the headers floor every round (an all-allowed workload)")
    p.add_argument("--batch-floor", action="append", default=[], metavar="SPEC",
                   help="with --redis: a cell of the batch floor every round, "
                        "[raw-|each-]WORK:IN_FLIGHT:FILL[+][:MAX] (incr:2:1); repeatable")
    p.add_argument("--syscalls", action="store_true",
                   help="count the server's syscalls with perf stat")
    p.add_argument("--keys", type=int, metavar="N",
                   help="a cycling workload's number of keys, in its stead")
    p.add_argument("--algorithm", choices=["fixed-window", "sliding-window", "gcra"],
                   help="the limited cells' algorithm (RATE_LIMIT_ALGORITHM)")
    p.add_argument("--rtt", type=float, metavar="MS",
                   help="with --redis: Redis behind a proxy that adds this round trip")
    p.add_argument("--reserve", type=int, metavar="N",
                   help="with --redis: the limited cells reserve N units of a key at a time "
                        "(RATE_LIMIT_RESERVE)")
    p.add_argument("--unix", action="store_true",
                   help="with --redis: each Redis cell also over a Unix socket, beside TCP")
    args = p.parse_args()
    procs.require("git", "cargo", "wrk", *(["redis-server"] if args.redis else []),
                  *(["perf"] if args.syscalls else []))
    if args.floor and not (args.redis and os.access(FLOOR, os.X_OK)):
        sys.exit(f"ab.py: --floor needs --redis and {FLOOR} "
                 "(cargo build --release in benches/peers)")
    batch_floors = {}
    for spec in args.batch_floor:
        parts = spec.split(":")
        client, work = "redis-rs", parts[0]
        for prefix, name in (("raw-", "raw"), ("each-", "redis-rs-each")):
            if work.startswith(prefix):
                client, work = name, work.removeprefix(prefix)
        if (not args.redis or not os.access(BATCH_FLOOR, os.X_OK) or len(parts) not in (3, 4)
                or work not in ("incr", "ping")
                or not all(p.isdigit() and int(p) >= 1
                           for p in [parts[1], parts[2].removesuffix("+"), *parts[3:]])):
            sys.exit(f"ab.py: --batch-floor {spec!r} needs --redis, {BATCH_FLOOR} (cargo "
                     "build --release in benches/peers) and [raw-|each-]WORK:IN_FLIGHT:FILL[+][:MAX], "
                     "WORK incr or ping, the rest whole numbers >= 1")
        env = {"FLOOR_WORK": work, "FLOOR_IN_FLIGHT": parts[1],
               "FLOOR_FILL": parts[2].removesuffix("+"),
               "FLOOR_FILL_FIRST": "on" if parts[2].endswith("+") else "off",
               "FLOOR_CLIENT": client}
        if len(parts) == 4:
            env["FLOOR_MAX_BATCH"] = parts[3]
        batch_floors[f"bf {spec}"] = env
    if args.unix and (not args.redis or args.rtt is not None):
        sys.exit("ab.py: --unix needs --redis, and no --rtt (its proxy is a TCP hop)")
    if args.reserve is not None and not (args.redis and args.reserve >= 1):
        sys.exit("ab.py: --reserve needs --redis and a count >= 1")
    if args.rtt is not None and not args.redis:
        sys.exit("ab.py: --rtt needs --redis (it delays the way to Redis)")
    if args.rtt is not None and not args.rtt > 0:
        sys.exit(f"ab.py: --rtt needs a round trip above 0 ms, not {args.rtt:g}")
    if args.headers_floor and not os.access(HEADERS_FLOOR, os.X_OK):
        sys.exit(f"ab.py: --headers-floor needs {HEADERS_FLOOR} "
                 "(cargo build --release in benches/peers)")
    workload = next(w for w in catalog.WORKLOADS if args.workload in w.name)
    if args.keys is not None:
        if args.keys < 1:
            sys.exit(f"ab.py: --keys needs a count >= 1, not {args.keys}")
        if not workload.script or workload.script[0] != "cycle":
            sys.exit(f"ab.py: --keys needs a workload that cycles keys; "
                     f"{workload.name!r} does not")
        name = f"allowed, {args.keys} key{'s' if args.keys > 1 else ''}, cycled"
        workload = dataclasses.replace(workload, name=name,
                                       script=("cycle", args.keys))
    if args.headers_floor and workload.spend:
        sys.exit(f"ab.py: --headers-floor needs a workload whose requests are all allowed; "
                 f"{workload.name!r} spends its keys first (the floor never answers 429)")
    target = os.path.join(ROOT, "target", "ab")
    builds = {rev: build(rev, target) for rev in args.revs}
    log = os.path.join(target, "server.log")
    redis = procs.Redis(unix=args.unix) if args.redis else None
    proxy = DelayProxy(redis.port, args.rtt) if args.rtt else None
    if proxy:
        print(f"Redis behind a proxy adding {args.rtt:g} ms: a PING through it takes "
              f"{proxy.measured_rtt():.2f} ms (median of 50)", file=sys.stderr)
    # What the servers connect to: Redis, or the proxy in front of it.
    route = Route(proxy.url, redis.proc) if proxy else redis
    plain, floor, headers_floor = "plain axum", "floor", "headers floor"
    # Per round: (binary, limited, with Redis), in a shuffled order.
    reserve = {"RATE_LIMIT_RESERVE": str(args.reserve)} if args.reserve else None
    cells = {rev: (binary, True, route, reserve) for rev, binary in builds.items()}
    if args.floor:
        cells[floor] = (FLOOR, False, route, None)
    for name, env in batch_floors.items():
        cells[name] = (BATCH_FLOOR, False, route, env)
    if args.unix:
        # The same cells over the socket; raw- batch floors speak TCP only.
        unix = redis.over_unix()
        cells.update({f"{name} unix": (binary, limited, unix, extra)
                      for name, (binary, limited, _, extra) in list(cells.items())
                      if (extra or {}).get("FLOOR_CLIENT") != "raw"})
    if args.headers_floor:
        cells[headers_floor] = (HEADERS_FLOOR, FLOOR_OF_HEADERS, None, None)
    rows = {name: [] for name in [plain, *cells]}
    try:
        for r in range(args.rounds):
            base = cell(builds[args.revs[-1]], workload, False, args.seconds, log,
                        syscalls=args.syscalls)
            warn_non2xx(r + 1, plain, base, workload, False)
            rows[plain].append((base[0], 1.0, *base[1:]))
            for name in random.sample(list(cells), len(cells)):
                binary, limited, with_redis, extra = cells[name]
                if with_redis:
                    # No keys from an earlier cell: a spent key would fail a
                    # denied workload's probe, a key left without a TTL (the
                    # incr batch floor's) would shape the next cell's costs,
                    # and every cell pays for creating its own keys.
                    redis.cli("FLUSHALL")
                got = cell(binary, workload, limited, args.seconds, log, with_redis,
                           args.syscalls, args.algorithm, extra)
                warn_non2xx(r + 1, name, got, workload, limited)
                rps, cpu, redis_cpu, switches = got[:4]
                rows[name].append((rps, rps / base[0], *got[1:]))
                print(f"round {r + 1}: {name:12s} {rps:9.0f} req/s, {rps / base[0]:.2f}x, "
                      f"server {cpu:.2f} µs/req (plain {base[1]:.2f}), Redis {redis_cpu:.2f} "
                      f"µs/req, {switches:.2f} context switches/req", file=sys.stderr)
    finally:
        if proxy:
            proxy.stop()
        if redis:
            redis.stop()
    rtt = f" behind {args.rtt:g} ms" if proxy else ""
    algorithm = f", {args.algorithm}" if args.algorithm else ""
    print(f"{workload.name}{', Redis' if redis else ''}{algorithm}{rtt}, {args.rounds} rounds of "
          f"{args.seconds} s, medians:")
    medians = {}
    for name, rounds in rows.items():
        medians[name] = [statistics.median(c[i] for c in rounds) for i in range(6)]
        rps, ratio, cpu, redis_cpu, switches, system = medians[name]
        more = f", Redis {redis_cpu:.2f} µs/req" if redis and name != plain else ""
        entries = [c[9] for c in rounds if c[9] is not None]
        if entries:
            more += f" in {statistics.median(entries):.3f} calls/req"
        print(f"  {name:12s} {rps:9.0f} req/s  {ratio:.2f}x  server {cpu:.2f} µs/req "
              f"({system:.2f} system){more}, {switches:.2f} context switches/req")
        if args.syscalls:
            calls, epoll, futex = (statistics.median(c[i] for c in rounds) for i in (6, 7, 8))
            print(f"  {'':12s} {calls:.2f} syscalls/req: {epoll:.3f} epoll_wait, "
                  f"{futex:.3f} futex")
    if args.floor or args.headers_floor or batch_floors:
        # Each round's cell minus that round's plain cell, then the median.
        print("server CPU per request over plain (median of the rounds' differences):")
        for name in cells:
            over = statistics.median(c[2] - b[2] for c, b in zip(rows[name], rows[plain]))
            print(f"  {name:12s} {over:+.2f} µs/req")


if __name__ == "__main__":
    main()
