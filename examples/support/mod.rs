//! What the example servers (`axum.rs`, `hyper.rs`, `actix.rs`, `tonic.rs`) share: configuration from
//! the environment, the rate-limit layer it describes, the listener, logging
//! and shutdown. Each example only builds its own server around [`setup`].
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `BIND` | `127.0.0.1:3000` | address to listen on (port 0 picks a free one); `[::]:port` is dual-stack (IPv4 clients too) whatever the system's default |
//! | `REDIS_URL` | unset: in-memory store | counters in Redis, e.g. `redis://127.0.0.1:6379/0`, or over a local Redis's Unix socket, `unix:///run/redis/redis.sock` |
//! | `REDIS_CLUSTER_URLS` | unset | counters in a Redis Cluster instead: seed node URLs separated by commas, e.g. `redis://10.0.0.1:7000,redis://10.0.0.2:7000`; needs the `cluster` feature, and not with `REDIS_URL` |
//! | `REDIS_SENTINEL_URLS` | unset | counters on the master that Redis Sentinel names instead, followed across failovers: sentinel URLs separated by commas, e.g. `redis://10.0.0.1:26379,redis://10.0.0.2:26379` (`rediss://` ones, all of them, reach the master over TLS too); needs the `sentinel` feature and `REDIS_SENTINEL_MASTER`, and not with `REDIS_URL`, `REDIS_CLUSTER_URLS` or `REDIS_POOL` |
//! | `REDIS_SENTINEL_MASTER` | unset | with `REDIS_SENTINEL_URLS`: the master's name in the sentinels' configuration, e.g. `mymaster` |
//! | `RATE_LIMIT_MEMORY_MAX_KEYS` | `1000000` | in-memory store only: the most keys it holds; new keys are denied (429) while it is full (see `MemoryStore`) |
//! | `REDIS_POOL` | unset: one multiplexed connection | with `REDIS_URL` or `REDIS_CLUSTER_URLS`: a bb8 pool of this many connections |
//! | `RATE_LIMIT` | `100/1s` | quota `<count>/<window>` (`5/500ms`, `1000/1h`); several separated by `;` (`10/1s;1000/1d`), all decided at once; or `off` for no limiter (then a variable of how to limit, such as `RATE_LIMIT_TIERS`, is refused) |
//! | `RATE_LIMIT_ALGORITHM` | `fixed-window` | `fixed-window`, `sliding-window` or `gcra`, for every quota |
//! | `RATE_LIMIT_BURST` | the quota's count | with `gcra`: requests admitted at once |
//! | `RATE_LIMIT_DENY_CACHE` | `on` | `off` sends every denial to the store (see `Limiter`'s deny cache) |
//! | `RATE_LIMIT_SHADOW` | `off` | `on`: dry run, decisions are made and reported but nothing is denied |
//! | `RATE_LIMIT_RESERVE` | unset: off | Redis only (refused without one), one `fixed-window` quota: reserve up to this many units of a key (1 to 2^50, `MAX_LIMIT`) per Redis call and admit from them in process (`LimiterBuilder::local_reservation`), for hot keys; never over-admits, and may under-admit by at most `n` units per instance and window (`n` its value; beyond it only the cost of a request that left before its reserve call answered) |
//! | `RATE_LIMIT_RESERVE_KEYS` | unset: 10000 | with `RATE_LIMIT_RESERVE`: how many keys may hold a reservation at once (`LimiterBuilder::local_reservation_keys`, 1 to 10000000, about 300 bytes each); size it to the keys hit again within a window |
//! | `RATE_LIMIT_KEY` | `ip` | `ip` (peer address), `client-ip` (the client behind trusted proxies, see below) or `header:<name>` (e.g. `header:x-api-key`) |
//! | `TRUSTED_PROXIES` | unset: none | with `client-ip`: proxies whose forwarding headers are believed, as addresses or CIDR ranges separated by commas, e.g. `10.0.0.0/8,::1` |
//! | `TRUSTED_HOPS` | unset | with `client-ip`: trust this many proxies in front of the server whatever their addresses (the client is the entry the n-th appended), 1 to 32 |
//! | `FORWARDED_HEADER` | `x-forwarded-for` | with `client-ip`: the header read, `x-forwarded-for`, `forwarded` or `x-real-ip` |
//! | `RATE_LIMIT_ON_ERROR` | `allow` | when the store fails: `allow` the request or `deny` it (503) |
//! | `RATE_LIMIT_TIERS` | unset: one tier | named tiers with their own quota, `<name>=<quota>` separated by `;`, e.g. `free=3/60s;pro=8/60s`; the tier header picks one, and a request without it, or naming no tier, gets `RATE_LIMIT`; every tier uses `RATE_LIMIT_ALGORITHM`, `RATE_LIMIT_BURST`, `RATE_LIMIT_DENY_CACHE` and `RATE_LIMIT_SHADOW`, and its `RateLimit` headers show its name and quota |
//! | `RATE_LIMIT_TIER_HEADER` | `x-plan` | with `RATE_LIMIT_TIERS`: the request header naming the tier (clients send it: only behind a gateway that overwrites it is a tier more than the client's choice) |
//! | `RATE_LIMIT_SKIP` | unset: none | clients never limited (no store call, no rate-limit headers), as addresses or CIDR ranges separated by commas, e.g. `127.0.0.0/8,::1`; matched on the client the key is made from: the peer for `ip` and `header:<name>`, the client behind `TRUSTED_PROXIES`/`TRUSTED_HOPS` for `client-ip`; one that overlaps `TRUSTED_PROXIES` is refused |
//! | `RATE_LIMIT_REFUND` | unset: none | give a request's cost back when its response is one of `server-errors` (5xx but 501 and 505; on gRPC not `UNIMPLEMENTED` or `DEADLINE_EXCEEDED`), `client-errors` (4xx) or `successes` (2xx); in the tonic example by `grpc-status`, at the head or in the trailers (`refund::TrailersLayer`) |
//! | `RUST_LOG` | `info` | tracing filter |
//!
//! Every Redis URL may be `rediss://` (TLS, checked against the system's
//! trust store; `rediss://host:port/#insecure` skips the check, for tests)
//! when the example is built with the `tls` feature.
//!
//! Every example but tonic answers `GET /` with `ok` and `GET /status/<code>`
//! with that status (200 to 599; any other code: 400), to try refunds.
//!
//! A bad value stops the server with a message naming the variable (exit
//! status 2); a Redis that cannot be reached at startup exits with status 1.

