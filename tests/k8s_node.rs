//! The test nodes of `tests/setup/node.sh` are real: Pods from the local base image are
//! placed by the real scheduler (spread over every test node), run under the `runc`
//! RuntimeClass, answer `exec` through the API server and the kubelet, and answer HTTP from
//! this host through a ClusterIP Service, a NodePort and their pod IP. A Pod whose image is
//! not on the node and may not be pulled never starts, and says why; the nodes pull from the
//! test registry with an image pull Secret, and only with it.

mod harness;

use std::collections::BTreeSet;
use std::time::Duration;

use harness::registry::{create_pull_secret, push_fresh_image, registry};
use harness::{cluster, docker, node, unique, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

const READY_TIMEOUT: Duration = Duration::from_secs(90);
const HTTP_PORT: i32 = 8080;

/// Answers every HTTP request with `<pod name> <node name>` (perl-base only).
const SERVER: &str = "$s=IO::Socket::INET->new(LocalPort=>8080,Listen=>5,ReuseAddr=>1) or die; \
    while($c=$s->accept){<$c>; print $c \"HTTP/1.0 200 OK\\r\\n\\r\\n$ENV{POD} $ENV{NODE}\"; close $c}";

/// One test's namespace; dropping it deletes the namespace and waits for its Pods to go.
struct Namespace(String);

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = cluster::kubectl(
            &[
                "delete",
                "namespace",
                &self.0,
                "--wait=true",
                "--timeout=60s",
            ],
            None,
        );
    }
}

/// A web Pod of `group`, spread across the test nodes by the scheduler (never given a node).
fn web_pod(name: &str, group: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"group": group, "pod": name}},
        "spec": {
            "runtimeClassName": node::RUNTIME_CLASS,
            "nodeSelector": {node::NODE_LABEL: "true"},
            "topologySpreadConstraints": [{
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"group": group}}
            }],
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "web",
                "image": node::BASE_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["perl", "-MIO::Socket::INET", "-e", SERVER],
                "env": [
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
                ],
                "ports": [{"containerPort": HTTP_PORT}],
                "readinessProbe": {"tcpSocket": {"port": HTTP_PORT}, "periodSeconds": 1}
            }]
        }
    }))
    .expect("pod")
}

/// Removes the images a test made the nodes hold (and, as [`harness::docker::Images`], the
/// engine), also when it panics.
struct NodeImages(harness::docker::Images);

impl Drop for NodeImages {
    fn drop(&mut self) {
        for image in &self.0.0 {
            node::remove_image(image);
        }
    }
}

/// The first waiting reason of the Pod's container other than `ContainerCreating`, once
/// there is one.
async fn waiting_reason(pods: &Api<Pod>, name: &str) -> String {
    wait_for(
        &format!("{name}'s waiting reason"),
        READY_TIMEOUT,
        || async {
            let pod = pods.get(name).await.map_err(|e| e.to_string())?;
            let status = pod.status.unwrap_or_default();
            status
                .container_statuses
                .unwrap_or_default()
                .iter()
                .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
                .find(|r| r != "ContainerCreating")
                .ok_or_else(|| format!("phase {:?}", status.phase))
        },
    )
    .await
}

/// A Pod of one container running `image`, pulled as `policy` says, with `secrets`.
fn image_pod(name: &str, image: &str, policy: &str, secrets: &[&str]) -> Pod {
    let secrets: Vec<_> = secrets.iter().map(|s| json!({"name": s})).collect();
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "runtimeClassName": node::RUNTIME_CLASS,
            "nodeSelector": {node::NODE_LABEL: "true"},
            "imagePullSecrets": secrets,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image, "imagePullPolicy": policy}]
        }
    }))
    .expect("pod")
}

/// The Pod once it is Ready, with its node and IP.
async fn ready(pods: &Api<Pod>, name: &str) -> Pod {
    wait_for(&format!("pod {name} Ready"), READY_TIMEOUT, || async {
        let pod = pods.get(name).await.map_err(|e| e.to_string())?;
        let status = pod.status.clone().unwrap_or_default();
        let is_ready = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if is_ready && status.pod_ip.is_some() {
            Ok(pod)
        } else {
            Err(format!("phase {:?}", status.phase))
        }
    })
    .await
}

/// GET `url` until it answers 200 (kube-proxy programs a new Service a moment after it
/// exists), returning the body. Every attempt opens a new connection: before the Service's
/// rules exist, this host's default route answers for its IP (with a 404 here), and a
/// kept-alive connection to that would never reach the Service.
async fn http_body(url: &str) -> String {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .pool_max_idle_per_host(0)
        .build()
        .expect("http client");
    wait_for(&format!("GET {url}"), READY_TIMEOUT, || async {
        let response = http.get(url).send().await.map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("status {}", response.status()));
        }
        response.text().await.map_err(|e| e.to_string())
    })
    .await
}

fn node_ip(node: &Node) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address.clone())
        .expect("node has an InternalIP")
}

