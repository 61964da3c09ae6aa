"""Processes and CPU time: tools on PATH, free ports, the benchmark's own
redis-server, and CPU seconds from /proc and getrusage."""

import os
import resource
import shutil
import sys

# The load benchmark's: a port the OS says is free (so never a running
# Redis's), waiting for a server to listen, and its redis-server.
from loadbench.procs import Redis, free_port, wait_port  # noqa: F401


def require(*tools):
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        sys.exit(f"{', '.join(missing)} not found on PATH: "
                 "apt-get install -y redis-server redis-tools wrk (and rustup for cargo)")


def stop(proc):
    proc.terminate()
    proc.wait()


class RedisServer(Redis):
    """The load benchmark's own redis-server (free port, no persistence),
    its directory removed when stopped."""

    def stop(self):
        super().stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def rusage_seconds(who):
    """User + system CPU seconds of getrusage(who): RUSAGE_SELF or RUSAGE_CHILDREN."""
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime


def proc_cpu_seconds(pid):
    """utime + stime of a running process, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds():
    """CPU seconds the whole machine was not idle, over all cores, since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is in user)
    busy = v[0] + v[1] + v[2] + v[5] + v[6]
    return busy / os.sysconf("SC_CLK_TCK")


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])