use std::{
    env, fmt,
    future::{Future, IntoFuture},
    net::SocketAddr,
    pin::Pin,
    process::ExitCode,
    time::Duration,
};

use futures_util::future::{FutureExt, Shared};

use ipnet::IpNet;

use http::HeaderName;
use redis::IntoConnectionInfo;
use redis_ratelimit::{
    MemoryStore, OnStoreError,
    key::{self, Key, KeyError, KeyExtractor, RequestInfo},
    skip,
};
use tokio::net::TcpListener;

pub use self::policy::Layer;
use self::{
    limits::Limits,
    policy::Policy,
    store::{AnyStore, connect, connect_cluster, connect_sentinel},
};

mod limits;
mod policy;
mod store;

/// What the examples serve with: a bound listener and, unless
/// `RATE_LIMIT=off`, the rate-limit layer.
pub struct Setup {
    pub listener: TcpListener,
    pub layer: Option<Layer>,
    /// Resolves on ctrl-c or SIGTERM: watched from before the startup line,
    /// so a signal sent once it is logged is never missed.
    pub shutdown: Shutdown,
}

/// [`Setup::shutdown`]: a future every clone of which resolves once the
/// signal has come.
pub type Shutdown = Shared<Pin<Box<dyn Future<Output = ()> + Send>>>;

/// How long an example, once signalled, goes on finishing its open
/// requests. Then it exits, closing what is still open: a client that
/// never reads its answers, or a gRPC stream that never ends, cannot keep
/// the process from stopping.
pub const DRAIN: Duration = Duration::from_secs(10);

/// Awaits `serving`, a server that stops gracefully on `shutdown` too,
/// giving it at most [`DRAIN`] from the signal to finish its open
/// requests.
#[allow(dead_code)] // not by hyper, which drains its own connections
pub async fn drained<E>(
    serving: impl IntoFuture<Output = Result<(), E>>,
    shutdown: Shutdown,
) -> Result<(), E> {
    let serving = serving.into_future();
    tokio::pin!(serving);
    tokio::select! {
        served = &mut serving => return served,
        () = shutdown => {}
    }
    within_drain(serving).await.unwrap_or(Ok(()))
}

