//! The Helm chart (charts/sandbox-operator) and the image (Dockerfile), against the real test
//! control plane and the real Docker engine:
//!
//! - lint, schema errors that name the wrong value, server-side dry runs of what the chart
//!   renders (default and full values), Pod Security admission of the pod it renders;
//! - `helm install` where the CRDs already exist (the shared test cluster) and on a fresh,
//!   private control plane where Helm creates them, plus the documented CRD upgrade path;
//! - an RBAC matrix (`kubectl auth can-i --as system:serviceaccount:…`) and the exact list of
//!   what the operator's account may do;
//! - the image, run with the rendered pod's arguments, mounts and security context and the
//!   chart's ServiceAccount token: it leads, reconciles a Sandbox (Secret, status, finalizer,
//!   Events) and releases its Lease on SIGTERM with nothing but the chart's RBAC.
//!
//! Pods never run on the test control plane (no scheduler, no kubelet), so "the pod runs" is
//! played by `docker run` of the image with the rendered pod spec translated flag by flag.

mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use harness::cluster::*;
use harness::docker::*;
use harness::image::{Image, build_image};
use harness::operator::*;
use harness::tools::*;
use harness::{cache, repo, unique, wait_for};
use serde_json::{Value, json};

const CRD_NAMES: [&str; 5] = [
    "sandboxes.sandboxes.dev",
    "sandboxvolumes.sandboxes.dev",
    "sandboxtemplates.sandboxes.dev",
    "sandboxbudgets.sandboxes.dev",
    "sandboxwarmpools.sandboxes.dev",
];

fn chart() -> PathBuf {
    repo().join("charts/sandbox-operator")
}

fn chart_arg() -> String {
    chart().to_string_lossy().into_owned()
}

fn full_values() -> String {
    chart()
        .join("ci/full-values.yaml")
        .to_string_lossy()
        .into_owned()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs helm and returns its stdout; panics with its output on failure.
fn helm_ok(args: &[&str]) -> String {
    let out = helm(args);
    assert!(
        out.status.success(),
        "helm {} failed:\n{}",
        args.join(" "),
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `helm template` of the chart; `extra` are further helm arguments.
fn render(release: &str, namespace: &str, extra: &[&str]) -> String {
    let chart = chart_arg();
    let mut args = vec!["template", release, &chart, "--namespace", namespace];
    args.extend_from_slice(extra);
    helm_ok(&args)
}

/// Every YAML document of a stream, as JSON values (empty documents skipped).
fn documents(yaml: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| serde_yaml::Value::deserialize(doc).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .map(|v| serde_json::to_value(v).expect("YAML → JSON"))
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(docs, kind);
    assert_eq!(found.len(), 1, "expected one {kind}, found {}", found.len());
    found[0]
}

/// A YAML stream of `docs`.
fn to_stream(docs: &[&Value]) -> String {
    docs.iter()
        .map(|d| serde_yaml::to_string(d).expect("yaml"))
        .collect::<Vec<_>>()
        .join("---\n")
}

fn write_temp(dir: &Path, name: &str, content: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).expect("write temp file");
    path.to_string_lossy().into_owned()
}

/// Uninstalls a release when dropped (cluster-scoped RBAC objects would outlive the test
/// namespace otherwise). Best effort: a failed uninstall never hides the test's own failure.
struct Release {
    name: String,
    namespace: String,
    kubeconfig: Option<PathBuf>,
}

impl Drop for Release {
    fn drop(&mut self) {
        let mut cmd = Command::new(helm_bin());
        cmd.args([
            "uninstall",
            &self.name,
            "-n",
            &self.namespace,
            "--wait=false",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        match &self.kubeconfig {
            Some(k) => cmd.env("KUBECONFIG", k),
            None => cmd.env("KUBECONFIG", kubeconfig()),
        };
        let _ = cmd.status();
    }
}

fn install(release: &str, namespace: &str, extra: &[&str]) -> Release {
    let chart = chart_arg();
    let mut args = vec!["install", release, &chart, "--namespace", namespace];
    args.extend_from_slice(extra);
    helm_ok(&args);
    Release {
        name: release.into(),
        namespace: namespace.into(),
        kubeconfig: None,
    }
}

/// `sandbox-operator` when the release name does not contain the chart name.
fn fullname(release: &str) -> String {
    format!("{release}-sandbox-operator")
}

// ---- chart files ---------------------------------------------------------------------------

#[test]
fn chart_crds_are_the_generated_crds() {
    const HINT: &str = "charts/sandbox-operator/crds/ must be a copy of crds/: run `make crds`";
    let files = |dir: PathBuf| -> BTreeMap<String, String> {
        std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .map(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read_to_string(&p).expect("read CRD"))
            })
            .collect()
    };
    let top = files(repo().join("crds"));
    let chart = files(chart().join("crds"));
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        top.keys().collect::<Vec<_>>(),
        "{HINT}"
    );
    for (name, content) in &top {
        assert!(chart[name] == *content, "{HINT}: {name} differs");
    }
    assert_eq!(top.len(), 5);
}

#[test]
fn chart_app_version_is_the_crate_version() {
    let chart: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(env!("CARGO_PKG_VERSION")),
        "Chart.yaml appVersion must be the crate version (the image `make image` tags)"
    );
    assert_eq!(chart["name"].as_str(), Some("sandbox-operator"));
}

#[test]
fn every_rbac_rule_says_why_it_is_needed() {
    let text = std::fs::read_to_string(chart().join("templates/rbac.yaml")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut rules = 0;
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("- apiGroups:") {
            rules += 1;
            let above = lines[..i]
                .iter()
                .rev()
                .map(|l| l.trim())
                .find(|l| !l.is_empty())
                .unwrap_or_default();
            assert!(
                above.starts_with('#') && above.len() > 20,
                "rbac.yaml line {}: the rule has no comment saying why it is needed",
                i + 1
            );
        }
    }
    assert!(rules >= 8, "found only {rules} rules");
}

#[test]
fn helm_lint_strict_passes_with_default_and_full_values() {
    let chart = chart_arg();
    let out = helm_ok(&["lint", "--strict", &chart]);
    assert!(out.contains("0 chart(s) failed"), "{out}");
    let out = helm_ok(&["lint", "--strict", &chart, "-f", &full_values()]);
    assert!(out.contains("0 chart(s) failed"), "{out}");
}

