//! The one address-to-key rule of [`PeerIp`](struct@super::PeerIp) and
//! [`ClientIp`](super::ClientIp): IPv4-mapped IPv6 as IPv4, then the address
//! or its network under a prefix length per family.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::Key;

/// Prefix lengths to group IPv4 and IPv6 clients by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Grouping {
    v4: u8,
    v6: u8,
}

impl Grouping {
    /// IPv4 by address, IPv6 by /64: one host often has a whole /64 to pick
    /// addresses from.
    pub(crate) const DEFAULT: Self = Self { v4: 32, v6: 64 };

    /// Groups IPv4 by `len` (clamped to 32).
    pub(crate) const fn ipv4_prefix(self, len: u8) -> Self {
        Self {
            v4: if len > 32 { 32 } else { len },
            ..self
        }
    }

    /// Groups IPv6 by `len` (clamped to 128).
    pub(crate) const fn ipv6_prefix(self, len: u8) -> Self {
        Self {
            v6: if len > 128 { 128 } else { len },
            ..self
        }
    }

    /// The IPv4 prefix length.
    pub(crate) fn v4(self) -> u8 {
        self.v4
    }

    /// The IPv6 prefix length.
    pub(crate) fn v6(self) -> u8 {
        self.v6
    }

    /// The key of `ip`: an IPv4-mapped address as IPv4; then the address
    /// (`203.0.113.9`, `2001:db8::1`) under a full-length prefix, else its
    /// network (`203.0.113.0/24`, `2001:db8:1:2::/64`). No allocation.
    pub(crate) fn key(self, ip: IpAddr) -> Key {
        match ip.to_canonical() {
            IpAddr::V4(v4) if self.v4 == 32 => Key::from_ip(v4.into()),
            IpAddr::V4(v4) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.v4)).unwrap_or(0);
                let net = Ipv4Addr::from_bits(v4.to_bits() & mask);
                Key::from_net(net.into(), self.v4)
            }
            IpAddr::V6(v6) if self.v6 == 128 => Key::from_ip(v6.into()),
            IpAddr::V6(v6) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.v6)).unwrap_or(0);
                let net = Ipv6Addr::from_bits(v6.to_bits() & mask);
                Key::from_net(net.into(), self.v6)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ipnet::IpNet;

    use super::*;

    fn key(grouping: Grouping, ip: &str) -> String {
        let key = grouping.key(ip.parse().unwrap());
        String::from_utf8(key.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn mapped_ipv4_is_ipv4_and_ipv6_is_grouped_by_64() {
        let g = Grouping::DEFAULT;
        assert_eq!(key(g, "::ffff:127.0.0.1"), "127.0.0.1");
        assert_eq!(key(g, "203.0.113.9"), "203.0.113.9");
        assert_eq!(key(g, "2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
        assert_eq!(key(g, "2001:db8:1:2::ffff"), "2001:db8:1:2::/64");
        assert_eq!(key(g, "::1"), "::/64");
        assert_eq!(key(g.ipv6_prefix(48), "2001:db8:1:2::1"), "2001:db8:1::/48");
        assert_eq!(key(g.ipv6_prefix(200), "2001:db8::1"), "2001:db8::1");
        assert_eq!(key(g.ipv6_prefix(0), "2001:db8::1"), "::/0");
        assert_eq!(key(g.ipv4_prefix(24), "203.0.113.77"), "203.0.113.0/24");
        assert_eq!(key(g.ipv4_prefix(0), "203.0.113.77"), "0.0.0.0/0");
        assert_eq!(key(g.ipv4_prefix(99), "::ffff:1.2.3.4"), "1.2.3.4");
    }

    /// The keys are ipnet's text of the truncated network, for every length.
    #[test]
    fn networks_read_as_ipnet_writes_them() {
        let ips: [IpAddr; 3] = [
            "203.0.113.77".parse().unwrap(),
            "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap(),
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe".parse().unwrap(),
        ];
        for ip in ips {
            let max = if ip.is_ipv4() { 32 } else { 128 };
            for len in 0..max {
                let g = Grouping::DEFAULT.ipv4_prefix(len).ipv6_prefix(len);
                let expected = IpNet::new(ip, len).unwrap().trunc().to_string();
                assert_eq!(key(g, &ip.to_string()), expected);
            }
        }
    }
}