/// Awaits `draining` for at most [`DRAIN`]: `None`, and a warning, if it
/// has not ended by then.
#[allow(dead_code)] // not by actix-web, which has its own timeout
pub async fn within_drain<F: Future>(draining: F) -> Option<F::Output> {
    let drained = tokio::time::timeout(DRAIN, draining).await.ok();
    if drained.is_none() {
        tracing::warn!("requests still open after {DRAIN:?}: exiting anyway");
    }
    drained
}

/// Reads the environment, connects the store, binds the listener and logs
/// the startup line.
pub async fn setup() -> Result<Setup, Error> {
    let config = Config::from_env()?;
    let (layer, limiting) = match &config.rate_limit {
        Some(l) => {
            let (layer, store) = l.layer(&config.policy).await?;
            let text = format!(
                "store: {store}; limit: {}; key: {}; on store error: {}{}",
                l.limits, l.key, l.on_error_name, config.policy
            );
            (Some(layer), text)
        }
        None => (None, "rate limiting off: RATE_LIMIT=off".to_owned()),
    };
    let listener = listen(config.bind)
        .map_err(|e| Error::runtime(format!("cannot listen on BIND={}: {e}", config.bind)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::runtime(e.to_string()))?;
    let shutdown = shutdown_signal();
    tracing::info!("listening on {addr} ({limiting})");
    Ok(Setup {
        listener,
        layer,
        shutdown,
    })
}

/// Binds `addr` as tokio's `TcpListener::bind` does (`SO_REUSEADDR` off
/// Windows, a backlog of 1024), but an IPv6 address is dual-stack
/// explicitly (`IPV6_V6ONLY` off): `[::]:port` takes IPv4 clients too,
/// whatever the system's default (Linux's `net.ipv6.bindv6only`; some BSDs
/// default to IPv6 only).
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // Best effort: a system that refuses dual-stack sockets (OpenBSD) still
    // listens on IPv6, and says so.
    if addr.is_ipv6()
        && let Err(e) = socket.set_only_v6(false)
    {
        tracing::warn!("BIND={addr}: IPv6 only, this system refused a dual-stack socket: {e}");
    }
    #[cfg(not(windows))]
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// The status `GET /status/<code>` answers with: `code` if it is a number
/// from 200 to 599, else 400.
#[allow(dead_code)]
pub fn status(code: &str) -> http::StatusCode {
    code.parse::<u16>()
        .ok()
        .filter(|c| (200..=599).contains(c))
        .and_then(|c| http::StatusCode::from_u16(c).ok())
        .unwrap_or(http::StatusCode::BAD_REQUEST)
}

/// Logs with `tracing-subscriber`, filtered by `RUST_LOG` (default `info`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
}

/// Resolves on ctrl-c or, on Unix, SIGTERM (a signal that cannot be
/// watched is never received): every example then finishes its open
/// requests, for up to [`DRAIN`], and exits with status 0, actix-web's too (`actix.rs` turns
/// actix-web's own signal handling off, which stopped at once on ctrl-c).
/// The signals are watched from this call on, not from the first poll.
fn shutdown_signal() -> Shutdown {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let (int, term) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        );
        let signalled: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move {
            let which = match (int, term) {
                (Ok(mut int), Ok(mut term)) => tokio::select! {
                    _ = int.recv() => "ctrl-c",
                    _ = term.recv() => "SIGTERM",
                },
                (Ok(mut int), Err(_)) => {
                    int.recv().await;
                    "ctrl-c"
                }
                (Err(_), Ok(mut term)) => {
                    term.recv().await;
                    "SIGTERM"
                }
                (Err(_), Err(_)) => std::future::pending().await,
            };
            tracing::info!("{which}: finishing open requests, then exiting (within {DRAIN:?})");
        });
        signalled.shared()
    }
    #[cfg(not(unix))]
    {
        let signalled: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
            tracing::info!("ctrl-c: finishing open requests, then exiting (within {DRAIN:?})");
        });
        signalled.shared()
    }
}

/// Turns the server's result into the process exit status, printing the
/// error (not a panic backtrace) if there is one.
pub fn report(result: Result<(), Error>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.message);
            ExitCode::from(e.status)
        }
    }
}

