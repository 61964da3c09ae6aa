//! Not a limiter: a floor for every design that asks Redis before it admits
//! a request, batched ones included. axum 0.8 whose handler queues the
//! request's key and waits; one task takes what has queued and makes one
//! Redis call for all of it, then wakes every request of the call, which
//! answers `200 ok` without any header.
//!
//! What the call holds, by `FLOOR_WORK`:
//!
//! * `incr` (the default): one `INCR` per request, pipelined: the least an
//!   exact limiter can make Redis do per decision (a counter, moved
//!   atomically). No script, no TTL, no reset read, no reply checked beyond
//!   its being integers: below any limiter, which must also keep a TTL on
//!   every key and answer with the window's reset.
//! * `ping`: one `PING` per call, whatever its size: only the round trip,
//!   shared by the batch.
//!
//! How it talks to Redis, by `FLOOR_CLIENT`:
//!
//! * `redis-rs` (the default): one multiplexed connection (redis-rs 1's
//!   `ConnectionManager`, with `TCP_NODELAY`), the client our `RedisStore`
//!   uses;
//! * `redis-rs-each`: one such connection per call in flight, each carrying
//!   one call at a time;
//! * `raw`: one plain TCP socket per call in flight, the request written as
//!   RESP bytes made by hand and the reply read back by counting its lines:
//!   less than any client library does, so that the floor does not depend
//!   on redis-rs's cost.
//!
//! How it batches, each a knob so that a run can sweep the policies:
//!
//! * `FLOOR_IN_FLIGHT` (default 2): calls out at once;
//! * `FLOOR_FILL` (default 1): a call beyond the first in flight goes only
//!   once this many requests wait (the first goes at once: nothing else
//!   would ever answer them);
//! * `FLOOR_FILL_FIRST` (`on` or `off`, the default): the first call too
//!   waits for `FLOOR_FILL` requests, or for its first request to have
//!   waited a millisecond (Tokio's timer tick), whichever comes first: the
//!   largest batches a closed loop allows, for what Redis's CPU per request
//!   can come down to, whatever it costs in requests per second;
//! * `FLOOR_MAX_BATCH` (default 256): requests per call at most.
//!
//! A timed linger of microseconds is not among them: Tokio's timers tick in
//! milliseconds (`FLOOR_FILL` makes calls larger without a timer).
//!
//! It is written to be cheaper than our batching connection: no decision,
//! no deadline, no reply parsed per key, no headers. Its ratio to plain
//! axum in `benches/ab.py --batch-floor` bounds, on the machine measured,
//! what any limiter that asks Redis before each admission can reach with
//! the same batching policy; the sweep over policies is what makes it a
//! bound for batched designs in general.
//!
//! It reads `BIND`, `REDIS_URL` (required) and `RATE_LIMIT_KEY` as the
//! peers read them; `RATE_LIMIT` is read and ignored (nothing is limited).
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 RATE_LIMIT_KEY=header:x-api-key \
//!     FLOOR_WORK=incr FLOOR_IN_FLIGHT=2 FLOOR_FILL=1 cargo run --release --bin redis-batch-floor
//! ```

use std::{net::SocketAddr, process::ExitCode, time::Duration};

use axum::{
    Router,
    extract::{ConnectInfo, State},
    http::{HeaderMap, StatusCode},
    routing::get,
};
use futures_util::{StreamExt, future::Either, stream::FuturesUnordered};
use ratelimit_peers::{Config, Error, KeyBy, Store, report, serve_axum, var};
use redis1::aio::ConnectionManager;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    sync::{mpsc, oneshot},
    time::Instant,
};

#[tokio::main]
async fn main() -> ExitCode {
    report(serve().await)
}

/// What one call does with its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    Incr,
    Ping,
}

/// The batching policy, from the environment.
#[derive(Debug, Clone, Copy)]
struct Policy {
    work: Work,
    client: ClientKind,
    in_flight: usize,
    fill: usize,
    fill_first: bool,
    max_batch: usize,
}

impl Policy {
    fn from_env() -> Result<Self, Error> {
        let work = match env_or("FLOOR_WORK", "incr")?.as_str() {
            "incr" => Work::Incr,
            "ping" => Work::Ping,
            other => return Err(Error::config("FLOOR_WORK", other, "use incr or ping")),
        };
        let client = match env_or("FLOOR_CLIENT", "redis-rs")?.as_str() {
            "redis-rs" => ClientKind::Shared,
            "redis-rs-each" => ClientKind::Each,
            "raw" => ClientKind::Raw,
            other => {
                return Err(Error::config(
                    "FLOOR_CLIENT",
                    other,
                    "use redis-rs, redis-rs-each or raw",
                ));
            }
        };
        let max_batch = number("FLOOR_MAX_BATCH", 256)?;
        let fill_first = match env_or("FLOOR_FILL_FIRST", "off")?.as_str() {
            "on" => true,
            "off" => false,
            other => return Err(Error::config("FLOOR_FILL_FIRST", other, "use on or off")),
        };
        Ok(Self {
            work,
            client,
            in_flight: number("FLOOR_IN_FLIGHT", 2)?,
            fill: number("FLOOR_FILL", 1)?.min(max_batch),
            fill_first,
            max_batch,
        })
    }
}