#[test]
fn wrong_values_fail_with_a_message_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, yaml: &str| write_temp(dir.path(), name, yaml);
    let inline_token = file(
        "inline-token.yaml",
        "providers:\n  - name: fly\n    type: fly\n    fly: {app: acme, token: fo1_SECRET}\n",
    );
    let inline_key = file(
        "inline-key.yaml",
        "providers:\n  - name: e2b\n    type: e2b\n    e2b:\n      apiKey: {secretName: e2b, key: k, value: e2b_SECRET}\n",
    );
    let inline_s3 = file(
        "inline-s3.yaml",
        "templateStores:\n  - name: s\n    bucket: b\n    credentials: {secretName: s3, accessKeyIdKey: a, secretAccessKeyKey: b, secretAccessKey: SECRET}\n",
    );
    let both_engines = file(
        "both.yaml",
        "providers:\n  - name: d\n    type: docker\n    docker: {socket: {hostPath: /var/run/docker.sock}, host: \"tcp://d:2375\"}\n",
    );
    let wrong_block = file(
        "wrong-block.yaml",
        "providers:\n  - name: f\n    type: fly\n    docker: {host: \"tcp://d:2375\"}\n",
    );
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["--set", "replicas=two"],
            vec!["/replicas", "want integer"],
        ),
        (
            vec!["--set", "logFormat=xml"],
            vec!["/logFormat", "'text', 'json'"],
        ),
        (vec!["--set", "replica=2"], vec!["'replica' not allowed"]),
        (
            vec!["--set", "leaseDurationSeconds=1"],
            vec!["/leaseDurationSeconds"],
        ),
        (
            vec!["--set", "image.pullPolicy=Sometimes"],
            vec!["/image/pullPolicy"],
        ),
        (vec!["--set", "instance=Team_A"], vec!["/instance"]),
        (
            vec!["--set", "rbac.secretAccess=everywhere"],
            vec!["/rbac/secretAccess"],
        ),
        (
            vec!["--set", "rbac.secretAccess=listed"],
            vec!["/rbac/secretNamespaces"],
        ),
        (
            vec!["--set", "sweeper.maxDeletionsPerPass=0"],
            vec!["/sweeper/maxDeletionsPerPass"],
        ),
        (
            vec!["--set", "sweeper.intervalSec=5"],
            vec!["/sweeper", "'intervalSec' not allowed"],
        ),
        (
            vec!["-f", &inline_token],
            vec!["/providers/0/fly/token", "want object"],
        ),
        (
            vec!["-f", &inline_key],
            vec!["/providers/0/e2b/apiKey", "'value' not allowed"],
        ),
        (
            vec!["-f", &inline_s3],
            vec![
                "/templateStores/0/credentials",
                "'secretAccessKey' not allowed",
            ],
        ),
        (vec!["-f", &both_engines], vec!["/providers/0/docker"]),
        (
            vec!["-f", &wrong_block],
            vec!["/providers/0", "missing property 'fly'"],
        ),
        (
            vec!["--set", "extraArgs[0]=--concurrency=3"],
            vec!["extraArgs: --concurrency is set by the chart"],
        ),
        (
            vec![
                "--set",
                "serviceMonitor.enabled=true",
                "--set",
                "metrics.service.enabled=false",
            ],
            vec!["serviceMonitor.enabled needs metrics.service.enabled"],
        ),
    ];
    let chart = chart_arg();
    for (extra, expected) in &cases {
        let mut args = vec!["template", "t", chart.as_str()];
        args.extend_from_slice(extra);
        let out = helm(&args);
        let message = text(&out);
        assert!(!out.status.success(), "helm accepted {extra:?}");
        for e in expected {
            assert!(
                message.contains(e),
                "helm {extra:?}: {e:?} not in:\n{message}"
            );
        }
        assert!(!message.contains("SECRET") || !message.contains("kind: ConfigMap"));
    }

    // The same check stops a real `helm install` before anything is created.
    let ns = tokio_block(namespace("helm-badvalues"));
    let release = unique("bad");
    let out = helm(&[
        "install",
        &release,
        &chart,
        "-n",
        &ns,
        "--set",
        "replicas=two",
    ]);
    assert!(!out.status.success());
    assert!(text(&out).contains("/replicas"), "{}", text(&out));
    let list = helm_ok(&["list", "-n", &ns, "-q"]);
    assert!(list.trim().is_empty(), "a release was recorded: {list}");
}

fn tokio_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

// ---- what the chart renders ---------------------------------------------------------------

/// The monitoring.coreos.com API (prometheus-operator) is not part of the test control plane,
/// so ServiceMonitors can only be dry-run where it is installed.
fn servicemonitor_api_served() -> bool {
    let out = kubectl(
        &[
            "api-resources",
            "--api-group=monitoring.coreos.com",
            "-o",
            "name",
        ],
        None,
    );
    String::from_utf8_lossy(&out.stdout).contains("servicemonitors")
}

#[tokio::test(flavor = "multi_thread")]
async fn rendered_manifests_pass_a_server_side_dry_run() {
    let ns = namespace("helm-dry").await;
    let watched = namespace("helm-dry-w").await;
    let secrets = namespace("helm-dry-s").await;

    // Default values, CRDs included (they exist: the dry run is an update of the same content).
    let yaml = render("dry", &ns, &["--include-crds"]);
    let docs = documents(&yaml);
    let kinds: BTreeSet<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    for kind in [
        "CustomResourceDefinition",
        "ServiceAccount",
        "ConfigMap",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
    ] {
        assert!(
            kinds.contains(kind),
            "default render has no {kind}: {kinds:?}"
        );
    }
    assert!(!kinds.contains("ServiceMonitor"));
    let out = kubectl_ok(&["apply", "--dry-run=server", "-f", "-"], Some(&yaml));
    assert_eq!(
        out.lines()
            .filter(|l| l.contains("(server dry run)"))
            .count(),
        docs.len(),
        "{out}"
    );

    // Every option at once (ci/full-values.yaml), retargeted to this test's namespaces.
    let namespaces = format!("rbac.secretNamespaces={{{watched},{secrets}}}");
    let watch = format!("watchNamespace={watched}");
    let yaml = render(
        "dry",
        &ns,
        &[
            "--include-crds",
            "-f",
            &full_values(),
            "--set",
            &watch,
            "--set",
            &namespaces,
        ],
    );
    let docs = documents(&yaml);
    let monitor = one(&docs, "ServiceMonitor");
    let service = one(&docs, "Service");
    let deployment = one(&docs, "Deployment");
    // The ServiceMonitor selects the metrics Service and scrapes its named port.
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap();
    for (k, v) in selector {
        assert_eq!(
            &service["metadata"]["labels"][k], v,
            "Service lacks label {k}"
        );
    }
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    assert_eq!(service["spec"]["ports"][0]["name"], "metrics");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["ports"][0]["name"], "metrics");
    assert_eq!(container["ports"][0]["containerPort"], 9090);
    assert!(
        container["args"]
            .as_array()
            .unwrap()
            .contains(&json!("--metrics-addr=[::]:9090"))
    );
    for (k, v) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&deployment["spec"]["template"]["metadata"]["labels"][k], v);
    }
    // Namespaced RBAC: a Role in the watched namespace, Secret Roles in the listed ones.
    let roles: Vec<(String, String)> = of_kind(&docs, "Role")
        .iter()
        .map(|r| {
            (
                r["metadata"]["namespace"].as_str().unwrap().to_string(),
                r["metadata"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        roles.contains(&(watched.clone(), "sbx-op".into())),
        "{roles:?}"
    );
    assert!(
        roles.contains(&(watched.clone(), "sbx-op-secrets".into())),
        "{roles:?}"
    );
    assert!(
        roles.contains(&(secrets.clone(), "sbx-op-secrets".into())),
        "{roles:?}"
    );
    assert!(
        roles.contains(&(ns.clone(), "sbx-op-leader-election".into())),
        "{roles:?}"
    );
    assert!(of_kind(&docs, "ClusterRole").is_empty());

    let to_apply: Vec<&Value> = if servicemonitor_api_served() {
        docs.iter().collect()
    } else {
        docs.iter()
            .filter(|d| d["kind"] != "ServiceMonitor")
            .collect()
    };
    let out = kubectl_ok(
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&to_stream(&to_apply)),
    );
    assert_eq!(
        out.lines()
            .filter(|l| l.contains("(server dry run)"))
            .count(),
        to_apply.len(),
        "{out}"
    );
}

#[test]
fn deployment_is_hardened_and_probes_the_operators_endpoints() {
    let docs = documents(&render("hard", "sandbox-system", &[]));
    let deployment = one(&docs, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(pod["securityContext"]["runAsGroup"], 65532);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(pod["serviceAccountName"], "hard-sandbox-operator");
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert!(sc["capabilities"].get("add").is_none());
    for kind in ["requests", "limits"] {
        for res in ["cpu", "memory"] {
            assert!(c["resources"][kind][res].is_string(), "no {kind}.{res}");
        }
    }
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "metrics");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "metrics");
    assert_eq!(c["ports"][0]["containerPort"], 8080);
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "run");
    assert!(args.contains(&"--metrics-addr=0.0.0.0:8080"), "{args:?}");
    assert!(
        args.contains(&"--config=/etc/sandbox-operator/config.yaml"),
        "{args:?}"
    );
    assert!(args.contains(&"--log-format=json"), "{args:?}");
    let env: BTreeMap<&str, &Value> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e))
        .collect();
    assert_eq!(
        env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert_eq!(
        env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    // A writable /tmp on a read-only root; the config from the ConfigMap, read-only.
    let mounts: BTreeMap<&str, &Value> = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["mountPath"].as_str().unwrap(), m))
        .collect();
    assert!(mounts.contains_key("/tmp"));
    assert_eq!(mounts["/etc/sandbox-operator"]["readOnly"], true);
    // Two replicas and a PodDisruptionBudget that keeps a standby through drains.
    assert_eq!(
        one(&docs, "PodDisruptionBudget")["spec"]["maxUnavailable"],
        1
    );
    // The config change rolls the pods.
    assert!(
        deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"].is_string()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_security_restricted_admits_the_tcp_engine_pod_and_names_the_socket_mount() {
    let ns = namespace("helm-psa").await;
    kubectl_ok(
        &[
            "label",
            "namespace",
            &ns,
            "pod-security.kubernetes.io/enforce=restricted",
        ],
        None,
    );
    let dir = tempfile::tempdir().unwrap();
    let tcp = write_temp(
        dir.path(),
        "tcp.yaml",
        "providers:\n  - name: docker\n    type: docker\n    docker: {host: \"tcp://dockerd.sandbox-system.svc:2375\"}\n",
    );
    let release = unique("psa");
    let _release = install(&release, &ns, &["-f", &tcp]);
    let pod_of = |extra: &[&str]| -> String {
        let docs = documents(&render(&release, &ns, extra));
        let template = &one(&docs, "Deployment")["spec"]["template"];
        serde_json::to_string(&json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "operator-pod", "namespace": ns, "labels": template["metadata"]["labels"]},
            "spec": template["spec"],
        }))
        .unwrap()
    };
    // The pod the chart renders for a TCP engine passes the "restricted" level.
    let out = kubectl(
        &["create", "--dry-run=server", "-f", "-"],
        Some(&pod_of(&["-f", &tcp])),
    );
    assert!(
        out.status.success(),
        "restricted refused the pod: {}",
        text(&out)
    );
    assert!(!text(&out).contains("Warning"), "{}", text(&out));
    // With the node's Docker socket, only the hostPath mount is refused — as values.yaml says.
    let out = kubectl(
        &["create", "--dry-run=server", "-f", "-"],
        Some(&pod_of(&[])),
    );
    assert!(!out.status.success(), "restricted admitted a hostPath pod");
    let message = text(&out);
    assert!(message.contains("hostPath"), "{message}");
    for other in [
        "allowPrivilegeEscalation",
        "runAsNonRoot",
        "seccompProfile",
        "capabilities",
    ] {
        assert!(!message.contains(other), "{other} flagged: {message}");
    }
}