/// Why the server did not start or stopped: a message that says what to fix.
#[derive(Debug)]
pub struct Error {
    message: String,
    status: u8,
}

impl Error {
    /// A variable with a bad value (exit status 2).
    fn config(var: &str, value: &str, fix: impl fmt::Display) -> Self {
        Self::usage(format!("{var}={value:?} is invalid: {fix}"))
    }

    /// A bad combination of variables, or a value best not echoed (exit
    /// status 2).
    pub fn usage(message: String) -> Self {
        Self { message, status: 2 }
    }

    /// A failure that is not a bad variable (exit status 1).
    fn runtime(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            status: 1,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Self::runtime(e.to_string())
    }
}

/// The key extractor picked by `RATE_LIMIT_KEY`.
#[derive(Debug, Clone)]
pub enum KeyBy {
    PeerIp(key::PeerIp),
    ClientIp(key::ClientIp),
    Header(key::Header),
}

impl<R: RequestInfo> KeyExtractor<R> for KeyBy {
    fn extract(&self, req: &R) -> Result<Key, KeyError> {
        match self {
            KeyBy::PeerIp(k) => k.extract(req),
            KeyBy::ClientIp(k) => k.extract(req),
            KeyBy::Header(k) => k.extract(req),
        }
    }
}

impl fmt::Display for KeyBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyBy::PeerIp(_) => f.write_str("ip"),
            KeyBy::ClientIp(k) => k.fmt(f),
            KeyBy::Header(h) => write!(f, "header:{}", h.name()),
        }
    }
}

struct Config {
    bind: SocketAddr,
    policy: Policy,
    /// `None` for `RATE_LIMIT=off`.
    rate_limit: Option<Limiting>,
}

struct Limiting {
    limits: Limits,
    key: KeyBy,
    on_error: OnStoreError,
    on_error_name: &'static str,
    backend: Backend,
}

enum Backend {
    Memory {
        max_keys: usize,
    },
    Redis {
        url: String,
        /// `host:port`, for the startup line (the URL may hold a password).
        addr: String,
        pool: Option<u32>,
    },
    Cluster {
        urls: Vec<String>,
        /// `host:port, ...`, for the startup line.
        addrs: String,
        pool: Option<u32>,
    },
    Sentinel {
        urls: Vec<String>,
        master: String,
        /// `host:port, ...`, for the startup line.
        addrs: String,
    },
}

/// `REDIS_CLUSTER_URLS` in an example built without the feature.
const NO_CLUSTER_FEATURE: &str = "REDIS_CLUSTER_URLS is set, but this example was built without \
     the `cluster` feature: run it with `--features cluster` (e.g. `cargo run --features cluster \
     --example axum`), or use REDIS_URL for a single Redis";

/// `REDIS_SENTINEL_URLS` in an example built without the feature.
const NO_SENTINEL_FEATURE: &str = "REDIS_SENTINEL_URLS is set, but this example was built without \
     the `sentinel` feature: run it with `--features sentinel` (e.g. `cargo run --features \
     sentinel --example axum`)";

/// Splits a comma-separated list of URLs from `var`, checking each; also
/// returns their `host:port`s for the startup line.
fn url_list(var: &str, list: &str, fix: &str) -> Result<(Vec<String>, String), Error> {
    let urls: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    if urls.is_empty() {
        return Err(Error::config(var, list, fix));
    }
    let addrs = urls
        .iter()
        .map(|u| redis_addr(var, u))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((urls, addrs.join(", ")))
}

/// What redis-rs's cluster client refuses before it reaches any node (a
/// Unix socket; seeds whose password, username, TLS, protocol or database
/// differ), refused here as a bad value (exit status 2), not when the
/// store connects, as if the cluster were down (status 1). Not echoed: the
/// URLs may hold a password.
fn cluster_seeds_agree(urls: &[String]) -> Result<(), Error> {
    #[cfg(feature = "cluster")]
    if let Err(e) = redis::cluster::ClusterClient::new(urls.to_vec()) {
        return Err(Error::usage(format!(
            "REDIS_CLUSTER_URLS is invalid: {e}; list TCP seed nodes that share one password, \
             username, scheme and database, such as redis://10.0.0.1:7000,redis://10.0.0.2:7000"
        )));
    }
    #[cfg(not(feature = "cluster"))]
    let _ = urls;
    Ok(())
}

