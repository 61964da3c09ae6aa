#!/usr/bin/env python3
"""Chaos run: Redis faults under a steady wrk load, for both store-error policies.

    python3 benches/chaos.py                 # the whole run, about 3 to 4 minutes
    python3 benches/chaos.py --check         # ... and exit 1 if a row shows a defect
    python3 benches/chaos.py --only pause --hold 2 --out /tmp/chaos   # one fault

Builds `examples/axum.rs` in release mode with the `cluster` feature, starts
its own redis-server (on a free port; append-only file on, so that a kill -9
and restart keeps every counter it acknowledged) and later its own Redis
Cluster (3 masters, 3 replicas, ports below 55535), and for each row starts
a fresh example server: `RATE_LIMIT=<limit>/1h`, `RATE_LIMIT_KEY=header:x-key`,
`RATE_LIMIT_DENY_CACHE=off` (every request reaches the store) and
`RATE_LIMIT_ON_ERROR=allow|deny`, over one multiplexed connection, a bb8
pool of 8 (`REDIS_POOL=8`, for the kill -9 fault) or a cluster connection.

A row: wrk (one connection per thread, `harness/chaos.lua`) cycles over
the row's own keys, far faster than the limit allows, so every key is spent
within the first second; after `--pre` seconds the fault is injected
(`harness/faults.py`), lifted `--hold` seconds later, and the row watches
`--post` seconds more. chaos.lua records every answer (time, latency,
status, whether it carries the `RateLimit` header, key), from which
`harness/verdict.py` computes the row: admissions over the limit (those
the store decided, and the fail-open ones), 503s, other 5xx, the largest
latency and the recovery. docs/reliability.md explains the columns.

Writes `<out>.md` (also printed) and `<out>.json`. Exits 0 when the run
completed, whatever the product did (the table reports it); 1 with
`--check` when a row shows a defect; 2 when the harness failed (a server did
not start, the load did not spend the keys before a fault, the deadline
passed). Every process it started is killed on the way out, also on
Ctrl-C, SIGTERM and the deadline.

Needs wrk, redis-server and redis-cli on PATH (apt-get install -y wrk
redis-server redis-tools) and cargo.
"""

import argparse
import datetime
import http.client
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import RESULTS, chaosreport, faults, procs, verdict, wrk  # noqa: E402
from harness.cluster import Cluster  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness", "chaos.lua")
HEADER = "x-key"
HARNESS_FAILED = 2


class Deadline(BaseException):
    """The run's overall deadline passed (BaseException: no handler of
    ordinary errors may swallow it)."""


class Stopped(BaseException):
    """SIGTERM or SIGHUP: stop, kill what was started, write what was done."""


def on_signal(signum, frame):
    raise Stopped(f"stopped by {signal.Signals(signum).name}")


class HarnessError(Exception):
    """The harness could not measure a row (not a finding about the product)."""


def arguments():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pre", type=float, default=3.0, help="seconds of load before the fault")
    ap.add_argument("--hold", type=float, default=3.0, help="seconds the fault lasts")
    ap.add_argument("--post", type=float, default=5.0, help="seconds watched after it")
    ap.add_argument("--limit", type=int, default=10, help="requests per key per hour")
    ap.add_argument("--keys", type=int, default=64, help="keys per row")
    ap.add_argument("--connections", type=int, default=16,
                    help="wrk connections, one per wrk thread")
    ap.add_argument("--deadline", type=float, default=420,
                    help="seconds the run (after the build) may take in all")
    ap.add_argument("--only", action="append", default=[], metavar="SUBSTRING",
                    help="only faults whose name contains this (repeatable)")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when a row shows a defect (see docs/reliability.md)")
    ap.add_argument("--no-build", action="store_true",
                    help="use target/release/examples/axum as it is")
    ap.add_argument("--out", default=os.path.join(RESULTS, "chaos"),
                    help="writes OUT.md and OUT.json (default: benches/results/chaos)")
    return ap.parse_args()


def rows(args):
    """(fault, connection, policy) of every row, in run order. The kill -9
    rows come first, while Redis's append-only file is small."""
    single = [faults.Kill9(), faults.Freeze(), faults.ClientPause(args.hold),
              faults.OutOfMemory(), faults.ScriptFlush()]
    out = []
    for fault in single:
        kinds = ["manager", "bb8 pool 8"] if isinstance(fault, faults.Kill9) else ["manager"]
        out += [(fault, kind, policy) for kind in kinds for policy in ("allow", "deny")]
    master = faults.MasterKill(promotion_timeout_s=args.hold + args.post + 10)
    out += [(master, "cluster", policy) for policy in ("allow", "deny")]
    if args.only:
        out = [r for r in out if any(s.lower() in r[0].name.lower() for s in args.only)]
    return out


