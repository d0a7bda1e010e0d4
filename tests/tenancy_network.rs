//! Tenancy on Docker, the network walls (issue 22, item 4): a sandbox of one namespace cannot
//! connect to a sandbox of another, and nothing on the engine's host answers a sandbox.
//!
//! Real engine, real host firewall: the provider is driven directly (the namespace a sandbox
//! belongs to is its owner's, exactly what the controller passes), and every probe is a TCP
//! connect from inside a sandbox with a deadline. Each refusal is paired with a control that
//! shows the same target answering someone who should reach it (the host itself), so a probe
//! that fails for an unrelated reason cannot pass the test.
//!
//! Needs root (the host firewall), the engine and the base image.

#[path = "egress/fakenet.rs"]
mod fakenet;
mod harness;

use std::net::{IpAddr, TcpListener};
use std::time::Duration;

use fakenet::{FakeNet, GatewayGuard, gateway_settings};
use harness::docker::{TEST_LABEL, TestEnv, base_image, http_server};
use harness::{host_reaches, unique, wait_for};
use sandbox_operator::provider::docker::{DockerProvider, DockerSettings};
use sandbox_operator::provider::{CreateRequest, Provider};

const DEADLINE: Duration = Duration::from_secs(60);

/// A request of `env` for a sandbox of namespace `namespace`.
fn request_in(env: &TestEnv, namespace: &str, name: &str) -> CreateRequest {
    let mut request = env.request(name);
    request.owner.namespace = namespace.into();
    request
}

async fn started(env: &TestEnv, request: &CreateRequest) {
    env.provider
        .create(request)
        .await
        .unwrap_or_else(|e| panic!("create {}: {e}", request.name));
    env.provider.start(&request.name).await.unwrap();
}

