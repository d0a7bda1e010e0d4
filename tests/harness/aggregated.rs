//! The aggregated API (`subresources.sandboxes.dev`) through the real kube-apiserver: an
//! operator serving it as a host process, registered by an APIService whose selector-less
//! Service has an EndpointSlice (and Endpoints) at this host's non-loopback address —
//! Endpoints refuse loopback addresses, and the test API server runs with
//! `--enable-aggregator-routing=true`, so it dials that address directly.
//!
//! The APIService is cluster-wide: one test at a time holds it (a file lock across test
//! processes), and it is deleted when the test ends, because an APIService whose backend is
//! gone blocks the deletion of every namespace in the cluster.

use std::fs::File;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use nix::fcntl::{Flock, FlockArg};
use sandbox_operator::access::channel::{self, Outcome};

use kube::Api;
use sandbox_operator::api::Sandbox;

use super::cluster::{client, kubeconfig, kubectl, kubectl_ok, namespace};
use super::docker::Purge;
use super::kubernetes::Kubernetes;
use super::objects::wait_ready_within;
use super::operator::{Operator, OperatorOptions};
use super::world::World;
use super::{cache, unique, wait_for};

/// The APIService's name.
pub const APISERVICE: &str = "v1alpha1.subresources.sandboxes.dev";
/// The group/version path.
pub const GROUP_VERSION: &str = "/apis/subresources.sandboxes.dev/v1alpha1";
/// Where the Service in front of the test operator lives.
pub const SERVICE_NAMESPACE: &str = "sandbox-access-test";
/// Its name.
pub const SERVICE: &str = "sandbox-operator-access";

/// This host's address towards the default route (what `tests/setup/node.sh` uses as the
/// node IP; `SANDBOX_NODE_IP` overrides it): an address the API server can dial and
/// Endpoints accept.
pub fn host_ip() -> String {
    if let Ok(ip) = std::env::var("SANDBOX_NODE_IP") {
        return ip;
    }
    let out = std::process::Command::new("ip")
        .args(["-4", "route", "get", "1.1.1.1"])
        .output()
        .expect("ip route get");
    let text = String::from_utf8_lossy(&out.stdout);
    let src = text.split_whitespace().skip_while(|w| *w != "src").nth(1);
    src.expect("a source address towards the default route (set SANDBOX_NODE_IP)")
        .to_string()
}

/// The DNS name the aggregator verifies our serving certificate for.
pub fn server_name() -> String {
    format!("{SERVICE}.{SERVICE_NAMESPACE}.svc")
}

/// A running operator serving the aggregated API, registered with the API server.
pub struct Aggregated {
    /// The operator process (dropped after the APIService is deleted).
    pub operator: Operator,
    /// Where its listener is reachable directly.
    pub addr: SocketAddr,
    /// The PEM CA the APIService trusts (a self-signed serving certificate).
    pub ca_pem: String,
    _lock: Flock<File>,
}

impl Aggregated {
    /// Starts an operator watching `namespace` with the Docker provider and the aggregated API
    /// on, registers it and waits until the APIService is Available and answers through the
    /// API server.
    pub async fn start(namespace: &str) -> Aggregated {
        Self::start_with(
            namespace,
            "providers:\n  - name: docker\n    type: docker\n",
        )
        .await
    }

