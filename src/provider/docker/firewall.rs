//! Host firewall rules that keep the cloud metadata endpoint and the engine's API out of
//! every sandbox's reach, whatever its egress.
//!
//! Why iptables on the engine's host: a container's packets leave through the host's
//! netfilter hooks — `FORWARD` (Docker's `DOCKER-USER` chain, which Docker promises never to
//! touch) for anything off the host such as `169.254.169.254`, `INPUT` for the host's own
//! addresses where a TCP-listening engine answers. Nothing inside the sandbox can undo them
//! (it has no `NET_ADMIN`, and no access to the host's namespace), and they hold for every
//! network a sandbox joins on that engine. The price: whoever installs them must run in the
//! engine host's network namespace with `NET_ADMIN` — an operator next to dockerd (root
//! there anyway: the Docker socket is root-equivalent), not one talking to a remote engine.
//!
//! The rules live in two chains of their own in the `filter` table, so they are found,
//! audited and removed as a unit, and are only ever added (idempotently, `-C` before `-A`),
//! never flushed: another operator on the same host may rely on them.
//!
//! - [`DEST_CHAIN`], jumped to from `DOCKER-USER` (or `FORWARD` when Docker manages no
//!   iptables) and `INPUT`: REJECT traffic from a container bridge to a blocked destination;
//! - [`HOST_CHAIN`], jumped to from `INPUT` only: REJECT (TCP reset) traffic from a container
//!   bridge to a blocked port of the host itself (the engine's API ports).
//!
//! Container bridges are matched by interface: `docker0` and `br-+` (every user-defined
//! bridge network). REJECT rather than DROP, so a client inside fails at once instead of
//! hanging until its timeout.

use std::net::IpAddr;

use tokio::process::Command;

/// Chain of the destination rules (both families).
pub const DEST_CHAIN: &str = "SBX-GUARD";
/// Chain of the host-port rules (both families).
pub const HOST_CHAIN: &str = "SBX-GUARD-HOST";
/// Interfaces container traffic enters the host through.
pub const BRIDGES: [&str; 2] = ["docker0", "br-+"];

/// IPv4 (`iptables`) or IPv6 (`ip6tables`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `iptables`.
    V4,
    /// `ip6tables`.
    V6,
}

impl Family {
    /// The command that manages this family's rules.
    pub fn command(self) -> &'static str {
        match self {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        }
    }
}

/// One rule: its family, its chain and its match and target arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Which table family.
    pub family: Family,
    /// [`DEST_CHAIN`] or [`HOST_CHAIN`].
    pub chain: &'static str,
    /// Everything after the chain name.
    pub args: Vec<String>,
}

/// An address or CIDR (`169.254.169.254`, `fd00:ec2::254/128`) as address and prefix.
pub fn parse_cidr(text: &str) -> Option<(IpAddr, u8)> {
    let (addr, prefix) = match text.trim().split_once('/') {
        Some((a, p)) => (a.parse::<IpAddr>().ok()?, Some(p.parse::<u8>().ok()?)),
        None => (text.trim().parse::<IpAddr>().ok()?, None),
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = prefix.unwrap_or(max);
    (prefix <= max).then_some((addr, prefix))
}

/// The rules for these blocked destinations and host ports, in order.
pub fn rules(destinations: &[String], host_ports: &[u16]) -> Vec<Rule> {
    let mut out = Vec::new();
    for bridge in BRIDGES {
        for dest in destinations {
            let Some((addr, prefix)) = parse_cidr(dest) else {
                continue;
            };
            let family = if addr.is_ipv4() {
                Family::V4
            } else {
                Family::V6
            };
            out.push(Rule {
                family,
                chain: DEST_CHAIN,
                args: args(&[
                    "-i",
                    bridge,
                    "-d",
                    &format!("{addr}/{prefix}"),
                    "-j",
                    "REJECT",
                ]),
            });
        }
        for port in host_ports {
            for family in [Family::V4, Family::V6] {
                out.push(Rule {
                    family,
                    chain: HOST_CHAIN,
                    args: args(&[
                        "-i",
                        bridge,
                        "-p",
                        "tcp",
                        "--dport",
                        &port.to_string(),
                        "-j",
                        "REJECT",
                        "--reject-with",
                        "tcp-reset",
                    ]),
                });
            }
        }
    }
    out
}

fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|p| p.to_string()).collect()
}

