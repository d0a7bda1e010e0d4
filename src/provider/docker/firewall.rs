//! Host firewall rules that keep the cloud metadata endpoint, the engine's API and every
//! service of the engine's host out of every sandbox's reach, whatever its egress.
//!
//! Why iptables on the engine's host: a container's packets leave through the host's
//! netfilter hooks — `FORWARD` (Docker's `DOCKER-USER` chain, which Docker promises never to
//! touch) for anything off the host such as `169.254.169.254`, `INPUT` for the host's own
//! addresses. Nothing inside the sandbox can undo them (it has no `NET_ADMIN`, and no access
//! to the host's namespace), and they hold for every network a sandbox joins on that engine.
//!
//! Who installs them: the operator, through the engine (see `hostguard`; without a helper
//! image, from its own process)
//! below): a short-lived helper container in the host's network namespace with `NET_ADMIN`,
//! `NET_RAW` and `SYS_CHROOT` only, the host's root mounted read-only, running the host's own
//! `iptables` (so the rules land in the backend — legacy or nft — dockerd uses). The engine
//! runs it wherever it is, so the rules hold in every install mode: an operator next to
//! dockerd, one in a Kubernetes pod with the node's socket and no privilege of its own, one
//! talking to a remote engine. Whoever holds the engine's API is root on its host already;
//! the helper adds no privilege the operator did not have.
//!
//! The rules live in chains of their own, so they are found, audited and removed as a unit,
//! and are only ever added (idempotently, `-C` before `-A`), never flushed: another operator
//! on the same host may rely on them.
//!
//! - [`DEST_CHAIN`], jumped to from `DOCKER-USER` (or `FORWARD` when Docker manages no
//!   iptables) and `INPUT`: REJECT traffic from a container bridge to a blocked destination;
//! - [`HOST_CHAIN`], jumped to from `INPUT` only: REJECT (TCP reset) traffic from a container
//!   bridge to a blocked port of the host itself (the engine's API ports);
//! - `hostclose::CLOSED_CHAIN`, jumped to from `INPUT` only: REJECT everything else a
//!   namespace network sends to the host, except replies, the template store and the
//!   engine's resolvers when they run on the host (see `hostclose`);
//! - [`GATEWAY_CHAIN`], jumped to from `DOCKER-USER` (or `FORWARD`): ACCEPT what sandboxes
//!   behind the egress gateway send to the gateway's DNS and proxy ports, and the gateway's
//!   replies. Their network has inter-container traffic off, and Docker's drop for that sits
//!   after `DOCKER-USER`, so these rules are the one exception to it: sandbox to gateway,
//!   never sandbox to sandbox (see `gateway_rules`);
//! - [`WALL_CHAIN`], in the `mangle` table, jumped to from its `FORWARD`: what must hold
//!   whatever the order of `filter`'s `FORWARD` ([`wall_rules`] says why): DROP traffic from
//!   a namespace bridge to a namespace bridge, from a container bridge to a blocked
//!   destination, and between two sandboxes behind the gateway.
//!
//! Container bridges are matched by interface: `docker0` and `br-+` (every user-defined
//! bridge network) and [`SANDBOX_BRIDGES`] (the namespace networks, see `networks`). In
//! `filter`, REJECT rather than DROP, so a client inside fails at once instead of hanging
//! until its timeout; `mangle` cannot REJECT, and runs first, so what it drops times out.

use std::net::{IpAddr, Ipv4Addr};

use tokio::process::Command;

