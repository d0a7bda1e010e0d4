//! End to end on Docker with an egress gateway: Sandbox objects in a real kube-apiserver →
//! the operator binary with a `type: docker` provider whose `egress` block runs the gateway
//! → containers on a local fake internet (`tests/egress/fakenet.rs`). The allow-list is
//! enforced, `status.egress` is observed inside the sandbox, a changed list applies in place
//! on the same container (also after a sleep), and switching to unrestricted recreates it.

#[path = "egress/fakenet.rs"]
mod fakenet;
mod harness;

use fakenet::{FakeNet, GatewayGuard, gateway_settings};
use harness::cluster::*;
use harness::docker::{TEST_LABEL, base_image};
use harness::objects::{READY_TIMEOUT, delete_and_wait_gone, patch_spec, sandbox_id, wait_ready};
use harness::operator::*;
use harness::{unique, wait_for};
use kube::Api;
use sandbox_operator::api::Sandbox;
use serde_json::json;

fn docker_exec(container: &str, script: &str) -> (i32, String) {
    let out = std::process::Command::new("docker")
        .args(["exec", container, "sh", "-c", script])
        .output()
        .expect("docker exec");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

async fn reaches(container: &str, url: &str, host: &str) -> Result<(), String> {
    match docker_exec(container, &format!("curl -sk -m 5 {url}")) {
        (0, body) if body.trim() == format!("hello {host}") => Ok(()),
        other => Err(format!("{url}: {other:?}")),
    }
}

async fn refused(container: &str, url: &str) -> Result<(), String> {
    match docker_exec(container, &format!("curl -sk -m 5 {url}")) {
        (0, body) => Err(format!("{url} connected: {body}")),
        _ => Ok(()),
    }
}

/// The engine's id of a container (the sandbox id is its name, which a recreate reuses).
fn container_id(name: &str) -> String {
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.Id}}", name])
        .output()
        .expect("docker inspect");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_allow_list_is_enforced_replaced_in_place_and_observed() {
    // Dropped in reverse: the sandboxes first, then the gateway, then the fake internet
    // (each holds an endpoint on the network of the next).
    let gw = unique("e2e-egw");
    let net = FakeNet::start(&unique("e2e-inet"), (TEST_LABEL, &gw)).await;
    let _guard = GatewayGuard(gw.clone());
    let ns = namespace("e2e-docker-egress").await;
    let _purge = harness::docker::Purge(ns.clone());
    let g = gateway_settings(&net, &gw, base_image(), 3);
    let config = format!(
        "providers:\n  - name: docker\n    type: docker\n    docker:\n      defaultImage: {}\n      \
         egress:\n        image: {}\n        hostBinary: {}\n        name: {}\n        network: {}\n        \
         upstreamDns: \"{}\"\n        checkIntervalSeconds: 3\n        \
         allowPrivateCidrs: [\"{}/32\"]\nsweeper:\n  enabled: false\n",
        base_image(),
        g.image,
        g.host_binary.as_deref().unwrap(),
        gw,
        net.network,
        net.dns,
        net.host,
    );
    let op = Operator::start(
        &ns,
        &ns,
        &OperatorOptions {
            config_extra: config,
            ..Default::default()
        },
    );
    let api: Api<Sandbox> = Api::namespaced(client().await, &ns);
    let manifest = format!(
        "apiVersion: sandboxes.dev/v1alpha1\nkind: Sandbox\nmetadata:\n  name: walled\n\
         spec:\n  provider: docker\n  image: {}\n  egress:\n    allowedDomains: [allowed.test]\n",
        base_image()
    );
    apply_yaml_ok(&manifest, &ns);
    let s = wait_ready(&api, "walled", &op).await;
    let id = sandbox_id(&s);
    let engine_id = container_id(&id);

    wait_for("allowed.test from the sandbox", READY_TIMEOUT, || {
        reaches(&id, "https://allowed.test/", "allowed.test")
    })
    .await;
    refused(&id, "http://other.test/").await.unwrap();
    let egress = s
        .status
        .as_ref()
        .and_then(|st| st.egress.clone())
        .expect("status.egress");
    assert_eq!(egress.state, "filtered", "{egress:?}");

    // In place: the same container, the new list enforced, egressApplied says so.
    patch_spec(
        &api,
        "walled",
        json!({"egress": {"allowedDomains": ["other.test"]}}),
    )
    .await;
    wait_for("other.test after the change", READY_TIMEOUT, || {
        reaches(&id, "http://other.test/", "other.test")
    })
    .await;
    refused(&id, "http://allowed.test/").await.unwrap();
    let s = wait_ready(&api, "walled", &op).await;
    assert_eq!(sandbox_id(&s), id);
    assert_eq!(
        container_id(&id),
        engine_id,
        "replaced in place, not recreated"
    );
    let applied = s
        .status
        .as_ref()
        .and_then(|st| st.egress_applied.clone())
        .expect("egressApplied");
    assert_eq!(applied.allowed_domains, vec!["other.test".to_string()]);

    // Sleep and wake: the policy is applied again and still holds.
    patch_spec(&api, "walled", json!({"state": "Sleeping"})).await;
    wait_for("Sleeping", READY_TIMEOUT, || async {
        let s = api.get("walled").await.map_err(|e| e.to_string())?;
        match s.status.as_ref().and_then(|st| st.phase.clone()) {
            Some(p) if p == "Sleeping" => Ok(()),
            other => Err(format!("phase {other:?}")),
        }
    })
    .await;
    patch_spec(&api, "walled", json!({"state": "Running"})).await;
    let s = wait_ready(&api, "walled", &op).await;
    assert_eq!(sandbox_id(&s), id);
    assert_eq!(
        container_id(&id),
        engine_id,
        "the same container after the wake"
    );
    wait_for("other.test after the wake", READY_TIMEOUT, || {
        reaches(&id, "http://other.test/", "other.test")
    })
    .await;

    // Unrestricted is another network: the sandbox is recreated on its namespace's network,
    // where nothing on the host answers it (the fake internet is served by the host, so it
    // is refused now; tests/tenancy_network.rs probes every host address).
    patch_spec(&api, "walled", json!({"egress": null})).await;
    wait_for(
        "a new container for the unrestricted spec",
        READY_TIMEOUT,
        || async {
            let now = container_id(&id);
            if !now.is_empty() && now != engine_id {
                Ok(())
            } else {
                Err(format!("container {now:?}"))
            }
        },
    )
    .await;
    let open = sandbox_id(&wait_ready(&api, "walled", &op).await);
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.HostConfig.NetworkMode}}", &open])
        .output()
        .expect("docker inspect");
    let mode = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(mode.starts_with(&format!("sbx-{ns}-")), "network {mode:?}");
    refused(&open, &format!("http://{}/", net.host))
        .await
        .unwrap();

    delete_and_wait_gone(&api, "walled").await;
    drop(op);
}
