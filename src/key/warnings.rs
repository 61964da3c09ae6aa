//! [`ClientIp`](super::ClientIp)'s misconfiguration warnings: each is logged
//! once per extractor (its clones share the flags), never per request.

use std::{
    net::IpAddr,
    sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
};

use http::HeaderName;
use ipnet::IpNet;

/// How many requests in a row from one trusted proxy without the forwarding
/// header it is expected to set make [`Warnings::no_header_from_proxy`] warn.
pub(crate) const NO_HEADER_STREAK: u32 = 100;

/// Which warnings have fired, for tests.
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Fired {
    /// Forwarding headers arrived but no proxy is trusted.
    pub(crate) untrusted_headers: bool,
    /// [`NO_HEADER_STREAK`] requests in a row came from one trusted proxy
    /// without the forwarding header.
    pub(crate) no_header_from_proxy: bool,
    /// A trusted range covers every address.
    pub(crate) trusts_everyone: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Warnings {
    untrusted_headers: AtomicBool,
    no_header_from_proxy: AtomicBool,
    trusts_everyone: AtomicBool,
    /// A fingerprint of the trusted peer of the current streak.
    streak_peer: AtomicU64,
    /// Requests in a row from `streak_peer` without the header.
    streak: AtomicU32,
}

impl Warnings {
    #[cfg(test)]
    pub(crate) fn fired(&self) -> Fired {
        Fired {
            untrusted_headers: self.untrusted_headers.load(Ordering::Relaxed),
            no_header_from_proxy: self.no_header_from_proxy.load(Ordering::Relaxed),
            trusts_everyone: self.trusts_everyone.load(Ordering::Relaxed),
        }
    }

    /// Whether the forwarding-header warning is still to come (a cheap check
    /// that lets the caller skip looking for the headers).
    pub(crate) fn wants_untrusted_headers(&self) -> bool {
        !self.untrusted_headers.load(Ordering::Relaxed)
    }

    /// A forwarding header arrived, but no proxy is trusted.
    pub(crate) fn untrusted_headers(&self, header: &HeaderName, peer: IpAddr) {
        if !self.untrusted_headers.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                %header,
                %peer,
                "rate limit: ignoring a `{header}` header because ClientIp trusts no proxy, so \
                 every client is keyed by its peer address. Behind a proxy or load balancer, \
                 list it with ClientIp::trust or ClientIp::trusted_proxies (or count hops with \
                 ClientIp::hops), or every client shares the proxy's bucket. If this server is \
                 exposed directly, a client sent the header and this is harmless. (Logged once.)"
            );
        }
    }

    /// A request came from trusted proxy `peer` with (`has_header`) or
    /// without the forwarding header ClientIp reads.
    pub(crate) fn request_from_proxy(&self, peer: IpAddr, header: &HeaderName, has_header: bool) {
        if self.no_header_from_proxy.load(Ordering::Relaxed) {
            return;
        }
        if has_header {
            if self.streak.load(Ordering::Relaxed) != 0 {
                self.streak.store(0, Ordering::Relaxed);
            }
            return;
        }
        let fingerprint = fingerprint(peer);
        if self.streak_peer.swap(fingerprint, Ordering::Relaxed) != fingerprint {
            self.streak.store(1, Ordering::Relaxed);
            return;
        }
        let streak = self.streak.fetch_add(1, Ordering::Relaxed) + 1;
        if streak >= NO_HEADER_STREAK && !self.no_header_from_proxy.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                %peer,
                %header,
                "rate limit: the last {streak} requests came from trusted proxy {peer} without \
                 a `{header}` header, so they all share the proxy's bucket. Make the proxy set \
                 it, or read the header it does set with ClientIp::header. (Load balancer \
                 health checks alone can also cause this.) (Logged once.)"
            );
        }
    }

    /// A trusted range covers every address.
    pub(crate) fn trusts_everyone(&self, net: IpNet) {
        self.trusts_everyone.store(true, Ordering::Relaxed);
        tracing::warn!(
            %net,
            "rate limit: ClientIp trusts {net}, that is every address, so any client can pick \
             its own key with a forwarding header and escape its limit. Trust only your \
             proxies' ranges, or count hops with ClientIp::hops."
        );
    }
}

/// 64 bits that tell peers apart (well enough for a streak counter).
fn fingerprint(ip: IpAddr) -> u64 {
    match ip {
        IpAddr::V4(v4) => u64::from(v4.to_bits()) | 1 << 63,
        IpAddr::V6(v6) => {
            let bits = v6.to_bits();
            (bits >> 64) as u64 ^ bits as u64
        }
    }
}
