//! Test harness: a real Redis Cluster per test, killed on drop.
//!
//! Every node is a `redis-server --cluster-enabled yes` with its own temp dir
//! and `nodes.conf`, on a free port below 55535 (the cluster bus listens on
//! port + 10000). `redis-cli --cluster create` forms the cluster, then the
//! harness waits, with a deadline, until every node reports
//! `cluster_state:ok`, knows every other node and, with replicas, until every
//! replica's link to its master is up. Binaries come from `REDIS_SERVER_BIN`
//! and `REDIS_CLI_BIN`, or `PATH`; a missing one is a loud failure with the
//! install hint. Queries use short-lived blocking connections.
#![cfg(feature = "cluster")]

mod inspect;
mod node;

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use redis_ratelimit::{Limiter, LimiterBuilder, RedisStore};

use self::node::{Node, bin, install_hint};
use super::TEST_TIMEOUT;

/// A Redis Cluster owned by one test.
pub struct RedisCluster {
    nodes: Vec<Node>,
}

impl RedisCluster {
    /// Three masters, no replicas; a 5 s node timeout, so that a loaded
    /// machine never fails a node by mistake.
    pub fn start() -> Self {
        Self::with(3, 0, 5_000)
    }

    /// Three masters with one replica each and a 1 s node timeout, so that a
    /// killed master's replica takes over within a few seconds.
    pub fn with_replicas() -> Self {
        Self::with(3, 1, 1_000)
    }

    /// `masters` masters with `replicas` replicas each.
    pub fn with(masters: usize, replicas: usize, node_timeout_ms: u64) -> Self {
        let count = masters * (1 + replicas);
        let nodes = (0..count).map(|_| Node::start(node_timeout_ms)).collect();
        let cluster = Self { nodes };
        let cli = bin("REDIS_CLI_BIN", "redis-cli");
        let out = Command::new(&cli)
            .arg("--cluster")
            .arg("create")
            .args(
                cluster
                    .nodes
                    .iter()
                    .map(|n| format!("127.0.0.1:{}", n.port)),
            )
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{}", install_hint(&cli, e)));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            cluster.log()
        );
        cluster.wait_until(Duration::from_secs(30), "the cluster to form", |c| {
            c.is_formed(count, masters * replicas)
        });
        cluster
    }

    fn is_formed(&self, count: usize, replicas: usize) -> bool {
        let known = format!("cluster_known_nodes:{count}\r\n");
        self.live_ports().all(|port| {
            let info: String = self.query(port, redis::cmd("CLUSTER").arg("INFO"));
            info.contains("cluster_state:ok\r\n")
                && info.contains("cluster_slots_ok:16384\r\n")
                && info.contains(&known)
        }) && self.replicas().len() == replicas
            && self.replicas().into_iter().all(|port| {
                let info: String = self.query(port, redis::cmd("INFO").arg("replication"));
                info.contains("master_link_status:up")
            })
    }

    /// Polls `done` every 50 ms, failing with every node's log after `limit`.
    pub fn wait_until(&self, limit: Duration, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + limit;
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "waited {limit:?} for {what}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn live_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
    }

    /// Runs one command on the node at `port`, panicking with the logs.
    pub fn query<T: redis::FromRedisValue>(&self, port: u16, cmd: &redis::Cmd) -> T {
        let url = format!("redis://127.0.0.1:{port}");
        let run = || -> redis::RedisResult<T> {
            let client = redis::Client::open(url.as_str())?;
            let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
            conn.set_read_timeout(Some(Duration::from_secs(2)))?;
            cmd.query(&mut conn)
        };
        run().unwrap_or_else(|e| panic!("{cmd:?} on {port}: {e}\n{}", self.log()))
    }

    /// Kills (SIGKILL) the node on `port`.
    pub fn kill(&mut self, port: u16) {
        let node = self.nodes.iter_mut().find(|n| n.port == port);
        node.unwrap_or_else(|| panic!("no node on port {port}"))
            .kill();
    }

    /// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) the node on `port`: a node
    /// that accepts connections but never answers.
    pub fn freeze(&self, port: u16, frozen: bool) {
        let node = self.nodes.iter().find(|n| n.port == port);
        let node = node.unwrap_or_else(|| panic!("no node on port {port}"));
        let pid = node.child.as_ref().expect("node is running").id();
        let signal = if frozen { "-STOP" } else { "-CONT" };
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// Starts the node killed on `port` again on the same port: it rejoins
    /// with its `nodes.conf` (identity and slots) and an empty dataset. Waits
    /// until every node reports `cluster_state:ok` again.
    pub fn restart(&mut self, port: u16) {
        let node = self.nodes.iter_mut().find(|n| n.port == port);
        node.unwrap_or_else(|| panic!("no node on port {port}"))
            .restart();
        let count = self.nodes.len();
        self.wait_until(Duration::from_secs(30), "the node to rejoin", |c| {
            c.is_formed(count, c.replicas().len())
        });
    }

    /// Redis URLs of every live node, to seed cluster connections.
    pub fn seed_urls(&self) -> Vec<String> {
        let ports = self.live_ports();
        ports.map(|p| format!("redis://127.0.0.1:{p}")).collect()
    }

    /// A new `RedisStore` with its own cluster connection.
    pub async fn store(&self) -> RedisStore {
        RedisStore::cluster(self.seed_urls())
            .await
            .unwrap_or_else(|e| panic!("RedisStore::cluster: {e}\n{}", self.log()))
    }

    /// A new `RedisStore` over a bb8 pool of `size` cluster connections.
    pub async fn pool_store(&self, size: u32) -> RedisStore {
        let client = RedisStore::cluster_client(self.seed_urls())
            .build()
            .unwrap();
        let pool = bb8::Pool::builder()
            .max_size(size)
            .test_on_check_out(false)
            .build(client)
            .await
            .unwrap_or_else(|e| panic!("bb8 cluster pool: {e}\n{}", self.log()));
        RedisStore::from_cluster_pool(pool)
    }

    /// A builder for `quota` on a new cluster store, with the test timeout.
    pub async fn builder(&self, quota: &str) -> LimiterBuilder {
        let builder = Limiter::builder(quota.parse().unwrap());
        builder.store(self.store().await).timeout(TEST_TIMEOUT)
    }

    /// A limiter for `quota` on a new cluster store.
    pub async fn limiter(&self, quota: &str) -> Limiter {
        self.builder(quota).await.build().unwrap()
    }

    /// The last 30 lines each node logged.
    pub fn log(&self) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            let log = node.log.lock().unwrap();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(30)..].join("\n");
            out.push_str(&format!("--- node {} ---\n{tail}\n", node.port));
        }
        out
    }
}
