//! The operator's own pod as a security reviewer checks it, on the rendered chart: a
//! NetworkPolicy on by default (ingress only to the metrics/probe port; egress only to DNS,
//! the API server, the configured provider endpoints and S3 stores), an ephemeral-storage
//! request and limit, an explicit image pull policy, and a soft pod anti-affinity across
//! nodes when there is more than one replica. The NetworkPolicy also passes a server-side
//! dry run against the test API server.
//!
//! Needs helm and kubectl (`tests/setup/tools.sh`, fetched by the harness) and the test
//! cluster (`tests/cluster/up.sh`) for the dry run.

mod harness;

use std::collections::BTreeSet;
use std::process::Output;

use harness::cluster::{kubectl, namespace};
use harness::repo;
use harness::tools::helm_template;
use serde_json::Value;

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `helm template` of the chart with `--set` values, as JSON documents.
fn render(sets: &[&str]) -> Vec<Value> {
    let chart = repo().join("charts/sandbox-operator");
    let chart = chart.to_string_lossy();
    let mut args = vec!["sec", &chart, "--namespace", "sec"];
    for set in sets {
        args.extend_from_slice(&["--set", set]);
    }
    helm_template(&args)
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// Every `port` of a list of NetworkPolicy ports, with its protocol.
fn ports(rule: &Value) -> BTreeSet<(i64, String)> {
    rule["ports"]
        .as_array()
        .unwrap_or_else(|| panic!("every rule names its ports: {rule}"))
        .iter()
        .map(|p| {
            (
                p["port"].as_i64().expect("numeric port"),
                p["protocol"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn tcp(list: &[i64]) -> BTreeSet<(i64, String)> {
    list.iter().map(|p| (*p, "TCP".to_string())).collect()
}

#[test]
fn the_default_network_policy_admits_only_the_metrics_port_and_the_needed_egress() {
    let docs = render(&[]);
    let policies = of_kind(&docs, "NetworkPolicy");
    assert_eq!(policies.len(), 1, "a NetworkPolicy by default");
    let spec = &policies[0]["spec"];
    let deployment = of_kind(&docs, "Deployment")[0];
    assert_eq!(
        spec["podSelector"]["matchLabels"], deployment["spec"]["selector"]["matchLabels"],
        "it selects exactly the operator's pods"
    );
    assert_eq!(
        spec["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );

    let ingress = spec["ingress"].as_array().unwrap();
    assert_eq!(ingress.len(), 1);
    let metrics_port =
        deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
            .as_i64()
            .unwrap();
    assert_eq!(
        ports(&ingress[0]),
        tcp(&[metrics_port]),
        "only metrics and probes"
    );

    // Default values: a Docker socket (no network), so DNS and the API server only.
    let egress = spec["egress"].as_array().unwrap();
    let want: Vec<BTreeSet<(i64, String)>> = vec![
        [(53, "UDP".to_string()), (53, "TCP".to_string())].into(),
        tcp(&[443, 6443]),
    ];
    let got: Vec<_> = egress.iter().map(ports).collect();
    assert_eq!(got, want);
}

#[test]
fn egress_follows_the_configured_provider_endpoints_and_stores() {
    let docs = render(&[
        "providers[0].name=remote",
        "providers[0].type=docker",
        "providers[0].docker.host=tcp://dockerd.example:2376",
        "templateStores[0].name=minio",
        "templateStores[0].bucket=t",
        "templateStores[0].endpoint=http://minio.storage:9000",
        "templateStores[1].name=aws",
        "templateStores[1].bucket=t",
        "networkPolicy.egressCidrs={10.20.0.0/16}",
        "networkPolicy.apiServer.cidrs={10.96.0.1/32}",
    ]);
    let spec = &of_kind(&docs, "NetworkPolicy")[0]["spec"];
    let egress = spec["egress"].as_array().unwrap();
    assert_eq!(egress.len(), 3, "DNS, API server, providers and stores");
    assert_eq!(egress[1]["to"][0]["ipBlock"]["cidr"], "10.96.0.1/32");
    assert_eq!(ports(&egress[2]), tcp(&[443, 2376, 9000]));
    assert_eq!(egress[2]["to"][0]["ipBlock"]["cidr"], "10.20.0.0/16");

    let off = render(&["networkPolicy.enabled=false"]);
    assert!(of_kind(&off, "NetworkPolicy").is_empty(), "the switch");
}

#[test]
fn the_pod_has_ephemeral_storage_bounds_a_pull_policy_and_soft_anti_affinity() {
    let docs = render(&[]);
    let pod = &of_kind(&docs, "Deployment")[0]["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let resources = &container["resources"];
    assert!(resources["requests"]["ephemeral-storage"].is_string());
    assert!(resources["limits"]["ephemeral-storage"].is_string());
    let policy = container["imagePullPolicy"].as_str().unwrap_or_default();
    assert!(
        ["Always", "IfNotPresent", "Never"].contains(&policy),
        "an explicit pull policy: {policy:?}"
    );

    // Two replicas by default: preferred (soft), across nodes, selecting its own pods.
    let anti = &pod["affinity"]["podAntiAffinity"];
    assert!(anti["requiredDuringSchedulingIgnoredDuringExecution"].is_null());
    let term = &anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    let selector = &of_kind(&docs, "Deployment")[0]["spec"]["selector"]["matchLabels"];
    assert_eq!(&term["labelSelector"]["matchLabels"], selector);

    let single = render(&["replicas=1"]);
    let pod = &of_kind(&single, "Deployment")[0]["spec"]["template"]["spec"];
    assert!(pod["affinity"].is_null(), "one replica: nothing to spread");
    let own = render(&[
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=a",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
    ]);
    let pod = &of_kind(&own, "Deployment")[0]["spec"]["template"]["spec"];
    assert!(
        pod["affinity"]["podAntiAffinity"].is_null(),
        "the user's affinity wins"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_network_policy_passes_a_server_side_dry_run() {
    let ns = namespace("helm-netpol").await;
    let docs = render(&[
        "providers[0].name=remote",
        "providers[0].type=docker",
        "providers[0].docker.host=tcp://dockerd.example:2376",
        "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring",
    ]);
    let mut policy = of_kind(&docs, "NetworkPolicy")[0].clone();
    policy["metadata"]["namespace"] = Value::String(ns.clone());
    let yaml = serde_yaml::to_string(&policy).unwrap();
    let out = kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(&yaml));
    let _ = kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
    assert!(out.status.success(), "dry run: {}", text(&out));
    assert!(text(&out).contains("(server dry run)"), "{}", text(&out));
}

/// The default install's Docker provider gets the host-firewall path (issue 22): its
/// configuration names the helper image the engine runs and does not opt out, and the
/// operator's pod needs no privilege for it — no host network, no added capability.
#[test]
fn the_default_install_gets_the_host_firewall_through_the_engine_with_no_pod_privilege() {
    let docs = render(&[]);
    let config = &of_kind(&docs, "ConfigMap")
        .into_iter()
        .find(|c| c["data"]["config.yaml"].is_string())
        .expect("the operator's ConfigMap")["data"]["config.yaml"];
    let config: serde_yaml::Value =
        serde_yaml::from_str(config.as_str().unwrap()).expect("config YAML");
    let docker = config["providers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "docker")
        .expect("a docker provider by default");
    let hardening = &docker["docker"]["hardening"];
    assert_ne!(
        hardening["hostFirewall"].as_str(),
        Some("off"),
        "{hardening:?}"
    );
    assert_eq!(
        hardening["firewallImage"].as_str(),
        Some("busybox:1.36.1"),
        "the helper image is rendered: {hardening:?}"
    );
    let pod = &of_kind(&docs, "Deployment")[0]["spec"]["template"]["spec"];
    assert!(pod["hostNetwork"].is_null() || pod["hostNetwork"] == false);
    let caps = &pod["containers"][0]["securityContext"]["capabilities"];
    assert!(caps["add"].is_null(), "no capability added: {caps}");
    assert_eq!(caps["drop"][0], "ALL");
}