    /// As [`Aggregated::start`], with the operator's `providers:` section (YAML, ending in a
    /// newline) given: the same access layer in front of another provider or a double.
    pub async fn start_with(namespace: &str, providers_yaml: &str) -> Aggregated {
        let lock = lock();
        let (cert, key, ca_pem) = serving_files(namespace);
        let port = sandbox_doubles::ports::quiet_port();
        let extra = format!(
            "{providers_yaml}access:\n  enabled: true\n  address: \"0.0.0.0:{port}\"\n  tlsCertFile: {}\n  tlsKeyFile: {}\n",
            cert.display(),
            key.display()
        );
        let opts = OperatorOptions {
            config_extra: extra,
            ..OperatorOptions::default()
        };
        let operator = Operator::start(namespace, namespace, &opts);
        let addr: SocketAddr = format!("{}:{port}", host_ip()).parse().expect("address");
        let me = Aggregated {
            operator,
            addr,
            ca_pem,
            _lock: lock,
        };
        wait_for(
            "the operator's aggregated API listener",
            Duration::from_secs(60),
            || {
                let up = std::net::TcpStream::connect(addr).is_ok();
                async move {
                    if up {
                        Ok(())
                    } else {
                        Err("not listening".into())
                    }
                }
            },
        )
        .await;
        register(port, &me.ca_pem);
        wait_available().await;
        me
    }
}

