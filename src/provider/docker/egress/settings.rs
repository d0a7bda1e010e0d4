//! Settings of a Docker provider's egress gateway: the `egress:` block of its `docker:`
//! settings. Absent = no gateway: a non-empty allow-list is refused at create, as Docker
//! alone cannot filter by domain.

use std::net::{Ipv4Addr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::validation::Issues;

/// Ports proxied unless configured.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];
/// Seconds between two checks that the gateway runs, unless configured.
pub const DEFAULT_CHECK_INTERVAL_SECONDS: u64 = 5;
/// The network the gateway reaches the outside through, unless configured.
pub const DEFAULT_NETWORK: &str = "bridge";
/// Where the operator binary is found in its own image.
pub const IMAGE_BINARY: &str = "/usr/local/bin/sandbox-operator";

/// How a provider's egress gateway runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressGatewaySettings {
    /// Image the gateway runs: the operator's own image (its binary at
    /// `/usr/local/bin/sandbox-operator`), or any image when `hostBinary` is set.
    pub image: String,
    /// A path ON THE ENGINE'S HOST to the operator binary, mounted read-only into the
    /// gateway and run instead of the image's (development and tests, where the binary is
    /// built on the host and no operator image exists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_binary: Option<String>,
    /// Container name of the gateway; default `sandbox-egress-<provider name>`. Its internal
    /// network and policy volume are named after it (`-net`, `-policy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The Docker network the gateway reaches the outside through.
    #[serde(default = "default_network")]
    pub network: String,
    /// Upstream DNS server (`IP:PORT`); default: the gateway container's own resolver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_dns: Option<String>,
    /// TCP ports sandboxes may connect out on (forwarded to the same port upstream).
    #[serde(default = "default_ports")]
    pub ports: Vec<u16>,
    /// IPv4 subnet of the internal network (`10.77.0.0/24`); default: one the engine picks
    /// from its free pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<String>,
    /// Seconds between two checks that the gateway runs (it is restarted when it does not).
    #[serde(default = "default_check_interval")]
    pub check_interval_seconds: u64,
    /// Private ranges (CIDRs or addresses, e.g. `10.1.0.0/16` for an internal mirror) a
    /// listed name may resolve to and still be reached. Without them the gateway never
    /// connects to loopback, RFC 1918, CGNAT, link-local or ULA addresses, whatever a name
    /// resolves to; the cloud metadata endpoints stay refused even inside a listed range.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_private_cidrs: Vec<String>,
}

fn default_network() -> String {
    DEFAULT_NETWORK.into()
}
fn default_ports() -> Vec<u16> {
    DEFAULT_PORTS.to_vec()
}
fn default_check_interval() -> u64 {
    DEFAULT_CHECK_INTERVAL_SECONDS
}

impl EgressGatewaySettings {
    /// Settings with every default and this image.
    pub fn with_image(image: impl Into<String>) -> Self {
        EgressGatewaySettings {
            image: image.into(),
            host_binary: None,
            name: None,
            network: default_network(),
            upstream_dns: None,
            ports: default_ports(),
            subnet: None,
            check_interval_seconds: default_check_interval(),
            allow_private_cidrs: Vec::new(),
        }
    }

