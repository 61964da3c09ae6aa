#!/usr/bin/env python3
"""Load benchmark: our limiter and its peers under wrk, side by side in one run.

    python3 benches/load.py                      # the full run: 5 rounds of 5 s
    python3 benches/load.py --rounds 1 --seconds 2 --only redis --out /tmp/smoke
    python3 benches/load.py --from-json benches/results/latest.json   # redraw only

Starts its own redis-server on a free port, builds `examples/axum.rs` and the
peer servers of `benches/peers/` in release mode, and for each round runs
every (server, workload) cell once: the workloads in a shuffled order, and
for each, every server back to back in a shuffled order, so that the
machine's drift hits all alike and each ratio compares cells close in time.
A cell: FLUSHALL, start the server (ours with RATE_LIMIT_ON_ERROR=deny, so
that a store error is a 503, not a fail-open 200),
spend the workload's keys and check it answers as designed, a wrk warm-up,
CONFIG RESETSTAT, the measured wrk run (`GET /`), INFO commandstats and cpu,
the paced run, stop the server, then the exactness checks
(`harness/exactness.py`: admitted answers within the workload's bound, no
Redis key without a TTL, no counter over the limit). The servers and
workloads are in `harness/catalog.py`; BENCHMARKS.md explains them.

The measured run is closed-loop at saturation: every connection sends its
next request as soon as it has the answer, so a slower server is measured
at a lower req/s (the same concurrency, not the same load). The paced run,
for `--paced-seconds`, sends the same requests but offers every server the
same rate, well below saturation: `--paced-rate`, 2000 req/s in all by
default, which with 32 connections means each waits 16 ms after each answer
(keys.lua's DELAY). The p99 target is judged on its latency, at the same
load. It records the rate offered and achieved, and marks a run whose
achieved req/s is more than 10% off the offered (`wrk.TOLERANCE`).

Writes `<out>.md` (also printed), `<out>.json` (raw cells, from which
`--from-json` redraws both) and the chart (`--chart`, with matplotlib).
Exits with status 1, after writing them, when an exactness check failed.

Needs wrk and redis-server on PATH (apt-get install -y wrk redis-server),
cargo, and for the chart matplotlib (pip install matplotlib).
"""

import argparse
import datetime
import math
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness.cluster import Cluster  # noqa: E402
from harness import (RESULTS, catalog, chart, exactness, markdown, procs,  # noqa: E402
                     redisstats, report, wrk)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def arguments():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5, help="measured seconds per cell")
    ap.add_argument("--warmup", type=int, default=1, help="wrk warm-up seconds per cell")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="wrk threads")
    ap.add_argument("--only", action="append", default=[], metavar="SUBSTRING",
                    help="only servers whose name contains this (repeatable; the "
                         "no-limiter baseline always runs)")
    ap.add_argument("--workload", action="append", default=[], metavar="SUBSTRING",
                    help="only workloads whose name contains this (repeatable)")
    ap.add_argument("--paced-rate", type=float, default=2000, metavar="R",
                    help="req/s offered in all by each cell's paced run, the same for "
                         "every server: each connection waits round(connections * 1000 "
                         "/ R) ms between answer and next request (default 2000; 0: no "
                         "paced run)")
    ap.add_argument("--paced-seconds", type=int, default=None,
                    help="seconds of each paced run (default: --seconds)")
    ap.add_argument("--paired", action="store_true",
                    help="run the baseline again right before every server's cell and "
                         "take each ratio against that cell (twice the cells, for a VM "
                         "whose speed drifts within minutes)")
    ap.add_argument("--out", default=None,
                    help="writes OUT.md and OUT.json (default: benches/results/latest, or with "
                         "--from-json the JSON's path without .json)")
    ap.add_argument("--chart", default=None,
                    help="chart image (default: docs/benchmarks.png, or OUT.png "
                         "when --out is given)")
    ap.add_argument("--from-json", metavar="PATH",
                    help="redraw the report and chart from a JSON file; run nothing")
    args = ap.parse_args()
    if args.paced_seconds is None:
        args.paced_seconds = args.seconds
    # wrk's delay() is in whole ms, per connection.
    args.paced_delay = (round(args.connections * 1000 / args.paced_rate)
                        if args.paced_rate > 0 else 0)
    if args.paced_rate > 0 and args.paced_delay < 1:
        ap.error(f"--paced-rate {args.paced_rate:g} is more than {args.connections} "
                 "connections can offer with a 1 ms delay")
    default_out = os.path.join(RESULTS, "latest")
    if args.out is None:
        args.out = (os.path.splitext(args.from_json)[0] if args.from_json else default_out)
    if args.chart is None:
        args.chart = (os.path.join(ROOT, "docs", "benchmarks.png")
                      if os.path.abspath(args.out) == default_out else args.out + ".png")
    return args


