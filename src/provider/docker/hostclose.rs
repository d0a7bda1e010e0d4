//! Closing the engine's host to the namespace networks, with the few exceptions sandboxes
//! need.
//!
//! Why: an unrestricted sandbox sits on its namespace's bridge (`networks`), and the host has
//! an address on every bridge. Without a rule, every service the host listens on — a
//! database on `0.0.0.0`, the kubelet, a node exporter, a development server — answers every
//! sandbox. So [`CLOSED_CHAIN`], jumped to from `INPUT` in both families, rejects every
//! packet a namespace bridge ([`SANDBOX_BRIDGES`]) sends to the host, after these openings,
//! each a `RETURN` (so the host's other rules, the engine's ports among them, still apply):
//!
//! - replies to what the host opened itself (published ports, health checks);
//! - IPv6 neighbour and router discovery, without which no IPv6 packet leaves the bridge;
//! - the template store, when it runs on the engine's host: sandboxes download and upload
//!   template archives themselves through presigned URLs (`templates::transfer`), so each
//!   address its endpoint resolves to is opened on that TCP port only
//!   ([`HardeningSettings::open_host_services`](super::hardening::HardeningSettings), to
//!   which the operator adds the provider's store);
//! - the engine's upstream resolvers at the host's addresses: the engine's embedded DNS
//!   forwards a sandbox's queries from the sandbox's own network namespace, so a resolver
//!   listening on the host (not on loopback) must answer port 53 there. They are read on the
//!   host itself, from the files the engine reads (see [`dns_openings`]).
//!
//! The egress gateway is a container, not the host: traffic to it is forwarded, never seen
//! by `INPUT`, and the gateway's own network gives the host no address (see `egress`).
//!
//! Order is what makes the exceptions hold whatever installed the chain before: every opening
//! is inserted at the top (`-I 1`) when missing, the reject is appended when missing, so an
//! opening added later by another provider or another operator on the same host still comes
//! before it. Nothing is ever flushed or deleted, and the script stops at the first rule it
//! cannot add, so a failure refuses the create (fail closed).

use std::net::{IpAddr, SocketAddr};

use super::firewall::{Family, Rule, SANDBOX_BRIDGES, ensure_chain, ensure_jump};

/// Chain of the rules that close the host to the namespace networks (both families).
pub const CLOSED_CHAIN: &str = "SBX-GUARD-NS";

/// Files the engine reads its upstream resolvers from: the usual one, and the one it uses
/// instead when the usual one names only systemd-resolved's loopback stub.
pub const RESOLVER_FILES: [&str; 2] = ["/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"];

/// A `host:port` service (`minio:9000`, `172.17.0.1:19000`, `[fd00::1]:9000`), checked.
pub fn parse_service(text: &str) -> Option<(String, u16)> {
    let (host, port) = text.trim().rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let plain = !host.is_empty() && !host.contains(['/', '@', ' ']);
    plain.then(|| (host.to_string(), port))
}

/// The `host:port` service a URL endpoint (`http://172.17.0.1:19000`) is served at, the
/// scheme's port when it names none; `None` when it is not a URL with a host.
pub fn service_of_url(endpoint: &str) -> Option<String> {
    let url = url::Url::parse(endpoint.trim()).ok()?;
    let port = url.port_or_known_default()?;
    match url.host()? {
        url::Host::Ipv6(ip) => Some(format!("[{ip}]:{port}")),
        host => Some(format!("{host}:{port}")),
    }
}

