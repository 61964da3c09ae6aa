//! [`ClientIp`]: the client's address behind trusted proxies.

use std::{fmt, net::IpAddr, sync::Arc};

use ipnet::{IpNet, Ipv4Net};

use super::{
    ForwardedHeader, Grouping, Key, KeyError, KeyExtractor, RequestInfo,
    forwarded::{self, Hop},
    warnings::Warnings,
};
use crate::ConfigError;

/// Keys by the client's IP address, read through the proxies you trust.
///
/// The address is the peer's unless the peer is a trusted proxy; then
/// ClientIp walks the forwarding header (by default `X-Forwarded-For`; see
/// [`header`](Self::header)) from the right, skipping trusted hops, and takes
/// the first address that is not trusted: the last one your own
/// infrastructure vouches for. Entries further left were written by the
/// client and are never read. [`proxies`](super::proxies) shows how to set
/// it up behind nginx, cloud load balancers and CDNs.
///
/// | configuration | the client is |
/// |---|---|
/// | [`ClientIp::new()`] | the peer address; forwarding headers are ignored |
/// | [`.trust("10.0.0.0/8")`](Self::trust) or [`.trusted_proxies(..)`](Self::trusted_proxies) | from a trusted peer: the rightmost untrusted address of the header |
/// | [`.hops(n)`](Self::hops) | the entry the `n`-th proxy (counting the peer as the first) appended |
///
/// * **Normalisation.** IPv4-mapped IPv6 addresses (`::ffff:192.0.2.1`)
///   become IPv4, before matching trusted ranges too. An IPv6 client is keyed
///   by its /64 network (`2001:db8:1:2::/64`; see
///   [`ipv6_prefix`](Self::ipv6_prefix)), as one host often has a whole /64
///   to pick addresses from; an IPv4 client by its address (see
///   [`ipv4_prefix`](Self::ipv4_prefix)). The keys are
///   [`PeerIp`](struct@super::PeerIp)'s, from the same code, so switching
///   keeps the counters.
/// * **Entries that are not an address** (`unknown`, obfuscated identifiers
///   such as `_hidden`, garbage, empty or overlong entries): the walk stops
///   there and the client is the last address it passed, the trusted hop
///   that wrote the entry (the peer, if it is the first). A client thus never
///   picks its key with garbage, and is never let through unlimited.
/// * **A trusted client.** If every entry is trusted, the client is the
///   leftmost one.
/// * **`Forwarded` is parsed strictly, from the right** (RFC 7239 with RFC
///   7230's quoted strings): the elements your proxy appended are read the
///   same whatever the client wrote before them, and the first element that
///   is not well-formed (an unterminated quote, a stray character) is not an
///   address, so nothing left of it is ever read.
/// * **IPv6 zones** (`fe80::1%eth0`, `"[fe80::1%eth0]:80"`) are dropped, in
///   every header as for the peer: the key is the address's.
/// * **Bounded work.** At most 32 entries are read, from the right, and of a
///   header line only its last 8 KiB (the cut-off rest is one entry that is
///   not an address). If 32 trusted hops are not enough, the 32nd is the
///   client.
/// * **No peer address:** [`KeyError::NoPeerAddr`] (500), as for `PeerIp`.
/// * **Misconfiguration warnings**, each logged once with `tracing` (clones
///   share them): forwarding headers arriving while no proxy is trusted; 100
///   requests in a row from one trusted proxy without the header (every
///   client then shares the proxy's bucket); a trusted range of `0.0.0.0/0`
///   or `::/0`, when it is configured.
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use redis_ratelimit::key::{ClientIp, KeyExtractor};
///
/// let client_ip = ClientIp::new().trust("10.0.0.0/8, 192.168.0.0/16")?;
/// let req = |peer: &str, xff: &str| {
///     let peer: SocketAddr = peer.parse().unwrap();
///     let req = Request::get("/").header("x-forwarded-for", xff).extension(peer);
///     req.body(()).unwrap().into_parts().0
/// };
/// // Through two trusted proxies: the real client.
/// let key = client_ip.extract(&req("10.0.0.2:4000", "203.0.113.7, 192.168.1.1"))?;
/// assert_eq!(key.as_bytes(), b"203.0.113.7");
/// // A spoofed entry left of the real client is never read.
/// let key = client_ip.extract(&req("10.0.0.2:4000", "1.1.1.1, 203.0.113.7"))?;
/// assert_eq!(key.as_bytes(), b"203.0.113.7");
/// // A client that is not a trusted proxy cannot choose its key.
/// let key = client_ip.extract(&req("198.51.100.4:5000", "1.1.1.1"))?;
/// assert_eq!(key.as_bytes(), b"198.51.100.4");
/// // IPv6 clients are grouped by /64.
/// let key = client_ip.extract(&req("10.0.0.2:4000", "2001:db8:1:2:aaaa::1"))?;
/// assert_eq!(key.as_bytes(), b"2001:db8:1:2::/64");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ClientIp {
    trusted: Vec<IpNet>,
    hops: Option<u8>,
    header: ForwardedHeader,
    grouping: Grouping,
    warnings: Arc<Warnings>,
}

