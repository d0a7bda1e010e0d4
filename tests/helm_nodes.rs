//! The README's install path, for real: the operator image (packed from the test build's
//! binary, as `make image` packs the release build), loaded into the test nodes' containerd,
//! then `helm install sandbox-operator charts/sandbox-operator -n sandbox-system
//! --create-namespace` — the defaults, apart from what the README tells a user on such a
//! machine to set: the image tag, the Docker socket's group and a firewall helper image the
//! engine has (no registry is reachable here). The operator runs as the chart's Pods on the
//! test nodes, reaches the API server through the `kubernetes` Service and the engine through
//! the node's socket, and reconciles a Sandbox to Ready and back to nothing. With
//! `access.enabled`, its Pods serve the aggregated API: `kubectl sandbox exec` reaches the
//! Sandbox through the real kube-apiserver aggregation layer.

mod harness;

use std::os::unix::fs::MetadataExt;
use std::process::Output;
use std::time::Duration;

use harness::cluster::{client, kubectl, kubectl_ok, namespace};
use harness::docker::{Purge, base_image};
use harness::image::{Image, NodeImage, build_image, import_into_nodes, node_image_name};
use harness::objects::{Logged, delete_and_wait_gone, wait_ready_within};
use harness::tools::helm;
use harness::{aggregated, node, repo, unique, wait_for};
use kube::Api;
use sandbox_operator::api::Sandbox;

const RELEASE: &str = "sandbox-operator";
const NAMESPACE: &str = "sandbox-system";
const SOCKET: &str = "/var/run/docker.sock";

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Where the installed operator's log is.
struct Installed;

impl Logged for Installed {
    fn where_logged(&self) -> String {
        format!("kubectl logs -n {NAMESPACE} deploy/{RELEASE}")
    }
}

/// Uninstalls the release and removes its namespace when dropped.
struct Release;

impl Drop for Release {
    fn drop(&mut self) {
        let _ = helm(&["uninstall", RELEASE, "-n", NAMESPACE, "--wait"]);
        let _ = kubectl(&["delete", "namespace", NAMESPACE, "--wait=false"], None);
    }
}

/// The group owning the engine's socket (the README's `stat -c %g`).
fn socket_gid() -> u32 {
    std::fs::metadata(SOCKET)
        .expect("the engine's socket")
        .gid()
}

/// The values a user on this machine passes: the image, the socket's group `gid`, and the
/// firewall helper image the engine has.
fn values(tag: &str, gid: u32) -> String {
    let (repository, image_tag) = tag.split_once(':').expect("repository:tag");
    format!(
        "image: {{repository: {repository}, tag: {image_tag}, pullPolicy: Never}}\n\
         dockerFirewallImage: {}\n\
         access: {{enabled: true}}\n\
         providers:\n\
         - name: docker\n  type: docker\n  docker:\n    socket: {{hostPath: {SOCKET}, groupId: {gid}}}\n",
        base_image()
    )
}

/// `helm install|upgrade` of the release with `values`.
fn helm_values(verb: &str, values: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).unwrap();
    let chart = repo().join("charts/sandbox-operator");
    let (chart, file) = (chart.to_string_lossy(), file.to_string_lossy());
    let mut args = vec![verb, RELEASE, &chart, "-n", NAMESPACE, "-f", &file];
    if verb == "install" {
        args.push("--create-namespace");
    }
    let out = helm(&args);
    assert!(out.status.success(), "helm {verb}: {}", text(&out));
}