def main():
    args = arguments()
    procs.require("wrk", "redis-server", "redis-cli", "cargo")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    plan = rows(args)
    if not plan:
        sys.exit("--only matched no fault")
    run = {
        "commit": procs.commit(ROOT),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": procs.machine(), "loadavg": procs.loadavg(), "command": "python3 " + " ".join(
            shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "settings": {"quota": f"{args.limit}/1h", "header": HEADER, "keys": args.keys,
                     "connections": args.connections, "pre_s": args.pre,
                     "hold_s": args.hold, "post_s": args.post,
                     "recovery_bound_s": verdict.RECOVERY_BOUND_S,
                     "latency_bound_ms": verdict.LATENCY_BOUND_MS},
        "faults": {f.name: f.about for f, _, _ in plan},
        "rows": [],
    }
    status = 0
    try:
        binary = build(args)
        signal.signal(signal.SIGALRM, on_deadline)
        signal.setitimer(signal.ITIMER_REAL, args.deadline)
        with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
            execute(args, plan, binary, tmp, run["rows"])
        signal.setitimer(signal.ITIMER_REAL, 0)
    except (Deadline, Stopped, KeyboardInterrupt, SystemExit, HarnessError) as e:
        signal.setitimer(signal.ITIMER_REAL, 0)
        why = {Deadline: f"the {args.deadline:g} s deadline passed",
               KeyboardInterrupt: "interrupted"}.get(type(e)) or str(e) or "exited"
        run["incomplete"] = f"{why}, after {len(run['rows'])} of {len(plan)} rows"
        print(f"chaos: {run['incomplete']}", file=sys.stderr)
        status = HARNESS_FAILED
    except Exception as e:  # noqa: BLE001 - a harness bug: report it, still write the rows
        traceback.print_exc()
        run["incomplete"] = f"harness error {e!r}, after {len(run['rows'])} of {len(plan)} rows"
        status = HARNESS_FAILED
    finally:
        reap()
    if run["rows"]:
        print(chaosreport.write(run, args.out))
        print(f"wrote {args.out}.md and {args.out}.json", file=sys.stderr)
    if status:
        return status
    if any(r.get("invalid") for r in run["rows"]):
        print("chaos: some rows could not be measured (see `invalid`)", file=sys.stderr)
        return HARNESS_FAILED
    if args.check and any(r["problems"] for r in run["rows"]):
        print("chaos: --check: some rows show defects", file=sys.stderr)
        return 1
    return 0


def on_deadline(signum, frame):
    raise Deadline()


def build(args):
    if args.no_build:
        return os.path.join(ROOT, "target", "release", "examples", "axum")
    return procs.build(ROOT, ["axum"], features=["cluster"])["axum"]


def execute(args, plan, binary, tmp, done):
    """Runs every row of `plan`, appending its record to `done`."""
    redis = cluster = None
    try:
        for i, (fault, kind, policy) in enumerate(plan):
            if kind == "cluster":
                if cluster is None:
                    print("chaos: forming the Redis Cluster", file=sys.stderr)
                    cluster = Cluster(masters=3, replicas=1, node_timeout_ms=1000)
                cluster.wait(30, "cluster_state:ok on every live node", cluster.ok)
                target, backend = cluster, {"REDIS_CLUSTER_URLS": cluster.urls()}
            else:
                if redis is None:
                    redis = procs.Redis("--appendonly", "yes", "--appendfsync", "no",
                                        "--auto-aof-rewrite-percentage", "0")
                if isinstance(fault, faults.Kill9):
                    compact(redis)
                target, backend = redis, {"REDIS_URL": redis.url}
                if kind.startswith("bb8 pool"):
                    backend["REDIS_POOL"] = kind.split()[-1]
            print(f"chaos: row {i + 1}/{len(plan)}: {fault.name}, {policy}, {kind}",
                  file=sys.stderr)
            row = measure(args, i, fault, kind, policy, target, backend, binary, tmp)
            done.append(row)
            print(f"chaos:   {chaosreport.cells(row)[3:]}", file=sys.stderr)
    finally:
        if cluster:
            cluster.stop()
        if redis:
            if redis.proc.poll() is None:
                os.kill(redis.proc.pid, signal.SIGCONT)
            redis.stop()
            shutil.rmtree(redis.dir, ignore_errors=True)