impl Default for ClientIp {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientIp {
    /// Keys by the peer address, trusting no proxy (add some with
    /// [`trust`](Self::trust)): reads `X-Forwarded-For` once trusted, groups
    /// IPv6 clients by /64 and IPv4 clients by address.
    pub fn new() -> Self {
        Self {
            trusted: Vec::new(),
            hops: None,
            header: ForwardedHeader::default(),
            grouping: Grouping::DEFAULT,
            warnings: Arc::default(),
        }
    }

    /// Also trusts the proxies in `list`: IP addresses or CIDR ranges,
    /// separated by commas or whitespace, such as
    /// `"10.0.0.0/8, 192.168.0.0/16, 2001:db8::/32, 127.0.0.1"`.
    ///
    /// Fails with [`ConfigError::InvalidTrustedProxy`], naming the entry, if
    /// one is neither. Trusting `0.0.0.0/0` or `::/0` is allowed but logs a
    /// warning: it lets any client choose its key.
    ///
    /// ```
    /// use redis_ratelimit::key::ClientIp;
    ///
    /// assert!(ClientIp::new().trust("10.0.0.0/8 fd00::/8").is_ok());
    /// let err = ClientIp::new().trust("10.0.0.0/33").unwrap_err();
    /// assert!(err.to_string().contains("10.0.0.0/33"));
    /// ```
    pub fn trust(self, list: &str) -> Result<Self, ConfigError> {
        let nets =
            parse_networks(list).map_err(|value| ConfigError::InvalidTrustedProxy { value })?;
        Ok(self.trusted_proxies(nets))
    }

    /// Also trusts the proxies in `nets`.
    ///
    /// ```
    /// use redis_ratelimit::key::ClientIp;
    ///
    /// let client_ip = ClientIp::new().trusted_proxies(["10.0.0.0/8".parse().unwrap()]);
    /// ```
    pub fn trusted_proxies(mut self, nets: impl IntoIterator<Item = IpNet>) -> Self {
        for net in nets {
            let net = canonical_net(net);
            if net.prefix_len() == 0 {
                self.warnings.trusts_everyone(net);
            }
            self.trusted.push(net);
        }
        self
    }

    /// Trusts the nearest `n` proxies whatever their addresses, counting the
    /// peer as the first: the client is the entry the `n`-th proxy appended,
    /// the `n`-th from the right (`hops(1)`: the rightmost). With fewer
    /// entries, the leftmost; with no header, the peer. `n` is capped at 32,
    /// and `hops(0)` means the peer address, even from a proxy trusted with
    /// [`trust`](Self::trust): no header is read, so every client behind it
    /// shares its key.
    ///
    /// Only safe if clients cannot reach the server except through those
    /// proxies. If proxies are also trusted by address, the header is read
    /// only from a trusted peer, but its entries are not checked.
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use http::Request;
    /// use redis_ratelimit::key::{ClientIp, KeyExtractor};
    ///
    /// // A CDN in front of a load balancer: the LB appends the CDN edge's
    /// // address, the CDN appended the client's.
    /// let client_ip = ClientIp::new().hops(2);
    /// let peer: SocketAddr = "10.1.2.3:50000".parse().unwrap();
    /// let req = Request::get("/")
    ///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.7, 198.51.100.10")
    ///     .extension(peer);
    /// let (parts, ()) = req.body(()).unwrap().into_parts();
    /// assert_eq!(client_ip.extract(&parts).unwrap().as_bytes(), b"203.0.113.7");
    /// ```
    pub fn hops(mut self, n: u8) -> Self {
        self.hops = Some(n.min(forwarded::MAX_HOPS as u8));
        self
    }