    /// Reports every setting that cannot work, under `at` (e.g. `providers[0].docker.egress`).
    pub fn validate(&self, at: &str, issues: &mut Issues) {
        if self.image.trim().is_empty() {
            issues.push(
                format!("{at}.image"),
                "is empty; name the operator's own image (it runs `sandbox-operator gateway`)",
            );
        }
        if let Some(path) = &self.host_binary
            && !path.starts_with('/')
        {
            issues.push(
                format!("{at}.hostBinary"),
                format!("`{path}` is not an absolute path on the engine's host"),
            );
        }
        if let Some(dns) = &self.upstream_dns
            && dns.parse::<SocketAddr>().is_err()
        {
            issues.push(
                format!("{at}.upstreamDns"),
                format!("`{dns}` is not IP:PORT; use e.g. `10.0.0.2:53`, or remove it for the gateway's own resolver"),
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        if self.ports.is_empty()
            || self
                .ports
                .iter()
                .any(|p| *p == 0 || *p == 53 || !seen.insert(*p))
        {
            issues.push(
                format!("{at}.ports"),
                "must list distinct TCP ports other than 0 and 53 (the gateway's DNS); default [80, 443]",
            );
        }
        if let Some(subnet) = &self.subnet
            && parse_subnet(subnet).is_err()
        {
            issues.push(
                format!("{at}.subnet"),
                format!("`{subnet}` is not an IPv4 network of /8 to /28 (e.g. `10.77.0.0/24`)"),
            );
        }
        if self.check_interval_seconds == 0 {
            issues.push(
                format!("{at}.checkIntervalSeconds"),
                format!(
                    "must be at least 1; remove it for the default {DEFAULT_CHECK_INTERVAL_SECONDS}"
                ),
            );
        }
        if self.network.trim().is_empty() {
            issues.push(format!("{at}.network"), "is empty; remove it for `bridge`");
        }
        for (i, cidr) in self.allow_private_cidrs.iter().enumerate() {
            if let Err(e) = crate::gateway::destination::Cidr::parse(cidr) {
                issues.push(format!("{at}.allowPrivateCidrs[{i}]"), e);
            }
        }
    }
}

/// An IPv4 network as `(base address, prefix length)`.
pub(crate) fn parse_subnet(cidr: &str) -> Result<(Ipv4Addr, u8), String> {
    let (ip, prefix) = cidr
        .split_once('/')
        .ok_or_else(|| format!("{cidr:?} has no /prefix"))?;
    let ip: Ipv4Addr = ip.parse().map_err(|e| format!("{cidr:?}: {e}"))?;
    let prefix: u8 = prefix.parse().map_err(|e| format!("{cidr:?}: {e}"))?;
    if !(8..=28).contains(&prefix) {
        return Err(format!("{cidr:?}: the prefix must be /8 to /28"));
    }
    let mask = u32::MAX << (32 - prefix);
    Ok((Ipv4Addr::from(u32::from(ip) & mask), prefix))
}

/// The layout inside a subnet: the gateway at base+2, sandboxes from the upper half (so the
/// engine never hands the gateway's address to a sandbox), the bridge's reserved address
/// at base+1 (never configured on the host: see the gateway module).
pub(crate) struct Layout {
    pub subnet: String,
    pub bridge: Ipv4Addr,
    pub gateway: Ipv4Addr,
    pub sandboxes: String,
}

pub(crate) fn layout(cidr: &str) -> Result<Layout, String> {
    let (base, prefix) = parse_subnet(cidr)?;
    let b = u32::from(base);
    let half = 1u32 << (32 - prefix - 1);
    Ok(Layout {
        subnet: format!("{base}/{prefix}"),
        bridge: Ipv4Addr::from(b + 1),
        gateway: Ipv4Addr::from(b + 2),
        sandboxes: format!("{}/{}", Ipv4Addr::from(b + half), prefix + 1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_layout() {
        let s: EgressGatewaySettings = serde_yaml::from_str("image: op:1").unwrap();
        assert_eq!(s, EgressGatewaySettings::with_image("op:1"));
        assert_eq!(s.ports, vec![80, 443]);
        let l = layout("172.30.0.7/24").unwrap();
        assert_eq!(l.subnet, "172.30.0.0/24");
        assert_eq!(l.gateway, Ipv4Addr::new(172, 30, 0, 2));
        assert_eq!(l.sandboxes, "172.30.0.128/25");
    }

    #[test]
    fn validation_names_each_bad_field() {
        let bad = EgressGatewaySettings {
            image: "".into(),
            host_binary: Some("rel/path".into()),
            upstream_dns: Some("10.0.0.1".into()),
            ports: vec![80, 80],
            subnet: Some("10.0.0.0/30".into()),
            check_interval_seconds: 0,
            allow_private_cidrs: vec!["10.1.0.0/16".into(), "intranet".into()],
            ..EgressGatewaySettings::with_image("x")
        };
        let mut issues = Issues::default();
        bad.validate("e", &mut issues);
        let paths: Vec<&str> = issues.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "e.image",
                "e.hostBinary",
                "e.upstreamDns",
                "e.ports",
                "e.subnet",
                "e.checkIntervalSeconds",
                "e.allowPrivateCidrs[1]"
            ]
        );
    }
}
