//! What the peer servers share: the example servers' environment interface
//! (`examples/support/mod.rs`), as far as each peer can follow it, so that
//! `benches/load.py` starts every server the same way.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `BIND` | `127.0.0.1:3000` | address to listen on |
//! | `REDIS_URL` | unset | Redis for `actix-erl` and `tower-redis` (required there unless `RATE_LIMIT=off`) and for the floors `redis-floor` and `redis-batch-floor` (required); `governor` keeps counters in memory and `headers-floor` keeps none: both refuse it |
//! | `RATE_LIMIT` | `100/1s` | one quota `<count>/<window>` (`1000/1s`, `1/1h`), or `off` for no limiter; `headers-floor` needs a quota, whose values its headers carry |
//! | `RATE_LIMIT_KEY` | `ip` | `ip` (peer address) or `header:<name>` (e.g. `header:x-api-key`) |
//!
//! Our own variables that a peer cannot honour (`REDIS_POOL`,
//! `RATE_LIMIT_ALGORITHM`, `RATE_LIMIT_BURST`, `client-ip` keys, several
//! `;`-separated quotas) stop it with exit status 2 and a message, rather
//! than letting a benchmark compare unlike things. `RATE_LIMIT_DENY_CACHE` is
//! a switch of ours that no peer has: it is ignored.
//!
//! `GET /` answers `200 ok`.

use std::{env, fmt, net::SocketAddr, process::ExitCode, time::Duration};

use http::HeaderName;

/// A quota: `count` requests per `window`.
#[derive(Debug, Clone, Copy)]
pub struct Limit {
    pub count: u64,
    pub window: Duration,
}

/// Which client a request counts against.
#[derive(Debug, Clone)]
pub enum KeyBy {
    /// The peer's IP address.
    Ip,
    /// The first value of this header.
    Header(HeaderName),
}

/// A peer server's configuration, read from the environment.
#[derive(Debug)]
pub struct Config {
    pub bind: SocketAddr,
    /// `None` for `RATE_LIMIT=off`.
    pub limit: Option<Limit>,
    pub key: KeyBy,
    pub redis_url: Option<String>,
}

/// What a peer needs from Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// Counters in the process; `REDIS_URL` is refused.
    Memory,
    /// Counters in Redis; `REDIS_URL` is required.
    Redis,
}

impl Config {
    /// Reads the environment for a peer that keeps its counters in `store`.
    pub fn from_env(store: Store) -> Result<Self, Error> {
        for unsupported in ["REDIS_POOL", "RATE_LIMIT_ALGORITHM", "RATE_LIMIT_BURST"] {
            if var(unsupported)?.is_some() {
                return Err(Error::usage(format!(
                    "{unsupported} is set, but this peer server has no such setting: unset it"
                )));
            }
        }
        let bind = var("BIND")?.unwrap_or_else(|| "127.0.0.1:3000".into());
        let bind = bind
            .parse()
            .map_err(|_| Error::config("BIND", &bind, "use host:port, such as 127.0.0.1:3000"))?;
        let limit = parse_limit(&var("RATE_LIMIT")?.unwrap_or_else(|| "100/1s".into()))?;
        let key = parse_key(&var("RATE_LIMIT_KEY")?.unwrap_or_else(|| "ip".into()))?;
        let redis_url = var("REDIS_URL")?;
        match (store, &redis_url, &limit) {
            (Store::Memory, Some(_), _) => {
                return Err(Error::usage(
                    "REDIS_URL is set, but this peer keeps its counters in memory: unset it".into(),
                ));
            }
            (Store::Redis, None, Some(_)) => {
                return Err(Error::usage(
                    "REDIS_URL is not set: this peer keeps its counters in Redis; \
                     set it, such as redis://127.0.0.1:6379"
                        .into(),
                ));
            }
            _ => {}
        }
        Ok(Self {
            bind,
            limit,
            key,
            redis_url,
        })
    }

    /// Describes the limiter for the startup line.
    pub fn describe(&self) -> String {
        match &self.limit {
            None => "rate limiting off: RATE_LIMIT=off".into(),
            Some(l) => {
                let key = match &self.key {
                    KeyBy::Ip => "ip".to_owned(),
                    KeyBy::Header(h) => format!("header:{h}"),
                };
                format!("limit: {}/{:?}; key: {key}", l.count, l.window)
            }
        }
    }
}