def pick(items, substrings, keep=lambda _: False):
    subs = [s.lower() for s in substrings]
    return [i for i in items
            if keep(i) or not subs or any(s in i.name.lower() for s in subs)]


def meta(args):
    def output(cmd):
        return procs.output(cmd, ROOT)

    return {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "commit": procs.commit(ROOT),
        "machine": procs.machine(),
        "rustc": output(["rustc", "--version"]),
        "redis": output(["redis-server", "--version"]),
        "wrk": output(["wrk", "--version"]).splitlines()[0] if output(["wrk", "--version"]) else "?",
        "rounds": args.rounds, "seconds": args.seconds, "warmup": args.warmup,
        "paired": args.paired,
        # The paced runs: the rate asked for, the delay configured.
        "paced_rate": args.paced_rate, "paced_seconds": args.paced_seconds,
        "paced_delay_ms": args.paced_delay,
        # What the whole-ms delay offers: may differ a little from paced_rate.
        "paced_offered_rps": (wrk.offered(args.connections, args.paced_delay)
                              if args.paced_delay else None),
        "connections": args.connections, "threads": args.threads,
        "loadavg_start": os.getloadavg()[0],
    }


def cell(redis, binary, server, workload, args, logdir, rnd, cluster=None):
    """Runs one (server, workload) cell; returns its raw record. A cluster
    server's Redis figures and checks are its masters', added up."""
    if server.cluster:
        redis = [n for n in cluster.live]
    for node in redisstats.nodes(redis):
        node.cli("FLUSHALL")
    env = dict(server.env)
    env.setdefault("RATE_LIMIT", workload.quota)
    env["RATE_LIMIT_KEY"] = workload.key
    if server.binary in catalog.EXAMPLES and server.limits:
        # The examples fail open by default: a store error would be a 200
        # without a decision, counted as throughput. Denied, it is a 503,
        # not 2xx, which the report flags. (RATE_LIMIT=off refuses it.)
        env.setdefault("RATE_LIMIT_ON_ERROR", "deny")
    if server.cluster:
        env["REDIS_CLUSTER_URLS"] = cluster.urls()
    elif server.redis:
        env["REDIS_URL"] = redis.url
    log = os.path.join(logdir, f"r{rnd}-{server.name}-{workload.name}.log".replace(" ", "_"))
    with procs.serving(binary, env, log) as (port, startup, pid):
        problem = procs.prepare(port, workload, server.limits)
        if problem:
            sys.exit(f"{server.name} / {workload.name}: {problem}; server log {log}:\n"
                     f"{procs.read_tail(log)}")
        url = f"http://127.0.0.1:{port}/"
        warmup = server.warmup if server.warmup is not None else args.warmup
        if warmup:
            warm = wrk.run(url, warmup, args.connections, args.threads, workload.script)
            # A server's own warm-up is meant to see every key of a cycling
            # workload once: on a machine too slow to, it runs again from
            # the first key, long enough at the rate just seen.
            cycling = workload.script and workload.script[0] == "cycle"
            keys = workload.script[1] if cycling else 0
            if server.warmup is not None and warm["requests"] < keys:
                longer = math.ceil(warmup * 1.25 * keys / max(warm["requests"], 1))
                wrk.run(url, longer, args.connections, args.threads, workload.script)
        cpu = redisstats.reset(redis)
        server_cpu = procs.cpu_seconds(pid)
        result = wrk.run(url, args.seconds, args.connections, args.threads, workload.script)
        result["server_cpu_s"] = procs.cpu_seconds(pid) - server_cpu
        result["redis"] = redisstats.collect(redis, cpu) if server.redis else None
        if args.paced_delay:
            result["paced"] = wrk.paced(url, args.paced_seconds, args.connections,
                                        args.threads, workload.script, args.paced_delay)
    # After the measured and paced runs, outside the timed part. The paced
    # run breaks none of the checks, so they follow it and cover what it did
    # in Redis too: the measured run's admitted bound is computed from that
    # run's own counts, which the paced run does not touch (its admitted
    # answers are held to a bound of their own, from its own counts); every
    # key it writes gets a TTL like any other; and no counter passes the
    # limit, since `denied`'s key and `mixed`'s k0..k999 stay spent (denied)
    # and `mixed`'s fresh keys carry the paced run's own nonce (each admitted
    # once).
    result["exactness"] = exactness.check(redis, server, workload, result, args.threads)
    # A store error is a 503 (RATE_LIMIT_ON_ERROR=deny above), which wrk
    # does not tell from a 429: the log does (report.py fails the cell).
    ours = server.binary in catalog.EXAMPLES and server.limits
    result["store_errors_logged"] = procs.store_errors_logged(log) if ours else 0
    return {"round": rnd, "server": server.name, "workload": workload.name,
            "startup": startup,
            "env": {k: v for k, v in env.items() if k not in ("REDIS_URL", "REDIS_CLUSTER_URLS")},
            **result}