def measure(args, i, fault, kind, policy, target, backend, binary, tmp):
    """One row: a fresh server, the load, the fault, the tally."""
    prefix = f"r{i:02d}-"
    events = os.path.join(tmp, f"row-{i:02d}")
    os.mkdir(events)
    env = {"RATE_LIMIT": f"{args.limit}/1h", "RATE_LIMIT_KEY": f"header:{HEADER}",
           "RATE_LIMIT_DENY_CACHE": "off", "RATE_LIMIT_ON_ERROR": policy, **backend}
    record = {"fault": fault.name, "policy": policy, "connection": kind, "prefix": prefix}
    with procs.serving(binary, env, os.path.join(tmp, f"server-{i:02d}.log")) as (
            port, startup, _):
        probe(port, prefix, startup)
        load = wrk.spawn(f"http://127.0.0.1:{port}/", args.connections, args.connections,
                         round(args.pre + args.hold + args.post + 60), SCRIPT,
                         [HEADER, prefix, args.keys, events])
        try:
            t0 = time.monotonic()
            sleep_until(t0 + args.pre)
            recovery_keys = None
            if getattr(fault, "cluster", False):
                recovery_keys = held_keys(fault.choose(target).port, prefix)
            start = fault.inject(target)
            # A killed master stays dead: lift() at once watches the failover.
            sleep_until(start + (0 if getattr(fault, "cluster", False) else args.hold))
            end = fault.lift(target)
            sleep_until(end + args.post)
            load.send_signal(signal.SIGINT)
            out, _ = load.communicate(timeout=15)
        finally:
            if load.poll() is None:
                load.kill()
                load.wait()
    if load.returncode != 0:
        raise HarnessError(f"wrk exited with status {load.returncode}:\n{out}")
    summary = wrk.parse(out)
    records = verdict.read(events)
    if len(records) != summary["requests"]:
        raise HarnessError(f"chaos.lua recorded {len(records)} answers, wrk counted "
                           f"{summary['requests']}")
    times = {"start": start, "end": end,
             "from": start if getattr(fault, "cluster", False) else end}
    record.update(verdict.tally(records, args.limit, args.keys, policy, times,
                                recovery_keys))
    record.update({
        "startup": startup,
        "fault_at_s": start - t0, "fault_end_s": end - t0,
        "socket_errors": summary["socket_errors"], "wrk_max_latency_ms": summary["max"],
    })
    if getattr(fault, "cluster", False):
        record["killed_port"] = fault.node.port
        record["keys_on_killed_master"] = len(recovery_keys)
        record["promoted_after_ms"] = (None if fault.promoted is None
                                       else (fault.promoted - start) * 1000)
    return record


def probe(port, prefix, startup):
    """One request must be decided by the store (a 200 with the RateLimit
    header) before the load starts; retried for 5 s."""
    deadline = time.monotonic() + 5
    last = None
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/", headers={HEADER: prefix + "probe"})
            res = conn.getresponse()
            res.read()
            if res.status == 200 and res.getheader("ratelimit"):
                return
            last = f"{res.status}, RateLimit: {res.getheader('ratelimit')}"
        except OSError as e:
            last = str(e)
        finally:
            conn.close()
        time.sleep(0.1)
    raise HarnessError(f"the server ({startup}) never decided a probe request: {last}")


def held_keys(port, prefix):
    """The row's key indices whose counters the node on `port` holds."""
    out = faults.cli(port, "--scan", "--pattern", f"*{prefix}*")
    found = set()
    for name in out.split():
        digits = name.split(prefix, 1)[1]
        digits = digits[:len(digits) - len(digits.lstrip("0123456789"))]
        if digits:
            found.add(int(digits))
    return found


def compact(redis):
    """Rewrites the append-only file to the live keys, so that a restart
    loads it at once."""
    faults.cli(redis.port, "BGREWRITEAOF")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = faults.cli(redis.port, "INFO", "persistence")
        if "aof_rewrite_in_progress:0" in info and "aof_rewrite_scheduled:0" in info:
            return
        time.sleep(0.05)
    raise HarnessError("BGREWRITEAOF did not finish within 30 s")


def sleep_until(t):
    time.sleep(max(0.0, t - time.monotonic()))


def reap():
    """SIGKILLs every process this run started that is still there (its
    descendants, found through /proc), e.g. after Ctrl-C or the deadline."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    todo, found = [os.getpid()], []
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    sys.exit(main())
