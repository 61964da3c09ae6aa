//! The test process's own TCP connections to given Redis ports, and their
//! socket options (`TCP_NODELAY`, `TCP_USER_TIMEOUT`, keepalive): read with
//! `getsockopt` on a duplicate of each socket, taken with `pidfd_getfd` from
//! `/proc/self/fd` (no `unsafe`).

use std::{collections::BTreeSet, net::SocketAddr, time::Duration};

use rustix::{
    net::{getpeername, getsockname, sockopt},
    process::{PidfdFlags, PidfdGetfdFlags, getpid, pidfd_getfd, pidfd_open},
};

/// One of this process's connections to a watched port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Conn {
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub nodelay: bool,
    /// `TCP_USER_TIMEOUT`, in ms (0: the kernel's default, none).
    pub user_timeout_ms: u32,
    /// `SO_KEEPALIVE`, and the idle time before the first probe.
    pub keepalive: Option<Duration>,
}

/// Every TCP connection this process holds to one of `ports` (any address).
pub fn connections_to(ports: &[u16]) -> BTreeSet<Conn> {
    let me = pidfd_open(getpid(), PidfdFlags::empty()).expect("pidfd_open on this process");
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd") {
        let Ok(entry) = entry else { continue };
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        // The fd may have closed since the listing: skip it then.
        let Ok(dup) = pidfd_getfd(&me, fd, PidfdGetfdFlags::empty()) else {
            continue;
        };
        let peer = getpeername(&dup)
            .ok()
            .flatten()
            .and_then(|a| SocketAddr::try_from(a).ok());
        let local = getsockname(&dup)
            .ok()
            .and_then(|a| SocketAddr::try_from(a).ok());
        let (Some(peer), Some(local)) = (peer, local) else {
            continue;
        };
        if !ports.contains(&peer.port()) {
            continue;
        }
        let nodelay = sockopt::tcp_nodelay(&dup).expect("getsockopt(TCP_NODELAY)");
        let user_timeout_ms =
            sockopt::tcp_user_timeout(&dup).expect("getsockopt(TCP_USER_TIMEOUT)");
        let keepalive = sockopt::socket_keepalive(&dup)
            .expect("getsockopt(SO_KEEPALIVE)")
            .then(|| sockopt::tcp_keepidle(&dup).expect("getsockopt(TCP_KEEPIDLE)"));
        found.insert(Conn {
            local,
            peer,
            nodelay,
            user_timeout_ms,
            keepalive,
        });
    }
    found
}

/// Asserts that the connections to `ports` opened since `before` (a
/// [`connections_to`] taken then) are at least one, and all have the
/// store's TCP settings: `TCP_NODELAY` on, `TCP_USER_TIMEOUT` 5 s, and
/// keepalive after 10 s idle (`RedisStore::tcp_settings`).
pub fn assert_new_ones_tuned(before: &BTreeSet<Conn>, ports: &[u16], log: &str) {
    let after = connections_to(ports);
    let new: Vec<&Conn> = after
        .iter()
        .filter(|c| !before.iter().any(|b| b.local == c.local))
        .collect();
    assert!(
        !new.is_empty(),
        "no new connection to {ports:?}; all now: {after:?}\n{log}"
    );
    let nagle: Vec<&&Conn> = new.iter().filter(|c| !c.nodelay).collect();
    assert!(
        nagle.is_empty(),
        "connections to Redis with Nagle's algorithm on (no TCP_NODELAY): {nagle:?} of {new:?}\n{log}"
    );
    let unbounded: Vec<&&Conn> = new
        .iter()
        .filter(|c| c.user_timeout_ms != 5_000 || c.keepalive != Some(Duration::from_secs(10)))
        .collect();
    assert!(
        unbounded.is_empty(),
        "connections to Redis a dead link would hold for minutes (no 5 s TCP_USER_TIMEOUT, \
         or no keepalive after 10 s): {unbounded:?} of {new:?}\n{log}"
    );
}