/// Every address these services resolve to, each with its port. A name that does not
/// resolve fails the whole install, naming it (it is retried by the next create).
pub async fn resolve(services: &[String]) -> Result<Vec<SocketAddr>, String> {
    let mut out = Vec::new();
    for service in services {
        let (host, port) = parse_service(service)
            .ok_or_else(|| format!("`{service}` is not a host:port service"))?;
        let found = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| format!("resolving the host service {service}: {e}"))?;
        out.extend(found);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The openings, in the order they are listed (each goes to the top of the chain when it is
/// missing, so their order among themselves does not matter).
pub fn opening_rules(services: &[SocketAddr]) -> Vec<Rule> {
    let mut out = Vec::new();
    for family in [Family::V4, Family::V6] {
        out.push(rule(
            family,
            &["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED"],
        ));
    }
    for kind in [
        "router-solicitation",
        "neighbour-solicitation",
        "neighbour-advertisement",
    ] {
        out.push(rule(
            Family::V6,
            &["-p", "ipv6-icmp", "-m", "icmp6", "--icmpv6-type", kind],
        ));
    }
    out.extend(services.iter().map(|s| service_rule(*s)));
    out
}

/// The opening of one service address: that address, that TCP port, nothing else.
pub fn service_rule(service: SocketAddr) -> Rule {
    let (family, prefix) = match service.ip() {
        IpAddr::V4(_) => (Family::V4, 32),
        IpAddr::V6(_) => (Family::V6, 128),
    };
    let dest = format!("{}/{prefix}", service.ip());
    let port = service.port().to_string();
    rule(family, &["-d", &dest, "-p", "tcp", "--dport", &port])
}

/// A `RETURN` from a namespace bridge matching `matches`.
fn rule(family: Family, matches: &[&str]) -> Rule {
    let mut args = vec!["-i".to_string(), SANDBOX_BRIDGES.to_string()];
    args.extend(matches.iter().map(|m| m.to_string()));
    args.extend(["-j".to_string(), "RETURN".to_string()]);
    Rule {
        family,
        chain: CLOSED_CHAIN,
        args,
    }
}

/// The reject that closes the host, in one family.
pub fn closing_rule(family: Family) -> Rule {
    Rule {
        family,
        chain: CLOSED_CHAIN,
        args: ["-i", SANDBOX_BRIDGES, "-j", "REJECT"]
            .map(String::from)
            .to_vec(),
    }
}

/// The script that closes the host: the chain and its jump from `INPUT` in both families,
/// the `openings` at the top, the resolvers' openings, then the reject at the end.
pub fn script(openings: &[Rule]) -> String {
    let mut out = vec!["set -e".to_string()];
    for family in [Family::V4, Family::V6] {
        let ipt = format!("{} -w", family.command());
        out.push(ensure_chain(&ipt, CLOSED_CHAIN));
        out.push(ensure_jump(&ipt, "INPUT", CLOSED_CHAIN));
        for opening in openings.iter().filter(|r| r.family == family) {
            out.push(insert_first(&ipt, opening));
        }
    }
    out.push(dns_openings(
        &RESOLVER_FILES,
        &format!("{} -w", Family::V4.command()),
        &format!("{} -w", Family::V6.command()),
    ));
    for family in [Family::V4, Family::V6] {
        out.push(super::firewall::append(&closing_rule(family)));
    }
    out.join("\n")
}

/// Inserts `rule` at the top of its chain unless it is there.
fn insert_first(ipt: &str, rule: &Rule) -> String {
    let args = quoted(&rule.args);
    let chain = rule.chain;
    format!("{ipt} -C {chain} {args} 2>/dev/null || {ipt} -I {chain} 1 {args}")
}

fn quoted(args: &[String]) -> String {
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    quoted.join(" ")
}

/// Shell that opens port 53 (UDP and TCP) of each resolver named in `files` (those that
/// exist) that is not on loopback (the engine queries those from its own namespace) and not
/// link-local with a zone; `ipt4` and `ipt6` are the commands of each family. Plain shell
/// (`read`, `case`), so it needs nothing of the host but its `sh`.
pub fn dns_openings(files: &[&str], ipt4: &str, ipt6: &str) -> String {
    let args = |proto: &str| {
        format!(
            "{} -d \"$ns\" -p {proto} --dport 53 -j RETURN",
            quoted(&["-i".to_string(), SANDBOX_BRIDGES.to_string()])
        )
    };
    let ensure = |proto: &str| {
        let args = args(proto);
        format!("$I -C {CLOSED_CHAIN} {args} 2>/dev/null || $I -I {CLOSED_CHAIN} 1 {args}")
    };
    format!(
        "for f in {files}; do\n  [ -r \"$f\" ] || continue\n  while read -r k ns _; do\n    \
         [ \"$k\" = nameserver ] || continue\n    case \"$ns\" in\n      ''|127.*|::1|*%*) \
         continue ;;\n      *:*) I=\"{ipt6}\" ;;\n      *) I=\"{ipt4}\" ;;\n    esac\n    \
         {udp}\n    {tcp}\n  done < \"$f\"\ndone",
        files = files.join(" "),
        udp = ensure("udp"),
        tcp = ensure("tcp"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_parse_from_host_port_and_from_urls() {
        assert_eq!(
            parse_service("172.17.0.1:19000"),
            Some(("172.17.0.1".into(), 19000))
        );
        assert_eq!(
            parse_service("[fd00::1]:9000"),
            Some(("fd00::1".into(), 9000))
        );
        assert_eq!(parse_service("minio:9000"), Some(("minio".into(), 9000)));
        assert_eq!(parse_service("minio"), None);
        assert_eq!(parse_service("minio:0"), None);
        assert_eq!(parse_service("http://minio:9000"), None);
        let url = |u| service_of_url(u);
        assert_eq!(
            url("http://172.17.0.1:19000"),
            Some("172.17.0.1:19000".into())
        );
        assert_eq!(url("https://s3.example"), Some("s3.example:443".into()));
        assert_eq!(url("http://[fd00::1]/"), Some("[fd00::1]:80".into()));
        assert_eq!(url("minio:9000/x"), None);
    }

    #[test]
    fn a_service_opens_its_address_and_port_only_and_the_reject_comes_last() {
        let store: SocketAddr = "172.17.0.1:19000".parse().unwrap();
        let openings = opening_rules(&[store]);
        let text = service_rule(store).args.join(" ");
        assert_eq!(
            text,
            "-i sbxns-+ -d 172.17.0.1/32 -p tcp --dport 19000 -j RETURN"
        );
        assert!(openings.iter().all(|r| r.args.last().unwrap() == "RETURN"));
        let script = script(&openings);
        assert!(script.starts_with("set -e\n"));
        let opened = script
            .find("-I SBX-GUARD-NS 1 '-i' 'sbxns-+' '-d' '172.17.0.1/32'")
            .expect(&script);
        let rejected = script
            .find("iptables -w -A SBX-GUARD-NS '-i' 'sbxns-+' '-j' 'REJECT'")
            .expect(&script);
        assert!(opened < rejected, "{script}");
        assert!(script.contains("ip6tables -w -A SBX-GUARD-NS '-i' 'sbxns-+' '-j' 'REJECT'"));
        assert!(script.contains("iptables -w -C INPUT -j SBX-GUARD-NS"));
    }

    /// Runs the resolver openings against stand-in commands that print what they add.
    #[test]
    fn only_resolvers_off_loopback_are_opened_for_udp_and_tcp() {
        let dir = std::env::temp_dir().join(format!("sbx-dns-{:08x}", fastrand::u32(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("resolv.conf");
        std::fs::write(
            &file,
            "# comment\nnameserver 127.0.0.53\nnameserver 10.0.0.2\nsearch x\n\
             nameserver fd00::53\nnameserver fe80::1%eth0\nnameserver ::1\n",
        )
        .unwrap();
        let missing = dir.join("absent");
        let fake = "four() { [ \"$1\" = -C ] && return 1; echo \"4 $*\"; }\n\
                    six() { [ \"$1\" = -C ] && return 1; echo \"6 $*\"; }\n";
        let files = [file.to_str().unwrap(), missing.to_str().unwrap()];
        let script = format!("set -e\n{fake}{}", dns_openings(&files, "four", "six"));
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(out.status.success(), "{script}: {out:?}");
        let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        let expected = [
            "4 -I SBX-GUARD-NS 1 -i sbxns-+ -d 10.0.0.2 -p udp --dport 53 -j RETURN",
            "4 -I SBX-GUARD-NS 1 -i sbxns-+ -d 10.0.0.2 -p tcp --dport 53 -j RETURN",
            "6 -I SBX-GUARD-NS 1 -i sbxns-+ -d fd00::53 -p udp --dport 53 -j RETURN",
            "6 -I SBX-GUARD-NS 1 -i sbxns-+ -d fd00::53 -p tcp --dport 53 -j RETURN",
        ];
        assert_eq!(lines, expected);
    }
}
