"""Processes and the machine: tools on PATH, free ports, the benchmark's own
redis-server, building and starting the servers, the warm-up requests that set
a workload up, CPU seconds from /proc and getrusage, and the machine and commit
a report names."""

import copy
import http.client
import os
import platform
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

from .catalog import API_KEY

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def require(*tools):
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        sys.exit(f"{', '.join(missing)} not found on PATH: "
                 "apt-get install -y redis-server redis-tools wrk (and rustup for cargo)")


def cpu_model():
    """The CPU's model name from /proc/cpuinfo, or "?"."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


def machine():
    """Cores, CPU model, memory and kernel, as a report's one line."""
    with open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    return (f"{os.cpu_count()} cores ({cpu_model()}), {mem_kib / 2**20:.0f} GiB, "
            f"{platform.system()} {platform.release()}")


def output(cmd, cwd=None):
    """A command's stdout, stripped; "?" if it cannot run."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd).stdout.strip()
    except OSError:
        return "?"


def commit(root):
    """The short commit of the checkout at `root`, "+dirty" when a tracked
    file is modified."""
    dirty = output(["git", "status", "--porcelain", "--untracked-files=no"], root)
    return (output(["git", "rev-parse", "--short", "HEAD"], root) or "unknown") + (
        "+dirty" if dirty else "")


def loadavg():
    """The 1, 5 and 15 minute load averages, as text."""
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what, log=None, interval=0.05):
    """Waits until something listens on `port`, polling every `interval`
    seconds; exits with `proc`'s log if it died, or after 30 s."""
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            tail = f":\n{read_tail(log)}" if log else ""
            sys.exit(f"{what} exited with status {proc.returncode}{tail}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(interval)
    sys.exit(f"{what} did not listen on port {port} within 30 s")


# What our servers log on a store error (core.rs, at most once a second,
# with a count of the rest) and when the breaker opens (deciding.rs).
STORE_ERROR_LOG = "rate limit store fail"


def store_errors_logged(path):
    """Lines of our server's log at `path` that report a store error. Under
    RATE_LIMIT_ON_ERROR=deny a store error is a 503, which wrk counts among
    its non-2xx answers beside the 429s: on a workload that denies by design
    only the log tells them apart."""
    try:
        with open(path, errors="replace") as f:
            return sum(STORE_ERROR_LOG in line for line in f)
    except OSError:
        return 0


def read_tail(path, lines=20):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


class Redis:
    """A redis-server of the benchmark's own, on a free port, without
    persistence; `cli` runs redis-cli against it.

    `config`: more redis-server arguments (`"--name", "value"` pairs), after
    the defaults so that they override them (e.g. `"--appendonly", "yes"`);
    `port`: this port instead of a free one (a cluster node's must be below
    55535); `unix`: it listens on a Unix socket in its directory too, which
    the copy `over_unix()` names as its `url`. `start` starts it again
    after a kill: same port, same directory, so the same data files."""

    def __init__(self, *config, port=None, unix=False):
        self.dir = tempfile.mkdtemp(prefix="load-redis-")
        self.log = os.path.join(self.dir, "redis.log")
        self.port = port or free_port()
        self.socket = os.path.join(self.dir, "redis.sock") if unix else None
        self.via_socket = False
        if self.socket:
            config = ("--unixsocket", self.socket, "--unixsocketperm", "700", *config)
        self.config = config
        self.start()

    def over_unix(self):
        """This server, with `url` its Unix socket (`cli` still goes by TCP)."""
        assert self.socket, "started without unix=True"
        other = copy.copy(self)
        other.via_socket = True
        return other

    def start(self, interval=0.05):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.dir, "--logfile", self.log,
             *self.config])
        wait_port(self.port, self.proc, "redis-server", self.log, interval)

    @property
    def url(self):
        if self.via_socket:
            return f"unix://{self.socket}"
        return f"redis://127.0.0.1:{self.port}"

    def cli(self, *args):
        return subprocess.run(["redis-cli", "-p", str(self.port), *args],
                              check=True, capture_output=True, text=True).stdout

    def stop(self):
        """Stops it and removes its directory."""
        terminate(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


def build(root, binaries, features=()):
    """Builds what `binaries` needs, in release mode; returns binary -> path.
    `features`: the crate's features for the example (e.g. "cluster")."""
    paths = {}
    if "axum" in binaries:
        more = ["--features", ",".join(features)] if features else []
        run(["cargo", "build", "--release", "--example", "axum", *more], cwd=root)
        paths["axum"] = os.path.join(root, "target", "release", "examples", "axum")
    peers = sorted(b for b in binaries if b != "axum")
    if peers:
        manifest = os.path.join(root, "benches", "peers", "Cargo.toml")
        bins = [arg for b in peers for arg in ("--bin", b)]
        run(["cargo", "build", "--release", "--manifest-path", manifest, *bins], cwd=root)
        for b in peers:
            paths[b] = os.path.join(root, "benches", "peers", "target", "release", b)
    return paths


def run(cmd, cwd):
    print("$", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, cwd=cwd, check=True)


# The example servers' variables (examples/support/mod.rs): a shell that
# exported one would change every cell, or stop a plain one (RATE_LIMIT=off
# refuses a setting of how to limit), so only a cell's own are passed.
EXAMPLE_VARIABLES = ("RATE_LIMIT", "REDIS_", "TRUSTED_", "FORWARDED_HEADER", "BIND")


def inherited_env():
    """This process's environment without the example servers' variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith(EXAMPLE_VARIABLES)}


@contextmanager
def serving(binary, env, log):
    """Starts a server on a free port; yields (port, startup line, pid);
    stops it (SIGTERM, then wait) on the way out."""
    port = free_port()
    env = dict(inherited_env(), **env, BIND=f"127.0.0.1:{port}", RUST_LOG="info", NO_COLOR="1")
    with open(log, "w") as out:
        proc = subprocess.Popen([binary], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_port(port, proc, os.path.basename(binary), log)
        startup = next((ANSI.sub("", line).strip() for line in read_tail(log).splitlines()
                        if "listening on" in line), "")
        yield port, startup, proc.pid
    finally:
        terminate(proc)


def terminate(proc, grace=10):
    """SIGTERM, then SIGKILL if `proc` has not exited within `grace` seconds
    (a server that hangs in its graceful shutdown, a stopped redis-server)."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def cpu_seconds(pid):
    """User + system CPU time of a running process, all its threads."""
    return sum(cpu_split(pid))


def cpu_split(pid):
    """(user, system) CPU seconds of a running process, all its threads. The
    kernel splits a thread's run time between the two by sampling at each
    clock tick, so over a few seconds the split is close, not exact."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of stat(5); fields[0] is field 3.
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


# The kernel tracepoints `syscall_counts` reads: every syscall, and the two
# by which a Tokio worker goes to sleep or wakes another.
SYSCALL_EVENTS = {
    "raw_syscalls:sys_enter": "syscalls",
    "syscalls:sys_enter_epoll_wait": "epoll_wait",
    "syscalls:sys_enter_futex": "futex",
}


@contextmanager
def syscall_counts(pid):
    """Counts a running process's syscalls (all its threads) while the block
    runs, with `perf stat` on kernel tracepoints (needs perf, and root or
    kernel.perf_event_paranoid at -1). Yields a dict that is filled on the
    way out: "syscalls", "epoll_wait" and "futex". A tracepoint perf cannot
    read is a loud failure, never a count of 0."""
    with tempfile.NamedTemporaryFile("r", suffix=".perf") as out:
        proc = subprocess.Popen(
            ["perf", "stat", "-x,", "-o", out.name, "-e", ",".join(SYSCALL_EVENTS),
             "-p", str(pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.1)  # attached before the block's work starts
        if proc.poll() is not None:
            sys.exit(f"perf stat failed: {proc.stderr.read().decode().strip()}")
        counts = {}
        try:
            yield counts
        finally:
            proc.send_signal(signal.SIGINT)  # perf prints its counts and exits
            proc.wait()
        for line in out.read().splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[2] in SYSCALL_EVENTS:
                if not fields[0].isdigit():
                    sys.exit(f"perf stat cannot count {fields[2]}: {fields[0]}")
                counts[SYSCALL_EVENTS[fields[2]]] = int(fields[0])
        missing = set(SYSCALL_EVENTS.values()) - set(counts)
        if missing:
            sys.exit(f"perf stat gave no count for {', '.join(sorted(missing))}")


def context_switches(pid):
    """Context switches (voluntary and not) of a running process so far, all
    its threads: each is a thread that slept or was preempted."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    # voluntary_ctxt_switches and nonvoluntary_ctxt_switches
                    if "ctxt_switches:" in line:
                        total += int(line.split()[1])
        except FileNotFoundError:
            pass  # a thread that ended meanwhile
    return total


def rusage_seconds(who):
    """User + system CPU seconds of getrusage(who): RUSAGE_SELF or RUSAGE_CHILDREN."""
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime


def machine_busy_seconds():
    """CPU seconds the whole machine was not idle, over all cores, since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is in user)
    busy = v[0] + v[1] + v[2] + v[5] + v[6]
    return busy / os.sysconf("SC_CLK_TCK")


def get(conn, key=None):
    """`GET /` on a kept-alive connection, with `x-api-key: key` if given."""
    conn.request("GET", "/", headers={API_KEY: key} if key else {})
    res = conn.getresponse()
    res.read()
    return res.status


def prepare(port, workload, limits):
    """Spends the workload's keys, then sends one probe: a spent key must be
    denied (429) when the server limits, a fresh key allowed. Returns what
    went wrong, or None; a mismeasured cell is worse than none. The probe
    also makes a Redis-backed server load its script before the counters
    are reset."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        keyed = workload.key.startswith("header:")
        for i in range(workload.spend):
            key = f"k{i}" if keyed else None
            status = get(conn, key)
            if status != 200:
                return f"warm-up request for key {key or 'ip'} answered {status}, not 200"
        if workload.spend:
            key, want, what = ("k0" if keyed else None), (429 if limits else 200), "spent"
        else:
            key, want, what = ("probe-fresh-key" if keyed else None), 200, "fresh"
        status = get(conn, key)
        if status != want:
            return f"a {what} key answered {status}, not {want}"
        return None
    finally:
        conn.close()