/// `name`'s value, or `default` when it is unset or blank.
fn env_or(name: &'static str, default: &str) -> Result<String, Error> {
    Ok(var(name)?.unwrap_or_else(|| default.into()))
}

/// A whole number >= 1 from the environment.
fn number(name: &'static str, default: usize) -> Result<usize, Error> {
    let v = env_or(name, &default.to_string())?;
    match v.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(Error::config(name, &v, "use a whole number, at least 1")),
    }
}

/// A request waiting for its call: its key, and where its answer goes.
struct Job {
    key: Vec<u8>,
    done: oneshot::Sender<bool>,
}

#[derive(Clone)]
struct App {
    key: KeyBy,
    queue: mpsc::UnboundedSender<Job>,
}

/// `FLOOR_CLIENT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientKind {
    Shared,
    Each,
    Raw,
}

/// Where calls go: the shared multiplexed connection, or one connection or
/// raw socket per call in flight (taken by a call, given back when it is
/// answered).
enum Client {
    Shared(ConnectionManager),
    Each(Vec<ConnectionManager>),
    Raw(Vec<TcpStream>),
}

/// What a finished call gives back to the pool.
enum Back {
    Nothing,
    Conn(ConnectionManager),
    Socket(TcpStream),
}

async fn serve() -> Result<(), Error> {
    let config = Config::from_env(Store::Redis)?;
    let policy = Policy::from_env()?;
    let url = config.redis_url.clone().ok_or_else(|| {
        Error::runtime("REDIS_URL is not set: the batch floor needs a Redis to call")
    })?;
    let info = redis1::IntoConnectionInfo::into_connection_info(url.as_str())
        .map_err(|e| Error::runtime(format!("REDIS_URL: {e}")))?
        .set_tcp_settings(redis1::io::tcp::TcpSettings::default().set_nodelay(true));
    let client = if policy.client == ClientKind::Raw {
        let redis1::ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
            return Err(Error::runtime(
                "FLOOR_CLIENT=raw needs a redis:// URL over TCP",
            ));
        };
        let mut sockets = Vec::new();
        for _ in 0..policy.in_flight {
            let socket = TcpStream::connect((host.as_str(), port))
                .await
                .map_err(|e| Error::runtime(format!("connecting to Redis: {e}")))?;
            socket
                .set_nodelay(true)
                .map_err(|e| Error::runtime(format!("TCP_NODELAY: {e}")))?;
            sockets.push(socket);
        }
        Client::Raw(sockets)
    } else {
        let client =
            redis1::Client::open(info).map_err(|e| Error::runtime(format!("REDIS_URL: {e}")))?;
        let mut conns = Vec::new();
        let n = if policy.client == ClientKind::Each {
            policy.in_flight
        } else {
            1
        };
        for _ in 0..n {
            conns.push(
                ConnectionManager::new(client.clone())
                    .await
                    .map_err(|e| Error::runtime(format!("connecting to Redis: {e}")))?,
            );
        }
        if policy.client == ClientKind::Each {
            Client::Each(conns)
        } else {
            Client::Shared(conns.remove(0))
        }
    };
    let (queue, jobs) = mpsc::unbounded_channel();
    tokio::spawn(batch(jobs, client, policy));
    let app = Router::new().route("/", get(admit)).with_state(App {
        key: config.key.clone(),
        queue,
    });
    let what = format!(
        "redis batch floor ({:?} through {}, {} in flight, fill {}{}, {} a call at most; no limiter)",
        policy.work,
        match policy.client {
            ClientKind::Shared => "one redis-rs connection",
            ClientKind::Each => "a redis-rs connection per call in flight",
            ClientKind::Raw => "raw sockets",
        },
        policy.in_flight,
        policy.fill,
        if policy.fill_first {
            " (the first call too)"
        } else {
            ""
        },
        policy.max_batch,
    );
    serve_axum(config.bind, &what, app).await
}

/// Queues the request's key and waits for its call; a Redis error (or a
/// lost batcher) answers 503, so that a broken floor is seen.
async fn admit(
    State(app): State<App>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Result<&'static str, StatusCode> {
    let mut key = b"bf:".to_vec();
    match &app.key {
        KeyBy::Header(name) => {
            key.extend_from_slice(headers.get(name).map_or(b"", |v| v.as_bytes()))
        }
        KeyBy::Ip => key.extend_from_slice(peer.ip().to_string().as_bytes()),
    }
    let (done, answer) = oneshot::channel();
    app.queue
        .send(Job { key, done })
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    match answer.await {
        Ok(true) => Ok("ok"),
        _ => Err(StatusCode::SERVICE_UNAVAILABLE),
    }
}

