//! A Redis Sentinel deployment on loopback: one master, one replica
//! (`--replicaof`) and three sentinels (`redis-server <conf> --sentinel`,
//! quorum 2, `down-after-milliseconds 1000`, `failover-timeout 3000`), each
//! with its own configuration file in its own temp dir, since sentinels
//! rewrite theirs. [`Sentinels::start`] returns once every sentinel knows
//! the replica and the other two sentinels, so a failover can be voted.

use std::time::Duration;

use super::{RedisServer, lease::eventually};

/// The master's name in the sentinels' configuration.
pub const MASTER: &str = "mymaster";

/// A master, its replica and three sentinels watching them.
pub struct Sentinels {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<RedisServer>,
}

/// One command on `port`, over a fresh connection.
pub async fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    cmd.query_async(&mut conn).await
}

/// `INFO replication` of the server at `port`, or "" if it does not answer.
pub async fn replication(port: u16) -> String {
    query(port, redis::cmd("INFO").arg("replication"))
        .await
        .unwrap_or_default()
}

impl Sentinels {
    /// Starts the master, the replica (waiting for its link to the master)
    /// and the sentinels (waiting until each sees the replica and the other
    /// two).
    pub async fn start() -> Self {
        let master = RedisServer::start();
        let master_port = master.port().to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master_port]);
        let mut deployment = Self {
            master,
            replica,
            sentinels: Vec::new(),
        };
        let port = deployment.replica.port();
        eventually(
            "the replica's link to the master",
            Duration::from_secs(20),
            &deployment.log(),
            || async move { replication(port).await.contains("master_link_status:up") },
        )
        .await;
        let conf = format!(
            "sentinel monitor {MASTER} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {MASTER} 1000\n\
             sentinel failover-timeout {MASTER} 3000\n\
             sentinel parallel-syncs {MASTER} 1\n"
        );
        deployment.sentinels = (0..3).map(|_| RedisServer::start_sentinel(&conf)).collect();
        let ports: Vec<u16> = deployment.sentinels.iter().map(RedisServer::port).collect();
        let log = deployment.log();
        for port in ports {
            eventually(
                "each sentinel sees the replica and the two other sentinels",
                Duration::from_secs(30),
                &log,
                || async move {
                    let fields: Vec<String> =
                        match query(port, redis::cmd("SENTINEL").arg("MASTER").arg(MASTER)).await {
                            Ok(fields) => fields,
                            Err(_) => return false,
                        };
                    let field = |name: &str| {
                        let at = fields.iter().position(|f| f == name)?;
                        fields.get(at + 1).cloned()
                    };
                    field("num-slaves").as_deref() == Some("1")
                        && field("num-other-sentinels").as_deref() == Some("2")
                },
            )
            .await;
        }
        deployment
    }

    /// The sentinels' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// Every server's log, for panic messages.
    pub fn log(&self) -> String {
        let mut out = format!(
            "--- master\n{}\n--- replica\n{}\n",
            self.master.log(),
            self.replica.log()
        );
        for (i, sentinel) in self.sentinels.iter().enumerate() {
            out += &format!("--- sentinel {i}\n{}\n", sentinel.log());
        }
        out
    }
}
