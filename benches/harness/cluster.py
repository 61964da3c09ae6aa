"""A Redis Cluster of the benchmark's own: masters with replicas on loopback
ports below 55535 (the cluster bus listens on port + 10000), formed with
`redis-cli --cluster create ... --cluster-replicas N --cluster-yes`, and
waited for until every node reports `cluster_state:ok`, knows every other
node and every replica's link to its master is up."""

import shutil
import socket
import subprocess
import sys
import time

from .procs import Redis, free_port

# The cluster bus of a node on port p listens on p + BUS.
BUS = 10_000
TOP = 65_535 - BUS


class Cluster:
    def __init__(self, masters=3, replicas=1, node_timeout_ms=1000, form_timeout=60):
        self.nodes = []
        try:
            self.form(masters, replicas, node_timeout_ms, form_timeout)
        except BaseException:
            self.stop()
            raise

    def form(self, masters, replicas, node_timeout_ms, form_timeout):
        config = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                  "--cluster-node-timeout", str(node_timeout_ms))
        for port in ports(masters * (1 + replicas)):
            self.nodes.append(Redis(*config, port=port))
        out = subprocess.run(
            ["redis-cli", "--cluster", "create",
             *(f"127.0.0.1:{n.port}" for n in self.nodes),
             "--cluster-replicas", str(replicas), "--cluster-yes"],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
        if out.returncode != 0:
            sys.exit(f"redis-cli --cluster create failed:\n{out.stdout}{out.stderr}")
        self.wait(form_timeout, "the cluster to form", lambda: self.formed(masters * replicas))

    @property
    def live(self):
        return [n for n in self.nodes if n.proc.poll() is None]

    def urls(self):
        """The live nodes' URLs, for REDIS_CLUSTER_URLS."""
        return ",".join(f"redis://127.0.0.1:{n.port}" for n in self.live)

    def formed(self, replicas):
        live = self.live
        for node in live:
            info = cli(node.port, "CLUSTER", "INFO")
            if ("cluster_state:ok" not in info or "cluster_slots_ok:16384" not in info):
                return False
        table = self.table(live[0].port)
        if len(table) < len(self.nodes):
            return False
        alive = [r for r in table if "fail" not in r["flags"] and "noaddr" not in r["flags"]]
        if sum(1 for r in alive if "slave" in r["flags"]) != replicas:
            return False
        return all("master_link_status:up" in cli(n.port, "INFO", "replication")
                   for n in live if n.port in {r["port"] for r in alive if "slave" in r["flags"]})

    def ok(self):
        """Every live node says cluster_state:ok."""
        return all("cluster_state:ok" in cli(n.port, "CLUSTER", "INFO") for n in self.live)

    def table(self, port):
        """CLUSTER NODES as seen from `port`: one dict per node (id, port,
        flags, master id, slot ranges as (first, last))."""
        rows = []
        for line in cli(port, "CLUSTER", "NODES").splitlines():
            f = line.split()
            if len(f) < 8:
                continue
            slots = []
            for s in f[8:]:
                if s.startswith("["):
                    continue  # a slot being migrated
                first, _, last = s.partition("-")
                slots.append((int(first), int(last or first)))
            rows.append({"id": f[0], "port": int(f[1].split(":")[1].split("@")[0]),
                         "flags": f[2].split(","), "master": f[3], "slots": slots})
        return rows

    def victim(self):
        """A live master with a live replica (the one the failover should
        promote), as (master's node, its replica's port)."""
        live_ports = {n.port for n in self.live}
        table = self.table(self.live[0].port)
        for row in sorted(table, key=lambda r: r["port"]):
            if "master" not in row["flags"] or row["port"] not in live_ports or not row["slots"]:
                continue
            replicas = [r["port"] for r in table
                        if r["master"] == row["id"] and r["port"] in live_ports]
            if replicas:
                node = next(n for n in self.nodes if n.port == row["port"])
                return node, replicas[0]
        sys.exit("no live master with a live replica is left to kill")

    def promoted(self, replica_port):
        """Whether the node on `replica_port` says it is a master with slots,
        and the cluster is ok as it sees it."""
        try:
            me = next(r for r in self.table(replica_port) if "myself" in r["flags"])
            return ("master" in me["flags"] and bool(me["slots"])
                    and "cluster_state:ok" in cli(replica_port, "CLUSTER", "INFO"))
        except (subprocess.SubprocessError, StopIteration):
            return False

    def wait(self, seconds, what, done):
        deadline = time.monotonic() + seconds
        while True:
            try:
                if done():
                    return
            except subprocess.SubprocessError:
                pass
            if time.monotonic() > deadline:
                logs = "\n".join(f"{n.port}: {n.log}" for n in self.nodes)
                sys.exit(f"waited {seconds} s for {what}; node logs:\n{logs}")
            time.sleep(0.1)

    def stop(self):
        """Stops the live nodes and removes every node's directory."""
        for node in self.nodes:
            if node.proc.poll() is None:
                node.stop()
            shutil.rmtree(node.dir, ignore_errors=True)


def cli(port, *args):
    """One redis-cli command on `port`; raises on failure."""
    return subprocess.run(["redis-cli", "-p", str(port), *args], check=True,
                          capture_output=True, text=True, timeout=5).stdout


def ports(count):
    """`count` distinct free ports below TOP whose bus port is free too."""
    found = []
    while len(found) < count:
        port = free_port()
        if port < TOP and port not in found and bindable(port + BUS):
            found.append(port)
    return found


def bindable(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False

