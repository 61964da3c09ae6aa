//! The test process's own TCP connections to given Redis ports, and whether
//! each has `TCP_NODELAY` set: read with `getsockopt` on a duplicate of each
//! socket, taken with `pidfd_getfd` from `/proc/self/fd` (no `unsafe`).

use std::{collections::BTreeSet, net::SocketAddr};

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
        found.insert(Conn {
            local,
            peer,
            nodelay,
        });
    }
    found
}

/// Asserts that the connections to `ports` opened since `before` (a
/// [`connections_to`] taken then) are at least one, and all have
/// `TCP_NODELAY` on.
pub fn assert_new_ones_nodelay(before: &BTreeSet<Conn>, ports: &[u16], log: &str) {
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
}