/// The finalizer policy: rendered for a cluster-wide install on an API server that serves
/// MutatingAdmissionPolicy, adding exactly the operator's finalizer on Sandbox creates, and
/// bound by name; absent without that API, for a watchNamespace install, or when disabled.
#[test]
fn the_finalizer_policy_renders_only_where_the_api_server_serves_it() {
    let served = [
        "--api-versions",
        "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",
    ];
    let docs = documents(&render("fin", "sandbox-system", &served));
    let policy = one(&docs, "MutatingAdmissionPolicy");
    let binding = one(&docs, "MutatingAdmissionPolicyBinding");
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    let rule = &policy["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(rule["resources"], json!(["sandboxes"]));
    assert_eq!(rule["operations"], json!(["CREATE"]));
    assert_eq!(policy["spec"]["failurePolicy"], "Ignore");
    let expression = policy["spec"]["mutations"][0]["applyConfiguration"]["expression"]
        .as_str()
        .expect("an apply configuration");
    assert!(
        expression.contains(&format!("[\"{}\"]", sandbox_operator::api::FINALIZER)),
        "{expression}"
    );
    for (what, extra) in [
        ("without the API", vec![]),
        (
            "watchNamespace",
            [&served[..], &["--set", "watchNamespace=w"]].concat(),
        ),
        (
            "disabled",
            [&served[..], &["--set", "finalizerPolicy.enabled=false"]].concat(),
        ),
    ] {
        let docs = documents(&render("fin", "sandbox-system", &extra));
        assert!(
            of_kind(&docs, "MutatingAdmissionPolicy").is_empty()
                && of_kind(&docs, "MutatingAdmissionPolicyBinding").is_empty(),
            "{what}: a policy was rendered"
        );
    }
}

/// The operator's own parser accepts the configuration the chart renders, the credentials it
/// references are all wired from Secrets, and the rendered command line parses.
#[test]
fn rendered_config_and_args_are_accepted_by_the_operator() {
    use sandbox_operator::config::OperatorConfig;
    let dir = tempfile::tempdir().unwrap();
    for (label, extra) in [
        ("default", vec![]),
        ("full", vec!["-f".to_string(), full_values()]),
    ] {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let docs = documents(&render("cfg", "sandbox-system", &extra));
        let cm = one(&docs, "ConfigMap");
        let config_text = cm["data"]["config.yaml"].as_str().expect("config.yaml");
        let config = OperatorConfig::from_yaml(config_text).unwrap_or_else(|e| {
            panic!("{label}: the operator cannot parse the config: {e}\n{config_text}")
        });
        config.validate().unwrap_or_else(|e| {
            panic!("{label}: the operator refuses the config: {e}\n{config_text}")
        });

        // Every {env: NAME} in the config is a secretKeyRef in the Deployment, and the
        // ConfigMap holds no Secret names or values.
        let config_json: Value =
            serde_json::to_value(serde_yaml::from_str::<serde_yaml::Value>(config_text).unwrap())
                .unwrap();
        let mut referenced = Vec::new();
        collect_env_refs(&config_json, &mut referenced);
        let deployment = one(&docs, "Deployment");
        let c = &deployment["spec"]["template"]["spec"]["containers"][0];
        let env: BTreeMap<String, Value> = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
            .collect();
        for name in &referenced {
            let entry = env.get(name).unwrap_or_else(|| {
                panic!("{label}: config references {name}, the Deployment does not set it")
            });
            assert!(
                entry["valueFrom"]["secretKeyRef"]["name"].is_string(),
                "{label}: {name} is not from a Secret: {entry}"
            );
        }
        let cm_text = serde_json::to_string(cm).unwrap();
        assert!(!cm_text.contains("secretName") && !cm_text.contains("secretKeyRef"));
        if label == "full" {
            assert_eq!(referenced.len(), 5, "{referenced:?}");
            let secrets: BTreeSet<(String, String)> = env
                .values()
                .filter_map(|e| {
                    let r = &e["valueFrom"]["secretKeyRef"];
                    Some((
                        r["name"].as_str()?.to_string(),
                        r["key"].as_str()?.to_string(),
                    ))
                })
                .collect();
            for (name, key) in [
                ("fly-api-token", "token"),
                ("e2b-api-key", "api-key"),
                ("template-store-s3", "access-key-id"),
                ("template-store-s3", "secret-access-key"),
                ("template-store-s3", "session-token"),
            ] {
                assert!(
                    secrets.contains(&(name.into(), key.into())),
                    "{label}: no secretKeyRef {name}/{key}"
                );
                assert!(
                    !cm_text.contains(name),
                    "{label}: the ConfigMap names Secret {name}"
                );
            }
        }

        // The rendered arguments parse: the binary gets past flags and configuration and
        // stops only because there is no Kubernetes API to talk to.
        let config_path = write_temp(dir.path(), &format!("{label}.yaml"), config_text);
        let args: Vec<String> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let a = a.as_str().unwrap();
                if a.starts_with("--config=") {
                    format!("--config={config_path}")
                } else {
                    a.to_string()
                }
            })
            .collect();
        let mut child = Command::new(env!("CARGO_BIN_EXE_sandbox-operator"))
            .args(&args)
            .env("KUBECONFIG", dir.path().join("no-such-kubeconfig"))
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("POD_NAMESPACE", "sandbox-system")
            .env("POD_NAME", "operator-0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run operator");
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{label}: the operator did not stop without an API server");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let message = text(&out);
        assert!(!out.status.success());
        assert!(
            message.contains("cannot build a Kubernetes client"),
            "{label}: {args:?} did not get past parsing:\n{message}"
        );
    }
}

fn collect_env_refs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if map.len() == 1
                && let Some(Value::String(name)) = map.get("env")
            {
                out.push(name.clone());
            }
            for v in map.values() {
                collect_env_refs(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_env_refs(v, out)),
        _ => {}
    }
}

// ---- install and RBAC ------------------------------------------------------------------------