    /// Which forwarding header to read (default
    /// [`ForwardedHeader::XForwardedFor`]). Read the one your nearest proxy
    /// sets or overwrites.
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups IPv6 clients by networks of this prefix length (default 64;
    /// 128 keys by address). Values above 128 are clamped to 128.
    pub fn ipv6_prefix(mut self, len: u8) -> Self {
        self.grouping = self.grouping.ipv6_prefix(len);
        self
    }

    /// Groups IPv4 clients by networks of this prefix length (default 32: by
    /// address; 24 groups each /24). Values above 32 are clamped to 32.
    pub fn ipv4_prefix(mut self, len: u8) -> Self {
        self.grouping = self.grouping.ipv4_prefix(len);
        self
    }

    /// The client address for a request from `peer` with these forwarding
    /// header lines, before grouping.
    fn client<'a>(&self, peer: IpAddr, lines: impl Iterator<Item = &'a [u8]>) -> (IpAddr, bool) {
        let hops = forwarded::hops(self.header, lines);
        let hops = hops.as_slice();
        let mut client = peer;
        if let Some(n) = self.hops {
            for hop in hops.iter().take(usize::from(n)) {
                match *hop {
                    Hop::Addr(ip) => client = ip.to_canonical(),
                    Hop::Unknown => break,
                }
            }
        } else {
            for hop in hops {
                match *hop {
                    Hop::Addr(ip) => client = ip.to_canonical(),
                    Hop::Unknown => break,
                }
                if !self.is_trusted(client) {
                    break;
                }
            }
        }
        (client, !hops.is_empty())
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// Which warnings fired so far.
    #[cfg(test)]
    pub(crate) fn fired(&self) -> super::warnings::Fired {
        self.warnings.fired()
    }
}

impl ClientIp {
    /// The client's address for `req`, before grouping: the address its key
    /// is made from (IPv4-mapped IPv6 as IPv4), or `None` without a peer
    /// address. Logs no warnings; [`skip::Networks`](crate::skip::Networks)
    /// matches on it.
    pub fn client_addr<R: RequestInfo + ?Sized>(&self, req: &R) -> Option<IpAddr> {
        self.address(req, false).ok()
    }

    /// The client's address; `warn`: feed the misconfiguration warnings.
    fn address<R: RequestInfo + ?Sized>(&self, req: &R, warn: bool) -> Result<IpAddr, KeyError> {
        let peer = req
            .peer_addr()
            .ok_or(KeyError::NoPeerAddr)?
            .ip()
            .to_canonical();
        let reads_headers = match self.hops {
            Some(n) => n > 0 && (self.trusted.is_empty() || self.is_trusted(peer)),
            None => self.is_trusted(peer),
        };
        if !reads_headers {
            if warn
                && self.trusted.is_empty()
                && self.hops.is_none()
                && self.warnings.wants_untrusted_headers()
            {
                for header in ForwardedHeader::ALL {
                    let name = header.name();
                    if req.header_values(&name).next().is_some() {
                        self.warnings.untrusted_headers(&name, peer);
                        break;
                    }
                }
            }
            return Ok(peer);
        }
        let name = self.header.name();
        let (client, had_header) = self.client(peer, req.header_values(&name));
        if warn {
            self.warnings.request_from_proxy(peer, &name, had_header);
        }
        Ok(client)
    }
}

impl<R: RequestInfo + ?Sized> KeyExtractor<R> for ClientIp {
    fn extract(&self, req: &R) -> Result<Key, KeyError> {
        Ok(self.grouping.key(self.address(req, true)?))
    }
}

impl fmt::Display for ClientIp {
    /// Describes the configuration, for startup logs, e.g.
    /// `client-ip (x-forwarded-for from 10.0.0.0/8; IPv4 by /32, IPv6 by /64)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client-ip (")?;
        match (self.hops, self.trusted.is_empty()) {
            (None, true) => write!(f, "peer address, no proxy trusted")?,
            (Some(n), true) => write!(f, "{} trusting {n} hop(s)", self.header.name())?,
            (hops, false) => {
                write!(f, "{} from ", self.header.name())?;
                for (i, net) in self.trusted.iter().enumerate() {
                    write!(f, "{}{net}", if i == 0 { "" } else { ", " })?;
                }
                if let Some(n) = hops {
                    write!(f, ", trusting {n} hop(s)")?;
                }
            }
        }
        write!(
            f,
            "; IPv4 by /{}, IPv6 by /{})",
            self.grouping.v4(),
            self.grouping.v6()
        )
    }
}

/// Addresses and CIDR ranges separated by commas or whitespace, such as
/// `"10.0.0.0/8, ::1"`, ranges of IPv4-mapped addresses as IPv4 (see
/// [`canonical_net`]); or the first entry that is neither.
pub(crate) fn parse_networks(list: &str) -> Result<Vec<IpNet>, String> {
    list.split(|c: char| c == ',' || c.is_ascii_whitespace())
        .filter(|e| !e.is_empty())
        .map(|entry| {
            entry
                .parse::<IpNet>()
                .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                .map(canonical_net)
                .map_err(|_| entry.to_owned())
        })
        .collect()
}

/// A range of IPv4-mapped IPv6 addresses (`::ffff:10.0.0.0/104`) as the IPv4
/// range it maps (`10.0.0.0/8`), since addresses are compared as IPv4.
pub(crate) fn canonical_net(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net
        && let Some(v4) = v6.network().to_ipv4_mapped()
        && let Some(len) = v6.prefix_len().checked_sub(96)
        && let Ok(v4) = Ipv4Net::new(v4, len)
    {
        return v4.into();
    }
    net
}

#[cfg(test)]
mod tests;