/// Chain of the destination rules (both families).
pub const DEST_CHAIN: &str = "SBX-GUARD";
/// Chain of the rules that must hold whatever `filter` looks like, in the `mangle` table
/// (both families; see [`wall_rules`]).
pub const WALL_CHAIN: &str = "SBX-WALL";
/// Chain of the host-port rules (both families).
pub const HOST_CHAIN: &str = "SBX-GUARD-HOST";
/// Chain of the rules that let sandboxes reach the egress gateway (IPv4 only: the gateway
/// listens on its IPv4 address).
pub const GATEWAY_CHAIN: &str = "SBX-GATEWAY";
/// How the Linux bridges of the namespace networks begin.
pub const SANDBOX_BRIDGE_PREFIX: &str = "sbxns-";
/// The namespace networks' bridges, as an iptables interface match.
pub const SANDBOX_BRIDGES: &str = "sbxns-+";
/// Interfaces container traffic enters the host through.
pub const BRIDGES: [&str; 3] = ["docker0", "br-+", SANDBOX_BRIDGES];

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
    /// The chain it is in: [`WALL_CHAIN`] in `mangle`, every other in `filter`.
    pub chain: &'static str,
    /// Everything after the chain name.
    pub args: Vec<String>,
}

impl Rule {
    /// The command that manages this rule, with its table.
    pub fn ipt(&self) -> String {
        ipt(self.family, self.chain)
    }
}

/// The table `chain` is in: `mangle` for [`WALL_CHAIN`]; `None` for iptables' default,
/// `filter`.
fn table(chain: &str) -> Option<&'static str> {
    (chain == WALL_CHAIN).then_some("mangle")
}

/// The command that manages `chain` of `family`, with its table.
fn ipt(family: Family, chain: &str) -> String {
    match table(chain) {
        Some(table) => format!("{} -w -t {table}", family.command()),
        None => format!("{} -w", family.command()),
    }
}

/// Where `chain` is jumped to from, in its own table: `$F` is the chain forwarded
/// container traffic is filtered in first (see [`forward_chain`]).
fn parents(chain: &str) -> &'static [&'static str] {
    match chain {
        DEST_CHAIN => &["$F", "INPUT"],
        HOST_CHAIN => &["INPUT"],
        GATEWAY_CHAIN => &["$F"],
        WALL_CHAIN => &["FORWARD"],
        _ => &[],
    }
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

/// The rules for these blocked destinations and host ports, in order (closing the rest of the
/// host to namespace networks is `hostclose`'s, with its exceptions). Each destination
/// twice per bridge: REJECT in [`DEST_CHAIN`], which the host's own addresses meet
/// (`INPUT`), and DROP in [`WALL_CHAIN`], which forwarded traffic meets first, whatever
/// `filter`'s order (see [`wall_rules`]): a client asking the metadata endpoint times out.
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
            let dest = format!("{addr}/{prefix}");
            for (chain, verdict) in [(DEST_CHAIN, "REJECT"), (WALL_CHAIN, "DROP")] {
                out.push(Rule {
                    family,
                    chain,
                    args: args(&["-i", bridge, "-d", &dest, "-j", verdict]),
                });
            }
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

/// The wall between namespace networks, in both families: DROP whatever a namespace bridge
/// forwards to a namespace bridge (another namespace's or its own), in [`WALL_CHAIN`] of the
/// `mangle` table, jumped to from `mangle`'s `FORWARD`.
///
/// Why not the engine's own isolation, or a rule in `filter`: both depend on the order of
/// `filter`'s `FORWARD`, and two things on a host rewrite it. The engine moves its jump to
/// `DOCKER-USER` to the top on every network it creates by deleting and re-inserting it; and
/// whatever saves the filter table and restores it later (kube-router's NetworkPolicy
/// firewall does, on every Pod change) writes back what it saw — a table caught between that
/// delete and insert has no jump to `DOCKER-USER` above a new network's `ACCEPT` of all it
/// forwards, and rules added meanwhile are lost. Measured in CI: a sandbox of one namespace
/// connected to another's. `mangle`'s `FORWARD` runs before `filter`'s, neither the engine
/// nor such a restore (`-T filter`) touches it, and this rule names no network, so it holds
/// whatever `filter` looks like. DROP, as `mangle` cannot REJECT: a connection across the
/// wall times out instead of being refused.
pub fn wall_rules() -> Vec<Rule> {
    [Family::V4, Family::V6]
        .map(|family| Rule {
            family,
            chain: WALL_CHAIN,
            args: args(&["-i", SANDBOX_BRIDGES, "-o", SANDBOX_BRIDGES, "-j", "DROP"]),
        })
        .to_vec()
}

fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|p| p.to_string()).collect()
}