/// `kubectl auth can-i` as the ServiceAccount (with the groups a real token carries).
fn can_i(sa: &(String, String), verb: &str, resource: &str, namespace: Option<&str>) -> bool {
    let user = format!("system:serviceaccount:{}:{}", sa.0, sa.1);
    let group = format!("system:serviceaccounts:{}", sa.0);
    let groups = [
        "system:serviceaccounts",
        group.as_str(),
        "system:authenticated",
    ];
    can_as(&user, &groups, verb, resource, namespace)
}

/// `kubectl auth can-i` as `user` in `groups`.
fn can_as(
    user: &str,
    groups: &[&str],
    verb: &str,
    resource: &str,
    namespace: Option<&str>,
) -> bool {
    let (resource, sub) = match resource.split_once('/') {
        // "…/status" and "pods/exec" are subresources; "leases…/NAME" names one object.
        Some((r, s)) if s == "status" || s == "exec" => (r, Some(s)),
        _ => (resource, None),
    };
    let mut args = vec!["auth", "can-i", verb, resource, "--as", user];
    for g in groups {
        args.extend(["--as-group", g]);
    }
    match namespace {
        Some(ns) => args.extend(["-n", ns]),
        None => args.push("--all-namespaces"),
    }
    if let Some(s) = sub {
        args.extend(["--subresource", s]);
    }
    let out = kubectl(&args, None);
    let message = text(&out);
    assert!(
        !message.contains("doesn't have a resource type"),
        "can-i {verb} {resource}: {message}"
    );
    match out.status.code() {
        Some(0) => true,
        Some(1) => false,
        other => panic!("kubectl auth can-i {verb} {resource} exited {other:?}: {message}"),
    }
}

