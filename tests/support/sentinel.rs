//! A Redis Sentinel deployment on loopback: one master, one replica
//! (`--replicaof`) and three sentinels (`redis-server <conf> --sentinel`,
//! quorum 2, `down-after-milliseconds 1000`, `failover-timeout 3000`), each
//! with its own configuration file in its own temp dir, since sentinels
//! rewrite theirs. [`Sentinels::start`] returns once every sentinel knows
//! the replica and the other two sentinels, so a failover can be voted.
//!
//! [`Sentinels::start_isolable`] makes a deployment whose master can be cut
//! off from its replica and its sentinels while the store still reaches it
//! ([`Sentinels::isolate_master`]): its sentinels and its replica log in to
//! it as the user [`PEER`], the store as [`APP`], and the master, with
//! `min-replicas-to-write 1`, refuses writes with `NOREPLICAS` once it has
//! no replica.

use std::time::Duration;

use super::{RedisServer, lease::eventually};

/// The master's name in the sentinels' configuration.
pub const MASTER: &str = "mymaster";

/// The user the sentinels and the replica log in as, in an isolable
/// deployment, and its password.
pub const PEER: (&str, &str) = ("peer", "peer-secret");

/// The user the store logs in as, in an isolable deployment, and its
/// password.
pub const APP: (&str, &str) = ("app", "app-secret");

/// A master, its replica and three sentinels watching them.
pub struct Sentinels {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<RedisServer>,
}

/// One command on `port`, over a fresh connection.
pub async fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    query_at(&format!("redis://127.0.0.1:{port}"), cmd).await
}

/// One command on `port` as the user [`APP`], over a fresh connection.
pub async fn query_as_app<T: redis::FromRedisValue>(
    port: u16,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    let (user, password) = APP;
    query_at(&format!("redis://{user}:{password}@127.0.0.1:{port}"), cmd).await
}

async fn query_at<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    cmd.query_async(&mut conn).await
}

/// `user <name> on ><password> ~* &* +@all`, as `redis-server` arguments.
fn user_args(user: (&str, &str)) -> Vec<String> {
    let (name, password) = user;
    [
        "--user",
        name,
        "on",
        &format!(">{password}"),
        "~*",
        "&*",
        "+@all",
    ]
    .map(String::from)
    .to_vec()
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
        Self::start_with(&[], &[], "").await
    }

    /// Like [`start`](Self::start), with a master that can be isolated
    /// ([`isolate_master`](Self::isolate_master); see the module docs).
    /// Both servers know the users [`PEER`] and [`APP`].
    pub async fn start_isolable() -> Self {
        let users = [user_args(PEER), user_args(APP)].concat();
        let master = [
            users.clone(),
            ["--min-replicas-to-write", "1"].map(String::from).to_vec(),
        ];
        let (peer, password) = PEER;
        let replica = [
            users,
            ["--masteruser", peer, "--masterauth", password]
                .map(String::from)
                .to_vec(),
        ];
        let auth = format!(
            "sentinel auth-user {MASTER} {peer}\n\
             sentinel auth-pass {MASTER} {password}\n"
        );
        Self::start_with(&master.concat(), &replica.concat(), &auth).await
    }

    /// Like [`start`](Self::start), with a master that refuses writes with
    /// `NOREPLICAS` once its replica has not acknowledged for over a second
    /// (`min-replicas-to-write 1`, `min-replicas-max-lag 1`): freezing the
    /// replica makes it so, and the sentinels go on naming the master.
    pub async fn start_needing_a_replica() -> Self {
        let master = [
            "--min-replicas-to-write",
            "1",
            "--min-replicas-max-lag",
            "1",
        ];
        Self::start_with(&master.map(String::from), &[], "").await
    }

    /// Cuts the master off from its replica and its sentinels: the users
    /// they log in as ([`PEER`], and `default`, which a login refused
    /// falls back to) are switched off and their connections closed. The
    /// store's user ([`APP`]) still reaches it. The sentinels see it down
    /// and promote the replica, but cannot demote it: it stays a master
    /// with no replica, refusing writes with `NOREPLICAS`.
    pub async fn isolate_master(&self) {
        let port = self.master.port();
        for user in [PEER.0, "default"] {
            let _: () = query_as_app(port, redis::cmd("ACL").arg("SETUSER").arg(user).arg("off"))
                .await
                .unwrap_or_else(|e| panic!("ACL SETUSER {user} off: {e}\n{}", self.log()));
        }
        for user in [PEER.0, "default"] {
            let _: i64 = query_as_app(port, redis::cmd("CLIENT").arg("KILL").arg("USER").arg(user))
                .await
                .unwrap_or_else(|e| panic!("CLIENT KILL USER {user}: {e}\n{}", self.log()));
        }
    }

    /// Starts the deployment: the master with `master` as extra
    /// `redis-server` arguments, the replica with `replica`, and the
    /// sentinels with `sentinel` after their configuration's lines.
    async fn start_with(master: &[String], replica: &[String], sentinel: &str) -> Self {
        fn args(args: &[String]) -> Vec<&str> {
            args.iter().map(String::as_str).collect()
        }
        let master = RedisServer::start_with(&args(master));
        let master_port = master.port().to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &master_port];
        replica_args.extend(args(replica));
        let replica = RedisServer::start_with(&replica_args);
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
             sentinel parallel-syncs {MASTER} 1\n\
             {sentinel}"
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