/// The release's Pods, with their nodes and readiness, for failure messages.
fn pods() -> String {
    text(&kubectl(
        &["get", "pods", "-n", NAMESPACE, "-o", "wide"],
        None,
    ))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_install_runs_the_operator_as_pods_on_the_test_nodes() {
    let nodes = node::ensure();
    // The chart registers the cluster-wide APIService: one test at a time holds it.
    let _apiservice = aggregated::lock();
    let tag = format!("sandbox-operator:{}", unique("nodes"));
    build_image(&tag);
    let _image = Image(tag.clone());
    import_into_nodes(&tag, nodes);
    let _node_image = NodeImage {
        name: node_image_name(&tag),
        nodes: nodes.to_vec(),
    };
    // A release left by an aborted run would make `install` fail.
    let _ = helm(&["uninstall", RELEASE, "-n", NAMESPACE, "--wait"]);
    // The chart's defaults watch every namespace: objects earlier test binaries left would
    // be adopted and get containers of this instance. Remove them first, and everything of
    // the instance at the end.
    let gc = std::process::Command::new("bash")
        .arg(repo().join("tests/cluster/gc.sh"))
        .output()
        .expect("run tests/cluster/gc.sh");
    assert!(gc.status.success(), "gc.sh: {}", text(&gc));
    let _instance = Purge(RELEASE.to_string());
    let gid = socket_gid();
    assert_ne!(
        gid, 0,
        "the test engine's socket belongs to the docker group"
    );
    // First the chart's default group (0): the Pods cannot use the socket and say why.
    helm_values("install", &values(&tag, 0));
    let _release = Release;
    let want = format!("set providers[].docker.socket.groupId={gid}");
    wait_for(
        "the Pods to name the socket's group",
        Duration::from_secs(120),
        || async {
            let logs = text(&kubectl(
                &[
                    "logs",
                    "-n",
                    NAMESPACE,
                    "-l",
                    "app.kubernetes.io/name=sandbox-operator",
                    "--tail=200",
                ],
                None,
            ));
            if logs.contains(&want) && logs.contains("permission denied on ") {
                Ok(())
            } else {
                Err(format!("no `{want}` in the logs yet:\n{logs}\n{}", pods()))
            }
        },
    )
    .await;
    // With the socket's group, as the README and the chart's NOTES say.
    helm_values("upgrade", &values(&tag, gid));
    let rollout = kubectl(
        &[
            "rollout",
            "status",
            &format!("deployment/{RELEASE}"),
            "-n",
            NAMESPACE,
            "--timeout=180s",
        ],
        None,
    );
    assert!(
        rollout.status.success(),
        "the operator's Pods did not become Ready: {}\n{}\nlogs:\n{}",
        text(&rollout),
        pods(),
        text(&kubectl(
            &[
                "logs",
                "-n",
                NAMESPACE,
                &format!("deploy/{RELEASE}"),
                "--tail=40"
            ],
            None
        ))
    );
    sandbox_round_trip().await;
}

/// A Sandbox in a namespace of its own becomes Ready under the installed operator, and its
/// deletion completes (the finalizer released by the Pods, not by a host process).
async fn sandbox_round_trip() {
    let ns = namespace("helm-nodes").await;
    let api: Api<Sandbox> = Api::namespaced(client().await, &ns);
    let yaml = format!(
        "apiVersion: sandboxes.dev/v1alpha1\nkind: Sandbox\nmetadata:\n  name: demo\nspec:\n  image: {}\n",
        base_image()
    );
    kubectl_ok(&["apply", "-n", &ns, "-f", "-"], Some(&yaml));
    let ready = wait_ready_within(&api, "demo", &Installed, Duration::from_secs(180)).await;
    let id = ready
        .status
        .and_then(|s| s.sandbox_id)
        .expect("a provider id");
    let inspect = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.State.Running}}", &id])
        .output()
        .expect("docker inspect");
    assert_eq!(
        String::from_utf8_lossy(&inspect.stdout).trim(),
        "true",
        "the Sandbox's container runs on the node's engine: {}",
        text(&inspect)
    );
    exec_through_the_aggregator(&ns).await;
    delete_and_wait_gone(&api, "demo").await;
    let _ = kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
}

/// `kubectl sandbox exec` through the aggregation layer to the chart's Pods: the output and the
/// exit code come back.
async fn exec_through_the_aggregator(ns: &str) {
    wait_for(
        "the chart's APIService to be Available",
        Duration::from_secs(120),
        || async {
            let state = aggregated::available();
            if state.starts_with("True") {
                Ok(())
            } else {
                Err(format!("{state}\n{}", pods()))
            }
        },
    )
    .await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-sandbox"))
        .env("KUBECONFIG", harness::cluster::kubeconfig())
        .args([
            "exec",
            "-n",
            ns,
            "demo",
            "--",
            "sh",
            "-c",
            "echo from-a-pod; exit 3",
        ])
        .output()
        .expect("run kubectl-sandbox");
    assert_eq!(
        out.status.code(),
        Some(3),
        "the remote exit code: {}",
        text(&out)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "from-a-pod\n",
        "{}",
        text(&out)
    );
}