def order(servers, workloads, paired, rnd):
    """One round's cells, as (server, workload, pair): the workloads in a
    shuffled order and, within each, every server back to back in a shuffled
    order, so each ratio compares cells a minute or two apart rather than a
    whole round apart. With `paired`, each server's cell directly follows a
    baseline cell of its own, seconds apart; `pair` names the baseline cell a
    ratio is taken against (report.summarize)."""
    base = next(s for s in servers if s.baseline)
    for w in random.sample(workloads, len(workloads)):
        runs = [s for s in servers if w.name not in s.skip]
        shuffled = random.sample(runs, len(runs))
        if not paired:
            for s in shuffled:
                yield s, w, f"{rnd}"
            continue
        for k, s in enumerate(x for x in shuffled if not x.baseline):
            yield base, w, f"{rnd}.{k}"
            yield s, w, f"{rnd}.{k}"


def measure(args, servers, workloads):
    procs.require("wrk", "redis-server", "redis-cli", "cargo")
    clustered = any(s.cluster for s in servers)
    binaries = procs.build(ROOT, {s.binary for s in servers},
                           features=("cluster",) if clustered else ())
    info = meta(args)
    if info["loadavg_start"] > 0.5:
        print(f"warning: load average {info['loadavg_start']:.2f}: the machine is not idle, "
              "so the figures will be noisy", file=sys.stderr)
    redis = procs.Redis()
    logdir = os.path.join(redis.dir, "servers")
    os.makedirs(logdir)
    cells = []
    # Three masters, no replicas: the cluster servers' Redis.
    cluster = Cluster(masters=3, replicas=0) if clustered else None
    try:
        for rnd in range(1, args.rounds + 1):
            for server, workload, pair in order(servers, workloads, args.paired, rnd):
                c = cell(redis, binaries[server.binary], server, workload, args, logdir, rnd,
                         cluster)
                c["pair"] = pair
                cells.append(c)
                print(f"round {rnd}: {server.name:38} {workload.name:20} {c['rps']:>9.0f} req/s "
                      f"p50 {c['p50']:.2f} p99 {c['p99']:.2f} ms, "
                      f"{c['non2xx'] / max(c['requests'], 1):.0%} not 2xx", file=sys.stderr)
                if "paced" in c:
                    p = c["paced"]
                    print(f"  paced: {p['rps']:.0f} of {p['offered_rps']:.0f} req/s offered, "
                          f"p50 {p['p50']:.2f} p99 {p['p99']:.2f} ms"
                          + ("" if p["rate_ok"] else
                             f": more than {wrk.TOLERANCE:.0%} off the offered rate"),
                          file=sys.stderr)
                if c["store_errors_logged"]:
                    print(f"  WARNING: {c['store_errors_logged']} store error line(s) in the "
                          "server's log: some not-2xx answers were 503s", file=sys.stderr)
                if c["exactness"] and not c["exactness"]["ok"]:
                    print("  exactness: " + "; ".join(c["exactness"]["problems"]),
                          file=sys.stderr)
    finally:
        redis.stop()
        if cluster:
            cluster.stop()
    info["loadavg_end"] = os.getloadavg()[0]
    info["server_logs"] = logdir
    return info, cells


def main():
    args = arguments()
    if args.from_json:
        info, servers, workloads, cells = report.load(args.from_json)
    else:
        servers = pick(catalog.SERVERS, args.only, keep=lambda s: s.baseline)
        workloads = pick(catalog.WORKLOADS, args.workload)
        if not workloads:
            sys.exit("--workload matched no workload: " +
                     ", ".join(w.name for w in catalog.WORKLOADS))
        info, cells = measure(args, servers, workloads)
    rows = report.summarize(cells, servers, workloads)
    text = markdown.render(rows, info, workloads, cells)
    print(text)
    with open(args.out + ".md", "w") as f:
        f.write(text)
    if not args.from_json:
        report.dump(args.out + ".json", info, servers, workloads, cells, rows)
    title = (f"{info['date']}, {info['commit']}: wrk -c{info['connections']}, "
             f"{info['rounds']} x {info['seconds']} s"
             + (f", paced at {info['paced_offered_rps']:.0f} req/s"
                if info.get("paced_offered_rps") else "") + f"; {info['machine']}")
    if chart.render(rows, args.chart, title):
        print(f"chart: {args.chart}", file=sys.stderr)
    print(f"report: {args.out}.md" + ("" if args.from_json else f", raw: {args.out}.json"),
          file=sys.stderr)
    failed = exactness.failures(cells)
    if failed:
        print(f"exactness under load: {len(failed)} cell(s) failed:", file=sys.stderr)
        for c in failed:
            print(f"  round {c['round']}: {c['server']} / {c['workload']}: "
                  + "; ".join(c["exactness"]["problems"]), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