/// The sentinel backend, if `REDIS_SENTINEL_URLS` is set; `None` leaves the
/// other Redis variables to decide.
fn sentinel_backend(
    redis_set: bool,
    pool_set: bool,
    max_keys_set: bool,
) -> Result<Option<Backend>, Error> {
    let urls = var("REDIS_SENTINEL_URLS")?;
    let master = var("REDIS_SENTINEL_MASTER")?;
    let Some(list) = urls else {
        return match master {
            Some(_) => Err(Error::usage(
                "REDIS_SENTINEL_MASTER is set but REDIS_SENTINEL_URLS is not: set the sentinels' \
                 URLs too, or unset REDIS_SENTINEL_MASTER"
                    .into(),
            )),
            None => Ok(None),
        };
    };
    let conflict = if redis_set {
        Some("REDIS_URL or REDIS_CLUSTER_URLS: set only one way to reach Redis")
    } else if pool_set {
        Some("REDIS_POOL: a sentinel store uses one multiplexed connection; unset REDIS_POOL")
    } else if max_keys_set {
        Some("RATE_LIMIT_MEMORY_MAX_KEYS: it bounds the in-memory store only; unset it")
    } else {
        None
    };
    if let Some(conflict) = conflict {
        return Err(Error::usage(format!(
            "REDIS_SENTINEL_URLS is set, and so is {conflict}"
        )));
    }
    if !cfg!(feature = "sentinel") {
        return Err(Error::usage(NO_SENTINEL_FEATURE.into()));
    }
    let Some(master) = master else {
        return Err(Error::usage(
            "REDIS_SENTINEL_URLS is set but REDIS_SENTINEL_MASTER is not: set it to the master's \
             name in the sentinels' configuration, such as mymaster"
                .into(),
        ));
    };
    let fix = "list sentinel URLs separated by commas, such as \
               redis://10.0.0.1:26379,redis://10.0.0.2:26379";
    let (urls, addrs) = url_list("REDIS_SENTINEL_URLS", &list, fix)?;
    let tls = urls.iter().filter(|u| u.starts_with("rediss://")).count();
    if tls != 0 && tls != urls.len() {
        // Refused by `RedisStore::sentinel` too, but as a startup error
        // (status 1), as if the sentinels were down.
        return Err(Error::usage(
            "REDIS_SENTINEL_URLS mixes rediss:// (TLS) and redis:// URLs: give every sentinel \
             the same scheme (the master is reached over TLS if the sentinels are)"
                .into(),
        ));
    }
    Ok(Some(Backend::Sentinel {
        urls,
        master: master.trim().to_owned(),
        addrs,
    }))
}

