"""The faults the chaos run (benches/chaos.py) injects into Redis under load.

A fault is put in place by `inject` and taken away by `lift`, after the
run's hold time. Both return the time (time.monotonic(), seconds) at which
the fault is certainly in place, or certainly over: the run measures the
recovery from requests sent after the second. For a single redis-server,
`target` is its `procs.Redis`; for the cluster fault, a `cluster.Cluster`.
"""

import os
import signal
import subprocess
import time

# Polling a restarted redis-server's port this often: the fault's end is
# known to within this much.
PORT_POLL_S = 0.002


def cli(port, *args):
    """One redis-cli command; raises on failure or after 5 s."""
    out = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True,
                         text=True, timeout=5)
    if out.returncode != 0 or out.stdout.startswith(("ERR", "(error)")):
        raise RuntimeError(f"redis-cli {' '.join(args)}: {out.stdout}{out.stderr}".strip())
    return out.stdout


class Kill9:
    name = "kill -9, restart"
    about = ("SIGKILL of redis-server; after the hold, the same redis-server is "
             "started again on the same port with the same data directory. The fault "
             "ends when the new process accepts connections (polled every 2 ms).")

    def inject(self, redis):
        redis.proc.kill()
        redis.proc.wait()
        return time.monotonic()

    def lift(self, redis):
        redis.start(interval=PORT_POLL_S)
        return time.monotonic()


class Freeze:
    name = "SIGSTOP, SIGCONT"
    about = ("redis-server stopped with SIGSTOP (its connections stay open and "
             "unanswered), then resumed with SIGCONT, which ends the fault.")

    def inject(self, redis):
        os.kill(redis.proc.pid, signal.SIGSTOP)
        return time.monotonic()

    def lift(self, redis):
        os.kill(redis.proc.pid, signal.SIGCONT)
        return time.monotonic()


class ClientPause:
    name = "CLIENT PAUSE ALL"
    about = ("`CLIENT PAUSE <hold ms> ALL`: Redis holds every client's commands "
             "until the pause ends. The fault ends <hold ms> after the command "
             "returned (a bound the pause cannot outlast).")

    def __init__(self, hold_s):
        self.ms = round(hold_s * 1000)

    def inject(self, redis):
        cli(redis.port, "CLIENT", "PAUSE", str(self.ms), "ALL")
        self.returned = time.monotonic()
        return self.returned

    def lift(self, redis):
        end = self.returned + self.ms / 1000
        time.sleep(max(0.0, end - time.monotonic()))
        return end


class OutOfMemory:
    name = "OOM (maxmemory 1)"
    about = ("`CONFIG SET maxmemory-policy noeviction` and `CONFIG SET maxmemory 1`: "
             "every script call is refused with -OOM; the fault ends when "
             "`CONFIG SET maxmemory 0` (and the old policy) returned.")

    def inject(self, redis):
        self.policy = cli(redis.port, "CONFIG", "GET", "maxmemory-policy").split()[-1]
        cli(redis.port, "CONFIG", "SET", "maxmemory-policy", "noeviction")
        cli(redis.port, "CONFIG", "SET", "maxmemory", "1")
        return time.monotonic()

    def lift(self, redis):
        cli(redis.port, "CONFIG", "SET", "maxmemory", "0")
        cli(redis.port, "CONFIG", "SET", "maxmemory-policy", self.policy)
        return time.monotonic()


class ScriptFlush:
    name = "SCRIPT FLUSH"
    about = ("`SCRIPT FLUSH`: Redis forgets every loaded script, so the next "
             "EVALSHA gets NOSCRIPT. An instant fault: it ends when the command "
             "returned, and the hold is only more load on the flushed server.")

    def inject(self, redis):
        cli(redis.port, "SCRIPT", "FLUSH")
        return time.monotonic()

    def lift(self, redis):
        return time.monotonic()


class MasterKill:
    name = "cluster master kill -9"
    about = ("SIGKILL of a Redis Cluster master that has a replica (3 masters, 3 "
             "replicas, cluster-node-timeout 1000 ms); it stays dead. Its replica must "
             "be promoted. The recovery is measured from the kill, over the keys "
             "whose counters the killed master held. There is no hold: `lift`, "
             "called at once, polls the replica every 50 ms until it says it is a "
             "master with slots and cluster_state:ok (for the record, and so that "
             "the run's post-fault time starts after the promotion).")
    cluster = True

    def __init__(self, promotion_timeout_s):
        self.timeout = promotion_timeout_s

    def choose(self, cluster):
        """Picks the master to kill (and the replica to watch); returns its
        node, so that the run can list the keys it holds first."""
        self.node, self.replica = cluster.victim()
        return self.node

    def inject(self, cluster):
        self.node.proc.kill()
        self.node.proc.wait()
        self.killed = time.monotonic()
        return self.killed

    def lift(self, cluster):
        deadline = self.killed + self.timeout
        while time.monotonic() < deadline:
            if cluster.promoted(self.replica):
                self.promoted = time.monotonic()
                return self.promoted
            time.sleep(0.05)
        self.promoted = None
        return time.monotonic()