/// The container's endpoints, by network name.
async fn endpoints(
    name: &str,
) -> std::collections::HashMap<String, bollard::models::EndpointSettings> {
    let c = harness::docker::engine()
        .await
        .inspect_container(
            name,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .expect("inspect");
    c.network_settings
        .and_then(|n| n.networks)
        .unwrap_or_default()
}

/// The container's addresses and its networks' gateways (the host's side of each bridge).
async fn addresses(name: &str) -> (Vec<IpAddr>, Vec<IpAddr>) {
    let networks = endpoints(name).await;
    let parse = |s: &Option<String>| s.as_deref().and_then(|s| s.parse::<IpAddr>().ok());
    let ips = networks.values().filter_map(|e| parse(&e.ip_address));
    let gateways = networks.values().filter_map(|e| parse(&e.gateway));
    (ips.collect(), gateways.collect())
}

/// Whether a TCP connection from inside the sandbox to `addr:port` is established.
async fn connects(env: &TestEnv, id: &str, addr: IpAddr, port: u16) -> bool {
    let script = format!(
        "if timeout 5 bash -c 'exec 3<>/dev/tcp/{addr}/{port}' 2>/dev/null; then echo open; \
         else echo closed; fi"
    );
    env.sh(id, &script).await.trim() == "open"
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_cannot_connect_to_a_sandbox_of_another_namespace() {
    let env = TestEnv::new("tenancy-net").await;
    let (ns_a, ns_b) = (unique("a"), unique("b"));
    let mut server = request_in(&env, &ns_a, &env.name("srv"));
    server.command = Some(http_server());
    started(&env, &server).await;
    let neighbour = request_in(&env, &ns_a, &env.name("nbr"));
    let stranger = request_in(&env, &ns_b, &env.name("str"));
    started(&env, &neighbour).await;
    started(&env, &stranger).await;

    refused(
        &env,
        &server.name,
        &stranger.name,
        "a sandbox of namespace b",
    )
    .await;
    // Inter-container traffic is off within a namespace too (see the provider's `networks`
    // module for why).
    refused(
        &env,
        &server.name,
        &neighbour.name,
        "a sandbox of the same namespace",
    )
    .await;
}

/// Asserts that `prober` cannot connect to port 8080 of the server sandbox at any of its
/// addresses, each first shown answering this host (the control); `who` names the prober in
/// the failure.
async fn refused(env: &TestEnv, server: &str, prober: &str, who: &str) {
    let (ips, _) = addresses(server).await;
    assert!(!ips.is_empty(), "the server sandbox has an address");
    for ip in ips {
        host_reaches(ip, 8080).await;
        assert!(
            !connects(env, prober, ip, 8080).await,
            "{who} connected to {ip}:8080 of the server sandbox {server}"
        );
    }
}

/// Takes the engine's own isolation rules for these bridges out of the host's firewall, as a
/// restore of an older copy of the filter table does (see `firewall::wall_rules`), and puts
/// them back when dropped (the engine removes them with the networks).
struct EngineIsolationRemoved(Vec<Vec<String>>);

impl EngineIsolationRemoved {
    fn of(bridges: &[&str]) -> Self {
        let mut removed = EngineIsolationRemoved(Vec::new());
        for bridge in bridges {
            let rule = ["DOCKER-ISOLATION-STAGE-2", "-o", bridge, "-j", "DROP"].map(String::from);
            let status = std::process::Command::new("iptables")
                .args(["-w", "-D"])
                .args(&rule)
                .status()
                .expect("iptables");
            assert!(status.success(), "the engine isolates {bridge}: {rule:?}");
            removed.0.push(rule.to_vec());
        }
        removed
    }
}

impl Drop for EngineIsolationRemoved {
    fn drop(&mut self) {
        for rule in &self.0 {
            let (chain, args) = rule.split_first().expect("a chain");
            let _ = std::process::Command::new("iptables")
                .args(["-w", "-I", chain, "1"])
                .args(args)
                .output();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_wall_between_namespaces_holds_without_the_engines_own_isolation() {
    use sandbox_operator::provider::docker::networks;
    let env = TestEnv::new("tenancy-wall").await;
    let mut server = request_in(&env, &unique("a"), &env.name("wsrv"));
    server.command = Some(http_server());
    started(&env, &server).await;
    let stranger = request_in(&env, &unique("b"), &env.name("wstr"));
    started(&env, &stranger).await;
    // Both ways: the engine drops a reply into the other network as well as the request.
    let bridges =
        [&server, &stranger].map(|r| networks::for_owner(env.provider.name(), &r.owner).bridge);
    let _removed = EngineIsolationRemoved::of(&[&bridges[0], &bridges[1]]);

    let who = format!("with the engine's isolation of {bridges:?} gone, a sandbox of namespace b");
    refused(&env, &server.name, &stranger.name, &who).await;
}

/// `curl` of the fake internet's `allowed.test` from inside the sandbox, through the gateway.
async fn reaches_allowed(env: &TestEnv, id: &str) -> Result<(), String> {
    let out = env
        .sh(id, "curl -s -m 5 http://allowed.test/ || echo failed")
        .await;
    match out.trim() {
        "hello allowed.test" => Ok(()),
        other => Err(format!("allowed.test from {id}: {other}")),
    }
}

/// A provider whose egress gateway `gw` forwards to the fake internet `net`.
async fn gateway_provider(name: &str, net: &FakeNet, gw: &str) -> DockerProvider {
    DockerProvider::connect_negotiated(
        name,
        DockerSettings {
            default_image: Some(base_image()),
            egress: Some(gateway_settings(net, gw, base_image(), 8)),
            ..Default::default()
        },
    )
    .await
    .expect("a provider with an egress gateway")
}

#[tokio::test(flavor = "multi_thread")]
async fn allow_listed_sandboxes_of_two_namespaces_cannot_connect_to_each_other() {
    // Dropped in reverse: sandboxes, gateway, fake internet (see tests/docker_egress.rs).
    let gw = unique("tn-gw");
    let net = FakeNet::start(&unique("tn-inet"), (TEST_LABEL, &gw)).await;
    let _guard = GatewayGuard(gw.clone());
    let env = TestEnv::new("tenancy-gw").await;
    let provider = gateway_provider("docker-tenancy-gw", &net, &gw).await;
    let allowed = Some(vec!["allowed.test".to_string()]);
    let mut server = request_in(&env, &unique("a"), &env.name("gsrv"));
    server.command = Some(http_server());
    server.allowed_domains = allowed.clone();
    let mut stranger = request_in(&env, &unique("b"), &env.name("gstr"));
    stranger.allowed_domains = allowed;
    for request in [&server, &stranger] {
        provider.create(request).await.expect("create");
        provider.start(&request.name).await.expect("start");
    }

    // Controls: both reach their allowed destination through the gateway, and the server
    // answers on its address (from itself: the host has no address on the gateway's network).
    for id in [&server.name, &stranger.name] {
        wait_for("allowed.test through the gateway", DEADLINE, || {
            reaches_allowed(&env, id)
        })
        .await;
    }
    let (ips, _) = addresses(&server.name).await;
    assert!(!ips.is_empty(), "the server sandbox has an address");
    for ip in ips {
        wait_for(
            &format!("the server answering on {ip}:8080"),
            DEADLINE,
            || async {
                match connects(&env, &server.name, ip, 8080).await {
                    true => Ok(()),
                    false => Err("closed".to_string()),
                }
            },
        )
        .await;
        assert!(
            !connects(&env, &stranger.name, ip, 8080).await,
            "an allow-listed sandbox of namespace b connected to {ip}:8080 of an allow-listed \
             sandbox of namespace a"
        );
    }
    backstop_holds(&env, &provider, &server.name, &stranger.name, &gw).await;
    for request in [&stranger, &server] {
        provider.destroy(&request.name).await.expect("destroy");
    }
}

/// The host's own addresses, loopback excluded (a sandbox has no route to it anyway), and
/// the bridges of user-defined networks too: other tests create and remove those meanwhile
/// (the sandbox's own bridge is probed through its gateway).
fn host_addresses() -> Vec<IpAddr> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .expect("ip addr");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            let interface = l.split_whitespace().nth(1).unwrap_or_default();
            !interface.starts_with("br-") && !interface.starts_with("sbxns-")
        })
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter_map(|cidr| cidr.split('/').next()?.parse::<IpAddr>().ok())
        .filter(|ip| !ip.is_loopback())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_on_the_host_answers_a_sandbox() {
    let env = TestEnv::new("tenancy-host").await;
    let listener = TcpListener::bind("0.0.0.0:0").expect("a host port on every address");
    let port = listener.local_addr().unwrap().port();
    let sandbox = request_in(&env, &unique("h"), &env.name("probe"));
    started(&env, &sandbox).await;

    let (_, gateways) = addresses(&sandbox.name).await;
    assert!(!gateways.is_empty(), "the sandbox's network has a gateway");
    let mut targets = gateways;
    targets.extend(host_addresses());
    targets.sort();
    targets.dedup();
    for ip in targets {
        host_reaches(ip, port).await;
        assert!(
            !connects(&env, &sandbox.name, ip, port).await,
            "the sandbox connected to the host at {ip}:{port}"
        );
    }
}

/// Waits until the sandbox reaches the open service, re-checking the provider's rules
/// between tries: anything on this host that restores an older copy of the filter table
/// (kube-router, for the Kubernetes tests) can drop the opening at any time.
async fn reaches_open_service(env: &TestEnv, id: &str, addr: IpAddr, port: u16) {
    host_reaches(addr, port).await;
    wait_for(
        &format!("the sandbox reaching the open host service {addr}:{port}"),
        DEADLINE,
        || async {
            if connects(env, id, addr, port).await {
                return Ok(());
            }
            env.provider.reassert_firewall().await?;
            Err("closed".to_string())
        },
    )
    .await;
}

/// Deletes a firewall opening a test added for a port of its own, so the host's rules do not
/// grow by one stand-in port per run (also when the test fails).
struct Opening(sandbox_operator::provider::docker::firewall::Rule);

impl Drop for Opening {
    fn drop(&mut self) {
        let rule = &self.0;
        let _ = std::process::Command::new(rule.family.command())
            .args(["-w", "-D", rule.chain])
            .args(&rule.args)
            .output();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_host_service_answers_a_sandbox_at_its_address_and_port_only() {
    use sandbox_operator::provider::docker::hostclose;
    let open = TcpListener::bind("0.0.0.0:0").expect("the open service's port");
    let closed = TcpListener::bind("0.0.0.0:0").expect("another port");
    let (port, other) = (
        open.local_addr().unwrap().port(),
        closed.local_addr().unwrap().port(),
    );
    let addr = *host_addresses().first().expect("a host address");
    let mut settings = harness::docker::settings();
    settings.hardening.open_host_services = vec![format!("{addr}:{port}")];
    let _opening = Opening(hostclose::service_rule((addr, port).into()));
    let env = TestEnv::with_settings("tenancy-open", settings).await;
    let sandbox = request_in(&env, &unique("o"), &env.name("probe"));
    started(&env, &sandbox).await;

    reaches_open_service(&env, &sandbox.name, addr, port).await;
    // The opening gone (as after a restore of an older copy of the filter table), the
    // provider's re-check (a sweep pass's) puts it back. No check that it is closed meanwhile:
    // such a restore can bring the opening back just as well.
    let opening = hostclose::service_rule((addr, port).into());
    sandbox_operator::provider::docker::firewall::remove(std::slice::from_ref(&opening))
        .await
        .expect("the opening removed");
    reaches_open_service(&env, &sandbox.name, addr, port).await;
    host_reaches(addr, other).await;
    assert!(
        !connects(&env, &sandbox.name, addr, other).await,
        "the sandbox connected to {addr}:{other}, a port of the host that is not open"
    );
    let (_, gateways) = addresses(&sandbox.name).await;
    for gateway in gateways.into_iter().filter(|g| *g != addr) {
        host_reaches(gateway, port).await;
        assert!(
            !connects(&env, &sandbox.name, gateway, port).await,
            "the sandbox connected to the open port {port} at {gateway}, not the open address"
        );
    }
}

/// Whether the engine has a network of this name.
async fn network_exists(name: &str) -> bool {
    harness::docker::engine()
        .await
        .inspect_network(name, None)
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sweepers_pass_reclaims_a_namespace_network_only_once_no_sandbox_uses_it() {
    use sandbox_operator::provider::docker::networks;
    let env = TestEnv::new("tenancy-prune").await;
    let namespace = unique("p");
    let first = request_in(&env, &namespace, &env.name("one"));
    let second = request_in(&env, &namespace, &env.name("two"));
    started(&env, &first).await;
    // Created, never started: it still holds the network.
    env.provider.create(&second).await.unwrap();
    let network = networks::for_owner(env.provider.name(), &first.owner).name;
    assert!(network_exists(&network).await, "{network} was created");

    env.provider.destroy(&first.name).await.unwrap();
    env.provider
        .inventory(&env.instance_labels())
        .await
        .unwrap();
    assert!(
        network_exists(&network).await,
        "{network} was removed while a sandbox was attached to it"
    );
    env.provider.destroy(&second.name).await.unwrap();
    // Reclaimed once it is older than the minimum age, by a later pass.
    wait_for(
        &format!("a pass to reclaim the empty {network}"),
        Duration::from_secs(networks::MIN_AGE_SECS as u64 + 60),
        || async {
            env.provider
                .inventory(&env.instance_labels())
                .await
                .map_err(|e| e.to_string())?;
            match network_exists(&network).await {
                true => Err("still there".to_string()),
                false => Ok(()),
            }
        },
    )
    .await;
    // A later create in the namespace brings it back.
    started(&env, &request_in(&env, &namespace, &env.name("three"))).await;
    assert!(network_exists(&network).await, "{network} recreated");
}

/// Whether the network has inter-container traffic off.
async fn icc_off(name: &str) -> bool {
    let network = harness::docker::engine()
        .await
        .inspect_network(name, None)
        .await
        .expect("inspect network");
    let options = network.options.unwrap_or_default();
    options.get(sandbox_operator::provider::docker::networks::ICC_OPTION)
        == Some(&"false".to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_network_with_inter_container_traffic_on_is_recreated_only_once_unused() {
    use bollard::models::{NetworkConnectRequest, NetworkCreateRequest, NetworkDisconnectRequest};
    use sandbox_operator::provider::ErrorKind;
    let gw = unique("tn-old");
    let net = FakeNet::start(&unique("tn-oinet"), (TEST_LABEL, &gw)).await;
    let _guard = GatewayGuard(gw.clone());
    let env = TestEnv::new("tenancy-oldgw").await;
    // What an older version left: the gateway's network, internal, inter-container traffic on.
    let old = format!("{gw}-net");
    let docker = harness::docker::engine().await;
    let request = NetworkCreateRequest {
        name: old.clone(),
        internal: Some(true),
        ..Default::default()
    };
    docker
        .create_network(request)
        .await
        .expect("the old network");
    let squatter = request_in(&env, &unique("o"), &env.name("osq"));
    started(&env, &squatter).await;
    let connect = NetworkConnectRequest {
        container: squatter.name.clone(),
        endpoint_config: None,
    };
    docker
        .connect_network(&old, connect)
        .await
        .expect("connect");
    let provider = gateway_provider("docker-tenancy-oldgw", &net, &gw).await;
    let mut sandbox = request_in(&env, &unique("o"), &env.name("onew"));
    sandbox.allowed_domains = Some(vec!["allowed.test".to_string()]);

    let err = provider.create(&sandbox).await.unwrap_err();
    assert!(err.is(ErrorKind::Unsupported), "{err}");
    assert!(err.message().contains(&squatter.name), "{err}");
    assert!(!icc_off(&old).await, "the used network was left as it was");

    let disconnect = NetworkDisconnectRequest {
        container: squatter.name.clone(),
        force: Some(true),
    };
    docker
        .disconnect_network(&old, disconnect)
        .await
        .expect("disconnect");
    provider.create(&sandbox).await.expect("create once unused");
    provider.start(&sandbox.name).await.expect("start");
    assert!(
        icc_off(&old).await,
        "{old} recreated with inter-container traffic off"
    );
    wait_for("allowed.test through the new gateway", DEADLINE, || {
        reaches_allowed(&env, &sandbox.name)
    })
    .await;
    provider.destroy(&sandbox.name).await.expect("destroy");
}

/// With `filter` accepting whatever the gateway's bridge forwards between its containers (as
/// a restore that reorders `FORWARD` can leave it), the `mangle` backstop still keeps
/// `stranger` from `server`; without the backstop too, it connects (so the backstop is what
/// held); the provider's re-check puts it back.
async fn backstop_holds(
    env: &TestEnv,
    provider: &DockerProvider,
    server: &str,
    stranger: &str,
    gw: &str,
) {
    use sandbox_operator::provider::docker::firewall::{self, WALL_CHAIN};
    let (bridge, gateway) = gateway_network(server, gw).await;
    let _accept = FilterAccepts::between(&bridge);
    let (ips, _) = addresses(server).await;
    let ip = *ips.first().expect("the server's address");
    assert!(
        !connects(env, stranger, ip, 8080).await,
        "with filter accepting on {bridge}, a sandbox behind the gateway reached another"
    );
    let backstop: Vec<_> = firewall::gateway_rules(&bridge, gateway, &[])
        .into_iter()
        .filter(|r| r.chain == WALL_CHAIN)
        .collect();
    firewall::remove(&backstop).await.expect("backstop removed");
    assert!(
        connects(env, stranger, ip, 8080).await,
        "control: neither the backstop nor filter in the way, the stranger connects"
    );
    provider.reassert_firewall().await.expect("re-check");
    assert!(
        !connects(env, stranger, ip, 8080).await,
        "the re-check put the backstop on {bridge} back"
    );
}

/// The Linux bridge of the network `server` is on behind the gateway, and the address of
/// the gateway container `gw` on it.
async fn gateway_network(server: &str, gw: &str) -> (String, std::net::Ipv4Addr) {
    let engine = harness::docker::engine().await;
    let networks = endpoints(server).await;
    let name = networks
        .keys()
        .next()
        .expect("the server's network")
        .clone();
    let network = engine
        .inspect_network(
            &name,
            None::<bollard::query_parameters::InspectNetworkOptions>,
        )
        .await
        .expect("inspect the gateway's network");
    let options = network.options.unwrap_or_default();
    // The engine's own name for a user-defined bridge unless the network names one.
    let id = network.id.unwrap_or_default();
    let bridge = match options.get("com.docker.network.bridge.name") {
        Some(name) => name.clone(),
        None => format!("br-{}", id.get(..12).expect("a network id")),
    };
    let containers = network.containers.unwrap_or_default();
    let gateway = containers
        .values()
        .find(|e| e.name.as_deref() == Some(gw))
        .and_then(|e| e.ipv4_address.as_deref())
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse().ok())
        .expect("the gateway's address on its network");
    (bridge, gateway)
}

/// An ACCEPT at the top of `filter`'s `FORWARD` for whatever a bridge forwards to itself,
/// removed when dropped.
struct FilterAccepts(String);

impl FilterAccepts {
    fn between(bridge: &str) -> Self {
        let status = std::process::Command::new("iptables")
            .args([
                "-w", "-I", "FORWARD", "1", "-i", bridge, "-o", bridge, "-j", "ACCEPT",
            ])
            .status()
            .expect("iptables");
        assert!(status.success(), "ACCEPT on {bridge} inserted");
        FilterAccepts(bridge.to_string())
    }
}

impl Drop for FilterAccepts {
    fn drop(&mut self) {
        let bridge = &self.0;
        let _ = std::process::Command::new("iptables")
            .args([
                "-w", "-D", "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT",
            ])
            .output();
    }
}