/// Checks each `(verb, resource, namespace)` and reports every mismatch at once.
fn check_matrix(sa: &(String, String), cases: &[(bool, &str, &str, Option<&str>)]) {
    let wrong: Vec<String> = cases
        .iter()
        .filter(|(want, verb, resource, ns)| can_i(sa, verb, resource, *ns) != *want)
        .map(|(want, verb, resource, ns)| {
            format!(
                "{} {verb} {resource} in {}",
                if *want { "CANNOT" } else { "CAN" },
                ns.unwrap_or("all namespaces")
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "RBAC of {}:{} is wrong:\n  {}",
        sa.0,
        sa.1,
        wrong.join("\n  ")
    );
}

/// `kubectl auth can-i --list` rows (whitespace-normalised) of the account in `namespace`.
fn permissions(sa: &(String, String), namespace: &str) -> BTreeSet<String> {
    let user = format!("system:serviceaccount:{}:{}", sa.0, sa.1);
    let out = kubectl_ok(
        &["auth", "can-i", "--list", "--as", &user, "-n", namespace],
        None,
    );
    out.lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
}

/// What the account may do beyond what every authenticated account may (discovery,
/// self-reviews): the rows of `--list` that a ServiceAccount without bindings does not have.
fn granted(sa: &(String, String), namespace: &str) -> BTreeSet<String> {
    let baseline = permissions(&(sa.0.clone(), "no-bindings-at-all".into()), namespace);
    permissions(sa, namespace)
        .difference(&baseline)
        .cloned()
        .collect()
}

fn set(rows: &[&str]) -> BTreeSet<String> {
    rows.iter().map(|r| r.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn install_where_crds_exist_and_the_account_can_do_what_it_needs_and_nothing_more() {
    let ns = namespace("helm-install").await;
    let other = namespace("helm-other").await;
    let release = unique("sbxop");
    let _release = install(&release, &ns, &[]);

    // Helm skipped the existing CRDs; they are (still) Established.
    kubectl_ok(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/sandboxes.sandboxes.dev",
            "crd/sandboxvolumes.sandboxes.dev",
            "crd/sandboxtemplates.sandboxes.dev",
        ],
        None,
    );
    let status = helm_ok(&["status", &release, "-n", &ns]);
    assert!(status.contains("STATUS: deployed"), "{status}");
    let name = fullname(&release);
    for object in [
        format!("deployment/{name}"),
        format!("serviceaccount/{name}"),
        format!("configmap/{name}"),
        format!("service/{name}-metrics"),
        format!("poddisruptionbudget/{name}"),
        format!("role/{name}-leader-election"),
        format!("rolebinding/{name}-leader-election"),
    ] {
        kubectl_ok(&["get", &object, "-n", &ns], None);
    }
    kubectl_ok(
        &[
            "get",
            &format!("clusterrole/{name}-{ns}"),
            &format!("clusterrolebinding/{name}-{ns}"),
        ],
        None,
    );

    let sa = (ns.clone(), name.clone());
    let lease = format!("leases.coordination.k8s.io/sandbox-operator-{release}");
    let other_lease = "leases.coordination.k8s.io/sandbox-operator-someone-else";
    let o = Some(other.as_str());
    let n = Some(ns.as_str());
    check_matrix(
        &sa,
        &[
            // What it needs, in any namespace a Sandbox may live in.
            (true, "list", "sandboxes.sandboxes.dev", None),
            (true, "watch", "sandboxvolumes.sandboxes.dev", None),
            (true, "list", "sandboxtemplates.sandboxes.dev", None),
            (true, "get", "sandboxes.sandboxes.dev", o),
            (true, "get", "sandboxvolumes.sandboxes.dev", o),
            (true, "get", "sandboxtemplates.sandboxes.dev", o),
            (true, "patch", "sandboxes.sandboxes.dev", o),
            (true, "patch", "sandboxvolumes.sandboxes.dev", o),
            (true, "patch", "sandboxtemplates.sandboxes.dev", o),
            (true, "patch", "sandboxes.sandboxes.dev/status", o),
            (true, "patch", "sandboxvolumes.sandboxes.dev/status", o),
            (true, "patch", "sandboxtemplates.sandboxes.dev/status", o),
            (true, "delete", "sandboxes.sandboxes.dev", o),
            (true, "watch", "sandboxbudgets.sandboxes.dev", None),
            (true, "patch", "sandboxbudgets.sandboxes.dev/status", o),
            (true, "watch", "sandboxwarmpools.sandboxes.dev", None),
            (true, "get", "sandboxwarmpools.sandboxes.dev", o),
            (true, "patch", "sandboxwarmpools.sandboxes.dev", o),
            (true, "patch", "sandboxwarmpools.sandboxes.dev/status", o),
            (false, "update", "sandboxwarmpools.sandboxes.dev/status", o),
            (false, "delete", "sandboxwarmpools.sandboxes.dev", o),
            (false, "patch", "sandboxbudgets.sandboxes.dev", o),
            (true, "create", "events.events.k8s.io", o),
            (true, "patch", "events.events.k8s.io", o),
            (true, "get", "secrets", o),
            // Its own Lease, in its own namespace.
            (true, "create", "leases.coordination.k8s.io", n),
            (true, "get", &lease, n),
            (true, "update", &lease, n),
            // Nothing broader.
            (false, "list", "secrets", o),
            (false, "watch", "secrets", None),
            (false, "create", "secrets", o),
            (false, "get", "configmaps", o),
            (false, "create", "pods", o),
            (false, "delete", "pods", o),
            (false, "delete", "pods", n),
            (false, "get", "pods", n),
            (false, "create", "pods/exec", n),
            (false, "create", "sandboxes.sandboxes.dev", o),
            (false, "update", "sandboxes.sandboxes.dev", o),
            (false, "update", "sandboxes.sandboxes.dev/status", o),
            (false, "delete", "sandboxvolumes.sandboxes.dev", o),
            (false, "delete", "sandboxtemplates.sandboxes.dev", o),
            (false, "deletecollection", "sandboxes.sandboxes.dev", o),
            (false, "create", "events", o),
            (false, "delete", "events.events.k8s.io", o),
            (false, "get", other_lease, n),
            (false, "update", other_lease, n),
            (false, "delete", &lease, n),
            (false, "create", "leases.coordination.k8s.io", o),
            (false, "get", "leases.coordination.k8s.io", o),
            (false, "list", "leases.coordination.k8s.io", n),
            (
                false,
                "create",
                "customresourcedefinitions.apiextensions.k8s.io",
                None,
            ),
            (
                false,
                "update",
                "customresourcedefinitions.apiextensions.k8s.io",
                None,
            ),
            (
                false,
                "create",
                "clusterrolebindings.rbac.authorization.k8s.io",
                None,
            ),
            (
                false,
                "escalate",
                "clusterroles.rbac.authorization.k8s.io",
                None,
            ),
            (false, "impersonate", "users", None),
            (false, "get", "nodes", None),
            (false, "list", "namespaces", None),
            (false, "*", "*", o),
        ],
    );

    // The complete list of what the account was granted, per namespace.
    assert_eq!(
        granted(&sa, &other),
        set(&[
            "events.events.k8s.io [] [] [create patch]",
            "sandboxbudgets.sandboxes.dev [] [] [list watch]",
            "sandboxbudgets.sandboxes.dev/status [] [] [patch]",
            "sandboxes.sandboxes.dev [] [] [get list watch patch delete]",
            "sandboxtemplates.sandboxes.dev [] [] [get list watch patch]",
            "sandboxvolumes.sandboxes.dev [] [] [get list watch patch]",
            "sandboxwarmpools.sandboxes.dev [] [] [get list watch patch]",
            "sandboxwarmpools.sandboxes.dev/status [] [] [patch]",
            "secrets [] [] [get]",
            "sandboxes.sandboxes.dev/status [] [] [patch]",
            "sandboxtemplates.sandboxes.dev/status [] [] [patch]",
            "sandboxvolumes.sandboxes.dev/status [] [] [patch]",
        ])
    );
    let in_own = granted(&sa, &ns);
    let lease_rows = set(&[
        "leases.coordination.k8s.io [] [] [create]",
        &format!("leases.coordination.k8s.io [] [sandbox-operator-{release}] [get update]"),
    ]);
    assert_eq!(
        in_own
            .difference(&granted(&sa, &other))
            .cloned()
            .collect::<BTreeSet<_>>(),
        lease_rows
    );
    tenants_read_budgets_and_cannot_change_them(&other).await;
}

/// A tenant bound to the built-in `edit` role in `ns` reads SandboxBudgets (the chart
/// aggregates that into it) and cannot create, change or delete one, nor write its status.
async fn tenants_read_budgets_and_cannot_change_them(ns: &str) {
    let binding = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: tenant-edit, namespace: {ns}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}\nsubjects: [{{kind: ServiceAccount, name: tenant, namespace: {ns}}}]\n"
    );
    kubectl_ok(&["apply", "-f", "-"], Some(&binding));
    let tenant = (ns.to_string(), "tenant".to_string());
    // The aggregation controller folds the chart's rule into `edit` shortly after install.
    wait_for(
        "edit to aggregate the budget rule",
        Duration::from_secs(60),
        || async {
            can_i(&tenant, "get", "sandboxbudgets.sandboxes.dev", Some(ns))
                .then_some(())
                .ok_or("not yet".to_string())
        },
    )
    .await;
    let n = Some(ns);
    check_matrix(
        &tenant,
        &[
            (true, "list", "sandboxbudgets.sandboxes.dev", n),
            (false, "create", "sandboxbudgets.sandboxes.dev", n),
            (false, "patch", "sandboxbudgets.sandboxes.dev", n),
            (false, "update", "sandboxbudgets.sandboxes.dev", n),
            (false, "delete", "sandboxbudgets.sandboxes.dev", n),
            (false, "patch", "sandboxbudgets.sandboxes.dev/status", n),
        ],
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn namespaced_install_limits_the_account_to_the_watched_and_listed_namespaces() {
    let ns = namespace("helm-ns").await;
    let watched = namespace("helm-ns-w").await;
    let listed = namespace("helm-ns-s").await;
    let other = namespace("helm-ns-o").await;
    let release = unique("nsop");
    let watch = format!("watchNamespace={watched}");
    let secret_namespaces = format!("rbac.secretNamespaces={{{listed}}}");
    let _release = install(
        &release,
        &ns,
        &[
            "--set",
            &watch,
            "--set",
            "rbac.secretAccess=listed",
            "--set",
            &secret_namespaces,
        ],
    );
    let sa = (ns.clone(), fullname(&release));
    let (w, l, o) = (
        Some(watched.as_str()),
        Some(listed.as_str()),
        Some(other.as_str()),
    );
    check_matrix(
        &sa,
        &[
            (true, "list", "sandboxes.sandboxes.dev", w),
            (true, "watch", "sandboxes.sandboxes.dev", w),
            (true, "patch", "sandboxes.sandboxes.dev/status", w),
            (true, "create", "events.events.k8s.io", w),
            (true, "get", "secrets", l),
            (false, "list", "sandboxes.sandboxes.dev", None),
            (false, "list", "sandboxes.sandboxes.dev", o),
            (false, "patch", "sandboxes.sandboxes.dev", o),
            (false, "create", "events.events.k8s.io", o),
            (false, "get", "secrets", w),
            (false, "get", "secrets", o),
            (false, "list", "secrets", l),
            (false, "watch", "secrets", l),
        ],
    );
    assert_eq!(granted(&sa, &listed), set(&["secrets [] [] [get]"]));
    assert_eq!(granted(&sa, &other), BTreeSet::new());

    // secretAccess=none renders no Secret rule anywhere.
    let docs = documents(&render("none", &ns, &["--set", "rbac.secretAccess=none"]));
    for role in of_kind(&docs, "ClusterRole")
        .into_iter()
        .chain(of_kind(&docs, "Role"))
    {
        let rules = serde_json::to_string(&role["rules"]).unwrap();
        assert!(!rules.contains("secrets"), "{rules}");
    }
}

/// A kube client that acts as the chart's ServiceAccount (impersonation), so a provider
/// built on it can do exactly what the chart granted.
async fn client_as(sa: &(String, String)) -> kube::Client {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let kc = kube::config::Kubeconfig::read_from(kubeconfig()).expect("kubeconfig");
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("config");
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{}:{}", sa.0, sa.1));
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".into(),
        format!("system:serviceaccounts:{}", sa.0),
        "system:authenticated".into(),
    ]);
    kube::Client::try_from(config).expect("client")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kubernetes_provider_gets_a_role_in_its_pod_namespace_and_works_with_only_that() {
    use sandbox_operator::provider::kubernetes::KubernetesProvider;
    use sandbox_operator::provider::labels::Owner;
    use sandbox_operator::provider::{CreateRequest, ExecRequest, Provider};

    harness::kubernetes::node().await;
    let ns = namespace("helm-k8s").await;
    let pods_ns = namespace("helm-k8s-pods").await;
    let other = namespace("helm-k8s-o").await;
    let _cleanup = harness::kubernetes::Cleanup {
        namespace: pods_ns.clone(),
        instance: ns.clone(),
    };
    let release = unique("k8sop");
    let volumes = harness::kubernetes::volume_dir();
    let providers = json!([{"name": "pods", "type": "kubernetes", "kubernetes": {
        "namespace": pods_ns, "runtimeClassName": "runc",
        "hostPathVolumes": volumes.to_string_lossy(),
    }}])
    .to_string();
    let providers = format!("providers={providers}");
    let _release = install(&release, &ns, &["--set-json", &providers]);
    let sa = (ns.clone(), fullname(&release));
    let (p, o) = (Some(pods_ns.as_str()), Some(other.as_str()));
    check_matrix(
        &sa,
        &[
            (true, "create", "pods", p),
            (true, "get", "pods", p),
            (true, "list", "pods", p),
            (true, "patch", "pods", p),
            (true, "delete", "pods", p),
            (true, "get", "pods/exec", p),
            (true, "create", "pods/exec", p),
            (true, "create", "services", p),
            (true, "delete", "services", p),
            (true, "create", "secrets", p),
            (true, "update", "secrets", p),
            (true, "patch", "secrets", p),
            (true, "create", "networkpolicies", p),
            (true, "create", "persistentvolumeclaims", p),
            (true, "list", "persistentvolumeclaims", p),
            (true, "create", "persistentvolumes", None),
            (true, "delete", "persistentvolumes", None),
            // Nowhere else, and nothing broader there.
            (false, "create", "pods", o),
            (false, "get", "pods/exec", o),
            (false, "get", "pods", o),
            (false, "create", "services", o),
            (false, "create", "persistentvolumeclaims", o),
            (false, "watch", "pods", p),
            (false, "update", "pods", p),
            (false, "list", "secrets", p),
            (false, "watch", "secrets", p),
            (false, "list", "networkpolicies", p),
            (false, "delete", "networkpolicies", p),
            (false, "create", "networkpolicies", o),
            (false, "list", "persistentvolumes", None),
            (false, "get", "nodes", None),
            (false, "*", "*", p),
        ],
    );
    let own = granted(&sa, &pods_ns)
        .difference(&granted(&sa, &other))
        .cloned()
        .collect::<BTreeSet<_>>();
    assert_eq!(
        own,
        set(&[
            "persistentvolumeclaims [] [] [get list create delete]",
            "pods [] [] [get list create patch delete]",
            "pods/exec [] [] [get create]",
            "networkpolicies.networking.k8s.io [] [] [create]",
            "networkpolicies.networking.k8s.io [] [sandboxes-default-deny] [get update]",
            "secrets [] [] [get create update patch delete]",
            "services [] [] [get create delete]",
        ])
    );

    // The provider, acting as that account, does its whole job in its namespace.
    let mut settings = harness::kubernetes::settings(&pods_ns);
    settings.kubeconfig = None;
    let provider = KubernetesProvider::with_client("pods", client_as(&sa).await, settings);
    let uid = unique("uid");
    let request = CreateRequest {
        name: format!("sbx-{uid}"),
        owner: Owner {
            instance: ns.clone(),
            kind: "Sandbox".into(),
            namespace: ns.clone(),
            name: "rbac".into(),
            uid: uid.clone(),
        },
        image: Some(base_image()),
        template: None,
        command: Some(idle()),
        restart_policy: Default::default(),
        env: BTreeMap::new(),
        labels: BTreeMap::new(),
        resources: Default::default(),
        ports: vec![sandbox_operator::provider::PortRequest {
            sandbox_port: 8080,
            protocol: "tcp".into(),
        }],
        volumes: vec![],
        allowed_domains: None,
        idle_action: None,
        image_pull_policy: Default::default(),
        registry_credentials: Vec::new(),
        secret_env_keys: Default::default(),
    };
    let volume = format!("v{}", &uid[4..]);
    let labels = request.owner.labels();
    let vols = provider.volumes().expect("volumes");
    vols.create_volume(&volume, &labels)
        .await
        .expect("create_volume");
    let mut request = request;
    request.volumes = vec![sandbox_operator::provider::VolumeMount {
        volume_name: volume.clone(),
        mount_path: "/data".into(),
        read_only: false,
    }];
    let d = provider.create(&request).await.expect("create");
    provider.start(&d.id).await.expect("start");
    let out = provider
        .exec(
            &d.id,
            &ExecRequest::shell("echo ok > /data/f && cat /data/f", Duration::from_secs(30)),
        )
        .await
        .expect("exec");
    assert_eq!(out.stdout, b"ok\n");
    let files = provider.files().expect("files");
    files
        .write_file(&d.id, "/tmp/x", b"bytes", 0o600)
        .await
        .expect("write");
    assert_eq!(
        files.read_file(&d.id, "/tmp/x").await.expect("read"),
        b"bytes"
    );
    provider.stop(&d.id).await.expect("stop");
    provider.start(&d.id).await.expect("start again");
    let found = provider.find(&Default::default()).await.expect("find");
    assert_eq!(found.len(), 1);
    provider.destroy(&d.id).await.expect("destroy");
    vols.remove_volume(&volume).await.expect("remove_volume");
}

// ---- a fresh control plane: Helm creates the CRDs; the documented upgrade path -------------

/// A private etcd + kube-apiserver started by tests/cluster/up.sh in a scratch cache directory
/// (the pinned binaries are linked, not rebuilt) on free ports; stopped and removed on drop.
struct PrivateCluster {
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl PrivateCluster {
    fn start() -> PrivateCluster {
        let dir = tempfile::Builder::new()
            .prefix("sbx-private-cluster-")
            .tempdir()
            .unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for entry in std::fs::read_dir(cache().join("bin")).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            // The versioned build directories (kubernetes-v…, etcd-v…, helm-v…); up.sh links
            // the binaries inside them itself.
            if entry.path().is_dir() && name.contains("-v") {
                std::os::unix::fs::symlink(entry.path(), bin.join(&name)).unwrap();
            }
        }
        let port = || sandbox_doubles::ports::quiet_port().to_string();
        let out = Command::new("bash")
            .arg(repo().join("tests/cluster/up.sh"))
            .env("SANDBOX_CACHE", dir.path())
            .env("SANDBOX_ETCD_PORT", port())
            .env("SANDBOX_ETCD_PEER_PORT", port())
            .env("SANDBOX_APISERVER_PORT", port())
            .output()
            .expect("run up.sh");
        let cluster = PrivateCluster {
            kubeconfig: dir.path().join("cluster/kubeconfig"),
            dir,
        };
        assert!(
            out.status.success(),
            "private control plane did not start:\n{}",
            text(&out)
        );
        cluster
    }

    fn run(&self, program: &Path, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(program);
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            });
        let mut child = cmd.spawn().expect("spawn");
        if let Some(input) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        child.wait_with_output().unwrap()
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        self.run(&kubectl_bin(), args, stdin)
    }

    fn helm_ok(&self, args: &[&str]) -> String {
        let out = self.run(&helm_bin(), args, None);
        assert!(
            out.status.success(),
            "helm {} failed:\n{}",
            args.join(" "),
            text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo().join("tests/cluster/down.sh"))
            .arg("--wipe")
            .env("SANDBOX_CACHE", self.dir.path())
            .output();
    }
}