/// The shell script that installs these rules, each chain they are in (and its jumps, see
/// [`parents`]) first, adding only what is missing (`-C` before `-A`), and fails (`set -e`)
/// on the first rule it cannot add.
pub fn script(rules: &[Rule]) -> String {
    let mut out = vec!["set -e".to_string()];
    let mut chains: Vec<(Family, &str)> = Vec::new();
    for rule in rules {
        if !chains.contains(&(rule.family, rule.chain)) {
            chains.push((rule.family, rule.chain));
        }
    }
    for (family, chain) in chains {
        let ipt = ipt(family, chain);
        out.push(ensure_chain(&ipt, chain));
        for parent in parents(chain) {
            if *parent == "$F" {
                out.push(forward_chain(&ipt));
            }
            out.push(ensure_jump(&ipt, parent, chain));
        }
    }
    out.extend(rules.iter().map(append));
    out.join("\n")
}

/// The rules that let sandboxes on the gateway's network (Linux bridge `bridge`) reach the
/// gateway at `gateway`: its DNS (UDP 53) and its proxy `ports`, and the gateway's replies.
/// Both ends are pinned to that bridge and the gateway's address, so a sandbox listening on
/// one of those ports is still out of every other sandbox's reach.
pub fn gateway_rules(bridge: &str, gateway: Ipv4Addr, ports: &[u16]) -> Vec<Rule> {
    let gateway = format!("{gateway}/32");
    let to_gateway = ["-i", bridge, "-o", bridge, "-d", gateway.as_str()];
    let mut out = vec![Rule {
        family: Family::V4,
        chain: GATEWAY_CHAIN,
        args: args(
            &[
                &to_gateway[..],
                &["-p", "udp", "--dport", "53", "-j", "ACCEPT"],
            ]
            .concat(),
        ),
    }];
    for port in ports {
        let port = port.to_string();
        let rule = [
            &to_gateway[..],
            &["-p", "tcp", "--dport", &port, "-j", "ACCEPT"],
        ]
        .concat();
        out.push(Rule {
            family: Family::V4,
            chain: GATEWAY_CHAIN,
            args: args(&rule),
        });
    }
    let replies = [
        "-i",
        bridge,
        "-o",
        bridge,
        "-s",
        gateway.as_str(),
        "-m",
        "conntrack",
        "--ctstate",
        "ESTABLISHED,RELATED",
        "-j",
        "ACCEPT",
    ];
    out.push(Rule {
        family: Family::V4,
        chain: GATEWAY_CHAIN,
        args: args(&replies),
    });
    out.extend(gateway_backstop(bridge, &gateway));
    out
}

/// The backstop of the gateway network's own isolation, in [`WALL_CHAIN`] (see
/// [`wall_rules`] for why `mangle`): whatever that bridge forwards between two containers
/// neither of which is the gateway (`gateway`, as `address/32`) is dropped, and all of its
/// IPv6 (the gateway serves IPv4 only). The engine's drop for the network and the openings
/// above sit in `filter`, where a restore of an older copy can reorder or lose them.
fn gateway_backstop(bridge: &str, gateway: &str) -> [Rule; 2] {
    let between = ["-i", bridge, "-o", bridge];
    let not_gateway = ["!", "-s", gateway, "!", "-d", gateway, "-j", "DROP"];
    [
        Rule {
            family: Family::V4,
            chain: WALL_CHAIN,
            args: args(&[&between[..], &not_gateway[..]].concat()),
        },
        Rule {
            family: Family::V6,
            chain: WALL_CHAIN,
            args: args(&[&between[..], &["-j", "DROP"][..]].concat()),
        },
    ]
}

