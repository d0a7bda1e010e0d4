//! Which addresses the gateway may dial: the one rule that keeps a listed name from being a
//! way into the host, the cluster or the cloud account.
//!
//! An allow-list names domains, but a domain resolves to whatever its owner (or a
//! split-horizon resolver) says: `127.0.0.1.nip.io`, `metadata.google.internal` or an
//! internal corporate name lead to addresses that are not "the internet". So the gateway
//! classifies every address it would dial, AFTER resolving, and refuses the ones that are
//! not publicly routable: loopback, RFC 1918, CGNAT, link-local, ULA, unspecified,
//! multicast, broadcast and reserved ranges, and the cloud metadata endpoints. IPv4 embedded
//! in IPv6 (mapped `::ffff:a.b.c.d`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) is judged by
//! the IPv4 address it carries, so no spelling slips past.
//!
//! A provider may allow private CIDRs explicitly (`allowPrivateCidrs`, e.g. a package
//! mirror on the corporate network). The metadata endpoints are refused even then: no
//! sandbox of untrusted code has a reason to reach them, and a broad allowance such as
//! `169.254.0.0/16` must not open them by accident.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::provider::docker::firewall::parse_cidr;

/// Why an address is not dialled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A cloud metadata endpoint (never allowed).
    Metadata,
    /// `0.0.0.0/8`, `::`.
    Unspecified,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// RFC 1918: `10/8`, `172.16/12`, `192.168/16`.
    Private,
    /// RFC 6598 carrier-grade NAT: `100.64/10`.
    SharedCgnat,
    /// `169.254/16`, `fe80::/10`.
    LinkLocal,
    /// IPv6 unique local: `fc00::/7` (and the deprecated site-local `fec0::/10`).
    UniqueLocal,
    /// `224/4`, `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// Special-purpose and reserved ranges that reach nothing public (`192.0.0/24`,
    /// `198.18/15`, `240/4`, the deprecated IPv4-compatible `::/96`).
    Reserved,
}

impl Class {
    /// What the class is, for a refusal message.
    pub fn describe(self) -> &'static str {
        match self {
            Class::Metadata => "a cloud metadata endpoint",
            Class::Unspecified => "an unspecified address",
            Class::Loopback => "a loopback address",
            Class::Private => "a private (RFC 1918) address",
            Class::SharedCgnat => "a carrier-grade NAT (100.64.0.0/10) address",
            Class::LinkLocal => "a link-local address",
            Class::UniqueLocal => "a unique local (fc00::/7) address",
            Class::Multicast => "a multicast address",
            Class::Broadcast => "the broadcast address",
            Class::Reserved => "a reserved address",
        }
    }
}

/// The metadata endpoints: AWS/GCP/Azure/OpenStack/Oracle (`169.254.169.254`), AWS's IPv6
/// twin, Alibaba (`100.100.100.200`), Azure's wire server (`168.63.129.16`, a public
/// address that only answers inside Azure), Oracle's legacy `192.0.0.192`.
const METADATA: [IpAddr; 5] = [
    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
    IpAddr::V4(Ipv4Addr::new(168, 63, 129, 16)),
    IpAddr::V4(Ipv4Addr::new(192, 0, 0, 192)),
];

/// The class of a non-public address; `None` for an address the gateway may dial.
pub fn classify(ip: IpAddr) -> Option<Class> {
    let ip = match ip {
        IpAddr::V6(v6) => embedded_v4(v6).map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    if METADATA.contains(&ip) {
        return Some(Class::Metadata);
    }
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// The IPv4 address an IPv6 address stands for when it is a mapped, NAT64 or 6to4 one.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if let Some(v4) = v6.to_ipv4_mapped() {
        Some(v4)
    } else if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        Some(low)
    } else if s[0] == 0x2002 {
        Some(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ))
    } else {
        None
    }
}

fn in_v4(ip: Ipv4Addr, base: [u8; 4], prefix: u32) -> bool {
    let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(base)) & mask
}