fn columns_of(cluster: &PrivateCluster) -> String {
    let out = cluster.kubectl(
        &[
            "get",
            "crd",
            "sandboxes.sandboxes.dev",
            "-o",
            "jsonpath={.spec.versions[0].additionalPrinterColumns[*].name}",
        ],
        None,
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn fresh_cluster_install_creates_the_crds_and_the_documented_upgrade_path_updates_them() {
    let cluster = PrivateCluster::start();
    let out = cluster.kubectl(&["get", "crd", "-o", "name"], None);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !text(&out).contains("sandboxes.dev"),
        "a fresh cluster already has the CRDs"
    );

    // First install: Helm creates the CRDs from the chart's crds/, and they become Established.
    let chart_dir = chart_arg();
    cluster.helm_ok(&[
        "install",
        "sbx",
        &chart_dir,
        "-n",
        "sandbox-system",
        "--create-namespace",
    ]);
    let crds: Vec<String> = CRD_NAMES.iter().map(|c| format!("crd/{c}")).collect();
    let mut wait = vec!["wait", "--for=condition=Established", "--timeout=60s"];
    wait.extend(crds.iter().map(String::as_str));
    let out = cluster.kubectl(&wait, None);
    assert!(out.status.success(), "CRDs not Established: {}", text(&out));
    let crd_dir = chart().join("crds");
    let crd_dir = crd_dir.to_string_lossy();
    // What Helm created is exactly the chart's CRDs: a server-side diff finds nothing.
    let out = cluster.kubectl(
        &["diff", "--server-side", "--force-conflicts", "-f", &crd_dir],
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "installed CRDs differ from the chart's:\n{}",
        text(&out)
    );

    // An older chart's CRDs: the printer columns are missing.
    let remove_columns = |cluster: &PrivateCluster| {
        for crd in CRD_NAMES {
            let out = cluster.kubectl(
                &[
                    "patch",
                    "crd",
                    crd,
                    "--type=json",
                    "-p",
                    r#"[{"op":"remove","path":"/spec/versions/0/additionalPrinterColumns"}]"#,
                ],
                None,
            );
            assert!(out.status.success(), "{}", text(&out));
        }
    };
    assert!(columns_of(&cluster).contains("Ready"));
    remove_columns(&cluster);
    let columns = columns_of;
    assert_eq!(columns(&cluster), "");

    // `helm upgrade` never touches crds/ (Helm's documented behaviour) ...
    cluster.helm_ok(&["upgrade", "sbx", &chart_dir, "-n", "sandbox-system"]);
    assert_eq!(
        columns(&cluster),
        "",
        "helm upgrade changed the CRDs after all"
    );

    // ... so the README's upgrade paths do, exactly as written there: the chart's crds/ ...
    let readme = std::fs::read_to_string(chart().join("README.md")).unwrap();
    for documented in [
        "kubectl apply --server-side --force-conflicts -f charts/sandbox-operator/crds/",
        "crds | kubectl apply --server-side --force-conflicts -f -",
    ] {
        assert!(
            readme.contains(documented),
            "the chart README no longer documents `{documented}`"
        );
    }
    let out = cluster.kubectl(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &crd_dir,
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        text(&out).matches("serverside-applied").count(),
        CRD_NAMES.len(),
        "{}",
        text(&out)
    );
    assert!(
        columns(&cluster).contains("Ready"),
        "printer columns not restored: {}",
        columns(&cluster)
    );
    let out = cluster.kubectl(
        &["diff", "--server-side", "--force-conflicts", "-f", &crd_dir],
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "CRDs still differ after the upgrade path:\n{}",
        text(&out)
    );
    let out = cluster.kubectl(&wait, None);
    assert!(out.status.success(), "{}", text(&out));

    // ... or what the operator binary (the image's entrypoint) prints.
    remove_columns(&cluster);
    assert_eq!(columns(&cluster), "");
    let printed = Command::new(env!("CARGO_BIN_EXE_sandbox-operator"))
        .arg("crds")
        .output()
        .unwrap();
    assert!(printed.status.success());
    let out = cluster.kubectl(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(&String::from_utf8_lossy(&printed.stdout)),
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        text(&out).matches("serverside-applied").count(),
        CRD_NAMES.len(),
        "{}",
        text(&out)
    );
    let out = cluster.kubectl(
        &["diff", "--server-side", "--force-conflicts", "-f", &crd_dir],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // And a Sandbox is accepted by the upgraded CRD.
    let out = cluster.kubectl(
        &[
            "apply",
            "--dry-run=server",
            "-f",
            &repo().join("examples/sandbox.yaml").to_string_lossy(),
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out));
}

// ---- the image, running the chart's pod -----------------------------------------------------

struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

fn docker_ok(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("run docker");
    assert!(
        out.status.success(),
        "docker {} failed:\n{}",
        args.join(" "),
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn image_runs_the_charts_pod_spec_with_only_the_charts_rbac() {
    use std::os::unix::fs::MetadataExt;

    let tag = format!(
        "sandbox-operator:test-{}",
        unique("img").trim_start_matches("img-")
    );
    build_image(&tag);
    let _image = Image(tag.clone());

    // Small, non-root, nothing but the binary: no shell to exec into.
    let inspect: Value = serde_json::from_str(&docker_ok(&["image", "inspect", &tag])).unwrap();
    let config = &inspect[0]["Config"];
    assert_eq!(config["User"], "65532:65532");
    assert_eq!(
        config["Entrypoint"],
        json!(["/usr/local/bin/sandbox-operator"])
    );
    let size = inspect[0]["Size"].as_u64().unwrap();
    assert!(size < 100 * 1024 * 1024, "image is {size} bytes");
    let out = Command::new("docker")
        .args(["run", "--rm", "--entrypoint", "/bin/sh", &tag, "-c", "true"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the image has a shell");
    let version = docker_ok(&["run", "--rm", &tag, "version"]);
    assert_eq!(
        version.trim(),
        format!("sandbox-operator {}", env!("CARGO_PKG_VERSION"))
    );

    // Install the chart for this namespace, with this image and a free metrics port.
    let ns = namespace("helm-image").await;
    let release = unique("img");
    let _purge = Purge(release.clone());
    let socket = Path::new("/var/run/docker.sock");
    let gid = std::fs::metadata(socket).expect("docker socket").gid();
    let port = sandbox_doubles::ports::quiet_port();
    let (repository, image_tag) = tag.split_once(':').unwrap();
    let dir = tempfile::tempdir().unwrap();
    let values = write_temp(
        dir.path(),
        "values.yaml",
        &format!(
            "watchNamespace: {ns}\nreplicas: 1\nimage: {{repository: {repository}, tag: {image_tag}, pullPolicy: Never}}\n\
             metrics: {{port: {port}, bindAddress: 127.0.0.1}}\nleaseDurationSeconds: 6\n\
             dockerFirewallImage: {firewall}\n\
             providers:\n  - name: docker\n    type: docker\n    docker:\n      socket: {{hostPath: {}, groupId: {gid}}}\n",
            socket.display(),
            // No registry is reachable here: the host-firewall helper runs from the base image.
            firewall = base_image(),
        ),
    );
    let _release = install(&release, &ns, &["-f", &values]);
    let manifest = helm_ok(&["get", "manifest", &release, "-n", &ns]);
    let docs = documents(&manifest);
    let deployment = one(&docs, "Deployment");
    let configmap = one(&docs, "ConfigMap");
    let pod = &deployment["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["image"], tag);

    // The pod's ServiceAccount token, as the kubelet would mount it.
    let sa = pod["serviceAccountName"].as_str().unwrap();
    let token = kubectl_ok(&["create", "token", sa, "-n", &ns, "--duration=1h"], None);
    let admin: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(kubeconfig()).unwrap()).unwrap();
    let cluster = &admin["clusters"][0]["cluster"];
    let sa_kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\n\
         users:\n- name: sa\n  user:\n    token: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: sa, namespace: {ns}}}\n\
         current-context: c\n",
        cluster["server"].as_str().unwrap(),
        cluster["certificate-authority-data"].as_str().unwrap(),
        token.trim()
    );
    let kube_dir = dir.path().join("kube");
    std::fs::create_dir_all(&kube_dir).unwrap();
    write_temp(&kube_dir, "config", &sa_kubeconfig);

    // Translate the pod spec into `docker run`, field by field.
    let pod_name = format!("{}-0", deployment["metadata"]["name"].as_str().unwrap());
    let mut run: Vec<String> = vec!["run".into(), "-d".into(), "--network=host".into()];
    let name = format!("sbx-op-{release}");
    run.push(format!("--name={name}"));
    let psc = &pod["securityContext"];
    let sc = &c["securityContext"];
    assert_eq!(psc["runAsNonRoot"], true);
    run.push(format!("--user={}:{}", psc["runAsUser"], psc["runAsGroup"]));
    for g in psc["supplementalGroups"].as_array().into_iter().flatten() {
        run.push(format!("--group-add={g}"));
    }
    if sc["readOnlyRootFilesystem"] == true {
        run.push("--read-only".into());
    }
    if sc["capabilities"]["drop"] == json!(["ALL"]) {
        run.push("--cap-drop=ALL".into());
    }
    if sc["allowPrivilegeEscalation"] == false {
        run.push("--security-opt=no-new-privileges".into());
    }
    assert_eq!(
        psc["seccompProfile"]["type"], "RuntimeDefault",
        "docker's default profile plays RuntimeDefault"
    );
    let volumes: BTreeMap<&str, &Value> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["name"].as_str().unwrap(), v))
        .collect();
    for m in c["volumeMounts"].as_array().unwrap() {
        let path = m["mountPath"].as_str().unwrap();
        let v = volumes[m["name"].as_str().unwrap()];
        if v.get("configMap").is_some() {
            let cm_dir = dir.path().join("configmap");
            std::fs::create_dir_all(&cm_dir).unwrap();
            for (key, value) in configmap["data"].as_object().unwrap() {
                write_temp(&cm_dir, key, value.as_str().unwrap());
            }
            run.push(format!("--volume={}:{path}:ro", cm_dir.display()));
        } else if v.get("emptyDir").is_some() {
            run.push(format!("--tmpfs={path}"));
        } else if let Some(host) = v["hostPath"]["path"].as_str() {
            run.push(format!("--volume={host}:{path}"));
        } else {
            panic!("volume kind not translated: {v}");
        }
    }
    for e in c["env"].as_array().unwrap() {
        let key = e["name"].as_str().unwrap();
        let value = match (
            &e["value"],
            e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        ) {
            (Value::String(v), _) => v.clone(),
            (_, Some("metadata.namespace")) => ns.clone(),
            (_, Some("metadata.name")) => pod_name.clone(),
            _ => panic!("env not translated: {e}"),
        };
        run.push(format!("--env={key}={value}"));
    }
    run.push(format!("--volume={}:/var/run/kube:ro", kube_dir.display()));
    run.push("--env=KUBECONFIG=/var/run/kube/config".into());
    run.push(tag.clone());
    for a in c["args"].as_array().unwrap() {
        run.push(a.as_str().unwrap().to_string());
    }
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    docker_ok(&run);
    let _container = Container(name.clone());
    let logs = || {
        let out = Command::new("docker")
            .args(["logs", "--tail", "40", &name])
            .output()
            .unwrap();
        text(&out)
    };

    // The probes the chart points the kubelet at answer.
    let addr = format!("127.0.0.1:{port}");
    wait_for("the operator's /readyz", Duration::from_secs(60), || {
        let r = http_get(&addr, "/readyz");
        let result = match r {
            Some(r) if r.starts_with("HTTP/1.1 200") || r.starts_with("HTTP/1.0 200") => Ok(()),
            other => Err(format!("{other:?}\n{}", logs())),
        };
        async move { result }
    })
    .await;
    assert!(
        http_get(&addr, "/healthz")
            .unwrap_or_default()
            .contains(" 200 ")
    );
    // It leads, with the Lease the chart's Role names.
    let lease_name = format!("sandbox-operator-{release}");
    wait_for("the Lease to be held", Duration::from_secs(60), || {
        let out = kubectl(
            &[
                "get",
                "lease",
                &lease_name,
                "-n",
                &ns,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
            None,
        );
        let holder = String::from_utf8_lossy(&out.stdout).into_owned();
        let pod_name = pod_name.clone();
        async move {
            if holder.starts_with(&pod_name) {
                Ok(())
            } else {
                Err(format!("holder {holder:?}"))
            }
        }
    })
    .await;

    // A Sandbox with a Secret in envFrom: watch, finalizer patch, Secret get, status patch.
    kubectl_ok(
        &[
            "create",
            "secret",
            "generic",
            "app-env",
            "-n",
            &ns,
            "--from-literal=GREETING=hello",
        ],
        None,
    );
    let sandbox = format!(
        "apiVersion: sandboxes.dev/v1alpha1\nkind: Sandbox\nmetadata: {{name: probe, namespace: {ns}}}\n\
         spec:\n  image: {}\n  command: [sh, -c, \"trap 'exit 0' TERM; while :; do sleep 1; done\"]\n\
         \x20 envFrom: [{{secretRef: {{name: app-env}}}}]\n",
        base_image()
    );
    kubectl_ok(&["apply", "-f", "-"], Some(&sandbox));
    let out = kubectl(
        &[
            "wait",
            "--for=condition=Ready",
            "sbx/probe",
            "-n",
            &ns,
            "--timeout=90s",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "Sandbox not Ready: {}\n{}",
        text(&out),
        logs()
    );
    let s: Value = serde_json::from_str(&get_json("sbx", "probe", &ns).unwrap()).unwrap();
    assert_eq!(
        s["status"]["observedGeneration"],
        s["metadata"]["generation"]
    );
    assert!(
        s["metadata"]["finalizers"]
            .as_array()
            .unwrap()
            .contains(&json!("sandboxes.dev/cleanup"))
    );
    let uid = s["metadata"]["uid"].as_str().unwrap();
    let env = docker_ok(&[
        "inspect",
        "-f",
        "{{json .Config.Env}}",
        &format!("sbx-{uid}"),
    ]);
    assert!(env.contains("GREETING=hello"), "{env}");
    // Events: created by the operator under its own account.
    let events = kubectl_ok(
        &["get", "events.events.k8s.io", "-n", &ns, "-o", "json"],
        None,
    );
    let events: Value = serde_json::from_str(&events).unwrap();
    assert!(
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["regarding"]["name"] == "probe"
                && e["reportingController"] == "sandbox-operator"),
        "no Event from the operator: {events}"
    );
    // Delete: the finalizer is released (a patch) once the container is gone.
    kubectl_ok(
        &["delete", "sbx", "probe", "-n", &ns, "--timeout=90s"],
        None,
    );
    let out = Command::new("docker")
        .args(["inspect", &format!("sbx-{uid}")])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "the sandbox's container outlived the Sandbox"
    );

    // SIGTERM (what the kubelet sends): a clean exit that releases the Lease.
    let out = Command::new("docker")
        .args(["stop", "-t", "30", &name])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let code = docker_ok(&["inspect", "-f", "{{.State.ExitCode}}", &name]);
    assert_eq!(code.trim(), "0", "operator exit code; logs:\n{}", logs());
    let holder = kubectl_ok(
        &[
            "get",
            "lease",
            &lease_name,
            "-n",
            &ns,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
        None,
    );
    assert_eq!(holder, "", "the Lease was not released");
    // JSON logs (logFormat: json), one object per line.
    let all_logs = Command::new("docker")
        .args(["logs", &name])
        .output()
        .unwrap();
    let first = String::from_utf8_lossy(&all_logs.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(
        serde_json::from_str::<Value>(&first).is_ok(),
        "not a JSON log line: {first:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tenant_roles_let_edit_manage_sandboxes_and_view_read_them_but_nobody_write_status() {
    let ns = namespace("helm-tenants").await;
    let team = namespace("helm-team").await;
    let elsewhere = namespace("helm-elsewhere").await;
    let release = unique("tenop");
    let _release = install(&release, &ns, &[]);
    let (editor, viewer) = (unique("alice"), unique("victor"));
    for (user, role) in [(&editor, "edit"), (&viewer, "view")] {
        kubectl_ok(
            &[
                "create",
                "rolebinding",
                user,
                "-n",
                &team,
                "--clusterrole",
                role,
                "--user",
                user,
            ],
            None,
        );
    }
    let groups = ["system:authenticated"];
    let t = Some(team.as_str());
    // The built-in roles pick the rules up through the controller-manager's aggregation.
    harness::wait_for(
        "edit to aggregate the tenant role",
        Duration::from_secs(60),
        || async {
            match can_as(&editor, &groups, "create", "sandboxes.sandboxes.dev", t) {
                true => Ok(()),
                false => Err("not yet".to_string()),
            }
        },
    )
    .await;
    harness::wait_for(
        "view to aggregate the tenant role",
        Duration::from_secs(60),
        || async {
            match can_as(
                &viewer,
                &groups,
                "list",
                "sandboxtemplates.sandboxes.dev",
                t,
            ) {
                true => Ok(()),
                false => Err("not yet".to_string()),
            }
        },
    )
    .await;
    let e = Some(elsewhere.as_str());
    let cases: &[(&str, bool, &str, &str, Option<&str>)] = &[
        (&editor, true, "patch", "sandboxes.sandboxes.dev", t),
        (&editor, true, "delete", "sandboxvolumes.sandboxes.dev", t),
        (&editor, true, "update", "sandboxtemplates.sandboxes.dev", t),
        (&editor, false, "patch", "sandboxes.sandboxes.dev/status", t),
        (
            &editor,
            false,
            "update",
            "sandboxes.sandboxes.dev/status",
            t,
        ),
        (
            &editor,
            false,
            "patch",
            "sandboxvolumes.sandboxes.dev/status",
            t,
        ),
        (
            &editor,
            false,
            "patch",
            "sandboxtemplates.sandboxes.dev/status",
            t,
        ),
        (&editor, false, "get", "sandboxes.sandboxes.dev", e),
        (&viewer, true, "get", "sandboxes.sandboxes.dev", t),
        (&viewer, false, "patch", "sandboxes.sandboxes.dev", t),
        (&viewer, false, "patch", "sandboxes.sandboxes.dev/status", t),
    ];
    let wrong: Vec<String> = cases
        .iter()
        .filter(|(user, want, verb, resource, ns)| {
            can_as(user, &groups, verb, resource, *ns) != *want
        })
        .map(|(user, want, verb, resource, ns)| {
            format!("{user} {verb} {resource} in {ns:?}: want {want}")
        })
        .collect();
    assert!(wrong.is_empty(), "tenant RBAC differs: {wrong:#?}");
}