fn parse_limit(text: &str) -> Result<Option<Limit>, Error> {
    let fix = "use one quota <count>/<window>, such as 1000/1s, 5/500ms or 1/1h, or `off`";
    let text = text.trim();
    if text.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    if text.contains(';') {
        let fix = format!("this peer takes one quota, not several; {fix}");
        return Err(Error::config("RATE_LIMIT", text, fix));
    }
    let bad = || Error::config("RATE_LIMIT", text, fix);
    let (count, window) = text.split_once('/').ok_or_else(bad)?;
    let count: u64 = count.trim().parse().map_err(|_| bad())?;
    let window = window.trim();
    let unit_at = window.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (amount, unit) = window.split_at(unit_at);
    let amount: u64 = if amount.is_empty() {
        1
    } else {
        amount.parse().map_err(|_| bad())?
    };
    let unit_ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    let window_ms = amount.checked_mul(unit_ms).ok_or_else(bad)?;
    if count == 0 || window_ms == 0 {
        return Err(bad());
    }
    Ok(Some(Limit {
        count,
        window: Duration::from_millis(window_ms),
    }))
}

fn parse_key(text: &str) -> Result<KeyBy, Error> {
    let fix = "use `ip` or `header:<name>`, such as header:x-api-key (peers have no `client-ip`)";
    if text.trim().eq_ignore_ascii_case("ip") {
        return Ok(KeyBy::Ip);
    }
    match text.split_once(':') {
        Some((kind, name)) if kind.trim().eq_ignore_ascii_case("header") => {
            HeaderName::try_from(name.trim())
                .map(KeyBy::Header)
                .map_err(|_| Error::config("RATE_LIMIT_KEY", text, fix))
        }
        _ => Err(Error::config("RATE_LIMIT_KEY", text, fix)),
    }
}

/// A variable's value; unset and empty are the same.
/// An environment variable: `None` when unset or blank; not UTF-8 is a
/// usage error (exit status 2).
pub fn var(name: &'static str) -> Result<Option<String>, Error> {
    match env::var(name) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(env::VarError::NotPresent) => Ok(None),
        Err(env::VarError::NotUnicode(_)) => Err(Error::usage(format!("{name} is not UTF-8"))),
    }
}

/// Binds `bind`, prints `what` and the address (`"<what> listening on
/// <addr>"`, the line `benches/load.py` waits for) and serves `app` with the
/// peer address available, until Ctrl-C. Shared by the axum servers.
///
/// `app` is a `Router`, or a limiter's layer wrapped around the whole
/// router, as `examples/axum.rs` wraps ours: the layer runs before routing
/// and adds no per-route boxing, so every limiter is measured the same way.
pub async fn serve_axum<S>(bind: SocketAddr, what: &str, app: S) -> Result<(), Error>
where
    S: tower::Service<
            axum::extract::Request,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let listener = tokio::net::TcpListener::bind(bind).await?;
    eprintln!("{what} listening on {}", listener.local_addr()?);
    axum::serve(
        listener,
        axum::ServiceExt::<axum::extract::Request>::into_make_service_with_connect_info::<
            SocketAddr,
        >(app),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}

/// Why a peer did not start or stopped: exit status 2 for configuration, 1
/// otherwise, as with the examples.
#[derive(Debug)]
pub struct Error {
    message: String,
    status: u8,
}

impl Error {
    /// A variable whose value is refused, and how to fix it (exit status 2).
    pub fn config(var: &str, value: &str, fix: impl fmt::Display) -> Self {
        Self::usage(format!("{var}={value:?} is invalid: {fix}"))
    }

    fn usage(message: String) -> Self {
        Self { message, status: 2 }
    }

    /// A failure that is not a bad variable.
    pub fn runtime(message: impl Into<String>) -> Self {
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

/// The process exit status for a server's result, printing the error.
pub fn report(result: Result<(), Error>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.message);
            ExitCode::from(e.status)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_like_the_examples() {
        let l = parse_limit("1000/1s").unwrap().unwrap();
        assert_eq!((l.count, l.window), (1000, Duration::from_secs(1)));
        let l = parse_limit("5/500ms").unwrap().unwrap();
        assert_eq!(l.window, Duration::from_millis(500));
        let l = parse_limit("1/h").unwrap().unwrap();
        assert_eq!(l.window, Duration::from_secs(3600));
        assert!(parse_limit("off").unwrap().is_none());
        for bad in ["10/1s;100/1d", "0/1s", "10", "10/1w", "x/1s"] {
            assert!(parse_limit(bad).is_err(), "{bad}");
        }
    }
}