fn classify_v4(ip: Ipv4Addr) -> Option<Class> {
    const TABLE: [([u8; 4], u32, Class); 12] = [
        ([0, 0, 0, 0], 8, Class::Unspecified),
        ([127, 0, 0, 0], 8, Class::Loopback),
        ([10, 0, 0, 0], 8, Class::Private),
        ([172, 16, 0, 0], 12, Class::Private),
        ([192, 168, 0, 0], 16, Class::Private),
        ([100, 64, 0, 0], 10, Class::SharedCgnat),
        ([169, 254, 0, 0], 16, Class::LinkLocal),
        ([192, 0, 0, 0], 24, Class::Reserved),
        ([198, 18, 0, 0], 15, Class::Reserved),
        ([224, 0, 0, 0], 4, Class::Multicast),
        ([255, 255, 255, 255], 32, Class::Broadcast),
        ([240, 0, 0, 0], 4, Class::Reserved),
    ];
    TABLE
        .iter()
        .find(|(base, prefix, _)| in_v4(ip, *base, *prefix))
        .map(|(_, _, class)| *class)
}

fn classify_v6(ip: Ipv6Addr) -> Option<Class> {
    let s = ip.segments();
    if ip.is_unspecified() {
        Some(Class::Unspecified)
    } else if ip.is_loopback() {
        Some(Class::Loopback)
    } else if s[..6] == [0; 6] {
        // `::a.b.c.d`, the deprecated IPv4-compatible form.
        Some(Class::Reserved)
    } else if s[0] & 0xfe00 == 0xfc00 || s[0] & 0xffc0 == 0xfec0 {
        Some(Class::UniqueLocal)
    } else if s[0] & 0xffc0 == 0xfe80 {
        Some(Class::LinkLocal)
    } else if s[0] & 0xff00 == 0xff00 {
        Some(Class::Multicast)
    } else {
        None
    }
}

/// An address range, from a CIDR or a bare address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    base: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `10.1.0.0/16`, `fd12::/48` or a bare address; the error says what is wrong.
    pub fn parse(text: &str) -> Result<Cidr, String> {
        parse_cidr(text)
            .map(|(base, prefix)| Cidr { base, prefix })
            .ok_or_else(|| format!("`{text}` is not an IP address or CIDR (e.g. `10.1.0.0/16`)"))
    }

    /// Whether `ip` lies in the range (an IPv4-mapped IPv6 address counts as its IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.base, ip) {
            (IpAddr::V4(base), IpAddr::V4(ip)) => in_v4(ip, base.octets(), u32::from(self.prefix)),
            (IpAddr::V6(base), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(ip) & mask == u128::from(base) & mask
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

/// The gateway's dialling rule: every public address, plus the private CIDRs the provider
/// allows explicitly, never a metadata endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DialPolicy {
    allowed_private: Vec<Cidr>,
}

/// Where the allowance is configured, for refusal messages.
pub const ALLOW_SETTING: &str = "egress.allowPrivateCidrs";

impl DialPolicy {
    /// The policy with these explicitly allowed private CIDRs.
    pub fn new(allowed_private: Vec<Cidr>) -> Self {
        DialPolicy { allowed_private }
    }

