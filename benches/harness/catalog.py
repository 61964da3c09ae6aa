"""What the load benchmark measures: the servers and the workloads.

Every server reads the example servers' environment (`examples/support/mod.rs`):
`BIND`, `REDIS_URL`, `REDIS_POOL`, `RATE_LIMIT`, `RATE_LIMIT_KEY`, and our
`RATE_LIMIT_DENY_CACHE=on|off`. The peers (`benches/peers/`) follow the same
interface where they can.
"""

from dataclasses import dataclass, field

# A quota no run can exhaust, that still fits governor's u32 burst.
HUGE = "1000000000/1h"
# The header the keyed workloads send, and the servers key by.
API_KEY = "x-api-key"
# Our example servers (examples/*.rs), as a Server's `binary`; the others
# are peers. load.py runs ours with RATE_LIMIT_ON_ERROR=deny.
EXAMPLES = ("axum", "hyper", "actix", "tonic")


@dataclass(frozen=True)
class Server:
    name: str
    # "axum" (examples/axum.rs), or a binary of benches/peers: "governor",
    # "actix-erl", "tower-redis", "redis-floor".
    binary: str
    env: dict = field(default_factory=dict)
    # Gets REDIS_URL pointing at the benchmark's redis-server.
    redis: bool = False
    # The no-limiter server every ratio is taken against.
    baseline: bool = False
    # Has a rate limiter (False: RATE_LIMIT=off, answers every request 200).
    limits: bool = True
    # Workloads (names) it does not run, each for a reason given where it
    # is listed.
    skip: tuple = ()
    # Gets REDIS_CLUSTER_URLS pointing at the benchmark's 3-master Redis
    # Cluster (and the example is built with the `cluster` feature).
    cluster: bool = False
    # Seconds of wrk warm-up for this server's cells, instead of --warmup:
    # for a server whose steady state needs every key seen once.
    warmup: int = None


SERVERS = [
    Server("axum, no limiter", "axum", {"RATE_LIMIT": "off"}, baseline=True, limits=False),
    Server("memory store", "axum"),
    Server("redis manager, deny cache on", "axum",
           {"RATE_LIMIT_DENY_CACHE": "on"}, redis=True),
    Server("redis manager, deny cache off", "axum",
           {"RATE_LIMIT_DENY_CACHE": "off"}, redis=True),
    # Hot keys: each instance reserves up to 100 units of a key per Redis
    # call (RATE_LIMIT_RESERVE, LimiterBuilder::local_reservation) and admits
    # from them in process: about one script call per 100 requests on one
    # key, never over the quota.
    Server("redis manager, local reservation 100", "axum",
           {"RATE_LIMIT_RESERVE": "100"}, redis=True),
    # The same with n sized for this key's rate: at ~100k req/s a refill's
    # round trip (~0.2 ms on average here, much longer in the VM's tail) is
    # worth 20+ units, so n = 100 (refilled at 25 left) runs dry often and
    # its requests wait; n = 1000 covers the tail. README: choosing n.
    Server("redis manager, local reservation 1000", "axum",
           {"RATE_LIMIT_RESERVE": "1000"}, redis=True),
    # Many warm keys: a map sized for 200,000 keys
    # (RATE_LIMIT_RESERVE_KEYS, LimiterBuilder::local_reservation_keys), so
    # every key of `allowed, 100k keys` keeps its reservation. Each key's
    # first request is a reserve call of its own, so the warm-up runs until
    # every key has been seen (3 s: 100,000 keys at 40,000+ req/s; on a
    # slower machine load.py runs it again, longer), and the measured run
    # is the steady state; one-off keys (`mixed`) each reserve.
    Server("redis manager, local reservation 100, 200k keys", "axum",
           {"RATE_LIMIT_RESERVE": "100", "RATE_LIMIT_RESERVE_KEYS": "200000"},
           redis=True, warmup=3),
    # A Redis Cluster of 3 masters, no replicas, through one cluster
    # connection: decisions batched per node (src/store/batch_cluster.rs).
    Server("redis cluster, 3 masters", "axum", redis=True, cluster=True),
    Server("redis bb8 pool 32, deny cache on", "axum",
           {"REDIS_POOL": "32", "RATE_LIMIT_DENY_CACHE": "on"}, redis=True),
    Server("redis bb8 pool 32, deny cache off", "axum",
           {"REDIS_POOL": "32", "RATE_LIMIT_DENY_CACHE": "off"}, redis=True),
    Server("tower_governor (memory)", "governor"),
    Server("actix-extensible-rate-limit (redis)", "actix-erl", redis=True),
    # GCRA: RATE_LIMIT's HUGE quota is clamped to a burst of 65535 and then
    # 1000/s per key (its capacity is a u16 and its interval whole
    # milliseconds: benches/peers/src/bin/tower-redis.rs), so it cannot
    # express "allowed, 1 key" and would deny most of it: skipped there.
    Server("tower-rate-limit-redis (redis)", "tower-redis", redis=True,
           skip=("allowed, 1 key",)),
    # Not a limiter: shows how much of actix-extensible-rate-limit's ratio is
    # actix-web itself rather than its limiter.
    Server("actix-web, no limiter", "actix-erl", {"RATE_LIMIT": "off"}, limits=False),
    # Not a limiter: one Redis PING per request through redis-rs 1's
    # ConnectionManager, as ours uses. The ceiling of any limiter that asks
    # Redis once per request, on this machine.
    Server("axum + one Redis PING per request (floor)", "redis-floor",
           {"RATE_LIMIT": "off"}, redis=True, limits=False),
]

BASELINE = next(s for s in SERVERS if s.baseline)


@dataclass(frozen=True)
class Workload:
    name: str
    # RATE_LIMIT and RATE_LIMIT_KEY for the servers.
    quota: str
    key: str
    # Arguments of keys.lua (mode, number of keys), or None: a plain GET.
    script: tuple = None
    # Before measuring, spend this many keys with one request each: the peer
    # address (key "ip") or header keys k0, k1, ... (the ones keys.lua sends).
    spend: int = 0
    # The share of 429 answers a server with a limiter should give.
    denied: float = 0.0
    about: str = ""


WORKLOADS = [
    Workload(
        "allowed, 1 key", HUGE, "ip",
        about="every request from 127.0.0.1, one key, a quota no run can exhaust: "
              "every decision allowed, all on one hot counter"),
    Workload(
        "allowed, 100k keys", HUGE, f"header:{API_KEY}", script=("cycle", 100_000),
        about=f"`{API_KEY}` cycles through k0 .. k99999 (keys.lua): every decision "
              "allowed, spread over 100,000 counters as real clients would be"),
    Workload(
        "denied, 1 key", "1/1h", "ip", spend=1, denied=1.0,
        about="one key, quota 1/1h, spent by a warm-up request: every measured "
              "request is denied (429)"),
    Workload(
        "mixed, 90% denied", "1/1h", f"header:{API_KEY}", script=("mixed", 1000),
        spend=1000, denied=0.9,
        about="quota 1/1h; the warm-up spends keys k0 .. k999; then 9 of every 10 "
              "requests cycle through those 1000 spent keys (denied) and the 10th "
              "sends a key never seen before (allowed): 90% denied, steadily, "
              "however long the run"),
]
