//! Redis refusing writes: out of memory under `noeviction`, or a read-only
//! replica. Plus what a test needs to prove that nothing was written: the
//! raw bytes of a key.

use std::time::{Duration, Instant};

use super::RedisServer;

impl RedisServer {
    /// `CONFIG SET name value`.
    pub async fn config_set(&self, name: &str, value: &str) {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async(&mut self.conn().await)
            .await
            .unwrap_or_else(|e| panic!("CONFIG SET {name} {value}: {e}\n{}", self.log()));
    }

    /// Out of memory (`maxmemory 1` under `noeviction`): Redis refuses every
    /// command that may grow memory (`OOM command not allowed...`) until
    /// `refuse_writes(false)` lifts the limit (`maxmemory 0`).
    pub async fn refuse_writes(&self, refuse: bool) {
        self.config_set("maxmemory-policy", "noeviction").await;
        self.config_set("maxmemory", if refuse { "1" } else { "0" })
            .await;
    }

    /// `DUMP key`: the key's value, serialized (its TTL is not part of it),
    /// or `None` when there is no such key.
    pub async fn dump(&self, key: &str) -> Option<Vec<u8>> {
        redis::cmd("DUMP")
            .arg(key)
            .query_async(&mut self.conn().await)
            .await
            .unwrap_or_else(|e| panic!("DUMP {key}: {e}\n{}", self.log()))
    }

    /// A second server, a read-only replica (`--replicaof`) of this one,
    /// returned once its link to this one is up and it has the data.
    pub async fn start_replica(&self) -> RedisServer {
        let port = self.port().to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut replica.conn().await)
                .await
                .unwrap();
            if info.contains("master_link_status:up") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "replica never linked up:\n{info}\n{}",
                replica.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.sync_replicas().await;
        replica
    }

    /// Waits (`WAIT 1`) until one replica has every write made so far.
    pub async fn sync_replicas(&self) {
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(10_000)
            .query_async(&mut self.conn().await)
            .await
            .unwrap();
        assert_eq!(acked, 1, "no replica acknowledged in 10 s\n{}", self.log());
    }
}
