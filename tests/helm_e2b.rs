//! The chart's E2B-compatible API values (`e2bApi`), rendered with `helm template`: off by
//! default (nothing of it rendered); when enabled, the `e2bApi` configuration section, the
//! container port, a Service for the API port of every replica, the envd access token key
//! from a Secret, the port open in the NetworkPolicy, and an optional Ingress for the API host `api.{domain}` and the wildcard
//! `*.{domain}` (envd and port URLs) with its TLS Secret and annotations (cert-manager).

mod harness;

use harness::repo;
use harness::tools::{helm, helm_template};
use serde_json::Value;

/// The documents `helm template` renders with `values` (YAML).
fn render(values: &str) -> Vec<Value> {
    render_in("ops", values)
}

/// [`render`] into `namespace`.
fn render_in(namespace: &str, values: &str) -> Vec<Value> {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).expect("values file");
    let chart = repo().join("charts/sandbox-operator");
    helm_template(&[
        "r",
        &chart.to_string_lossy(),
        "--namespace",
        namespace,
        "-f",
        &file.to_string_lossy(),
    ])
}

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn config(docs: &[Value]) -> serde_yaml::Value {
    let map = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("the ConfigMap");
    serde_yaml::from_str(map["data"]["config.yaml"].as_str().expect("config.yaml"))
        .expect("the configuration")
}

const ENABLED: &str = r#"
e2bApi:
  enabled: true
  port: 3000
  domain: sandboxes.example.com
  templates: {base: "sandbox-operator/base:bookworm"}
  accessTokenKey: {secretName: e2b-token-key, key: key}
  ingress:
    enabled: true
    className: nginx
    annotations: {cert-manager.io/cluster-issuer: letsencrypt}
    tls: {secretName: e2b-tls}
"#;

#[test]
fn the_e2b_api_is_not_rendered_when_disabled() {
    let docs = render("{}\n");
    assert!(named(&docs, "Service", "r-sandbox-operator-e2b-api").is_none());
    assert!(docs.iter().all(|d| d["kind"] != "Ingress"));
    assert!(config(&docs).get("e2bApi").is_none());
    let text = serde_json::to_string(&docs).expect("json");
    assert!(!text.contains("e2b-api"), "{text}");
}

#[test]
fn the_e2b_api_renders_its_config_service_token_key_and_ingress() {
    let docs = render(ENABLED);
    let e2b = config(&docs)["e2bApi"].clone();
    assert_eq!(e2b["enabled"], true);
    assert_eq!(e2b["address"], "0.0.0.0:3000");
    assert_eq!(e2b["domain"], "sandboxes.example.com");
    assert_eq!(e2b["templates"]["base"], "sandbox-operator/base:bookworm");
    let key_file = e2b["accessTokenKeyFile"]
        .as_str()
        .expect("accessTokenKeyFile");

    let service = named(&docs, "Service", "r-sandbox-operator-e2b-api").expect("the Service");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "e2b-api");
    let selector = service["spec"]["selector"].as_object().expect("selector");
    assert!(!selector.is_empty() && !selector.contains_key("app.kubernetes.io/component"));

    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let ports = pod["containers"][0]["ports"].as_array().expect("ports");
    assert!(
        ports
            .iter()
            .any(|p| p["name"] == "e2b-api" && p["containerPort"] == 3000),
        "{ports:?}"
    );
    let mounts = pod["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts");
    let mount = mounts
        .iter()
        .find(|m| m["name"] == "e2b-token-key")
        .expect("the token key mount");
    let dir = mount["mountPath"].as_str().expect("path");
    assert!(key_file.starts_with(dir), "{key_file} outside {dir}");
    let volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "e2b-token-key")
        .expect("the token key volume");
    assert_eq!(volume["secret"]["secretName"], "e2b-token-key");
    assert_eq!(volume["secret"]["items"][0]["key"], "key");

    let policy = docs
        .iter()
        .find(|d| d["kind"] == "NetworkPolicy")
        .expect("NetworkPolicy");
    let open = policy["spec"]["ingress"].as_array().expect("ingress rules");
    assert!(
        open.iter().any(|r| r["ports"][0]["port"] == 3000),
        "the NetworkPolicy blocks the E2B API port: {open:?}"
    );
    check_ingress(&docs);
}

fn check_ingress(docs: &[Value]) {
    let ingress = named(docs, "Ingress", "r-sandbox-operator-e2b-api").expect("the Ingress");
    let spec = &ingress["spec"];
    assert_eq!(spec["ingressClassName"], "nginx");
    assert_eq!(
        ingress["metadata"]["annotations"]["cert-manager.io/cluster-issuer"],
        "letsencrypt"
    );
    let hosts: Vec<&str> = spec["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| r["host"].as_str().expect("host"))
        .collect();
    assert_eq!(
        hosts,
        ["api.sandboxes.example.com", "*.sandboxes.example.com"]
    );
    for rule in spec["rules"].as_array().expect("rules") {
        let backend = &rule["http"]["paths"][0]["backend"]["service"];
        assert_eq!(backend["name"], "r-sandbox-operator-e2b-api");
        assert_eq!(backend["port"]["name"], "e2b-api");
    }
    assert_eq!(spec["tls"][0]["secretName"], "e2b-tls");
    assert_eq!(
        spec["tls"][0]["hosts"],
        serde_json::json!(["api.sandboxes.example.com", "*.sandboxes.example.com"])
    );
}

#[test]
fn an_ingress_without_a_domain_is_refused() {
    let chart = repo().join("charts/sandbox-operator");
    let out = helm(&[
        "template",
        "r",
        &chart.to_string_lossy(),
        "--set",
        "e2bApi.enabled=true",
        "--set",
        "e2bApi.ingress.enabled=true",
    ]);
    assert!(
        !out.status.success(),
        "helm accepted an Ingress without a domain"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("e2bApi.domain"), "{stderr}");
}

/// The API server accepts the rendered Service and Ingress as they are (a server-side dry
/// run validates them against the served schemas).
#[tokio::test]
async fn the_api_server_accepts_the_e2b_service_and_ingress() {
    let ns = harness::cluster::namespace("helm-e2b").await;
    let docs = render_in(&ns, ENABLED);
    let ours: Vec<&Value> = docs
        .iter()
        .filter(|d| d["metadata"]["name"] == "r-sandbox-operator-e2b-api")
        .collect();
    assert_eq!(ours.len(), 2, "{ours:?}");
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": ours});
    let out = harness::cluster::kubectl_ok(
        &["apply", "--dry-run=server", "-n", &ns, "-f", "-"],
        Some(&list.to_string()),
    );
    assert_eq!(out.matches("(server dry run)").count(), 2, "{out}");
    let _ = harness::cluster::kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
}