impl Config {
    /// Parses every variable, so a typo is reported even where it would not
    /// matter (say, `REDIS_POOL` with `RATE_LIMIT=off`).
    fn from_env() -> Result<Self, Error> {
        let bind = var("BIND")?.unwrap_or_else(|| "127.0.0.1:3000".into());
        let bind = bind.parse().map_err(|_| {
            Error::config(
                "BIND",
                &bind,
                "use host:port, such as 127.0.0.1:3000 or 0.0.0.0:8080",
            )
        })?;
        let pool = var("REDIS_POOL")?;
        let pool_size = pool.as_deref().map(parse_pool).transpose()?;
        let max_keys = var("RATE_LIMIT_MEMORY_MAX_KEYS")?;
        let max_keys_set = max_keys.is_some();
        let max_keys = max_keys.as_deref().map(parse_max_keys).transpose()?;
        let (redis_url, cluster_urls) = (var("REDIS_URL")?, var("REDIS_CLUSTER_URLS")?);
        let redis_set = redis_url.is_some() || cluster_urls.is_some();
        let sentinel = sentinel_backend(redis_set, pool.is_some(), max_keys_set)?;
        let backend = match (redis_url, cluster_urls, pool) {
            _ if sentinel.is_some() => sentinel.expect("just checked"),
            (Some(_), Some(_), _) => {
                return Err(Error::usage(
                    "REDIS_URL and REDIS_CLUSTER_URLS are both set: set REDIS_URL for one Redis \
                     or REDIS_CLUSTER_URLS for a Redis Cluster, not both"
                        .into(),
                ));
            }
            (None, None, None) => Backend::Memory {
                max_keys: max_keys.unwrap_or(MemoryStore::DEFAULT_MAX_KEYS),
            },
            (Some(_), _, _) | (_, Some(_), _) if max_keys_set => {
                return Err(Error::usage(
                    "RATE_LIMIT_MEMORY_MAX_KEYS is set but so is REDIS_URL or \
                     REDIS_CLUSTER_URLS: it bounds the in-memory store only; unset it, or unset \
                     the Redis variables"
                        .into(),
                ));
            }
            (None, None, Some(_)) => {
                return Err(Error::usage(
                    "REDIS_POOL is set but neither REDIS_URL nor REDIS_CLUSTER_URLS is: set one \
                     of them too, or unset REDIS_POOL"
                        .into(),
                ));
            }
            (Some(url), None, _) => Backend::Redis {
                addr: redis_addr("REDIS_URL", &url)?,
                url,
                pool: pool_size,
            },
            (None, Some(_), _) if !cfg!(feature = "cluster") => {
                return Err(Error::usage(NO_CLUSTER_FEATURE.into()));
            }
            (None, Some(list), _) => {
                let fix = "list seed node URLs separated by commas, such as \
                           redis://10.0.0.1:7000,redis://10.0.0.2:7000";
                let (urls, addrs) = url_list("REDIS_CLUSTER_URLS", &list, fix)?;
                cluster_seeds_agree(&urls)?;
                Backend::Cluster {
                    urls,
                    addrs,
                    pool: pool_size,
                }
            }
        };
        let limits = Limits::from_env()?;
        if limits.is_none() {
            no_effect_when_off()?;
        }
        if matches!(backend, Backend::Memory { .. })
            && limits.as_ref().is_some_and(Limits::reserves)
        {
            return Err(Error::usage(
                "RATE_LIMIT_RESERVE is set but no Redis is: a reservation saves Redis calls, and \
                 the in-memory store makes none; set REDIS_URL too, or unset RATE_LIMIT_RESERVE"
                    .into(),
            ));
        }
        let key = parse_key(var("RATE_LIMIT_KEY")?.as_deref().unwrap_or("ip"))?;
        let key = client_ip_settings(key)?;
        let on_error = var("RATE_LIMIT_ON_ERROR")?.unwrap_or_else(|| "allow".into());
        let (on_error, on_error_name) = match on_error.to_ascii_lowercase().as_str() {
            "allow" => (OnStoreError::Allow, "allow"),
            "deny" => (OnStoreError::Deny, "deny"),
            _ => {
                let fix = "use `allow` (let requests through) or `deny` (answer 503)";
                return Err(Error::config("RATE_LIMIT_ON_ERROR", &on_error, fix));
            }
        };
        let policy = Policy::from_env(limits.as_ref())?;
        skip_apart_from_proxies()?;
        Ok(Self {
            bind,
            policy,
            rate_limit: limits.map(|limits| Limiting {
                limits,
                key,
                on_error,
                on_error_name,
                backend,
            }),
        })
    }
}

impl Limiting {
    /// Connects the store and builds the layer; also describes the store for
    /// the startup line.
    async fn layer(&self, policy: &Policy) -> Result<(Layer, String), Error> {
        let (store, described) = match &self.backend {
            Backend::Memory { max_keys } => (
                AnyStore::Memory(MemoryStore::with_max_keys(*max_keys)),
                format!(
                    "in-memory (at most {max_keys} keys), REDIS_URL unset; it needs no deny cache"
                ),
            ),
            Backend::Redis { url, addr, pool } => {
                let (store, via) = connect(url, addr, *pool).await?;
                (AnyStore::Redis(store), format!("redis at {addr} via {via}"))
            }
            Backend::Cluster { urls, addrs, pool } => {
                let (store, via) = connect_cluster(urls, addrs, *pool).await?;
                (
                    AnyStore::Redis(store),
                    format!("redis cluster at {addrs} via {via}"),
                )
            }
            Backend::Sentinel {
                urls,
                master,
                addrs,
            } => {
                let store = connect_sentinel(urls, master, addrs).await?;
                (
                    AnyStore::Redis(store),
                    format!("redis master {master:?} named by the sentinels at {addrs}"),
                )
            }
        };
        let limiter = store
            .apply(self.limits.builder())
            .build()
            .map_err(|e| Error::runtime(format!("cannot build the limiter: {e}")))?;
        let layer = policy.layer(&self.limits, limiter, &self.key, |b| store.apply(b))?;
        Ok((layer.on_store_error(self.on_error), described))
    }
}