    /// `Ok` when `ip` may be dialled; otherwise why not, naming the fix where there is one.
    pub fn check(&self, ip: IpAddr) -> Result<(), String> {
        match classify(ip) {
            None => Ok(()),
            Some(Class::Metadata) => Err(format!(
                "{ip} is {}, which the egress gateway never connects to",
                Class::Metadata.describe()
            )),
            Some(_) if self.allowed_private.iter().any(|c| c.contains(ip)) => Ok(()),
            Some(class) => Err(format!(
                "{ip} is {}; the egress gateway connects to it only when the provider's \
                 {ALLOW_SETTING} lists a CIDR containing it",
                class.describe()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn every_non_public_range_is_classified() {
        let table: &[(&str, Option<Class>)] = &[
            ("127.0.0.1", Some(Class::Loopback)),
            ("127.255.255.254", Some(Class::Loopback)),
            ("::1", Some(Class::Loopback)),
            ("::ffff:127.0.0.1", Some(Class::Loopback)),
            ("0.0.0.0", Some(Class::Unspecified)),
            ("0.1.2.3", Some(Class::Unspecified)),
            ("::", Some(Class::Unspecified)),
            ("10.0.0.1", Some(Class::Private)),
            ("172.16.0.1", Some(Class::Private)),
            ("172.31.255.255", Some(Class::Private)),
            ("172.32.0.1", None),
            ("192.168.1.1", Some(Class::Private)),
            ("::ffff:10.1.2.3", Some(Class::Private)),
            ("::ffff:192.168.0.1", Some(Class::Private)),
            ("100.64.0.1", Some(Class::SharedCgnat)),
            ("100.127.255.255", Some(Class::SharedCgnat)),
            ("100.128.0.1", None),
            ("169.254.1.1", Some(Class::LinkLocal)),
            ("fe80::1", Some(Class::LinkLocal)),
            ("febf::1", Some(Class::LinkLocal)),
            ("fc00::1", Some(Class::UniqueLocal)),
            ("fdff::1", Some(Class::UniqueLocal)),
            ("fec0::1", Some(Class::UniqueLocal)),
            ("169.254.169.254", Some(Class::Metadata)),
            ("::ffff:169.254.169.254", Some(Class::Metadata)),
            ("fd00:ec2::254", Some(Class::Metadata)),
            ("100.100.100.200", Some(Class::Metadata)),
            ("168.63.129.16", Some(Class::Metadata)),
            ("224.0.0.1", Some(Class::Multicast)),
            ("239.255.255.250", Some(Class::Multicast)),
            ("ff02::1", Some(Class::Multicast)),
            ("255.255.255.255", Some(Class::Broadcast)),
            ("240.0.0.1", Some(Class::Reserved)),
            ("192.0.0.8", Some(Class::Reserved)),
            ("198.18.0.1", Some(Class::Reserved)),
            ("::7f00:1", Some(Class::Reserved)),
            // NAT64 and 6to4 carry an IPv4 address: judged by it.
            ("64:ff9b::7f00:1", Some(Class::Loopback)),
            ("64:ff9b::a9fe:a9fe", Some(Class::Metadata)),
            ("2002:c0a8:0101::1", Some(Class::Private)),
            ("64:ff9b::808:808", None),
            ("2002:0808:0808::1", None),
            // Public addresses.
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("192.0.2.1", None),
            ("2606:4700::1111", None),
            ("::ffff:8.8.8.8", None),
        ];
        for (addr, want) in table {
            assert_eq!(classify(ip(addr)), *want, "{addr}");
        }
    }

    #[test]
    fn cidrs_parse_and_contain() {
        let c = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(c.contains(ip("10.1.200.3")));
        assert!(c.contains(ip("::ffff:10.1.0.9")));
        assert!(!c.contains(ip("10.2.0.1")));
        assert!(!c.contains(ip("fd00::1")));
        let one = Cidr::parse("127.0.0.1").unwrap();
        assert_eq!(one.to_string(), "127.0.0.1/32");
        assert!(one.contains(ip("127.0.0.1")) && !one.contains(ip("127.0.0.2")));
        let v6 = Cidr::parse("fd12:3456::/32").unwrap();
        assert!(v6.contains(ip("fd12:3456:1::1")) && !v6.contains(ip("fd12:3457::1")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("10.0.0.1")));
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("intranet").unwrap_err().contains("CIDR"));
    }

    #[test]
    fn an_allowance_opens_its_cidr_but_never_the_metadata_endpoints() {
        let none = DialPolicy::default();
        assert!(none.check(ip("93.184.215.14")).is_ok());
        let refused = none.check(ip("10.1.2.3")).unwrap_err();
        assert!(
            refused.contains("10.1.2.3")
                && refused.contains("private")
                && refused.contains(ALLOW_SETTING),
            "{refused}"
        );
        let some = DialPolicy::new(vec![
            Cidr::parse("10.1.0.0/16").unwrap(),
            Cidr::parse("169.254.0.0/16").unwrap(),
        ]);
        assert!(some.check(ip("10.1.2.3")).is_ok());
        assert!(some.check(ip("::ffff:10.1.2.3")).is_ok());
        assert!(some.check(ip("10.2.0.1")).is_err());
        assert!(some.check(ip("169.254.1.1")).is_ok());
        let metadata = some.check(ip("169.254.169.254")).unwrap_err();
        assert!(metadata.contains("metadata") && metadata.contains("never"));
    }
}
