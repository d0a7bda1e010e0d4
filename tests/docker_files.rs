//! Docker-only behaviour of the exec, file, capacity, egress and event capabilities,
//! against a real engine: files of a stopped container through the archive API, what the
//! engine's own probes measure and observe, and how engine events are filtered and mapped.
//! What every provider promises is in the conformance suite (`tests/conformance/`, run for
//! Docker by `tests/conformance_docker.rs`).
//!
//! Containers are set up directly with bollard (not through the provider's own create),
//! each test uses unique names and removes what it made through a guard, and nothing waits
//! by sleeping — anything asynchronous is polled against a deadline.
//!
//! Needs a Docker engine at the default socket (or `DOCKER_HOST`) and the base image
//! (`SANDBOX_BASE_IMAGE`, default `sandbox-operator/base:bookworm`; see tests/setup).

mod harness;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::models::{ContainerCreateBody, HostConfig, VolumeCreateRequest};
use bollard::query_parameters::{CreateContainerOptionsBuilder, StopContainerOptionsBuilder};
use futures::StreamExt;

use sandbox_operator::provider::ErrorKind;
use sandbox_operator::provider::docker::DockerProvider;

use harness::docker::{Purge, TEST_LABEL, base_image, engine, provider};
use harness::unique;
use sandbox_operator::provider::labels::Owner;
use sandbox_operator::provider::{
    CapacityProbe, Egress, EgressState, ExecOutput, ExecRequest, Files, Provider, ProviderError,
    ProviderEvents,
};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

struct Spec {
    network_mode: Option<&'static str>,
    labels: HashMap<String, String>,
    start: bool,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            network_mode: None,
            labels: HashMap::new(),
            start: true,
        }
    }
}

/// Creates (and by default starts) a container of the base image running `sleep infinity`,
/// removed (with its anonymous volumes) when the returned guard drops.
async fn container(what: &str, spec: Spec) -> (String, Purge) {
    let docker = engine().await;
    let name = unique(what);
    let guard = Purge(name.clone());
    let mut labels = spec.labels;
    labels.insert(TEST_LABEL.to_string(), name.clone());
    let body = ContainerCreateBody {
        image: Some(base_image()),
        cmd: Some(vec!["sleep".into(), "infinity".into()]),
        labels: Some(labels),
        host_config: Some(HostConfig {
            network_mode: spec.network_mode.map(String::from),
            ..Default::default()
        }),
        ..Default::default()
    };
    docker
        .create_container(
            Some(CreateContainerOptionsBuilder::default().name(&name).build()),
            body,
        )
        .await
        .expect("create test container (is the base image built? see tests/setup)");
    if spec.start {
        docker
            .start_container(&name, None)
            .await
            .expect("start test container");
    }
    (name, guard)
}

async fn stop(name: &str) {
    engine()
        .await
        .stop_container(
            name,
            Some(StopContainerOptionsBuilder::default().t(0).build()),
        )
        .await
        .expect("stop container");
}

async fn sh(p: &DockerProvider, id: &str, script: &str) -> ExecOutput {
    p.exec(id, &ExecRequest::shell(script, Duration::from_secs(30)))
        .await
        .unwrap_or_else(|e| panic!("exec {script:?}: {e}"))
}