/// Checks a Redis URL from `var` and returns its `host:port`. The URL itself
/// is never echoed: it may hold a password.
fn redis_addr(var: &str, url: &str) -> Result<String, Error> {
    if !cfg!(feature = "tls") && url.trim_start().starts_with("rediss://") {
        return Err(Error::usage(format!(
            "{var} is a rediss:// (TLS) URL, but this example was built without the `tls` \
             feature: run it with `--features tls` (e.g. `cargo run --features tls --example axum`)"
        )));
    }
    match url.into_connection_info() {
        Ok(info) => Ok(info.addr().to_string()),
        Err(e) => Err(Error::usage(format!(
            "{var} is invalid: {e}; use redis://[:password@]host:port[/db], such as redis://127.0.0.1:6379/0"
        ))),
    }
}

fn parse_pool(text: &str) -> Result<u32, Error> {
    match text.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(Error::config(
            "REDIS_POOL",
            text,
            "use a number of connections above 0, such as 32, or unset it for one multiplexed connection",
        )),
    }
}

fn parse_max_keys(text: &str) -> Result<usize, Error> {
    match text.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(Error::config(
            "RATE_LIMIT_MEMORY_MAX_KEYS",
            text,
            "use a number of keys above 0, such as 1000000 (about 45 MB of fixed windows)",
        )),
    }
}

fn parse_key(text: &str) -> Result<KeyBy, Error> {
    let fix = "use `ip`, `client-ip` or `header:<name>`, such as header:x-api-key";
    if text.eq_ignore_ascii_case("ip") {
        return Ok(KeyBy::PeerIp(key::PeerIp));
    }
    if text.eq_ignore_ascii_case("client-ip") {
        return Ok(KeyBy::ClientIp(key::ClientIp::new()));
    }
    match text.split_once(':') {
        Some((kind, name)) if kind.eq_ignore_ascii_case("header") => {
            let name = HeaderName::try_from(name.trim()).map_err(|_| {
                let fix = format!("{:?} is not an HTTP header name; {fix}", name.trim());
                Error::config("RATE_LIMIT_KEY", text, fix)
            })?;
            Ok(KeyBy::Header(key::Header::from_name(name)))
        }
        _ => Err(Error::config("RATE_LIMIT_KEY", text, fix)),
    }
}

/// Applies `TRUSTED_PROXIES`, `TRUSTED_HOPS` and `FORWARDED_HEADER` to a
/// `client-ip` key; with any other key they are a mistake worth reporting.
fn client_ip_settings(key: KeyBy) -> Result<KeyBy, Error> {
    let proxies = var("TRUSTED_PROXIES")?;
    let hops = var("TRUSTED_HOPS")?;
    let header = var("FORWARDED_HEADER")?;
    let KeyBy::ClientIp(mut client_ip) = key else {
        return match ["TRUSTED_PROXIES", "TRUSTED_HOPS", "FORWARDED_HEADER"]
            .into_iter()
            .zip([&proxies, &hops, &header])
            .find(|(_, v)| v.is_some())
        {
            Some((name, _)) => Err(Error::usage(format!(
                "{name} is set but RATE_LIMIT_KEY is not `client-ip`: set RATE_LIMIT_KEY=client-ip, or unset {name}"
            ))),
            None => Ok(key),
        };
    };
    if let Some(list) = proxies {
        some_entry("TRUSTED_PROXIES", &list)?;
        client_ip = client_ip
            .trust(&list)
            .map_err(|e| Error::config("TRUSTED_PROXIES", &list, e))?;
    }
    if let Some(text) = hops {
        let n = match text.trim().parse::<u8>() {
            // 0 reads no header: every client behind a proxy would share
            // the proxy's key.
            Ok(n) if (1..=32).contains(&n) => n,
            _ => {
                let fix = "use the number of proxies in front of the server, 1 to 32, or unset it";
                return Err(Error::config("TRUSTED_HOPS", &text, fix));
            }
        };
        client_ip = client_ip.hops(n);
    }
    if let Some(text) = header {
        let header = match text.trim().to_ascii_lowercase().as_str() {
            "x-forwarded-for" => key::ForwardedHeader::XForwardedFor,
            "forwarded" => key::ForwardedHeader::Forwarded,
            "x-real-ip" => key::ForwardedHeader::XRealIp,
            _ => {
                let fix = "use `x-forwarded-for`, `forwarded` or `x-real-ip`";
                return Err(Error::config("FORWARDED_HEADER", &text, fix));
            }
        };
        client_ip = client_ip.header(header);
    }
    Ok(KeyBy::ClientIp(client_ip))
}

