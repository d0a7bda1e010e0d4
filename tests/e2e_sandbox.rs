//! End to end: `kubectl apply` → the operator binary → a real Docker container, through a
//! real kube-apiserver. Each test has its own namespace and operator instance.

mod harness;

use std::time::Duration;

use bollard::query_parameters::InspectContainerOptions;
use harness::cluster::*;
use harness::docker::*;
use harness::objects::{READY_TIMEOUT, delete_and_wait_gone, patch_spec, wait_gone, wait_ready};
use harness::operator::*;
use harness::{repo, wait_for};
use kube::Api;
use kube::api::DeleteParams;
use sandbox_operator::api::{Sandbox, SandboxVolume, condition};
use sandbox_operator::provider::labels::OWNER_UID;

async fn containers_of(uid: &str) -> Vec<bollard::models::ContainerSummary> {
    containers_labelled(&engine().await, OWNER_UID, uid).await
}

async fn inspect(name: &str) -> bollard::models::ContainerInspectResponse {
    engine()
        .await
        .inspect_container(name, None::<InspectContainerOptions>)
        .await
        .expect("inspect")
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_creates_a_matching_container_and_delete_removes_it() {
    let ns = namespace("e2e-basic").await;
    let _purge = Purge(ns.clone());
    let op = Operator::start(&ns, &ns, &OperatorOptions::default());
    apply_example("sandbox.yaml", &ns);
    let api: Api<Sandbox> = Api::namespaced(client().await, &ns);
    let s = wait_ready(&api, "demo", &op).await;
    let uid = s.metadata.uid.clone().expect("uid");
    let status = s.status.clone().expect("status");
    assert_eq!(
        status.external_name.as_deref(),
        Some(format!("sbx-{uid}").as_str())
    );
    assert_eq!(status.provider.as_deref(), Some("docker"));
    assert!(status.started_at.is_some(), "startedAt set");
    assert!(
        s.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == "sandboxes.dev/cleanup")
    );

    // The container matches the spec.
    let c = inspect(&format!("sbx-{uid}")).await;
    let labels = c
        .config
        .as_ref()
        .and_then(|c| c.labels.clone())
        .unwrap_or_default();
    assert_eq!(labels.get("sandboxes.dev/managed-by"), Some(&ns));
    assert_eq!(labels.get("sandboxes.dev/owner-uid"), Some(&uid));
    assert_eq!(
        labels.get("sandboxes.dev/owner"),
        Some(&format!("{ns}.demo"))
    );
    assert_eq!(
        labels.get("sandboxes.dev/kind").map(String::as_str),
        Some("Sandbox")
    );
    assert_eq!(labels.get("team").map(String::as_str), Some("examples"));
    let env = c
        .config
        .as_ref()
        .and_then(|c| c.env.clone())
        .unwrap_or_default();
    assert!(env.contains(&"GREETING=hello".to_string()), "env {env:?}");
    let cmd = c
        .config
        .as_ref()
        .and_then(|c| c.cmd.clone())
        .unwrap_or_default();
    assert_eq!(cmd.first().map(String::as_str), Some("perl"));
    let host = c.host_config.clone().expect("host config");
    assert_eq!(host.memory, Some(256 * 1024 * 1024));
    assert_eq!(host.nano_cpus, Some(500_000_000));
    assert_eq!(host.pids_limit, Some(256));
    let restart = host
        .restart_policy
        .and_then(|r| r.name)
        .map(|n| format!("{n:?}"))
        .unwrap_or_default();
    assert!(
        restart.to_lowercase().contains("on") && restart.to_lowercase().contains("failure"),
        "restart policy {restart}"
    );

    // The published port answers on loopback, at the URL status gives.
    let url = status.url.clone().expect("status.url");
    assert!(url.starts_with("http://127.0.0.1:"), "url {url}");
    let addr = url.trim_start_matches("http://").to_string();
    let body = wait_for("the sandbox's HTTP server", Duration::from_secs(30), || {
        let addr = addr.clone();
        async move {
            http_get(&addr, "/")
                .filter(|r| r.contains("hello from sandbox"))
                .ok_or_else(|| "no answer yet".to_string())
        }
    })
    .await;
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");

    // Delete: container gone, finalizer released.
    delete_and_wait_gone(&api, "demo").await;
    assert!(
        containers_of(&uid).await.is_empty(),
        "container left behind"
    );

    // Logs written to a file carry no terminal colour codes.
    let log = std::fs::read_to_string(&op.log).expect("operator log");
    assert!(!log.is_empty(), "the operator logged nothing");
    assert!(
        !log.contains('\u{1b}'),
        "ANSI escape codes in {}",
        op.log.display()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn spec_changes_converge_resources_and_power_state() {
    let ns = namespace("e2e-converge").await;
    let _purge = Purge(ns.clone());
    let op = Operator::start(&ns, &ns, &OperatorOptions::default());
    let manifest = format!(
        r#"
apiVersion: sandboxes.dev/v1alpha1
kind: Sandbox
metadata:
  name: counter
spec:
  image: {}
  command: ["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done"]
  resources:
    memory: 128Mi
    cpu: "1"
"#,
        base_image()
    );
    apply_yaml_ok(&manifest, &ns);
    let api: Api<Sandbox> = Api::namespaced(client().await, &ns);
    let s = wait_ready(&api, "counter", &op).await;
    let name = s
        .status
        .as_ref()
        .and_then(|s| s.external_name.clone())
        .expect("external name");
    let first_id = inspect(&name).await.id;

    // Resources change in place (same container).
    patch_spec(
        &api,
        "counter",
        serde_json::json!({"resources": {"memory": "192Mi", "cpu": "500m"}}),
    )
    .await;
    wait_ready(&api, "counter", &op).await;
    let c = inspect(&name).await;
    assert_eq!(c.id, first_id, "resources must not recreate");
    let hc = c.host_config.expect("host config");
    assert_eq!(
        (hc.memory, hc.nano_cpus),
        (Some(192 * 1024 * 1024), Some(500_000_000))
    );

    // Sleeping = paused, processes preserved.
    patch_spec(&api, "counter", serde_json::json!({"state": "Sleeping"})).await;
    let s = wait_ready(&api, "counter", &op).await;
    let state = inspect(&name).await.state.expect("state");
    assert_eq!(state.paused, Some(true));
    let hib = s
        .status
        .and_then(|st| st.last_hibernation)
        .expect("lastHibernation");
    assert!(
        hib.processes_preserved,
        "pause preserves processes: {hib:?}"
    );

    // Stopped = exited.
    patch_spec(&api, "counter", serde_json::json!({"state": "Stopped"})).await;
    wait_ready(&api, "counter", &op).await;
    let state = inspect(&name).await.state.expect("state");
    assert_eq!((state.running, state.paused), (Some(false), Some(false)));

    // Back to Running, same container.
    patch_spec(&api, "counter", serde_json::json!({"state": "Running"})).await;
    wait_ready(&api, "counter", &op).await;
    let c = inspect(&name).await;
    assert_eq!(c.state.and_then(|s| s.running), Some(true));
    assert_eq!(c.id, first_id);

    delete_and_wait_gone(&api, "counter").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn volumes_follow_their_reclaim_policy() {
    let ns = namespace("e2e-volumes").await;
    let _purge = Purge(ns.clone());
    let op = Operator::start(&ns, &ns, &OperatorOptions::default());
    let manifest = format!(
        r#"
apiVersion: sandboxes.dev/v1alpha1
kind: SandboxVolume
metadata:
  name: keep
spec:
  reclaimPolicy: Retain
---
apiVersion: sandboxes.dev/v1alpha1
kind: SandboxVolume
metadata:
  name: scratch
spec:
  reclaimPolicy: Delete
---
apiVersion: sandboxes.dev/v1alpha1
kind: Sandbox
metadata:
  name: worker
spec:
  image: {}
  volumes:
    - volumeRef: {{name: keep}}
      mountPath: /data
    - volumeRef: {{name: scratch}}
      mountPath: /scratch
"#,
        base_image()
    );
    apply_yaml_ok(&manifest, &ns);
    let client = client().await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let vols: Api<SandboxVolume> = Api::namespaced(client, &ns);
    let s = wait_ready(&api, "worker", &op).await;
    let keep = vols
        .get("keep")
        .await
        .expect("keep")
        .status
        .and_then(|s| s.volume_name)
        .expect("volume name");
    let scratch = vols
        .get("scratch")
        .await
        .expect("scratch")
        .status
        .and_then(|s| s.volume_name)
        .expect("volume name");
    let c = inspect(
        s.status
            .and_then(|s| s.external_name)
            .as_deref()
            .expect("name"),
    )
    .await;
    let mounts: Vec<(String, String)> = c
        .mounts
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            (
                m.name.unwrap_or_default(),
                m.destination.unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        mounts.contains(&(keep.clone(), "/data".into())),
        "{mounts:?}"
    );
    assert!(
        mounts.contains(&(scratch.clone(), "/scratch".into())),
        "{mounts:?}"
    );

    // While the sandbox holds it, a Delete volume is not removed: the object waits.
    vols.delete("scratch", &DeleteParams::default())
        .await
        .expect("delete scratch");
    wait_for(
        "scratch to report VolumeAttached",
        READY_TIMEOUT,
        || async {
            let v = vols.get("scratch").await.map_err(|e| e.to_string())?;
            let reason = v
                .status
                .as_ref()
                .and_then(|s| condition(&s.conditions, "Ready"))
                .map(|c| c.reason.clone());
            (reason.as_deref() == Some("VolumeAttached"))
                .then_some(())
                .ok_or(format!("reason {reason:?}"))
        },
    )
    .await;
    let docker = engine().await;
    assert!(
        docker.inspect_volume(&scratch).await.is_ok(),
        "attached volume must survive"
    );

    delete_and_wait_gone(&api, "worker").await;
    wait_gone(&vols, "scratch", READY_TIMEOUT).await;
    assert!(
        docker.inspect_volume(&scratch).await.is_err(),
        "Delete volume must be removed"
    );
    delete_and_wait_gone(&vols, "keep").await;
    assert!(
        docker.inspect_volume(&keep).await.is_ok(),
        "Retain volume must survive"
    );
    drop(op);
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_template_stalls_and_creates_nothing() {
    let ns = namespace("e2e-notemplate").await;
    let _purge = Purge(ns.clone());
    let op = Operator::start(&ns, &ns, &OperatorOptions::default());
    let manifest = format!(
        "apiVersion: sandboxes.dev/v1alpha1\nkind: Sandbox\nmetadata:\n  name: fromtpl\nspec:\n  image: {}\n  templateRef:\n    name: does-not-exist\n",
        base_image()
    );
    assert!(apply_yaml(&manifest, &ns).status.success());
    let api: Api<Sandbox> = Api::namespaced(client().await, &ns);
    let s = wait_for("Stalled=True", READY_TIMEOUT, || async {
        let s = api.get("fromtpl").await.map_err(|e| e.to_string())?;
        let st = s.status.clone().unwrap_or_default();
        match condition(&st.conditions, "Stalled") {
            Some(c) if c.status == "True" => Ok(s),
            other => Err(format!("{other:?}; log: {}", op.log.display())),
        }
    })
    .await;
    let st = s.status.clone().expect("status");
    let stalled = condition(&st.conditions, "Stalled").expect("stalled");
    assert_eq!(stalled.reason, "TemplateNotFound");
    assert!(
        stalled.message.contains("does-not-exist"),
        "{}",
        stalled.message
    );
    assert_eq!(
        condition(&st.conditions, "Ready").map(|c| c.status.as_str()),
        Some("False")
    );
    assert!(
        containers_of(s.metadata.uid.as_deref().expect("uid"))
            .await
            .is_empty(),
        "never boots the plain image"
    );
    delete_and_wait_gone(&api, "fromtpl").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn crash_between_create_and_status_write_adopts_instead_of_duplicating() {
    let ns = namespace("e2e-crash").await;
    let _purge = Purge(ns.clone());
    let crashing = OperatorOptions {
        env: vec![("SANDBOX_OPERATOR_FAILPOINT".into(), "after-create".into())],
        ..Default::default()
    };
    let mut op = Operator::start(&ns, &ns, &crashing);
    let manifest = format!(
        "apiVersion: sandboxes.dev/v1alpha1\nkind: Sandbox\nmetadata:\n  name: crashy\nspec:\n  image: {}\n",
        base_image()
    );
    assert!(apply_yaml(&manifest, &ns).status.success());
    let status = op.wait_exit(READY_TIMEOUT).await;
    assert!(!status.success(), "the failpoint aborts the process");
    let api: Api<Sandbox> = Api::namespaced(client().await, &ns);
    let s = api.get("crashy").await.expect("get");
    let uid = s.metadata.uid.clone().expect("uid");
    assert_eq!(containers_of(&uid).await.len(), 1, "the create happened");
    assert!(
        s.status
            .as_ref()
            .and_then(|s| s.sandbox_id.clone())
            .is_none(),
        "but was not recorded"
    );

    let op = Operator::start(&ns, &ns, &OperatorOptions::default());
    wait_ready(&api, "crashy", &op).await;
    assert_eq!(
        containers_of(&uid).await.len(),
        1,
        "exactly one container after restart"
    );
    delete_and_wait_gone(&api, "crashy").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_manifests_are_rejected_by_the_api_server_with_their_message() {
    let ns = namespace("e2e-invalid").await;
    let dir = repo().join("examples/invalid");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("examples/invalid")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    assert!(
        files.len() >= 15,
        "at least 15 invalid manifests, have {}",
        files.len()
    );
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        let expect = text
            .lines()
            .find_map(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{} has no '# expect:' line", file.display()))
            .trim()
            .to_string();
        let out = kubectl(
            &["apply", "-n", &ns, "-f", "-"],
            Some(&retarget(&text, &ns)),
        );
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        if out.status.success() || !stderr.contains(&expect) {
            failures.push(format!(
                "{}: expected rejection containing {expect:?}, got success={} stderr={stderr}",
                file.display(),
                out.status.success()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