/// The one batching task. Requests queue in `pending` (at most
/// `max_batch`); they go as one call once fewer than `in_flight` calls are
/// out and either `fill` requests wait or no call is out (with
/// `fill_first`: or the oldest has waited a millisecond). Calls in flight
/// are driven all the while.
async fn batch(mut jobs: mpsc::UnboundedReceiver<Job>, mut client: Client, policy: Policy) {
    let mut calls = FuturesUnordered::new();
    let mut pending: Vec<Job> = Vec::new();
    let mut since: Option<Instant> = None;
    loop {
        while pending.len() < policy.max_batch {
            match jobs.try_recv() {
                Ok(job) => pending.push(job),
                Err(_) => break,
            }
        }
        if pending.is_empty() {
            since = None;
        } else if since.is_none() {
            since = Some(Instant::now());
        }
        let waited = |since: Option<Instant>| since.is_some_and(|t| t.elapsed() >= FILL_WAIT);
        let due = pending.len() >= policy.fill
            || (calls.is_empty() && (!policy.fill_first || waited(since)));
        if !pending.is_empty() && calls.len() < policy.in_flight && due {
            let batch = std::mem::take(&mut pending);
            since = None;
            calls.push(match &mut client {
                Client::Shared(conn) => Either::Left(call(conn.clone(), policy.work, batch, false)),
                Client::Each(conns) => {
                    let conn = conns.pop().expect("a connection for every call in flight");
                    Either::Left(call(conn, policy.work, batch, true))
                }
                Client::Raw(sockets) => {
                    let socket = sockets.pop().expect("a socket for every call in flight");
                    Either::Right(call_raw(socket, policy.work, batch))
                }
            });
            continue;
        }
        let idle = calls.is_empty();
        let wait = async {
            match since {
                Some(t) if policy.fill_first && idle => {
                    tokio::time::sleep_until(t + FILL_WAIT).await
                }
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(back) = calls.next(), if !calls.is_empty() => match (&mut client, back) {
                (Client::Raw(sockets), Back::Socket(socket)) => sockets.push(socket),
                (Client::Each(conns), Back::Conn(conn)) => conns.push(conn),
                _ => {}
            },
            job = jobs.recv(), if pending.len() < policy.max_batch => match job {
                Some(job) => pending.push(job),
                None => break,
            },
            () = wait => {}
        }
    }
}

/// How long the first call waits to fill, with `fill_first`.
const FILL_WAIT: Duration = Duration::from_millis(1);

/// One call through redis-rs; it gives its connection back if it `owns` it.
async fn call(mut conn: ConnectionManager, work: Work, batch: Vec<Job>, owns: bool) -> Back {
    let ok = match work {
        Work::Ping => redis1::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .is_ok(),
        Work::Incr => {
            let mut pipe = redis1::pipe();
            for job in &batch {
                pipe.cmd("INCR").arg(&job.key[..]);
            }
            pipe.query_async::<Vec<i64>>(&mut conn)
                .await
                .is_ok_and(|counts| counts.len() == batch.len())
        }
    };
    answer(batch, ok);
    if owns {
        Back::Conn(conn)
    } else {
        Back::Nothing
    }
}

/// One call on a raw socket: the RESP request written by hand, the reply
/// read until it holds one line per command, each of the expected type
/// (`+` for `PING`, `:` for `INCR`). A socket that fails is not given
/// back: the floor stops with a message, as a broken floor must be seen.
async fn call_raw(mut socket: TcpStream, work: Work, batch: Vec<Job>) -> Back {
    let mut request = Vec::with_capacity(32 * batch.len().max(1));
    let (lines, kind) = match work {
        Work::Ping => {
            request.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
            (1, b'+')
        }
        Work::Incr => {
            for job in &batch {
                request.extend_from_slice(b"*2\r\n$4\r\nINCR\r\n$");
                let mut digits = itoa::Buffer::new();
                request.extend_from_slice(digits.format(job.key.len()).as_bytes());
                request.extend_from_slice(b"\r\n");
                request.extend_from_slice(&job.key);
                request.extend_from_slice(b"\r\n");
            }
            (batch.len(), b':')
        }
    };
    let ok = exchange(&mut socket, &request, lines, kind).await;
    if !ok {
        eprintln!("redis-batch-floor: a raw call failed or was answered with an error");
        std::process::exit(1);
    }
    answer(batch, ok);
    Back::Socket(socket)
}

/// Writes `request`, then reads until `lines` reply lines have come, each
/// starting with `kind`.
async fn exchange(socket: &mut TcpStream, request: &[u8], lines: usize, kind: u8) -> bool {
    if socket.write_all(request).await.is_err() {
        return false;
    }
    let mut buf = [0u8; 16 * 1024];
    let (mut seen, mut at_line_start) = (0, true);
    while seen < lines {
        let n = match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        for &b in &buf[..n] {
            if at_line_start && b != kind {
                return false;
            }
            at_line_start = b == b'\n';
            seen += usize::from(at_line_start);
        }
    }
    true
}

fn answer(batch: Vec<Job>, ok: bool) {
    for job in batch {
        let _ = job.done.send(ok);
    }
}