/// Creates `chain` unless it exists; a concurrent creator may win between the check and
/// `-N`, so it checks again.
pub(super) fn ensure_chain(ipt: &str, chain: &str) -> String {
    format!(
        "{ipt} -n -L {chain} >/dev/null 2>&1 || {ipt} -N {chain} 2>/dev/null || \
         {ipt} -n -L {chain} >/dev/null"
    )
}

/// Sets `F` to the chain forwarded container traffic is filtered in first.
fn forward_chain(ipt: &str) -> String {
    format!("if {ipt} -n -L DOCKER-USER >/dev/null 2>&1; then F=DOCKER-USER; else F=FORWARD; fi")
}

/// Jumps from the top of `parent` to `chain` unless it already does.
pub(super) fn ensure_jump(ipt: &str, parent: &str, chain: &str) -> String {
    format!("{ipt} -C {parent} -j {chain} 2>/dev/null || {ipt} -I {parent} 1 -j {chain}")
}

/// Appends `rule` unless it is there.
pub(super) fn append(rule: &Rule) -> String {
    let quoted: Vec<String> = rule.args.iter().map(|a| format!("'{a}'")).collect();
    let args = quoted.join(" ");
    let (ipt, chain) = (rule.ipt(), rule.chain);
    format!("{ipt} -C {chain} {args} 2>/dev/null || {ipt} -A {chain} {args}")
}

/// Removes these rules (not the chains or jumps): for tests that installed rules for
/// stand-in addresses and must leave the host as they found it.
pub async fn remove(rules: &[Rule]) -> Result<(), String> {
    for rule in rules {
        while run(rule, "-C").await.is_ok() {
            run(rule, "-D").await?;
        }
    }
    Ok(())
}

