//! Walls between tenants on the Kubernetes provider, on the real test node(s): Secret values
//! stay out of the Pod spec (a per-sandbox Secret owned by the Pod carries them), the
//! sandboxes namespace has a default-deny NetworkPolicy, and a Sandbox that says nothing
//! about resources still gets requests, limits and an ephemeral-storage limit.
//!
//! The policy's shape is checked against the real API server (which validates it), and what
//! it does on the test nodes, whose bridge CNI is joined by kube-router's firewall to enforce
//! NetworkPolicy (`tests/setup/node.sh`): a sandbox Pod of one namespace cannot connect to
//! one of another, and the egress the policy allows still passes.

mod harness;

use std::collections::BTreeMap;
use std::net::{IpAddr, TcpListener};
use std::time::Duration;

use harness::cluster::{client, create_secret, get_json};
use harness::docker::{http_server, idle};
use harness::kubernetes::Kubernetes;
use harness::{host_reaches, wait_for};
use k8s_openapi::api::core::v1::{Node, Secret, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use sandbox_operator::provider::kubernetes::KubernetesProvider;
use sandbox_operator::provider::labels::Owner;
use sandbox_operator::provider::{
    CreateRequest, ExecRequest, ImagePullPolicy, Provider, Resources, RestartPolicy,
};
use serde_json::{Value, json};

/// How long a probe's target may take to answer.
const DEADLINE: Duration = Duration::from_secs(60);

type World = harness::world::World<Kubernetes>;

/// The provider's one NetworkPolicy in its namespace.
const POLICY: &str = "sandboxes-default-deny";

fn sleeper() -> Value {
    json!({
        "provider": "k8s",
        "image": harness::docker::base_image(),
        "command": ["sleep", "infinity"],
    })
}

/// What `printenv NAME` prints inside sandbox `id`.
async fn printenv(w: &World, id: &str, name: &str) -> String {
    let out = w
        .provider()
        .await
        .exec(
            id,
            &ExecRequest::shell(format!("printenv {name}"), Duration::from_secs(30)),
        )
        .await
        .expect("exec");
    assert_eq!(out.exit_code, 0, "printenv {name}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

/// The sandbox's env Secret, `None` when there is none.
async fn env_secret(w: &World, id: &str) -> Option<Secret> {
    Api::<Secret>::namespaced(client().await, &w.pods_ns)
        .get_opt(&format!("{id}-env"))
        .await
        .expect("get the env Secret")
}

/// Asserts that the env Secret of `id` is owned by the Pod `id` as it is now.
async fn assert_owned_by_pod(w: &World, id: &str) {
    let pod = w.pods().await.get(id).await.expect("the Pod");
    let secret = env_secret(w, id).await.expect("the per-sandbox env Secret");
    let owners = secret.metadata.owner_references.unwrap_or_default();
    let to_pod: Vec<_> = owners
        .iter()
        .map(|o| (o.kind.as_str(), o.name.as_str(), Some(o.uid.clone())))
        .collect();
    assert_eq!(
        to_pod,
        vec![("Pod", id, pod.metadata.uid.clone())],
        "owned by the Pod, so the API server's garbage collector removes it with the Pod"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn env_from_values_reach_the_pod_through_an_owned_secret_never_its_spec() {
    let w = World::kubernetes("ten-k8s-env").await;
    let value = harness::unique("team-a-secret-value");
    create_secret(&w.ns, "team-token", None, json!({"TOKEN": value})).await;
    let op = w.operator("", vec![]);
    let mut spec = sleeper();
    spec["envFrom"] = json!([{"secretRef": {"name": "team-token"}}]);
    spec["env"] = json!([{"name": "PLAIN", "value": "visible"}]);
    w.apply("env", spec);
    let s = w.wait_ready("env", &op).await;
    let uid = s.metadata.uid.clone().expect("uid");
    let id = s.status.and_then(|st| st.sandbox_id).expect("sandboxId");

    // Whoever can `get pods` in the sandboxes namespace does not see the value.
    let pod_json = get_json("pod", &id, &w.pods_ns).expect("the Pod as JSON");
    assert!(
        !pod_json.contains(&value),
        "the Secret's value is in the Pod: {pod_json}"
    );
    let pod: Value = serde_json::from_str(&pod_json).expect("json");
    let env = &pod["spec"]["containers"][0]["env"];
    let by_name: BTreeMap<&str, &Value> = env
        .as_array()
        .expect("env")
        .iter()
        .map(|e| (e["name"].as_str().unwrap_or_default(), e))
        .collect();
    assert_eq!(
        by_name["PLAIN"]["value"], "visible",
        "plain env stays inline"
    );
    assert_eq!(
        by_name["TOKEN"]["valueFrom"]["secretKeyRef"],
        json!({"name": format!("{id}-env"), "key": "TOKEN"}),
    );
    let secret = env_secret(&w, &id).await.expect("the env Secret");
    let labels = secret.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("sandboxes.dev/owner-uid"), Some(&uid));
    assert_eq!(labels.get("sandboxes.dev/managed-by"), Some(&w.ns));
    assert_owned_by_pod(&w, &id).await;
    assert_eq!(
        printenv(&w, &id, "TOKEN").await,
        value,
        "the sandbox sees it"
    );

    // A stop replaces the Pod: the Secret follows the new Pod instead of going with the old.
    w.patch_spec("env", json!({"state": "Stopped"})).await;
    w.wait_ready("env", &op).await;
    w.patch_spec("env", json!({"state": "Running"})).await;
    w.wait_ready("env", &op).await;
    assert_owned_by_pod(&w, &id).await;
    assert_eq!(printenv(&w, &id, "TOKEN").await, value, "after a restart");

    w.delete_and_wait_gone("env").await;
    assert!(
        env_secret(&w, &id).await.is_none(),
        "the env Secret goes with the sandbox"
    );
}

/// The egress exceptions every sandbox Pod gets: loopback, RFC 1918, CGNAT, link-local (the
/// metadata endpoint included), Azure's wire server, and IPv6 loopback, link-local and ULA.
fn expected_policy_spec() -> Value {
    json!({
        "podSelector": {"matchExpressions": [
            {"key": "sandboxes.dev/owner-uid", "operator": "Exists"}
        ]},
        "policyTypes": ["Ingress", "Egress"],
        "egress": [
            {"to": [
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": [
                    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8",
                    "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16", "168.63.129.16/32"
                ]}},
                {"ipBlock": {"cidr": "::/0", "except": ["::1/128", "fe80::/10", "fc00::/7"]}}
            ]},
            {"to": [{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}
            }], "ports": [
                {"protocol": "UDP", "port": 53},
                {"protocol": "TCP", "port": 53}
            ]}
        ],
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sandboxes_namespace_has_one_default_deny_network_policy() {
    let w = World::kubernetes("ten-k8s-netpol").await;
    let op = w.operator("", vec![]);
    w.apply("one", sleeper());
    w.wait_ready("one", &op).await;
    let policies = Api::<NetworkPolicy>::namespaced(client().await, &w.pods_ns);
    let policy = policies
        .get_opt(POLICY)
        .await
        .expect("get")
        .unwrap_or_else(|| panic!("no NetworkPolicy {POLICY} in {}", w.pods_ns));
    let labels = policy.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("sandbox-operator")
    );
    let spec = serde_json::to_value(policy.spec.clone().expect("spec")).expect("json");
    assert_eq!(
        spec,
        expected_policy_spec(),
        "no ingress rule: no Pod (another tenant's sandbox included) reaches a sandbox"
    );

    // Ensured once: a second sandbox leaves the policy as it was.
    w.apply("two", sleeper());
    w.wait_ready("two", &op).await;
    let again = policies.get(POLICY).await.expect("get");
    assert_eq!(
        again.metadata.resource_version, policy.metadata.resource_version,
        "not rewritten per create"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_spec_gets_default_requests_limits_and_ephemeral_storage() {
    let w = World::kubernetes("ten-k8s-res").await;
    let op = w.operator("", vec![]);
    w.apply("plain", sleeper());
    let s = w.wait_ready("plain", &op).await;
    let status = s.status.expect("status");
    let id = status.sandbox_id.clone().expect("sandboxId");
    let pod = w.pods().await.get(&id).await.expect("the Pod");
    let resources = pod.spec.expect("spec").containers[0]
        .resources
        .clone()
        .expect("resources");
    let quantities =
        |m: Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            m.unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect::<BTreeMap<_, _>>()
        };
    let pairs = |p: &[(&str, &str)]| {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(
        quantities(resources.limits),
        pairs(&[
            ("cpu", "1"),
            ("memory", "1Gi"),
            ("ephemeral-storage", "2Gi")
        ])
    );
    assert_eq!(
        quantities(resources.requests),
        pairs(&[
            ("cpu", "100m"),
            ("memory", "128Mi"),
            ("ephemeral-storage", "128Mi")
        ])
    );
    let applied = status.resources.expect("status.resources");
    assert_eq!(applied.cpu.as_deref(), Some("1000m"));
    assert_eq!(applied.memory.as_deref(), Some("1073741824"));
    assert_eq!(applied.disk.as_deref(), Some("2147483648"));
}

/// A sandbox of tenant `namespace` in this world's operator instance, running `command`.
fn request_of(w: &World, namespace: &str, name: &str, command: Vec<String>) -> CreateRequest {
    CreateRequest {
        name: harness::unique(name),
        owner: Owner {
            instance: w.ns.clone(),
            kind: "Sandbox".into(),
            namespace: namespace.into(),
            name: name.into(),
            uid: harness::unique("uid"),
        },
        image: Some(harness::docker::base_image()),
        template: None,
        command: Some(command),
        restart_policy: RestartPolicy::Never,
        env: BTreeMap::new(),
        labels: BTreeMap::new(),
        resources: Resources::default(),
        ports: vec![],
        volumes: vec![],
        allowed_domains: None,
        idle_action: None,
        image_pull_policy: ImagePullPolicy::IfNotPresent,
        registry_credentials: Vec::new(),
        secret_env_keys: Default::default(),
    }
}

/// Creates and starts the sandbox; its id (the Pod's name).
async fn started(provider: &KubernetesProvider, request: &CreateRequest) -> String {
    let created = provider
        .create(request)
        .await
        .unwrap_or_else(|e| panic!("create {}: {e}", request.name));
    provider.start(&created.id).await.expect("start");
    created.id
}

/// The Pod's IP, once it has one.
async fn pod_ip(w: &World, id: &str) -> IpAddr {
    let pods = w.pods().await;
    wait_for(&format!("an IP for Pod {id}"), DEADLINE, || async {
        let pod = pods.get(id).await.map_err(|e| e.to_string())?;
        let ip = pod.status.and_then(|s| s.pod_ip);
        ip.and_then(|ip| ip.parse::<IpAddr>().ok())
            .ok_or_else(|| "no IP yet".to_string())
    })
    .await
}

/// Whether a TCP connection from inside sandbox `id` to `addr:port` is established.
async fn connects(provider: &KubernetesProvider, id: &str, addr: IpAddr, port: u16) -> bool {
    let script = format!(
        "if timeout 5 bash -c 'exec 3<>/dev/tcp/{addr}/{port}' 2>/dev/null; then echo open; \
         else echo closed; fi"
    );
    let out = provider
        .exec(id, &ExecRequest::shell(script, Duration::from_secs(30)))
        .await
        .expect("exec");
    assert_eq!(out.exit_code, 0, "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim() == "open"
}

/// The test nodes' address (they all share this host's), as the API server knows it.
async fn node_ip() -> IpAddr {
    let node = Api::<Node>::all(client().await)
        .get(&harness::node::ensure()[0])
        .await
        .expect("the first test node");
    let addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
    addresses
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .and_then(|a| a.address.parse().ok())
        .expect("the node's InternalIP")
}

/// Whether the shipped policy denies egress to `ip` (one of its excepted ranges holds it).
fn denied_by_policy(ip: IpAddr) -> bool {
    use sandbox_operator::provider::kubernetes::network_policy::{DENIED_V4, DENIED_V6};
    let within = |cidr: &str| {
        let (net, prefix) = cidr.split_once('/').expect("a CIDR");
        let prefix: u32 = prefix.parse().expect("a prefix");
        match (ip, net.parse::<IpAddr>().expect("an address")) {
            (IpAddr::V4(ip), IpAddr::V4(net)) => {
                let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
                u32::from(ip) & mask == u32::from(net) & mask
            }
            (IpAddr::V6(ip), IpAddr::V6(net)) => {
                let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
                u128::from(ip) & mask == u128::from(net) & mask
            }
            _ => false,
        }
    };
    DENIED_V4.iter().chain(DENIED_V6.iter()).any(|c| within(c))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_pod_of_one_namespace_cannot_connect_to_a_sandbox_pod_of_another() {
    let w = World::kubernetes("ten-k8s-wall").await;
    let provider = w.provider().await;
    // Pods of a namespace are admitted once its default ServiceAccount exists.
    let accounts = Api::<ServiceAccount>::namespaced(client().await, &w.pods_ns);
    wait_for("the default ServiceAccount", DEADLINE, || async {
        match accounts.get_opt("default").await {
            Ok(Some(_)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let server = started(&provider, &request_of(&w, "team-a", "srv", http_server())).await;
    let stranger = started(&provider, &request_of(&w, "team-b", "probe", idle())).await;
    let ip = pod_ip(&w, &server).await;

    // The node reaches the server (the kubelet's probes come from there), so it is up.
    host_reaches(ip, 8080).await;
    // A policy controller programs a new Pod's rules after it starts (asynchronously, as
    // NetworkPolicy allows), so the wall must stand within a deadline, then hold.
    let wall = || async {
        match connects(&provider, &stranger, ip, 8080).await {
            false => Ok(()),
            true => Err(format!(
                "a sandbox Pod of namespace team-b connected to {ip}:8080 of a sandbox Pod of \
                 namespace team-a"
            )),
        }
    };
    wait_for(
        "the wall between the two namespaces' sandbox Pods",
        DEADLINE,
        wall,
    )
    .await;
    if let Err(breach) = wall().await {
        panic!("the wall did not hold: {breach}");
    }

    // What the policy allows still passes: egress to an address outside its excepted
    // ranges. The nodes' own address is the one such address here (no internet); when it
    // lies in an excepted range, the same probe must be refused instead.
    let node = node_ip().await;
    let listener = TcpListener::bind((node, 0)).expect("a port on the node's address");
    let port = listener.local_addr().expect("addr").port();
    host_reaches(node, port).await;
    let allowed = !denied_by_policy(node);
    assert_eq!(
        connects(&provider, &stranger, node, port).await,
        allowed,
        "egress from a sandbox Pod to {node}:{port} (allowed by the policy: {allowed})"
    );
    for id in [&server, &stranger] {
        provider.destroy(id).await.expect("destroy");
    }
}