/// Runs a shell script that must succeed and returns its trimmed stdout.
async fn sh_ok(p: &DockerProvider, id: &str, script: &str) -> String {
    let out = sh(p, id, script).await;
    assert_eq!(
        out.exit_code,
        0,
        "{script:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn owner(instance: &str, uid: &str) -> Owner {
    Owner {
        instance: instance.into(),
        kind: "Sandbox".into(),
        namespace: "tests".into(),
        name: format!("obj-{uid}"),
        uid: uid.into(),
    }
}

fn labels_of(owner: &Owner) -> HashMap<String, String> {
    owner.labels().into_iter().collect()
}

// ---------------------------------------------------------------------------------------------
// files of a stopped container
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_stopped_container_is_read_and_written_through_the_archive_api() {
    let p = provider("docker").await;
    let (id, _g) = container("stopped-files", Spec::default()).await;
    p.write_file(&id, "/data/a.txt", b"12345", 0o644)
        .await
        .unwrap();
    p.write_file(&id, "/data/sub/deep.txt", b"x", 0o644)
        .await
        .unwrap();
    sh_ok(&p, &id, "ln -s /etc/hostname /data/link && mkdir /empty").await;
    // Written as root, whatever the archive says.
    assert_eq!(
        sh_ok(
            &p,
            &id,
            "stat -c '%u:%g' /data /data/sub /data/sub/deep.txt"
        )
        .await,
        "0:0\n0:0\n0:0"
    );
    let listed = p.list_dir(&id, "/data").await.unwrap();

    stop(&id).await;
    assert_eq!(
        p.list_dir(&id, "/data").await.unwrap(),
        listed,
        "the archive listing of a stopped container agrees with the running one"
    );
    assert_eq!(p.list_dir(&id, "/empty").await.unwrap(), vec![]);
    let err = p.list_dir(&id, "/no/such/dir").await.unwrap_err();
    assert!(err.is(ErrorKind::NotFound), "{err:?}");
    p.write_file(&id, "/opt/cold/file", b"written while stopped", 0o600)
        .await
        .unwrap();
    assert_eq!(
        p.read_file(&id, "/opt/cold/file").await.unwrap(),
        b"written while stopped"
    );
    // Deleting needs a process in the container; exec in a stopped one is a Conflict.
    let err = p.delete_path(&id, "/opt/cold/file").await.unwrap_err();
    assert!(err.is(ErrorKind::Conflict), "{err:?}");
    let err = p
        .exec(&id, &ExecRequest::shell("true", Duration::from_secs(10)))
        .await
        .unwrap_err();
    assert!(
        err.is(ErrorKind::Conflict) && err.message().contains("not running"),
        "{err:?}"
    );
    engine().await.start_container(&id, None).await.unwrap();
    p.delete_path(&id, "/opt/cold/file").await.unwrap();
    let err = p.read_file(&id, "/opt/cold/file").await.unwrap_err();
    assert!(err.is(ErrorKind::NotFound), "{err:?}");
}

// ---------------------------------------------------------------------------------------------
// capacity
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn capacity_of_the_local_engine_is_measured() {
    let p = provider("docker").await;
    let c = CapacityProbe::capacity(&p).await.unwrap();
    assert!(c.disk_bytes.is_some_and(|b| b > 0), "{c:?}");
    assert!(c.inodes.is_some_and(|i| i > 0), "{c:?}");
    assert!(c.memory_bytes.is_some_and(|m| m > 0), "{c:?}");
    assert_eq!(c.admits, None);
    assert!(c.detail.contains("measured"), "{c:?}");
}

// ---------------------------------------------------------------------------------------------
// egress
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn egress_verdicts_read_the_network_mode_and_the_namespace() {
    let p = provider("docker").await;
    let (none, _g1) = container(
        "egress-none",
        Spec {
            network_mode: Some("none"),
            ..Default::default()
        },
    )
    .await;
    let (bridged, _g2) = container("egress-bridge", Spec::default()).await;

    let v = p.egress_verdict(&none).await.unwrap();
    assert_eq!(v.state, EgressState::Filtered, "{v:?}");
    assert!(v.detail.contains("loopback"), "{v:?}");
    assert_eq!(v.remediation, None);

    let v = p.egress_verdict(&bridged).await.unwrap();
    assert_eq!(
        v.state,
        EgressState::Open,
        "a bridged container is open: {v:?}"
    );
    assert!(
        v.remediation
            .as_deref()
            .is_some_and(|r| r.contains("allowedDomains")),
        "{v:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// events
// ---------------------------------------------------------------------------------------------

/// Reads events until every `(uid, action)` in `wanted` has been seen (30 s deadline),
/// asserting on the way that each event belongs to one of `allowed` and is not an exec's.
async fn wait_for_events(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<
        Result<sandbox_operator::provider::ProviderEvent, ProviderError>,
    >,
    seen: &mut Vec<(String, String)>,
    wanted: &[(String, &str)],
    allowed: &[&Owner],
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !wanted
        .iter()
        .all(|(u, a)| seen.iter().any(|(su, sa)| su == u && sa == a))
    {
        let ev = tokio::time::timeout_at(deadline.into(), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("events {wanted:?} still missing after 30 s; saw {seen:?}"))
            .expect("event stream ended");
        let ev = ev.expect("event stream error");
        if ev.owner.uid == "marker" {
            continue;
        }
        assert!(
            allowed.contains(&&ev.owner),
            "only our own resources' events arrive: {ev:?}"
        );
        assert!(
            !ev.action.starts_with("exec"),
            "exec events are filtered out: {ev:?}"
        );
        seen.push((ev.owner.uid, ev.action));
    }
}

#[tokio::test]
async fn events_map_managed_changes_to_their_owner_and_nothing_else() {
    let p = provider("docker").await;
    let docker = engine().await;
    let instance = unique("inst");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut events = p.subscribe(&instance);
    let pump = tokio::spawn(async move {
        while let Some(ev) = events.next().await {
            if tx.send(ev).is_err() {
                break;
            }
        }
    });

    // Handshake: the subscription is live once a marker container's event comes through.
    let marker = owner(&instance, "marker");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut markers = Vec::new();
    'ready: loop {
        assert!(
            Instant::now() < deadline,
            "the event subscription never delivered the marker's event"
        );
        let (name, guard) = container(
            "marker",
            Spec {
                labels: labels_of(&marker),
                start: false,
                ..Default::default()
            },
        )
        .await;
        markers.push(guard);
        let _ = name;
        let until = Instant::now() + Duration::from_millis(500);
        while let Ok(Some(ev)) = tokio::time::timeout_at(until.into(), rx.recv()).await {
            if ev.unwrap().owner.uid == "marker" {
                break 'ready;
            }
        }
    }
    drop(markers);

    let ours = owner(&instance, &unique("uid"));
    let ours_volume = Owner {
        kind: "SandboxVolume".into(),
        ..owner(&instance, &unique("vuid"))
    };
    let theirs = owner(&unique("other-instance"), "foreign");
    let (id, _g) = container(
        "ev-ours",
        Spec {
            labels: labels_of(&ours),
            ..Default::default()
        },
    )
    .await;
    let (_unlabelled, _g2) = container("ev-unlabelled", Spec::default()).await;
    let (_foreign, _g3) = container(
        "ev-foreign",
        Spec {
            labels: labels_of(&theirs),
            ..Default::default()
        },
    )
    .await;
    sh_ok(&p, &id, "true").await; // exec events must not come through
    stop(&id).await;
    let mut seen: Vec<(String, String)> = Vec::new();
    let container_wanted = [
        (ours.uid.clone(), "create"),
        (ours.uid.clone(), "start"),
        (ours.uid.clone(), "die"),
        (ours.uid.clone(), "stop"),
    ];
    wait_for_events(
        &mut rx,
        &mut seen,
        &container_wanted,
        &[&ours, &ours_volume],
    )
    .await;

    // A volume's create is mapped by inspecting it, so remove it only once that was seen
    // (as in real life: nothing deletes a volume in the instant it is created).
    let volume = unique("vol");
    let _volumes = Purge(instance.clone());
    docker
        .create_volume(VolumeCreateRequest {
            name: Some(volume.clone()),
            labels: Some(labels_of(&ours_volume)),
            ..Default::default()
        })
        .await
        .unwrap();
    let created = [(ours_volume.uid.clone(), "create")];
    wait_for_events(&mut rx, &mut seen, &created, &[&ours, &ours_volume]).await;
    docker
        .remove_volume(
            &volume,
            None::<bollard::query_parameters::RemoveVolumeOptions>,
        )
        .await
        .unwrap();
    let destroyed = [(ours_volume.uid.clone(), "destroy")];
    wait_for_events(&mut rx, &mut seen, &destroyed, &[&ours, &ours_volume]).await;
    pump.abort();
}