#[tokio::test]
async fn pods_are_scheduled_across_the_nodes_run_exec_and_answer_from_the_host() {
    let nodes = node::ensure();
    let client = cluster::client().await;
    let ns = Namespace(cluster::namespace("k8snode").await);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.0);

    // one Pod per node; the spread constraint lets the scheduler put at most one on each
    let names: Vec<String> = (0..nodes.len()).map(|i| format!("web-{i}")).collect();
    for name in &names {
        pods.create(&PostParams::default(), &web_pod(name, "web"))
            .await
            .expect("create pod");
    }
    let mut placed = BTreeSet::new();
    let mut running = Vec::new();
    for name in &names {
        let pod = ready(&pods, name).await;
        let spec = pod.spec.clone().expect("spec");
        assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
        let on = spec.node_name.expect("scheduled pod has a node");
        assert!(
            nodes.contains(&on),
            "{name} landed on {on}, not a test node"
        );
        placed.insert(on);
        running.push(pod);
    }
    let all: BTreeSet<String> = nodes.iter().cloned().collect();
    assert_eq!(
        placed, all,
        "the scheduler spreads the Pods over every node"
    );

    // exec through the API server and the kubelet (kube's exec needs the `ws` feature,
    // which this crate does not enable; kubectl takes the same route)
    let out = cluster::kubectl(
        &[
            "exec",
            "-n",
            &ns.0,
            &names[0],
            "--",
            "sh",
            "-c",
            "echo $((6 * 7)) >/tmp/answer && cat /tmp/answer && exit 3",
        ],
        None,
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");
    assert_eq!(
        out.status.code(),
        Some(3),
        "the command's exit code comes back: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // from this host: the pod IP, a ClusterIP Service and a NodePort, for each Pod
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.0);
    let node_api: Api<Node> = Api::all(client.clone());
    for pod in &running {
        let name = pod.metadata.name.clone().expect("name");
        let on = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let expected = format!("{name} {}", on.clone().unwrap_or_default());
        let pod_ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
        let pod_ip = pod_ip.expect("pod ip");
        assert_eq!(
            http_body(&format!("http://{pod_ip}:{HTTP_PORT}/")).await,
            expected
        );

        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "type": "NodePort",
                "selector": {"pod": name},
                "ports": [{"port": 80, "targetPort": HTTP_PORT}]
            }
        }))
        .expect("service");
        let svc = services
            .create(&PostParams::default(), &svc)
            .await
            .expect("create service");
        let spec = svc.spec.expect("service spec");
        let cluster_ip = spec.cluster_ip.expect("cluster ip");
        assert_eq!(http_body(&format!("http://{cluster_ip}/")).await, expected);

        let node_port = spec.ports.expect("ports")[0].node_port.expect("node port");
        let node = node_api.get(&on.expect("node")).await.expect("node");
        let url = format!("http://{}:{node_port}/", node_ip(&node));
        assert_eq!(http_body(&url).await, expected);
    }
}

#[tokio::test]
async fn a_pod_whose_image_is_absent_and_may_not_be_pulled_never_starts_and_says_why() {
    node::ensure();
    let client = cluster::client().await;
    let ns = Namespace(cluster::namespace("k8snode-absent").await);
    let pods: Api<Pod> = Api::namespaced(client, &ns.0);
    let pod = image_pod(
        "absent",
        "sandbox-operator/not-on-any-node:none",
        "Never",
        &[],
    );
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");

    let reason = waiting_reason(&pods, "absent").await;
    assert_eq!(reason, "ErrImageNeverPull");
    let pod = pods.get("absent").await.expect("pod");
    let status = pod.status.expect("status");
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    assert!(
        status
            .container_statuses
            .unwrap_or_default()
            .iter()
            .all(|c| !c.ready
                && c.restart_count == 0
                && c.state.as_ref().is_some_and(|s| s.running.is_none())),
        "the container never ran"
    );
}

#[tokio::test]
async fn nodes_pull_from_the_test_registry_with_a_pull_secret_and_only_with_it() {
    node::ensure();
    let r = registry();
    let engine = docker::engine().await;
    let repository = unique("k8snode-pull");
    let digest = push_fresh_image(
        &engine,
        &docker::base_image(),
        &r,
        &repository,
        "1",
        "pulled",
    )
    .await;
    let image = format!("{}/{repository}:1", r.addr);
    let _images = NodeImages(harness::docker::Images(vec![image.clone(), digest]));

    let client = cluster::client().await;
    let ns = Namespace(cluster::namespace("k8snode-pull").await);
    create_pull_secret(&ns.0, "regcred", &r, &r.password).await;
    let pods: Api<Pod> = Api::namespaced(client, &ns.0);

    // without the Secret the registry refuses the pull
    let pod = image_pod("anonymous", &image, "Always", &[]);
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let reason = waiting_reason(&pods, "anonymous").await;
    assert!(
        reason == "ErrImagePull" || reason == "ImagePullBackOff",
        "an anonymous pull fails, got {reason}"
    );

    // with it the image is pulled and runs: the marker file the fresh image carries is there
    let pod = image_pod("authorised", &image, "Always", &["regcred"]);
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    ready(&pods, "authorised").await;
    let out = cluster::kubectl(
        &["exec", "-n", &ns.0, "authorised", "--", "cat", "/marker"],
        None,
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "pulled");
}