/// With `RATE_LIMIT=off` nothing is limited, so a setting of how to limit
/// would be ignored: refused, naming it, rather than leaving a server
/// unlimited that was meant to limit (its tiers, say).
fn no_effect_when_off() -> Result<(), Error> {
    const HOW: [&str; 11] = [
        "RATE_LIMIT_ALGORITHM",
        "RATE_LIMIT_BURST",
        "RATE_LIMIT_DENY_CACHE",
        "RATE_LIMIT_SHADOW",
        "RATE_LIMIT_ON_ERROR",
        "RATE_LIMIT_RESERVE",
        "RATE_LIMIT_RESERVE_KEYS",
        "RATE_LIMIT_TIERS",
        "RATE_LIMIT_TIER_HEADER",
        "RATE_LIMIT_SKIP",
        "RATE_LIMIT_REFUND",
    ];
    for name in HOW {
        if var(name)?.is_some() {
            return Err(Error::usage(format!(
                "{name} is set but RATE_LIMIT=off: nothing is limited, so it would have no \
                 effect; unset {name}, or set RATE_LIMIT to a quota"
            )));
        }
    }
    Ok(())
}

/// Refuses a `RATE_LIMIT_SKIP` that overlaps `TRUSTED_PROXIES`: a request
/// whose client cannot be read past a proxy (no forwarding header,
/// `unknown`, an obfuscated identifier) is keyed by the proxy's address, and
/// would go unlimited (see `skip::Networks`).
fn skip_apart_from_proxies() -> Result<(), Error> {
    let (Some(proxies), Some(skip)) = (var("TRUSTED_PROXIES")?, var("RATE_LIMIT_SKIP")?) else {
        return Ok(());
    };
    // Both lists were read already: entries that are neither an address nor
    // a range were refused there. Read again as the crate reads them: an
    // IPv4-mapped range (`::ffff:10.0.0.0/104`) is the IPv4 one it maps, so
    // it overlaps an IPv4 range as it does there.
    let nets = |name: &'static str, list: &str| -> Result<Vec<IpNet>, Error> {
        match skip::Networks::new(key::PeerIp, list) {
            Ok(networks) => Ok(networks.nets().to_vec()),
            Err(e) => Err(Error::config(name, list, e)),
        }
    };
    let skip = nets("RATE_LIMIT_SKIP", &skip)?;
    for proxy in nets("TRUSTED_PROXIES", &proxies)? {
        for skipped in &skip {
            if proxy.contains(&skipped.network()) || skipped.contains(&proxy.network()) {
                return Err(Error::usage(format!(
                    "RATE_LIMIT_SKIP ({skipped}) overlaps TRUSTED_PROXIES ({proxy}): a request \
                     whose client cannot be read past the proxy is keyed by the proxy and \
                     would never be limited; keep the two lists apart"
                )));
            }
        }
    }
    Ok(())
}

/// Refuses a list of addresses that names none (`,`): a typo, not "none",
/// which is the variable unset.
fn some_entry(name: &'static str, list: &str) -> Result<(), Error> {
    if list
        .split([',', ' ', '\t', '\n'])
        .any(|entry| !entry.is_empty())
    {
        return Ok(());
    }
    Err(Error::config(
        name,
        list,
        "it names no address or range; unset it for none",
    ))
}

/// A variable's value; unset and empty are the same.
fn var(name: &'static str) -> Result<Option<String>, Error> {
    match env::var(name) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(env::VarError::NotPresent) => Ok(None),
        Err(env::VarError::NotUnicode(v)) => Err(Error::config(
            name,
            &v.to_string_lossy(),
            "it is not valid UTF-8",
        )),
    }
}
