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
    /// returned once its link to this one is up and it has the data. This
    /// server sends its data at once (`repl-diskless-sync-delay 0`; Redis
    /// waits 5 s for more replicas by default).
    pub async fn start_replica(&self) -> RedisServer {
        self.config_set("repl-diskless-sync-delay", "0").await;
        let port = self.port().to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
        replica.wait_for_master_link("up").await;
        self.sync_replicas().await;
        replica
    }

    /// Waits (20 s at most) until this replica's link to its master is
    /// `status` (`up` or `down`), as `INFO replication` says.
    pub async fn wait_for_master_link(&self, status: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut self.conn().await)
                .await
                .unwrap();
            if info.contains(&format!("master_link_status:{status}")) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the replica's link never went {status}:\n{info}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until a replica has acknowledged every write made so far, on
    /// any connection: its acknowledged offset (`INFO replication`'s
    /// `slave0:...,offset=`) reaches the master's `master_repl_offset`.
    /// (`WAIT` would not do: it waits only for the asking connection's own
    /// writes, and the harness asks on a connection of its own.)
    pub async fn sync_replicas(&self) {
        let field = |info: &str, name: &str| -> Option<u64> {
            info.lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.trim().parse().ok())
        };
        let acked = |info: &str| -> Option<u64> {
            let replica = info.lines().find_map(|l| l.strip_prefix("slave0:"))?;
            replica
                .split(',')
                .find_map(|kv| kv.strip_prefix("offset="))
                .and_then(|v| v.parse().ok())
        };
        let mut conn = self.conn().await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut target = None;
        loop {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut conn)
                .await
                .unwrap();
            let offset = field(&info, "master_repl_offset:");
            let target = *target.get_or_insert(offset);
            if let (Some(target), Some(acked)) = (target, acked(&info))
                && acked >= target
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no replica acknowledged offset {target:?} in 10 s:\n{info}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
