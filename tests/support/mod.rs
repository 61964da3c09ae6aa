//! Test harness: a real `redis-server` per test, on a free port, killed on drop.
//!
//! The binary comes from `REDIS_SERVER_BIN`, or `redis-server` on `PATH`; a
//! missing binary is a loud failure with the install hint. The server runs with
//! `--save "" --appendonly no`, logs to stdout, which a reader thread copies to
//! `redis.log` in the server's temp dir and into memory for panic messages.
//! Readiness is Redis's own "Ready to accept connections" line, confirmed with
//! one `PING`, so nothing polls or sleeps while waiting for it.
#![allow(dead_code, unreachable_pub)]

pub mod cluster;
pub mod delay;
pub mod http;
pub mod inproc;
pub mod lease;
pub mod limits;
pub mod logs;
pub mod lossy;
pub mod refusal;
pub mod scenarios;
#[cfg(feature = "sentinel")]
pub mod sentinel;
pub mod servers;
pub mod slow_reserve;
pub mod sockets;
pub mod switch;
#[cfg(feature = "tls")]
pub mod tls;

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::Duration,
};

use redis_ratelimit::{Limiter, LimiterBuilder, MemoryStore, Quota, RedisStore};

/// A decide script's reply as the tests read it: the scripts return their
/// flat array of integers packed with `cmsgpack.pack` (one bulk string).
#[derive(Debug, PartialEq, Eq)]
pub struct Reply(pub Vec<i64>);

impl redis::FromRedisValue for Reply {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        let redis::Value::BulkString(bytes) = v else {
            return Err(format!("not a packed reply: {v:?}").into());
        };
        let mut rd = bytes.as_slice();
        let bad = |e: String| redis::ParsingError::from(format!("bad MessagePack: {e}"));
        let len = rmp::decode::read_array_len(&mut rd).map_err(|e| bad(e.to_string()))?;
        let values = (0..len)
            .map(|_| rmp::decode::read_int(&mut rd).map_err(|e| bad(e.to_string())))
            .collect::<Result<_, _>>()?;
        match rd.is_empty() {
            true => Ok(Reply(values)),
            false => Err(bad("trailing bytes".into())),
        }
    }
}

impl Reply {
    /// decide.lua's reply to requests of one limit each (five numbers a
    /// request), as its caller reads it: without its first number, Redis's
    /// clock (µs, or 0 for a call that never read it), and with each reset
    /// in ms, rounded up, where `gcra` says the script gave them in µs.
    pub fn decided(self, gcra: bool) -> Vec<i64> {
        let Some((now, rest)) = self.0.split_first() else {
            panic!("decide.lua replied nothing");
        };
        assert!(
            *now == 0 || *now > 1_600_000_000_000_000,
            "not Redis's clock in µs: {now} ({:?})",
            self.0
        );
        let mut rest = rest.to_vec();
        if gcra {
            for request in rest.chunks_mut(5) {
                request[3] = (request[3] + 999).div_euclid(1000);
            }
        }
        rest
    }
}

/// A script's invocation on `keys` with `argv`, for tests that call a
/// script directly.
pub fn invocation<'a>(
    script: &'a redis::Script,
    keys: &[&str],
    argv: &[&str],
) -> redis::ScriptInvocation<'a> {
    let mut call = script.prepare_invoke();
    for k in keys {
        call.key(*k);
    }
    call.arg(argv);
    call
}