/// Installs the chains, their jumps and the rules, adding only what is missing.
pub async fn ensure(rules: &[Rule]) -> Result<(), String> {
    for family in [Family::V4, Family::V6] {
        let mine: Vec<&Rule> = rules.iter().filter(|r| r.family == family).collect();
        if mine.is_empty() {
            continue;
        }
        ensure_chain(family, DEST_CHAIN).await?;
        ensure_chain(family, HOST_CHAIN).await?;
        let forward = if run(family, &["-n", "-L", "DOCKER-USER"]).await.is_ok() {
            "DOCKER-USER"
        } else {
            "FORWARD"
        };
        ensure_jump(family, forward, DEST_CHAIN).await?;
        ensure_jump(family, "INPUT", DEST_CHAIN).await?;
        ensure_jump(family, "INPUT", HOST_CHAIN).await?;
        for rule in mine {
            ensure_rule(rule).await?;
        }
    }
    Ok(())
}

/// Removes these rules (not the chains or jumps): for tests that installed rules for
/// stand-in addresses and must leave the host as they found it.
pub async fn remove(rules: &[Rule]) -> Result<(), String> {
    for rule in rules {
        while check(rule).await {
            let mut argv = vec!["-D", rule.chain];
            argv.extend(rule.args.iter().map(String::as_str));
            run(rule.family, &argv).await?;
        }
    }
    Ok(())
}

async fn ensure_chain(family: Family, chain: &str) -> Result<(), String> {
    if run(family, &["-n", "-L", chain]).await.is_ok() {
        return Ok(());
    }
    match run(family, &["-N", chain]).await {
        Ok(()) => Ok(()),
        // Created by a concurrent caller between the two calls.
        Err(_) if run(family, &["-n", "-L", chain]).await.is_ok() => Ok(()),
        Err(e) => Err(e),
    }
}

async fn ensure_jump(family: Family, parent: &str, chain: &str) -> Result<(), String> {
    if run(family, &["-C", parent, "-j", chain]).await.is_ok() {
        return Ok(());
    }
    run(family, &["-I", parent, "1", "-j", chain]).await
}

async fn ensure_rule(rule: &Rule) -> Result<(), String> {
    if check(rule).await {
        return Ok(());
    }
    let mut argv = vec!["-A", rule.chain];
    argv.extend(rule.args.iter().map(String::as_str));
    run(rule.family, &argv).await
}

async fn check(rule: &Rule) -> bool {
    let mut argv = vec!["-C", rule.chain];
    argv.extend(rule.args.iter().map(String::as_str));
    run(rule.family, &argv).await.is_ok()
}

/// Runs the family's command with `-w` (wait for the xtables lock, shared with dockerd).
async fn run(family: Family, argv: &[&str]) -> Result<(), String> {
    let output = Command::new(family.command())
        .arg("-w")
        .args(argv)
        .output()
        .await
        .map_err(|e| format!("cannot run {}: {e}", family.command()))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{} -w {}` failed: {}",
            family.command(),
            argv.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_parse_with_and_without_prefix() {
        assert_eq!(
            parse_cidr("169.254.169.254"),
            Some(("169.254.169.254".parse().unwrap(), 32))
        );
        assert_eq!(
            parse_cidr("fd00:ec2::254/128"),
            Some(("fd00:ec2::254".parse().unwrap(), 128))
        );
        assert_eq!(parse_cidr("10.0.0.0/33"), None);
        assert_eq!(parse_cidr("metadata"), None);
    }

    #[test]
    fn each_bridge_gets_each_destination_in_its_family_and_each_port_in_both() {
        let r = rules(
            &["169.254.169.254/32".into(), "fd00:ec2::254/128".into()],
            &[2375],
        );
        assert_eq!(r.len(), 2 * (2 + 2));
        let v6: Vec<&Rule> = r
            .iter()
            .filter(|r| r.family == Family::V6 && r.chain == DEST_CHAIN)
            .collect();
        assert_eq!(v6.len(), 2);
        assert!(v6[0].args.contains(&"fd00:ec2::254/128".to_string()));
        assert!(
            r.iter()
                .filter(|r| r.chain == HOST_CHAIN)
                .all(|r| r.args.contains(&"tcp-reset".to_string()))
        );
    }
}
