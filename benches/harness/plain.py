"""C_plain: the whole machine's CPU time per request of plain axum
(`examples/axum.rs`, RATE_LIMIT=off) under wrk, server and wrk together."""

import http.client
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from . import KEYS, ROOT
from .bound import medians
from .procs import (cpu_seconds, free_port, inherited_env, machine_busy_seconds,
                    rusage_seconds, terminate, wait_port)

KEYS_LUA = os.path.join(ROOT, "benches", "harness", "keys.lua")


def build_axum(no_build):
    binary = os.path.join(ROOT, "target", "release", "examples", "axum")
    if not no_build:
        print("$ cargo build --release --example axum", file=sys.stderr)
        done = subprocess.run(["cargo", "build", "--release", "--example", "axum"], cwd=ROOT)
        if done.returncode != 0:
            if not os.path.exists(binary):
                sys.exit("cargo build --release --example axum failed and there is no binary")
            print("warning: the build failed; using the existing "
                  "target/release/examples/axum", file=sys.stderr)
    if not os.path.exists(binary):
        sys.exit(f"{binary} not found: cargo build --release --example axum")
    return binary


def wrk(url, seconds, connections):
    """One wrk run over the KEYS x-api-keys (keys.lua); the requests it counted."""
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", KEYS_LUA, url,
           "--", "cycle", str(KEYS), "x"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    m = re.search(r"(\d+) requests in ", out)
    if not m:
        sys.exit(f"wrk's report has no request count:\n{out}")
    problems = re.findall(r"(Non-2xx or 3xx responses: \d+|Socket errors: .*)", out)
    if problems:
        sys.exit(f"wrk: {'; '.join(problems)}:\n{out}")
    return int(m.group(1))


def check_answers(port):
    """One request: plain axum must answer 200."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/", headers={"x-api-key": "k0"})
    res = conn.getresponse()
    body = res.read()
    conn.close()
    if res.status != 200:
        sys.exit(f"plain axum answered {res.status} {body!r}, not 200")


def run(proc, url, args):
    """One measured wrk run after its warm-up: CPU per request."""
    if args.warmup:
        wrk(url, args.warmup, args.wrk_connections)
    server0, machine0 = cpu_seconds(proc.pid), machine_busy_seconds()
    wrk0 = rusage_seconds(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    requests = wrk(url, args.seconds, args.wrk_connections)
    wall = time.perf_counter() - t0
    wrk_cpu = rusage_seconds(resource.RUSAGE_CHILDREN) - wrk0
    server = cpu_seconds(proc.pid) - server0
    machine = machine_busy_seconds() - machine0
    return {"requests": requests, "rps": requests / args.seconds, "wall_s": wall,
            "server_cpu_s": server, "wrk_cpu_s": wrk_cpu,
            "c_plain_us": (server + wrk_cpu) * 1e6 / requests,
            "server_us": server * 1e6 / requests,
            "wrk_us": wrk_cpu * 1e6 / requests,
            "machine_busy_us": machine * 1e6 / requests}


def measure_plain(args):
    binary = build_axum(args.no_build)
    port = free_port()
    logdir = tempfile.mkdtemp(prefix="redis-limit-axum-")
    log = os.path.join(logdir, "axum.log")
    env = dict(inherited_env(), BIND=f"127.0.0.1:{port}", RATE_LIMIT="off",
               RATE_LIMIT_KEY="header:x-api-key", RUST_LOG="warn", NO_COLOR="1")
    with open(log, "w") as out:
        proc = subprocess.Popen([binary], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_port(port, proc, "examples/axum", log)
        check_answers(port)
        url = f"http://127.0.0.1:{port}/"
        runs = [run(proc, url, args) for _ in range(args.repeats)]
    finally:
        terminate(proc)
        shutil.rmtree(logdir, ignore_errors=True)
    med = medians(runs, ("c_plain_us", "server_us", "wrk_us", "machine_busy_us", "rps"))
    return {"binary": binary, "runs": runs, **med}


def given(c_plain_us):
    """C_plain taken from --plain-us, nothing else measured."""
    nan = float("nan")
    return {"given": True, "c_plain_us": c_plain_us, "server_us": nan, "wrk_us": nan,
            "machine_busy_us": nan, "rps": nan, "runs": []}