/// Runs `op` (`-C`, `-D`) on `rule` with its family's command, in its table, with `-w`
/// (wait for the xtables lock, shared with dockerd).
async fn run(rule: &Rule, op: &str) -> Result<(), String> {
    let command = rule.family.command();
    let table = table(rule.chain).map(|t| ["-t", t]);
    let output = Command::new(command)
        .arg("-w")
        .args(table.iter().flatten())
        .args([op, rule.chain])
        .args(&rule.args)
        .output()
        .await
        .map_err(|e| format!("cannot run {command}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{} {op} {} {}` failed: {}",
            rule.ipt(),
            rule.chain,
            rule.args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_adds_each_rule_only_when_missing_in_its_table() {
        let r = rules(&["169.254.169.254/32".into()], &[2375]);
        let text = script(&r);
        assert!(text.starts_with("set -e\n"));
        for line in [
            "iptables -w -C SBX-GUARD '-i' 'docker0' '-d' '169.254.169.254/32' '-j' 'REJECT' \
             2>/dev/null || iptables -w -A SBX-GUARD '-i' 'docker0' '-d' '169.254.169.254/32' \
             '-j' 'REJECT'",
            "iptables -w -t mangle -C SBX-WALL '-i' 'sbxns-+' '-d' '169.254.169.254/32' '-j' \
             'DROP' 2>/dev/null || iptables -w -t mangle -A SBX-WALL '-i' 'sbxns-+' '-d' \
             '169.254.169.254/32' '-j' 'DROP'",
            "iptables -w -C $F -j SBX-GUARD 2>/dev/null || iptables -w -I $F 1 -j SBX-GUARD",
            "iptables -w -C INPUT -j SBX-GUARD-HOST 2>/dev/null || \
             iptables -w -I INPUT 1 -j SBX-GUARD-HOST",
            "iptables -w -t mangle -C FORWARD -j SBX-WALL 2>/dev/null || \
             iptables -w -t mangle -I FORWARD 1 -j SBX-WALL",
        ] {
            assert!(text.contains(line), "{line}\nnot in\n{text}");
        }
        // `$F` is set before the first jump from it.
        let set = text.find("then F=DOCKER-USER").unwrap();
        assert!(set < text.find("-I $F 1").unwrap(), "{text}");
    }

    #[test]
    fn the_gateway_rules_accept_only_its_ports_on_its_bridge_and_its_replies() {
        let r = gateway_rules("br-0123456789ab", Ipv4Addr::new(10, 9, 0, 2), &[80, 443]);
        assert_eq!(r.len(), 6);
        assert!(
            r[..4]
                .iter()
                .all(|r| r.family == Family::V4 && r.chain == GATEWAY_CHAIN)
        );
        for rule in &r[..3] {
            let text = rule.args.join(" ");
            assert!(
                text.starts_with("-i br-0123456789ab -o br-0123456789ab -d 10.9.0.2/32 -p "),
                "{text}"
            );
        }
        assert!(r[0].args.join(" ").ends_with("udp --dport 53 -j ACCEPT"));
        assert!(r[2].args.join(" ").ends_with("tcp --dport 443 -j ACCEPT"));
        assert!(r[3].args.join(" ").contains("-s 10.9.0.2/32 -m conntrack"));
        // The backstop: sandbox to sandbox dropped in mangle, all of IPv6 too.
        assert_eq!((r[4].family, r[4].chain), (Family::V4, WALL_CHAIN));
        assert_eq!(
            r[4].args.join(" "),
            "-i br-0123456789ab -o br-0123456789ab ! -s 10.9.0.2/32 ! -d 10.9.0.2/32 -j DROP"
        );
        assert_eq!((r[5].family, r[5].chain), (Family::V6, WALL_CHAIN));
        assert_eq!(
            r[5].args.join(" "),
            "-i br-0123456789ab -o br-0123456789ab -j DROP"
        );
        let text = script(&r);
        assert!(text.starts_with("set -e\n"));
        assert!(
            text.contains(
                "iptables -w -C $F -j SBX-GATEWAY 2>/dev/null || iptables -w -I $F 1 -j SBX-GATEWAY"
            ),
            "{text}"
        );
        assert!(
            !text
                .lines()
                .any(|l| l.starts_with("ip6tables -w -C") || l.starts_with("ip6tables -w -N")),
            "no IPv6 rule in filter: {text}"
        );
    }

    #[test]
    fn the_wall_drops_namespace_bridge_to_namespace_bridge_in_mangle_in_both_families() {
        let text = script(&wall_rules());
        assert!(text.starts_with("set -e\n"), "{text}");
        for ipt in ["iptables", "ip6tables"] {
            let mangle = format!("{ipt} -w -t mangle");
            for line in [
                format!("{mangle} -n -L SBX-WALL >/dev/null 2>&1 || {mangle} -N SBX-WALL"),
                format!(
                    "{mangle} -C FORWARD -j SBX-WALL 2>/dev/null || {mangle} -I FORWARD 1 -j SBX-WALL"
                ),
                format!("{mangle} -A SBX-WALL '-i' 'sbxns-+' '-o' 'sbxns-+' '-j' 'DROP'"),
            ] {
                assert!(text.contains(&line), "{line} not in {text}");
            }
        }
        // Nothing of it in `filter`, whose order others rewrite.
        assert!(
            text.lines().skip(1).all(|l| l.contains("-t mangle")),
            "{text}"
        );
    }

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
        assert_eq!(r.len(), 3 * (2 * 2 + 2));
        let v6: Vec<&Rule> = r
            .iter()
            .filter(|r| r.family == Family::V6 && r.chain == DEST_CHAIN)
            .collect();
        assert_eq!(v6.len(), 3);
        assert!(v6[0].args.contains(&"fd00:ec2::254/128".to_string()));
        let backstops = r.iter().filter(|r| r.chain == WALL_CHAIN);
        assert!(
            backstops
                .clone()
                .all(|r| r.args.ends_with(&args(&["-j", "DROP"])))
        );
        assert_eq!(backstops.count(), 3 * 2, "each destination on each bridge");
        assert!(
            r.iter()
                .filter(|r| r.chain == HOST_CHAIN && r.args.contains(&"--dport".to_string()))
                .all(|r| r.args.contains(&"tcp-reset".to_string()))
        );
    }
}
