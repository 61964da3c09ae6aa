//! The peer address tonic's server records: with the `tonic` feature,
//! [`PeerIp`](struct@super::PeerIp) and [`ClientIp`](super::ClientIp) read it.

use std::net::SocketAddr;

use http::Extensions;
use tonic::transport::server::TcpConnectInfo;

/// The remote address of tonic's `TcpConnectInfo` request extension, which
/// `tonic::transport::Server` inserts for TCP connections.
pub(super) fn peer_addr(extensions: &Extensions) -> Option<SocketAddr> {
    extensions.get::<TcpConnectInfo>()?.remote_addr()
}
