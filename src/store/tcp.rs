//! `TCP_NODELAY` on every connection the store opens itself.
//!
//! redis-rs 1 leaves Nagle's algorithm on (`TcpSettings::default()`), and a
//! store's calls are small writes with up to two calls in flight on one
//! connection (`batch.rs`). With Nagle on, the kernel holds the second
//! call's bytes until the first call's are acknowledged, which on a network
//! comes with the first call's reply: the second call waits one round trip
//! more, and the batches behind it with it. Loopback hides this (its round
//! trip is microseconds), so only a network, or `benches/ab.py --rtt`, shows
//! it. Redis sets `TCP_NODELAY` on its own side of every client connection.
//!
//! Connections handed to the store already built (a `ConnectionManager`, a
//! bb8 pool, a cluster connection) keep the settings they were built with;
//! the constructors' docs say how to set it there.

use redis::{Client, ConnectionInfo, RedisResult};

/// `info` with `TCP_NODELAY` on and its other TCP settings (keepalive,
/// user timeout) as they were.
pub(super) fn nodelay(info: ConnectionInfo) -> ConnectionInfo {
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    info.set_tcp_settings(tcp)
}

/// `client` with [`nodelay`] on its connection info (address, credentials
/// and TLS settings kept).
pub(super) fn nodelay_client(client: &Client) -> RedisResult<Client> {
    Client::open(nodelay(client.get_connection_info().clone()))
}