impl Drop for Aggregated {
    /// Deletes the APIService, retrying for a while when the API server does not answer (a
    /// left-over APIService without a backend blocks every namespace deletion).
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let args = [
                "delete",
                "apiservice",
                APISERVICE,
                "--ignore-not-found",
                "--wait=false",
            ];
            if kubectl(&args, None).status.success() || std::time::Instant::now() > deadline {
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// The one APIService, held across test processes for the whole test.
/// Holds the cluster-wide APIService for one test at a time (across test processes).
pub fn lock() -> Flock<File> {
    let path = cache().join("aggregated-api.lock");
    let file = File::create(&path).expect("lock file");
    Flock::lock(file, FlockArg::LockExclusive).expect("lock the APIService")
}

/// A self-signed serving certificate for [`server_name`], written to files.
fn serving_files(tag: &str) -> (PathBuf, PathBuf, String) {
    let dir = super::repo().join("target/e2e");
    std::fs::create_dir_all(&dir).expect("dir");
    let certified = rcgen::generate_simple_self_signed(vec![server_name()]).expect("certificate");
    let ca = certified.cert.pem();
    let cert = dir.join(format!("{tag}-access.crt"));
    let key = dir.join(format!("{tag}-access.key"));
    std::fs::write(&cert, &ca).expect("write cert");
    std::fs::write(&key, certified.signing_key.serialize_pem()).expect("write key");
    (cert, key, ca)
}

/// Points the APIService at `port` on this host, trusting `ca_pem`.
pub fn register(port: u16, ca_pem: &str) {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let ip = host_ip();
    let yaml = format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {SERVICE_NAMESPACE}}}
---
apiVersion: v1
kind: Service
metadata: {{name: {SERVICE}, namespace: {SERVICE_NAMESPACE}}}
spec:
  ports: [{{name: https, port: 443, targetPort: {port}, protocol: TCP}}]
---
apiVersion: v1
kind: Endpoints
metadata: {{name: {SERVICE}, namespace: {SERVICE_NAMESPACE}}}
subsets:
  - addresses: [{{ip: "{ip}"}}]
    ports: [{{name: https, port: {port}, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {SERVICE}-host
  namespace: {SERVICE_NAMESPACE}
  labels: {{kubernetes.io/service-name: {SERVICE}}}
addressType: IPv4
endpoints: [{{addresses: ["{ip}"], conditions: {{ready: true}}}}]
ports: [{{name: https, port: {port}, protocol: TCP}}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {{name: {APISERVICE}}}
spec:
  group: subresources.sandboxes.dev
  version: v1alpha1
  groupPriorityMinimum: 1000
  versionPriority: 15
  service: {{namespace: {SERVICE_NAMESPACE}, name: {SERVICE}, port: 443}}
  caBundle: {ca}
"#
    );
    kubectl_ok(&["apply", "-f", "-"], Some(&yaml));
}

/// The APIService's `Available` condition status and message.
pub fn available() -> String {
    let out = kubectl(
        &[
            "get",
            "apiservice",
            APISERVICE,
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="Available")].status} {.status.conditions[?(@.type=="Available")].message}"#,
        ],
        None,
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until the APIService is Available and discovery answers through the API server
/// (the second proves the aggregator reaches this operator, not an earlier one).
async fn wait_available() {
    let admin = super::cluster::client().await;
    wait_for(
        "the APIService to be Available",
        Duration::from_secs(90),
        || {
            let admin = admin.clone();
            async move {
                let state = available();
                if !state.starts_with("True") {
                    return Err(state);
                }
                let request = http::Request::get(GROUP_VERSION)
                    .body(Vec::new())
                    .expect("request");
                admin
                    .request_text(request)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        },
    )
    .await;
}

/// A client of the test cluster that impersonates `user` in `groups`.
pub async fn client_as(user: &str, groups: &[&str]) -> Client {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let kc = Kubeconfig::read_from(kubeconfig()).expect("read kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kube config");
    config.auth_info.impersonate = Some(user.to_string());
    config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
    Client::try_from(config).expect("kube client")
}

/// The subresource path of `namespace/name`.
pub fn path(namespace: &str, name: &str, subresource: &str) -> String {
    format!("{GROUP_VERSION}/namespaces/{namespace}/sandboxes/{name}/{subresource}")
}

/// What an exec printed and how it ended.
#[derive(Debug)]
pub struct Exec {
    /// stdout.
    pub stdout: String,
    /// stderr.
    pub stderr: String,
    /// The error channel's outcome.
    pub outcome: Outcome,
}

/// Runs `argv` in `namespace/name` through the API server (kube's WebSocket connect).
pub async fn exec(
    client: &Client,
    namespace: &str,
    name: &str,
    argv: &[&str],
) -> Result<Exec, kube::Error> {
    use futures::StreamExt;
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    for arg in argv {
        query.append_pair("command", arg);
    }
    query
        .append_pair("stdout", "true")
        .append_pair("stderr", "true");
    let uri = format!("{}?{}", path(namespace, name, "exec"), query.finish());
    let request = http::Request::get(uri).body(Vec::new()).expect("request");
    let mut ws = client.connect(request).await?.into_stream();
    let (mut stdout, mut stderr) = (String::new(), String::new());
    while let Some(message) = ws.next().await {
        // (kube's own tokio-tungstenite: the message type is not named here)
        let Ok(message) = message else { continue };
        if !message.is_binary() {
            continue;
        }
        let data = message.into_data();
        let Some((ch, payload)) = channel::split(&data) else {
            continue;
        };
        let text = String::from_utf8_lossy(payload);
        match ch {
            channel::STDOUT => stdout.push_str(&text),
            channel::STDERR => stderr.push_str(&text),
            channel::ERROR => {
                let outcome = channel::parse_status(payload);
                return Ok(Exec {
                    stdout,
                    stderr,
                    outcome,
                });
            }
            _ => {}
        }
    }
    panic!("exec ended without a status; stdout {stdout:?} stderr {stderr:?}");
}

/// A fresh user name for RBAC tests.
pub fn user(prefix: &str) -> String {
    unique(prefix)
}

/// Applies the chart's aggregated ClusterRoles (`edit` gets exec/attach/portforward/files,
/// `view` gets log), rendered by helm from the chart itself.
pub fn apply_chart_roles() {
    let chart = super::repo().join("charts/sandbox-operator");
    let out = super::tools::helm(&[
        "template",
        "sandbox-access-test",
        &chart.to_string_lossy(),
        "--namespace",
        SERVICE_NAMESPACE,
        "--set",
        "access.enabled=true",
        "--show-only",
        "templates/access-roles.yaml",
    ]);
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    kubectl_ok(
        &["apply", "-f", "-"],
        Some(&String::from_utf8_lossy(&out.stdout)),
    );
}

/// Binds `user` to the built-in ClusterRole `role` in `namespace`.
pub fn bind(user: &str, role: &str, namespace: &str) {
    kubectl_ok(
        &[
            "create",
            "rolebinding",
            &format!("{role}-{user}"),
            &format!("--clusterrole={role}"),
            &format!("--user={user}"),
            "-n",
            namespace,
        ],
        None,
    );
}

/// A Sandbox on Docker that prints a line to its log and then idles.
pub fn sandbox_yaml(name: &str) -> String {
    sandbox_yaml_on(name, On::Docker)
}

/// A Sandbox on `on`'s provider that prints a line to its log and then idles.
pub fn sandbox_yaml_on(name: &str, on: On) -> String {
    format!(
        r#"apiVersion: sandboxes.dev/v1alpha1
kind: Sandbox
metadata: {{name: {name}}}
spec:
  provider: {provider}
  image: {image}
  command: ["sh", "-c", "echo hello from {name}; exec sleep infinity"]
"#,
        provider = on.provider(),
        image = super::docker::base_image()
    )
}

/// The provider a test's sandboxes run on behind the aggregated API: the same checks run
/// on each (sandboxes as Docker containers, or as Pods on the test nodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    /// The local engine, the provider named `docker`.
    Docker,
    /// Pods on the test kubelets, the provider named `k8s`.
    Kubernetes,
}

impl On {
    /// The provider's name in the operator's configuration (what `spec.provider` names).
    pub fn provider(self) -> &'static str {
        match self {
            On::Docker => "docker",
            On::Kubernetes => <Kubernetes as super::world::Backend>::NAME,
        }
    }

    /// How long a Sandbox gets to become Ready on it (a kubelet schedules and starts a Pod).
    pub fn ready_timeout(self) -> Duration {
        match self {
            On::Docker => super::objects::READY_TIMEOUT,
            On::Kubernetes => super::kubernetes::READY_TIMEOUT,
        }
    }
}

/// What the provider holds for one access world, removed when the world is dropped (after
/// the operator has stopped).
enum FarSide {
    Docker(Purge),
    Kubernetes(Box<World<Kubernetes>>),
}

/// One namespace (also the operator instance) with an operator serving the aggregated API
/// in front of one provider, and the cleanup of what that provider holds for it.
pub struct AccessWorld {
    /// The Sandbox namespace.
    pub ns: String,
    /// Which provider the sandboxes run on.
    pub on: On,
    /// The operator and its APIService (dropped first: nothing re-creates what is purged).
    pub api: Aggregated,
    _far: FarSide,
}

impl AccessWorld {
    /// A fresh namespace `<prefix>-…` and an operator with `on`'s provider serving the
    /// aggregated API. For Kubernetes, its Pods go to a namespace of their own.
    pub async fn start(on: On, prefix: &str) -> AccessWorld {
        match on {
            On::Docker => {
                let ns = namespace(prefix).await;
                let far = FarSide::Docker(Purge(ns.clone()));
                let api = Aggregated::start(&ns).await;
                AccessWorld {
                    ns,
                    on,
                    api,
                    _far: far,
                }
            }
            On::Kubernetes => {
                let world = World::kubernetes(prefix).await;
                let ns = world.ns.clone();
                let api = Aggregated::start_with(&ns, &world.config("", "")).await;
                let far = FarSide::Kubernetes(Box::new(world));
                AccessWorld {
                    ns,
                    on,
                    api,
                    _far: far,
                }
            }
        }
    }

    /// Waits for the Sandbox `name` to be Ready, within the provider's bound, and asserts
    /// that it runs on this world's provider.
    pub async fn wait_ready(&self, name: &str) -> Sandbox {
        let sandboxes: Api<Sandbox> = Api::namespaced(client().await, &self.ns);
        let timeout = self.on.ready_timeout();
        let sandbox = wait_ready_within(&sandboxes, name, &self.api.operator, timeout).await;
        let provider = sandbox.status.as_ref().and_then(|s| s.provider.as_deref());
        assert_eq!(provider, Some(self.on.provider()), "{name} runs elsewhere");
        sandbox
    }
}