/// `good`'s arguments with one spoiled at a time: for each `(i, spoiled)`,
/// a copy of `good` whose argument `i` is `spoiled`.
pub fn spoiled<'a>(good: &[&'a str], spoils: &[(usize, &'a str)]) -> Vec<Vec<&'a str>> {
    spoils
        .iter()
        .map(|&(i, spoiled)| {
            let mut argv = good.to_vec();
            argv[i] = spoiled;
            argv
        })
        .collect()
}

/// Calls `script` with each of `bad` (its `ARGV`) on `keys`: every call must
/// be refused, and write no key (none of `keys` exists, and the number of
/// keys is as it was).
pub async fn assert_refused(
    conn: &mut redis::aio::MultiplexedConnection,
    script: &redis::Script,
    keys: &[&str],
    bad: &[Vec<&str>],
) {
    let dbsize = || redis::cmd("DBSIZE");
    let before: usize = dbsize().query_async(conn).await.unwrap();
    for argv in bad {
        let r: redis::RedisResult<Reply> = invocation(script, keys, argv).invoke_async(conn).await;
        assert!(r.is_err(), "{argv:?} accepted: {r:?}");
    }
    for key in keys {
        let exists: bool = redis::AsyncCommands::exists(conn, *key).await.unwrap();
        assert!(!exists, "a refused call wrote {key}");
    }
    let after: usize = dbsize().query_async(conn).await.unwrap();
    assert_eq!(after, before, "a refused call wrote a key");
}

/// The store timeout of the harness's limiters. Tests run in parallel on a
/// loaded machine (2 cores in CI), where the 200 ms default would test the
/// machine rather than the code; tests about timeouts set their own.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(2);

/// A `redis-server` owned by one test.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    log: Arc<Mutex<String>>,
    /// Arguments after the harness's own, kept for restarts.
    args: Vec<String>,
    /// What kind of server this is.
    kind: Kind,
}

/// What a [`RedisServer`] runs as.
#[derive(Clone)]
enum Kind {
    /// A plain Redis on `port`.
    Plain,
    /// A Redis whose `port` is its TLS port (`--tls-port`), with no plain port.
    Tls,
    /// A sentinel, from the configuration file at this path.
    Sentinel(std::path::PathBuf),
    /// A sentinel whose `port` is its TLS port, with no plain port.
    TlsSentinel(std::path::PathBuf),
}

fn binary() -> String {
    std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free local port")
}

enum Started {
    Ready(Child),
    PortTaken,
}

impl RedisServer {
    /// Starts a server on a free port, retrying if another process took it.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments
    /// (`["--requirepass", "secret"]`, `["--replicaof", ...]`), kept across
    /// restarts.
    pub fn start_with(args: &[&str]) -> Self {
        Self::start_as(Kind::Plain, args, |_| {})
    }

    /// A server that speaks TLS only, on [`port`](Self::port): `args` must
    /// name its certificate files (`--tls-cert-file`, ...; see `tls.rs`).
    /// Its [`url`](Self::url) is `rediss://`; the harness's own helpers
    /// (`conn`, `store`, ...) speak plain Redis and do not work on it.
    pub fn start_tls(args: &[&str]) -> Self {
        Self::start_as(Kind::Tls, args, |_| {})
    }

    /// A sentinel (`redis-server <conf> --sentinel`) whose configuration file
    /// holds `conf` (the sentinel rewrites it, so each has its own).
    pub fn start_sentinel(conf: &str) -> Self {
        Self::sentinel_as(conf, false, &[])
    }

    /// Like [`start_sentinel`](Self::start_sentinel), speaking TLS only on
    /// its port, with `args` (the certificates: see `tls::Pki::sentinel`).
    #[cfg(feature = "tls")]
    pub fn start_tls_sentinel(conf: &str, args: &[&str]) -> Self {
        Self::sentinel_as(conf, true, args)
    }

    fn sentinel_as(conf: &str, tls: bool, args: &[&str]) -> Self {
        let conf = conf.to_owned();
        let args = [&["--sentinel"], args].concat();
        Self::start_as(Kind::Sentinel(Default::default()), &args, move |server| {
            let path = server.dir.path().join("sentinel.conf");
            std::fs::write(&path, &conf).expect("write sentinel.conf");
            server.kind = match tls {
                true => Kind::TlsSentinel(path),
                false => Kind::Sentinel(path),
            };
        })
    }

    fn start_as(kind: Kind, args: &[&str], prepare: impl FnOnce(&mut Self)) -> Self {
        let mut server = Self {
            child: None,
            port: 0,
            dir: tempfile::tempdir().expect("temp dir for redis-server"),
            log: Arc::new(Mutex::new(String::new())),
            args: args.iter().map(|a| a.to_string()).collect(),
            kind,
        };
        prepare(&mut server);
        for _ in 0..10 {
            server.port = free_port();
            if let Started::Ready(child) = server.spawn() {
                server.child = Some(child);
                return server;
            }
        }
        panic!("could not find a free port for redis-server after 10 tries");
    }

    fn spawn(&self) -> Started {
        let port = self.port.to_string();
        let mut command = Command::new(binary());
        match &self.kind {
            Kind::Plain => command.args(["--port", &port]),
            Kind::Tls => command.args(["--tls-port", &port, "--port", "0"]),
            Kind::Sentinel(conf) => command.arg(conf).args(["--port", &port]),
            Kind::TlsSentinel(conf) => command.arg(conf).args(["--tls-port", &port, "--port", "0"]),
        };
        let mut child = command
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", self.dir.path().to_str().expect("utf-8 temp dir")])
            .args(["--logfile", ""])
            .args(&self.args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run `{}` ({e}). The tests need a real redis-server: \
                     install it (Debian/Ubuntu: apt-get install -y redis-server; \
                     macOS: brew install redis) or set REDIS_SERVER_BIN",
                    binary()
                )
            });
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        let log = self.log.clone();
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("redis.log"))
            .expect("redis.log");
        let start_of_run = self.log().len();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = writeln!(file, "{line}");
                log.lock().unwrap().push_str(&(line.clone() + "\n"));
                // A sentinel never says "Ready": it is once it monitors.
                if line.contains("Ready to accept connections") || line.contains("+monitor master")
                {
                    let _ = tx.send(true);
                }
            }
            let _ = tx.send(false);
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(true) => {
                // A TLS server's readiness is its "Ready" line alone.
                if !matches!(self.kind, Kind::Tls | Kind::TlsSentinel(_)) {
                    // A server that does not answer is stopped before the
                    // panic: a `Child` is not killed when dropped.
                    let ping = std::panic::AssertUnwindSafe(|| self.ping());
                    if let Err(panic) = std::panic::catch_unwind(ping) {
                        let _ = child.kill();
                        let _ = child.wait();
                        std::panic::resume_unwind(panic);
                    }
                }
                Started::Ready(child)
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                if self.log()[start_of_run..].contains("Address already in use") {
                    Started::PortTaken
                } else {
                    panic!(
                        "redis-server did not start on port {}:\n{}",
                        self.port,
                        self.log()
                    )
                }
            }
        }
    }

    fn ping(&self) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))
            .unwrap_or_else(|e| panic!("connect to redis: {e}\n{}", self.log()));
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"PING\r\n").unwrap();
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf)
            .unwrap_or_else(|e| panic!("PING: {e}\n{}", self.log()));
        // A server started with `--requirepass` answers `-NOAUTH ...`.
        assert!(
            &buf == b"+PONG\r\n" || buf.starts_with(b"-NOAUTH"),
            "PING answered oddly\n{}",
            self.log()
        );
    }

    /// `redis://127.0.0.1:<port>` (`rediss://` for a TLS server).
    pub fn url(&self) -> String {
        let scheme = match self.kind {
            Kind::Tls | Kind::TlsSentinel(_) => "rediss",
            _ => "redis",
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Everything the server logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) the server: a Redis that
    /// accepts connections but never answers.
    pub fn freeze(&self, frozen: bool) {
        let pid = self.child.as_ref().expect("server is running").id();
        let signal = if frozen { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// Starts the server again on the same port, with an empty dataset.
    pub fn restart(&mut self) {
        self.kill();
        match self.spawn() {
            Started::Ready(child) => self.child = Some(child),
            Started::PortTaken => panic!("port {} was taken during restart", self.port),
        }
    }

    /// A fresh connection for inspecting or tampering with keys.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("connect: {e}\n{}", self.log()))
    }

    /// A new `RedisStore` (its own `ConnectionManager`) on this server.
    pub async fn store(&self) -> RedisStore {
        RedisStore::connect(self.url())
            .await
            .unwrap_or_else(|e| panic!("RedisStore::connect: {e}\n{}", self.log()))
    }

    /// Adds the ACL user `name` with `password`, every key and every command
    /// but `denied` (e.g. `"quit"`); returns this server's URL as that user.
    pub async fn acl_user_without(&self, name: &str, password: &str, denied: &str) -> String {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(name)
            .arg("on")
            .arg(format!(">{password}"))
            .arg("~*")
            .arg("+@all")
            .arg(format!("-{denied}"))
            .query_async(&mut self.conn().await)
            .await
            .unwrap_or_else(|e| panic!("ACL SETUSER: {e}\n{}", self.log()));
        format!("redis://{name}:{password}@127.0.0.1:{}", self.port())
    }

    /// A new `RedisStore` on this server without the startup check
    /// (`connect_lazy`): for a server the check refuses, such as a
    /// read-only replica, where a test wants the refusals of later calls.
    pub fn lazy_store(&self) -> RedisStore {
        RedisStore::connect_lazy(self.url())
            .unwrap_or_else(|e| panic!("RedisStore::connect_lazy: {e}\n{}", self.log()))
    }

    /// A limiter for `quota` on a new `RedisStore` of this server.
    pub async fn limiter(&self, quota: &str) -> Limiter {
        Limiter::builder(quota.parse().unwrap())
            .store(self.store().await)
            .timeout(TEST_TIMEOUT)
            .build()
            .unwrap()
    }

    /// A new `RedisStore` over a bb8 pool of `size` connections.
    pub async fn pool_store(&self, size: u32) -> RedisStore {
        pool_store(&self.url(), size, || self.log()).await
    }

    /// Every key with its PTTL (`-1` means no TTL).
    pub async fn keys_with_ttl(&self) -> Vec<(String, i64)> {
        let mut conn = self.conn().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut conn)
            .await
            .unwrap();
        let mut out = Vec::new();
        for key in keys {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            out.push((key, ttl));
        }
        out
    }

    /// `EVALSHA` plus `EVAL` calls since the server started or the last
    /// [`reset_stats`](Self::reset_stats), from `INFO commandstats`.
    pub async fn script_calls(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.conn().await)
            .await
            .unwrap();
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// `CONFIG RESETSTAT`: command statistics start from zero.
    pub async fn reset_stats(&self) {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut self.conn().await)
            .await
            .unwrap();
    }

    /// Holds the server in `LOADING`, as after a restart with data on disk:
    /// writes `keys` keys, then reloads them (`DEBUG RELOAD`, so the server
    /// must be started with `--enable-debug-command yes`) at about `micros`
    /// µs a key (`key-load-delay`), answering other clients meanwhile.
    /// Returns once the server is loading; the task ends when it has loaded.
    pub async fn reload_slowly(&self, keys: u32, micros: u32) -> tokio::task::JoinHandle<()> {
        let mut conn = self.conn().await;
        let fill = "for i = 1, ARGV[1] do redis.call('SET', 'filler:' .. i, 'x') end";
        let _: () = redis::cmd("EVAL")
            .arg(fill)
            .arg(0)
            .arg(keys)
            .query_async(&mut conn)
            .await
            .unwrap();
        for (name, value) in [
            ("key-load-delay", micros),
            // Serve other clients every KiB of the file, not every 2 MiB.
            ("loading-process-events-interval-bytes", 1024),
        ] {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg(name)
                .arg(value)
                .query_async(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("CONFIG SET {name}: {e}\n{}", self.log()));
        }
        let reload = tokio::spawn(async move {
            let _: redis::RedisResult<()> = redis::cmd("DEBUG")
                .arg("RELOAD")
                .query_async(&mut conn)
                .await;
        });
        let mut watcher = self.conn().await;
        for _ in 0..500 {
            let info: String = redis::cmd("INFO")
                .arg("persistence")
                .query_async(&mut watcher)
                .await
                .unwrap();
            if info.lines().any(|l| l == "loading:1") {
                return reload;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the server never started loading\n{}", self.log());
    }

    /// Panics, with the server log, if any key has no TTL.
    pub async fn assert_every_key_has_ttl(&self) {
        for (key, ttl) in self.keys_with_ttl().await {
            assert!(ttl != -1, "key {key} has no TTL\n{}", self.log());
        }
    }
}

/// A new `RedisStore` over a bb8 pool of `size` connections to `url` (a
/// server, or a proxy to one); `log` gives the server's log for the panic
/// message.
pub async fn pool_store(url: &str, size: u32, log: impl Fn() -> String) -> RedisStore {
    let manager = bb8_redis::RedisConnectionManager::new(url).unwrap();
    // As `RedisStore::from_pool` recommends: no PING on checkout.
    let pool = bb8::Pool::builder()
        .max_size(size)
        .test_on_check_out(false)
        .build(manager)
        .await
        .unwrap_or_else(|e| panic!("bb8 pool: {e}\n{}", log()));
    RedisStore::from_pool(pool)
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The three ways a limiter can store counters, for tests that run against
/// each of them.
pub enum Backend {
    /// In-process.
    Memory(MemoryStore),
    /// Redis through a `ConnectionManager` (or a bb8 pool).
    Redis(RedisServer, RedisStore),
}

impl Backend {
    pub fn memory() -> Self {
        Backend::Memory(MemoryStore::new())
    }

    pub async fn redis() -> Self {
        let server = RedisServer::start();
        let store = server.store().await;
        Backend::Redis(server, store)
    }

    pub async fn redis_pool() -> Self {
        let server = RedisServer::start();
        let store = server.pool_store(8).await;
        Backend::Redis(server, store)
    }

    /// A builder on this backend's store.
    pub fn builder(&self, quota: &str) -> LimiterBuilder {
        self.builder_for(quota.parse().unwrap())
    }

    /// A builder for `quota` (with its algorithm) on this backend's store.
    pub fn builder_for(&self, quota: Quota) -> LimiterBuilder {
        let builder = Limiter::builder(quota).timeout(TEST_TIMEOUT);
        match self {
            Backend::Memory(m) => builder.store(m.clone()),
            Backend::Redis(_, r) => builder.store(r.clone()),
        }
    }

    /// A limiter on this backend's store.
    pub fn limiter(&self, quota: &str) -> Limiter {
        self.builder(quota).build().unwrap()
    }

    /// A second limiter counting against the same counters through a separate
    /// connection, as another replica would.
    pub async fn other_replica(&self, quota: &str) -> Limiter {
        let quota: Quota = quota.parse().unwrap();
        let builder = Limiter::builder(quota).timeout(TEST_TIMEOUT);
        match self {
            Backend::Memory(m) => builder.store(m.clone()),
            Backend::Redis(server, _) => builder.store(server.store().await),
        }
        .share_counters()
        .build()
        .unwrap()
    }

    pub fn server(&self) -> Option<&RedisServer> {
        match self {
            Backend::Memory(_) => None,
            Backend::Redis(s, _) => Some(s),
        }
    }
}

#[allow(unused_macros)]
/// Runs each named scenario `async fn(Backend)` against every store: in
/// memory, Redis through a `ConnectionManager`, and Redis through a bb8 pool.
macro_rules! for_every_store {
    ($($scenario:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test] async fn $scenario() {
                super::$scenario(crate::support::Backend::memory()).await
            })*
        }
        mod redis_manager {
            $(#[tokio::test] async fn $scenario() {
                super::$scenario(crate::support::Backend::redis().await).await
            })*
        }
        mod redis_bb8_pool {
            $(#[tokio::test] async fn $scenario() {
                super::$scenario(crate::support::Backend::redis_pool().await).await
            })*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use for_every_store;
