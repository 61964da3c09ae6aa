//! The TCP settings of every connection the store opens itself:
//! `TCP_NODELAY`, and a bound on how long a dead link goes unnoticed.
//!
//! **Nagle's algorithm.** redis-rs 1 leaves it on (`TcpSettings::default()`),
//! and a store's calls are small writes with up to two calls in flight on
//! one connection (`batch.rs`). With Nagle on, the kernel holds the second
//! call's bytes until the first call's are acknowledged, which on a network
//! comes with the first call's reply: the second call waits one round trip
//! more, and the batches behind it with it. Loopback hides this (its round
//! trip is microseconds), so only a network, or `benches/ab.py --rtt`, shows
//! it. Redis sets `TCP_NODELAY` on its own side of every client connection.
//!
//! **Dead links.** A link that loses every packet without a reset (a host
//! gone, a partition, a firewall that forgot the connection) looks, to the
//! client, like a Redis that is slow to answer: redis-rs's response timeout
//! is off (the limiter's timeout bounds each call instead), so nothing
//! closes the connection, and the kernel gives up on unacknowledged data
//! only after `tcp_retries2` (about 15 minutes). Every call in between would
//! time out and follow the [`OnStoreError`](crate::OnStoreError) policy.
//! [`USER_TIMEOUT`] (`TCP_USER_TIMEOUT`, Linux) has the kernel close the
//! connection once data it sent has gone unacknowledged that long, and
//! keepalive probes an idle connection after [`KEEPALIVE_IDLE`]; the
//! connection then ends in an error, and the store reconnects as it does
//! after Redis closed it. Only the peer's TCP stack acknowledges, not Redis:
//! a Redis that is busy or frozen (its host up) keeps its connections.
//!
//! Connections handed to the store already built (a `ConnectionManager`, a
//! bb8 pool, a cluster connection) keep the settings they were built with;
//! build them with [`RedisStore::tcp_settings`](super::RedisStore::tcp_settings).

use std::time::Duration;

use redis::{Client, ConnectionInfo, RedisResult, io::tcp::TcpSettings};

/// How long data sent on a connection may go unacknowledged before the
/// kernel closes it (Linux's `TCP_USER_TIMEOUT`).
pub(super) const USER_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection may sit idle before the kernel probes it.
pub(super) const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);

/// `base` with `TCP_NODELAY` on, and, where `base` sets none, the store's
/// user timeout and keepalive.
pub(super) fn settings(base: &TcpSettings) -> TcpSettings {
    let mut tcp = base.clone().set_nodelay(true);
    if tcp.keepalive().is_none() {
        let keepalive = redis::io::tcp::socket2::TcpKeepalive::new().with_time(KEEPALIVE_IDLE);
        // Probes a second apart: the user timeout, not their count, ends it.
        #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
        let keepalive = keepalive.with_interval(Duration::from_secs(1));
        tcp = tcp.set_keepalive(keepalive);
    }
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    if tcp.user_timeout().is_none() {
        tcp = tcp.set_user_timeout(USER_TIMEOUT);
    }
    tcp
}

/// `info` with [`settings`] applied to its TCP settings.
pub(super) fn tuned(info: ConnectionInfo) -> ConnectionInfo {
    let tcp = settings(info.tcp_settings());
    info.set_tcp_settings(tcp)
}

/// `client` with [`tuned`] connection info (address, credentials and TLS
/// settings kept).
pub(super) fn tuned_client(client: &Client) -> RedisResult<Client> {
    Client::open(tuned(client.get_connection_info().clone()))
}
