//! `helm install` with a SaaS provider and its token Secret, rendered and run: the chart is
//! rendered with Fly Machines, Fly Sprites or E2B values whose token is a Secret reference,
//! the Secret is created in the test namespace, and the operator binary runs with exactly
//! the rendered configuration, arguments and environment — each `secretKeyRef` resolved from
//! the Secret on the API server, as the kubelet would — against the provider's double, until
//! a Sandbox of that provider is Ready and, once deleted, gone from the provider.
//!
//! Pods never run on the test control plane (no scheduler, no kubelet), so "the pod runs" is
//! played by the binary (the image's pod spec itself is run in `tests/helm.rs`). The one
//! rendered value changed is the metrics port, to a free loopback port: tests share a host.

mod harness;

use std::collections::BTreeMap;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use harness::cluster::*;
use harness::objects::{Logged, delete_and_wait_gone_within, wait_ready_within};
use harness::tools::*;
use harness::{repo, unique, wait_for};
use kube::Api;
use sandbox_operator::api::Sandbox;
use serde_json::{Value, json};

const READY_TIMEOUT: Duration = Duration::from_secs(120);

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `helm template` of the chart with `values` (YAML), as JSON documents.
fn render(release: &str, namespace: &str, values: &str) -> Vec<Value> {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).expect("values file");
    let chart = repo().join("charts/sandbox-operator");
    helm_template(&[
        release,
        &chart.to_string_lossy(),
        "--namespace",
        namespace,
        "-f",
        &file.to_string_lossy(),
    ])
}

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "expected one {kind}");
    found[0]
}

/// The value of key `key` of Secret `name`, read from the API server.
fn secret_value(namespace: &str, name: &str, key: &str) -> String {
    use base64::Engine as _;
    let path = format!("jsonpath={{.data.{key}}}");
    let out = kubectl(&["get", "secret", name, "-n", namespace, "-o", &path], None);
    assert!(out.status.success(), "read Secret {name}: {}", text(&out));
    let encoded = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .expect("Secret data is base64");
    String::from_utf8(bytes).expect("a UTF-8 token")
}

/// The operator, run as the rendered Deployment's container would run; killed on drop.
struct Rendered {
    child: Child,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Rendered {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Creates Secret `secret` (key `key` = `token`) in `namespace`, renders the chart with
/// `values`, and starts the binary with the rendered config, args and env.
fn install_and_run(
    namespace: &str,
    values: &str,
    secret: &str,
    key: &str,
    token: &str,
) -> Rendered {
    let create = kubectl(
        &[
            "create",
            "secret",
            "generic",
            secret,
            "-n",
            namespace,
            &format!("--from-literal={key}={token}"),
        ],
        None,
    );
    assert!(create.status.success(), "create Secret: {}", text(&create));
    let release = unique("hp");
    let docs = render(&release, namespace, values);
    let config = one(&docs, "ConfigMap")["data"]["config.yaml"]
        .as_str()
        .expect("config.yaml")
        .to_string();
    assert!(!config.contains(token), "the token is not in the ConfigMap");
    assert!(!config.contains(secret), "nor the Secret's name");
    let container = &one(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0];

    let dir = tempfile::tempdir().expect("temp dir");
    let config_path = dir.path().join("config.yaml");
    std::fs::write(&config_path, &config).expect("config file");
    let port = sandbox_doubles::ports::quiet_port();
    let args: Vec<String> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| {
            let a = a.as_str().expect("string arg");
            if a.starts_with("--config=") {
                format!("--config={}", config_path.display())
            } else if a.starts_with("--metrics-addr=") {
                format!("--metrics-addr=127.0.0.1:{port}")
            } else {
                a.to_string()
            }
        })
        .collect();
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for e in container["env"].as_array().expect("env") {
        let name = e["name"].as_str().expect("env name").to_string();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_string()
        } else if let Some(r) = e["valueFrom"]["secretKeyRef"].as_object() {
            secret_value(
                namespace,
                r["name"].as_str().expect("secret name"),
                r["key"].as_str().expect("secret key"),
            )
        } else if e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace" {
            namespace.to_string()
        } else if e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name" {
            format!("{release}-0")
        } else {
            panic!("an env entry the test cannot play: {e}")
        };
        env.insert(name, value);
    }
    let log_dir = repo().join("target/e2e");
    std::fs::create_dir_all(&log_dir).expect("log dir");
    let log = log_dir.join(format!("{namespace}-helm.log"));
    let file = std::fs::File::create(&log).expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_sandbox-operator"))
        .args(&args)
        .env_clear()
        .envs(&env)
        .env("KUBECONFIG", kubeconfig())
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdout(file.try_clone().expect("log"))
        .stderr(file)
        .stdin(Stdio::null())
        .spawn()
        .expect("run the operator");
    Rendered {
        child,
        log,
        _dir: dir,
    }
}

