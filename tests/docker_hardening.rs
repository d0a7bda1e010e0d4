//! The hardened defaults of Docker sandboxes, read back from inside the container
//! (`/proc/1/status`), and the host firewall that keeps the metadata endpoint and the
//! engine's API out of reach, tested against stand-ins on this machine: a listener in a
//! network namespace of its own behind a veth pair (reached through the host's FORWARD path,
//! like the real metadata endpoint) and listeners on the docker0 gateway address (reached
//! through INPUT, like a TCP-listening engine). The real endpoint is never contacted.
//!
//! Needs root (iptables, ip netns), the engine and the base image.

mod harness;

use std::collections::BTreeSet;
use std::net::{IpAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use harness::docker::TestEnv;
use harness::unique;
use sandbox_operator::provider::docker::firewall::{self, DEST_CHAIN};
use sandbox_operator::provider::docker::hardening::{
    HardeningSettings, MINIMAL_CAPABILITIES, capabilities_in_mask,
};
use sandbox_operator::provider::docker::{DockerProvider, DockerSettings};
use sandbox_operator::provider::{ErrorKind, Provider};

/// A provider on the local engine with these hardening settings.
async fn provider_with(hardening: HardeningSettings) -> DockerProvider {
    DockerProvider::connect_negotiated(
        "docker-hardening",
        DockerSettings {
            hardening,
            // The firewall helper's image (it needs `chroot`).
            default_image: Some(harness::docker::base_image()),
            ..Default::default()
        },
    )
    .await
    .expect("the Docker engine answers (run tests/setup/docker.sh)")
}

/// `Name:\tvalue` lines of `/proc/1/status` as seen inside the sandbox.
async fn pid1_status(env: &TestEnv, id: &str) -> std::collections::BTreeMap<String, String> {
    env.sh(id, "cat /proc/1/status")
        .await
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

fn caps(status: &std::collections::BTreeMap<String, String>, field: &str) -> BTreeSet<String> {
    capabilities_in_mask(&status[field]).unwrap_or_else(|| panic!("{field} is a hex mask"))
}

#[tokio::test]
async fn a_default_sandbox_keeps_only_the_minimal_capabilities_and_no_new_privileges() {
    let env = TestEnv::new("hardened").await;
    let name = env.name("sbx");
    let created = env.provider.create(&env.request(&name)).await.unwrap();
    env.provider.start(&name).await.unwrap();

    let status = pid1_status(&env, &name).await;
    let minimal: BTreeSet<String> = MINIMAL_CAPABILITIES.iter().map(|c| c.to_string()).collect();
    assert_eq!(caps(&status, "CapEff"), minimal, "effective set of pid 1");
    assert_eq!(caps(&status, "CapBnd"), minimal, "bounding set of pid 1");
    assert_eq!(status["NoNewPrivs"], "1");
    // An exec'd process (how agents run commands) is held the same way.
    let exec_status = env
        .sh(&name, "grep -E '^(CapBnd|NoNewPrivs)' /proc/self/status")
        .await;
    assert!(exec_status.contains("NoNewPrivs:\t1"), "{exec_status}");
    let bnd = exec_status
        .lines()
        .next()
        .unwrap()
        .split_once('\t')
        .unwrap()
        .1;
    assert_eq!(capabilities_in_mask(bnd).unwrap(), minimal);

    let raw = engine_inspect(&name).await;
    let host = raw.host_config.unwrap();
    assert_eq!(host.privileged, Some(false));
    assert_eq!(host.pids_limit, Some(4096), "the default pids ceiling");
    assert!(host.pid_mode.as_deref().is_none_or(str::is_empty));
    assert_ne!(host.network_mode.as_deref(), Some("host"));

    let profile = created.isolation.expect("the profile is reported");
    assert!(
        profile.starts_with("runtime=default hardened no-new-privileges caps=CHOWN,"),
        "{profile}"
    );
    assert!(profile.ends_with("host-firewall=iptables"), "{profile}");
    // The IPv6 twin of the metadata endpoint is blocked too (no bridge here has IPv6, so
    // only the rule itself can be checked).
    let v6 = Command::new("ip6tables")
        .args([
            "-w",
            "-C",
            DEST_CHAIN,
            "-i",
            "docker0",
            "-d",
            "fd00:ec2::254/128",
        ])
        .args(["-j", "REJECT"])
        .status()
        .unwrap();
    assert!(
        v6.success(),
        "the ip6tables rule for fd00:ec2::254 is installed"
    );
}

#[tokio::test]
async fn settings_relax_the_defaults_only_explicitly_and_status_says_so() {
    let mut env = TestEnv::new("relaxed").await;
    env.provider = provider_with(HardeningSettings {
        no_new_privileges: false,
        capabilities: vec!["CHOWN".into(), "NET_RAW".into()],
        default_pids_limit: 0,
        ..Default::default()
    })
    .await;
    let name = env.name("sbx");
    let created = env.provider.create(&env.request(&name)).await.unwrap();
    env.provider.start(&name).await.unwrap();
    let status = pid1_status(&env, &name).await;
    let want: BTreeSet<String> = ["CHOWN", "NET_RAW"].map(String::from).into();
    assert_eq!(caps(&status, "CapEff"), want);
    assert_eq!(status["NoNewPrivs"], "0");
    let host = engine_inspect(&name).await.host_config.unwrap();
    assert!(host.pids_limit.is_none_or(|p| p <= 0), "no default ceiling");
    let profile = created.isolation.unwrap();
    assert!(
        profile.contains(" relaxed caps=CHOWN,NET_RAW "),
        "{profile}"
    );
}

#[tokio::test]
async fn a_firewall_that_cannot_be_installed_refuses_the_create_naming_the_setting() {
    let env = TestEnv::new("fw-broken").await;
    let provider = provider_with(HardeningSettings {
        // A registry nobody listens on: the helper's image cannot be had.
        firewall_image: Some("localhost:1/sandbox-operator/none:x".into()),
        ..Default::default()
    })
    .await;
    let name = env.name("sbx");
    let err = provider.create(&env.request(&name)).await.unwrap_err();
    assert!(err.is(ErrorKind::Unsupported), "{err}");
    assert!(err.message().contains("hostFirewall: off"), "{err}");
    assert!(
        provider.describe(&name).await.unwrap().is_none(),
        "nothing was created"
    );
}

#[tokio::test]
async fn metadata_and_engine_stand_ins_are_unreachable_while_the_rest_is_not() {
    let mut env = TestEnv::new("fw").await;
    let off_host = OffHostStandIn::start();
    let gateway = docker0_gateway();
    let engine_port = HostListener::bind(gateway);
    let hardening = HardeningSettings {
        blocked_destinations: hardening_dests(&off_host),
        blocked_host_ports: vec![engine_port.port],
        ..Default::default()
    };
    let _rules = RulesGuard(firewall::rules(
        &hardening.blocked_destinations,
        &hardening.blocked_host_ports,
    ));
    env.provider = provider_with(hardening).await;
    let name = env.name("sbx");
    env.provider.create(&env.request(&name)).await.unwrap();
    env.provider.start(&name).await.unwrap();

    // The control first: the path itself works. (No host port answers a sandbox at all:
    // tests/tenancy_network.rs.)
    assert!(
        connects(&env, &name, off_host.control, 8080).await,
        "control off-host address"
    );
    // The stand-ins for the metadata endpoint and the engine's API port do not.
    assert!(
        !connects(&env, &name, off_host.blocked, 8080).await,
        "metadata stand-in reached"
    );
    assert!(
        !connects(&env, &name, gateway, engine_port.port).await,
        "engine stand-in reached"
    );

    // The `filter` rules lost (as a restore of an older copy of the table loses them), the
    // `mangle` backstop still holds; without it too, the stand-in answers: the two are what
    // kept it out.
    let (filter, mangle): (Vec<_>, Vec<_>) = firewall::rules(&hardening_dests(&off_host), &[])
        .into_iter()
        .partition(|r| r.chain == DEST_CHAIN);
    firewall::remove(&filter)
        .await
        .expect("filter rules removed");
    assert!(
        !connects(&env, &name, off_host.blocked, 8080).await,
        "metadata stand-in reached with only the mangle backstop in place"
    );
    firewall::remove(&mangle)
        .await
        .expect("mangle rules removed");
    assert!(
        connects(&env, &name, off_host.blocked, 8080).await,
        "the stand-in answers once neither rule is there"
    );
}

/// The blocked destinations of the metadata test.
fn hardening_dests(off_host: &OffHostStandIn) -> Vec<String> {
    vec![format!("{}/32", off_host.blocked)]
}

/// Whether a TCP connection from inside the sandbox to `addr:port` is established.
async fn connects(env: &TestEnv, id: &str, addr: IpAddr, port: u16) -> bool {
    let script = format!(
        "if timeout 5 bash -c 'exec 3<>/dev/tcp/{addr}/{port}' 2>/dev/null; then echo open; \
         else echo closed; fi"
    );
    env.sh(id, &script).await.trim() == "open"
}

async fn engine_inspect(name: &str) -> bollard::models::ContainerInspectResponse {
    harness::docker::engine()
        .await
        .inspect_container(
            name,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .expect("inspect")
}

fn sh(cmd: &str) {
    let out = Command::new("sh").args(["-c", cmd]).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The default bridge's gateway: the host's own address as containers see it. As in
/// `tests/setup/s3.sh`: the engine's recorded `Gateway`, else docker0's own address (an engine
/// started for the first time may record only the subnet).
fn docker0_gateway() -> IpAddr {
    let stdout = |cmd: &mut Command| {
        String::from_utf8_lossy(&cmd.output().expect("run a command").stdout).into_owned()
    };
    let recorded = stdout(
        Command::new("docker")
            .args(["network", "inspect", "bridge", "--format"])
            .arg("{{(index .IPAM.Config 0).Gateway}}"),
    );
    let address = match recorded.trim() {
        "" => stdout(Command::new("ip").args(["-4", "-o", "addr", "show", "docker0"]))
            .split_whitespace()
            .nth(3)
            .and_then(|cidr| cidr.split('/').next())
            .unwrap_or_default()
            .to_string(),
        gateway => gateway.to_string(),
    };
    address
        .parse()
        .unwrap_or_else(|_| panic!("a gateway address, not {address:?}"))
}

/// A TCP listener on the host (kernel backlog accepts the handshake; nothing is read).
struct HostListener {
    port: u16,
    _listener: TcpListener,
}

impl HostListener {
    fn bind(ip: IpAddr) -> Self {
        let listener = TcpListener::bind((ip, 0)).expect("bind on the docker0 gateway");
        HostListener {
            port: listener.local_addr().unwrap().port(),
            _listener: listener,
        }
    }
}

/// Two addresses in a network namespace of their own, behind a veth pair routed from the
/// host: container traffic to them is forwarded, exactly like traffic to the metadata
/// endpoint. One HTTP listener answers on both.
struct OffHostStandIn {
    netns: String,
    host_if: String,
    blocked: IpAddr,
    control: IpAddr,
    server: Child,
}

impl OffHostStandIn {
    fn start() -> Self {
        let tag = &unique("n")[2..10];
        let netns = format!("sbxmd-{tag}");
        let host_if = format!("sbxh{tag}");
        let peer_if = format!("sbxp{tag}");
        // A /29 of 198.18.0.0/15 (benchmark space, never routed on the internet).
        let n = u32::from_str_radix(tag, 16).unwrap();
        let base = (198u32 << 24) | (18 << 16) | ((n >> 8) & 0x1_fff8);
        let ip = |i: u32| IpAddr::from(std::net::Ipv4Addr::from(base + i));
        let (gw, blocked, control) = (ip(1), ip(2), ip(3));
        sh(&format!(
            "ip netns add {netns} && ip link add {host_if} type veth peer name {peer_if} && \
             ip link set {peer_if} netns {netns} && ip addr add {gw}/29 dev {host_if} && \
             ip link set {host_if} up && \
             ip netns exec {netns} sh -c 'ip link set lo up && ip link set {peer_if} up && \
             ip addr add {blocked}/29 dev {peer_if} && ip addr add {control}/29 dev {peer_if} && \
             ip route add default via {gw}'"
        ));
        let server = Command::new("ip")
            .args([
                "netns",
                "exec",
                &netns,
                "/usr/bin/python3",
                "-m",
                "http.server",
                "8080",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stand_in = OffHostStandIn {
            netns,
            host_if,
            blocked,
            control,
            server,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect_timeout(&(control, 8080).into(), Duration::from_secs(1))
            .is_err()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "stand-in listener never came up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        stand_in
    }
}

impl Drop for OffHostStandIn {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

/// Removes the stand-in rules this test made the provider install.
struct RulesGuard(Vec<firewall::Rule>);

impl Drop for RulesGuard {
    fn drop(&mut self) {
        let rules = self.0.clone();
        let done = std::thread::spawn(move || {
            tokio::runtime::Runtime::new()
                .unwrap()
                .block_on(firewall::remove(&rules))
        })
        .join();
        if !matches!(done, Ok(Ok(()))) {
            eprintln!("could not remove the stand-in firewall rules: {done:?}");
        }
    }
}