impl Logged for Rendered {
    fn where_logged(&self) -> String {
        format!("operator log: {}", self.log.display())
    }
}

/// Applies a Sandbox, waits for Ready, deletes it and waits until it is gone.
async fn ready_then_deleted(namespace: &str, spec: Value, op: &Rendered) -> Sandbox {
    let manifest = json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": "box"},
        "spec": spec,
    });
    let out = apply_yaml(&serde_yaml::to_string(&manifest).unwrap(), namespace);
    assert!(out.status.success(), "apply: {}", text(&out));
    let api: Api<Sandbox> = Api::namespaced(client().await, namespace);
    let s = wait_ready_within(&api, "box", op, READY_TIMEOUT).await;
    delete_and_wait_gone_within(&api, "box", READY_TIMEOUT).await;
    s
}

/// Chart values common to every provider: this namespace only, one replica.
fn common(namespace: &str) -> String {
    format!("watchNamespace: {namespace}\ninstance: {namespace}\nreplicas: 1\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fly_install_with_its_token_secret_runs_a_fly_sandbox() {
    use sandbox_doubles::fly::{FlyDoubleOptions, spawn};
    let ns = namespace("helm-fly").await;
    let double = spawn(FlyDoubleOptions::default())
        .await
        .expect("Fly double");
    let first = sandbox_doubles::ports::quiet_block(501);
    let values = format!(
        "{}providers:\n  - name: fly\n    type: fly\n    fly:\n      app: {}\n      apiUrl: {}\n      \
         publicHost: {}\n      firstPublicPort: {first}\n      lastPublicPort: {}\n      \
         token: {{secretName: fly-api-token, key: token}}\n",
        common(&ns),
        double.app(),
        double.base_url(),
        double.publish_host(),
        first + 100,
    );
    let op = install_and_run(&ns, &values, "fly-api-token", "token", double.token());
    let spec = json!({
        "provider": "fly",
        "image": harness::docker::base_image(),
        "command": ["sleep", "infinity"],
    });
    let s = ready_then_deleted(&ns, spec, &op).await;
    assert!(s.status.and_then(|st| st.sandbox_id).is_some());
    assert!(
        double.live_machines(double.app()).is_empty(),
        "the machine is destroyed with its Sandbox"
    );
    drop(op);
    double.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sprites_install_with_its_token_secret_runs_a_sprite() {
    use sandbox_doubles::sprites::{self, SpritesOptions};
    let ns = namespace("helm-sprites").await;
    let double = sprites::spawn(SpritesOptions::new(harness::docker::base_image())).await;
    let values = format!(
        "{}providers:\n  - name: sprites\n    type: sprites\n    sprites:\n      org: e2e\n      \
         apiUrl: {}\n      token: {{secretName: sprites-token, key: token}}\n",
        common(&ns),
        double.base_url,
    );
    let op = install_and_run(&ns, &values, "sprites-token", "token", &double.token);
    let s = ready_then_deleted(&ns, json!({"provider": "sprites"}), &op).await;
    let id = s.status.and_then(|st| st.sandbox_id).expect("sandboxId");
    assert!(id.starts_with("sbx-"), "{id}");
    assert_eq!(double.creates(), 1);
    assert!(
        double.sprite_names().await.is_empty(),
        "the sprite is deleted"
    );
    drop(op);
    double.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_e2b_install_with_its_key_secret_runs_an_e2b_sandbox() {
    use sandbox_doubles::e2b::{self, E2bDoubleOptions};
    let ns = namespace("helm-e2b").await;
    let double = e2b::spawn(E2bDoubleOptions::default())
        .await
        .expect("E2B double");
    let values = format!(
        "{}providers:\n  - name: e2b\n    type: e2b\n    e2b:\n      apiUrl: {}\n      \
         sandboxUrl: {}\n      apiKey: {{secretName: e2b-api-key, key: api-key}}\n",
        common(&ns),
        double.api_url(),
        double.envd_url(),
    );
    let op = install_and_run(&ns, &values, "e2b-api-key", "api-key", double.api_key());
    let s = ready_then_deleted(&ns, json!({"provider": "e2b", "image": "base"}), &op).await;
    let id = s.status.and_then(|st| st.sandbox_id).expect("sandboxId");
    wait_for("the E2B sandbox killed", READY_TIMEOUT, || async {
        match double.sandbox(&id).await {
            None => Ok(()),
            Some(_) => Err(format!("{id} still held")),
        }
    })
    .await;
    drop(op);
    let _ = double.shutdown().await;
}
