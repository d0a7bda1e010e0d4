//! The Docker provider against a real engine: core lifecycle, volumes, templates,
//! hibernation and resources, each asserting what the engine actually holds.
//!
//! Needs a running engine and the base image (`tests/setup/docker.sh`,
//! `tests/setup/base-image.sh`; `SANDBOX_BASE_IMAGE` overrides the tag).

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::time::{Duration, Instant};

use bollard::query_parameters::InspectContainerOptions;
use common::{IDLE, TestEnv, base_image, unique, wait_for};
use sandbox_operator::provider::ErrorKind;
use sandbox_operator::provider::docker::{DockerProvider, DockerSettings};
use sandbox_operator::provider::labels::{KIND, MANAGED_BY, OWNER, OWNER_UID, TEMPLATE};
use sandbox_operator::provider::{
    CommitRequest, PortRequest, Provider, ProviderError, Resources, RestartPolicy, SandboxQuery,
    SandboxState, VolumeMount, VolumeQuery,
};

const WAIT: Duration = Duration::from_secs(20);

/// Raw engine client, to check what the engine holds independently of the provider.
async fn engine() -> bollard::Docker {
    bollard::Docker::connect_with_defaults()
        .expect("docker client")
        .negotiate_version()
        .await
        .expect("engine answers")
}

async fn raw_inspect(name: &str) -> bollard::models::ContainerInspectResponse {
    engine()
        .await
        .inspect_container(name, None::<InspectContainerOptions>)
        .await
        .expect("inspect")
}

fn argv(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Start time (clock ticks since boot) of pid 1 inside the sandbox: changes iff the main
/// process was started again.
async fn pid1_start(env: &TestEnv, id: &str) -> String {
    let stat = env.sh(id, "cat /proc/1/stat").await;
    // Field 22; the command name (field 2) is parenthesised and may contain spaces.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    after
        .split_whitespace()
        .nth(19)
        .expect("starttime field")
        .to_string()
}

#[tokio::test]
async fn create_leaves_a_never_started_sandbox_then_start_runs_it() {
    let env = TestEnv::new("lifecycle").await;
    let name = env.name("sbx");
    let created = env.provider.create(&env.request(&name)).await.unwrap();
    assert_eq!(created.id, name);
    assert_eq!(created.state, SandboxState::Creating);
    assert_eq!(created.started_at, None, "never started (rule 6)");
    assert!(created.created_at.is_some());
    assert!(created.ports.is_empty());

    let raw = raw_inspect(&name).await;
    assert_eq!(
        raw.state.unwrap().status.unwrap().to_string(),
        "created",
        "create must not start the container"
    );

    // find sees the same wreckage signature.
    let found = env
        .provider
        .find(&SandboxQuery {
            labels: env.instance_labels(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].started_at, None);

    env.provider.start(&name).await.unwrap();
    let running = env.provider.describe(&name).await.unwrap().unwrap();
    assert_eq!(running.state, SandboxState::Running);
    let started = running.started_at.expect("started_at after start");
    assert!(started >= running.created_at.unwrap());
    // Starting a running sandbox is a success.
    env.provider.start(&name).await.unwrap();

    env.provider.stop(&name).await.unwrap();
    let stopped = env.provider.describe(&name).await.unwrap().unwrap();
    assert_eq!(stopped.state, SandboxState::Stopped);
    assert!(stopped.started_at.is_some(), "stopped is not never-started");
    assert_eq!(stopped.exit_code, Some(0));
    env.provider.stop(&name).await.unwrap();
}

#[tokio::test]
async fn create_applies_labels_env_command_restart_policy_and_limits() {
    let env = TestEnv::new("fields").await;
    let name = env.name("sbx");
    let mut request = env.request(&name);
    request.labels = BTreeMap::from([("team".to_string(), "blue".to_string())]);
    request.env = BTreeMap::from([("GREETING".to_string(), "hello world".to_string())]);
    let command = argv(&[
        "sh",
        "-c",
        "trap 'exit 0' TERM; echo \"$GREETING\" > /tmp/greeting; while :; do sleep 0.1; done",
    ]);
    request.command = Some(command.clone());
    request.restart_policy = RestartPolicy::OnFailure;
    request.resources = Resources {
        cpu_millis: Some(500),
        memory_bytes: Some(64 << 20),
        disk_bytes: Some(1 << 30),
        pids: Some(64),
    };
    let d = env.provider.create(&request).await.unwrap();

    // Through the provider.
    assert_eq!(d.labels["team"], "blue");
    assert_eq!(d.labels[OWNER_UID], request.owner.uid);
    assert_eq!(d.labels[MANAGED_BY], env.instance);
    assert_eq!(d.labels[OWNER], format!("test.{name}"));
    assert_eq!(d.labels[KIND], "Sandbox");
    assert_eq!(d.env["GREETING"], "hello world");
    assert_eq!(d.command.as_ref(), Some(&command));
    assert_eq!(d.restart_policy, RestartPolicy::OnFailure);
    assert_eq!(d.resources.memory_bytes, Some(64 << 20));
    assert_eq!(d.resources.cpu_millis, Some(500));
    assert_eq!(d.resources.pids, Some(64));
    assert_eq!(d.resources.disk_bytes, Some(1 << 30));
    assert!(!d.resources.disk_enforced, "Docker does not enforce disk");
    assert_eq!(d.image.as_deref(), Some(base_image().as_str()));
    assert_eq!(d.template_ref, None);

    // In the engine itself.
    let raw = raw_inspect(&name).await;
    let host = raw.host_config.unwrap();
    assert_eq!(host.memory, Some(64 << 20));
    assert_eq!(host.memory_swap, Some(64 << 20));
    assert_eq!(host.nano_cpus, Some(500_000_000));
    assert_eq!(host.pids_limit, Some(64));
    assert_eq!(host.storage_opt, None, "disk is never passed to the engine");
    assert_eq!(
        host.restart_policy.unwrap().name.unwrap().to_string(),
        "on-failure"
    );
    let config = raw.config.unwrap();
    assert_eq!(config.cmd.as_ref(), Some(&command));
    assert!(
        config
            .entrypoint
            .unwrap_or_default()
            .iter()
            .all(String::is_empty),
        "the image's entrypoint is reset"
    );
    assert!(
        config
            .env
            .unwrap()
            .contains(&"GREETING=hello world".to_string())
    );

    // The argv is the main process itself: pid 1's command line, byte for byte.
    env.provider.start(&name).await.unwrap();
    let cmdline = env.sh(&name, "tr '\\0' '\\n' < /proc/1/cmdline").await;
    assert_eq!(cmdline.lines().collect::<Vec<_>>(), command);
    let greeting = wait_for("the main process to write its greeting", WAIT, || async {
        let out = env.sh(&name, "cat /tmp/greeting 2>/dev/null || true").await;
        (!out.is_empty()).then_some(out)
    })
    .await;
    assert_eq!(greeting, "hello world\n");
}

#[tokio::test]
async fn published_port_is_reachable_on_loopback() {
    let env = TestEnv::new("ports").await;
    let name = env.name("sbx");
    let mut request = env.request(&name);
    request.command = Some(argv(&[
        "perl",
        "-MIO::Socket::INET",
        "-e",
        "$SIG{TERM} = sub { exit 0 }; \
         my $s = IO::Socket::INET->new(LocalPort => 8080, Listen => 5, ReuseAddr => 1) or die $!; \
         while (my $c = $s->accept) { print $c \"hello-from-sandbox\\n\"; close $c }",
    ]));
    request.ports = vec![PortRequest {
        sandbox_port: 8080,
        protocol: "tcp".into(),
    }];
    env.provider.create(&request).await.unwrap();
    env.provider.start(&name).await.unwrap();

    let d = env.provider.describe(&name).await.unwrap().unwrap();
    assert_eq!(d.ports.len(), 1, "{:?}", d.ports);
    let mapping = &d.ports[0];
    assert_eq!(mapping.sandbox_port, 8080);
    assert_eq!(mapping.protocol, "tcp");
    assert_eq!(mapping.host, "127.0.0.1");
    assert_ne!(mapping.port, 0);

    let addr = format!("{}:{}", mapping.host, mapping.port);
    let answer = wait_for("the sandbox's server to answer", WAIT, || {
        let addr = addr.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let mut stream = std::net::TcpStream::connect(&addr).ok()?;
                stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
                let mut buf = String::new();
                stream.read_to_string(&mut buf).ok()?;
                // docker-proxy accepts before the server listens, then closes: retry.
                (!buf.is_empty()).then_some(buf)
            })
            .await
            .ok()
            .flatten()
        }
    })
    .await;
    assert_eq!(answer, "hello-from-sandbox\n");
}

#[tokio::test]
async fn a_missing_template_is_an_error_and_creates_nothing() {
    let env = TestEnv::new("notemplate").await;
    let name = env.name("sbx");
    let mut request = env.request(&name);
    request.template = Some(unique("absent-template"));
    let err = env.provider.create(&request).await.unwrap_err();
    assert!(
        matches!(&err, m if m.is(ErrorKind::NotFound) && m.message().contains("never booted from the base image")),
        "{err}"
    );
    assert_eq!(env.provider.describe(&name).await.unwrap(), None);

    // The same for a plain image that is not on the engine: never pulled.
    let mut request = env.request(&name);
    request.image = Some("sandbox-operator/not-here:never".into());
    let err = env.provider.create(&request).await.unwrap_err();
    assert!(
        matches!(&err, m if m.is(ErrorKind::NotFound) && m.message().contains("never pulled")),
        "{err}"
    );
    assert_eq!(env.provider.describe(&name).await.unwrap(), None);
}

#[tokio::test]
async fn creating_an_existing_name_is_a_conflict() {
    let env = TestEnv::new("conflict").await;
    let name = env.name("sbx");
    let first = env.provider.create(&env.request(&name)).await.unwrap();
    let err = env.provider.create(&env.request(&name)).await.unwrap_err();
    assert!(err.is(ErrorKind::Conflict), "{err}");
    // The first one is untouched.
    let again = env.provider.describe(&name).await.unwrap().unwrap();
    assert_eq!(again.labels[OWNER_UID], first.labels[OWNER_UID]);
}

#[tokio::test]
async fn destroy_is_idempotent_and_describe_of_absent_is_none() {
    let env = TestEnv::new("destroy").await;
    let name = env.name("sbx");
    env.provider.create(&env.request(&name)).await.unwrap();
    env.provider.start(&name).await.unwrap();
    env.provider.destroy(&name).await.unwrap();
    assert_eq!(env.provider.describe(&name).await.unwrap(), None);
    env.provider.destroy(&name).await.unwrap();
    env.provider
        .destroy(&unique("never-existed"))
        .await
        .unwrap();
    // Operations that need the sandbox say it is gone (the dead-machine signal).
    assert!(matches!(
        env.provider.start(&name).await,
        Err(e) if e.is(ErrorKind::NotFound)
    ));
}

#[tokio::test]
async fn find_narrows_by_labels_states_and_owner() {
    let env = TestEnv::new("find").await;
    let (a, b, c) = (env.name("a"), env.name("b"), env.name("c"));
    let mut ra = env.request(&a);
    ra.labels.insert("role".into(), "web".into());
    let mut rb = env.request(&b);
    rb.labels.insert("role".into(), "db".into());
    rb.owner = ra.owner.clone();
    let mut rc = env.request(&c);
    rc.labels.insert("role".into(), "web".into());
    for r in [&ra, &rb, &rc] {
        env.provider.create(r).await.unwrap();
    }
    env.provider.start(&a).await.unwrap();

    let ids = |found: Vec<sandbox_operator::provider::SandboxDescriptor>| {
        found.into_iter().map(|d| d.id).collect::<Vec<_>>()
    };
    let mut sorted = vec![a.clone(), b.clone(), c.clone()];
    sorted.sort();
    let all = env
        .provider
        .find(&SandboxQuery {
            labels: env.instance_labels(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(ids(all), sorted);

    let mut web = env.instance_labels();
    web.insert("role".into(), "web".into());
    let mut expect = vec![a.clone(), c.clone()];
    expect.sort();
    let found = env
        .provider
        .find(&SandboxQuery {
            labels: web,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(ids(found), expect);

    let running = env
        .provider
        .find(&SandboxQuery {
            labels: env.instance_labels(),
            states: Some(vec![SandboxState::Running]),
            owner: None,
        })
        .await
        .unwrap();
    assert_eq!(ids(running), vec![a.clone()]);

    let creating = env
        .provider
        .find(&SandboxQuery {
            labels: env.instance_labels(),
            states: Some(vec![SandboxState::Creating]),
            owner: None,
        })
        .await
        .unwrap();
    let mut expect = vec![b.clone(), c.clone()];
    expect.sort();
    assert_eq!(ids(creating.clone()), expect);
    assert!(creating.iter().all(|d| d.started_at.is_none()));

    let owned = env
        .provider
        .find(&SandboxQuery {
            labels: env.instance_labels(),
            states: None,
            owner: Some(format!("test.{}", ra.owner.name)),
        })
        .await
        .unwrap();
    let mut expect = vec![a.clone(), b.clone()];
    expect.sort();
    assert_eq!(ids(owned), expect);

    let none = env
        .provider
        .find(&SandboxQuery {
            labels: env.instance_labels(),
            states: Some(vec![SandboxState::Sleeping]),
            owner: None,
        })
        .await
        .unwrap();
    assert!(none.is_empty(), "looked and found none");
}

/// Providers pointed at an engine that is not there: a socket nobody listens on, and a
/// closed TCP port.
fn unreachable_providers() -> (tempfile::TempDir, Vec<DockerProvider>) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("docker.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let providers = [
        format!("unix://{}", socket.display()),
        format!("tcp://127.0.0.1:{port}"),
    ]
    .into_iter()
    .map(|endpoint| {
        DockerProvider::connect(
            "docker",
            DockerSettings {
                endpoint: Some(endpoint),
                ..Default::default()
            },
        )
        .unwrap()
    })
    .collect();
    (dir, providers)
}

#[tokio::test]
async fn enumerations_and_lookups_fail_when_the_engine_is_unreachable() {
    let (_dir, providers) = unreachable_providers();
    for provider in providers {
        let endpoint = provider.settings().endpoint.clone();
        let transient = |r: &ProviderError| r.is(ErrorKind::Transient);
        let err = provider.find(&SandboxQuery::default()).await.unwrap_err();
        assert!(transient(&err), "{endpoint:?}: find: {err}");
        let err = provider
            .volumes()
            .unwrap()
            .list_volumes(&VolumeQuery::default())
            .await
            .unwrap_err();
        assert!(transient(&err), "{endpoint:?}: list_volumes: {err}");
        let templates = provider.templates().unwrap();
        let err = templates.list_templates(None).await.unwrap_err();
        assert!(transient(&err), "{endpoint:?}: list_templates: {err}");
        let err = templates.get_template("some-template").await.unwrap_err();
        assert!(transient(&err), "{endpoint:?}: get_template: {err}");
        let err = provider.describe("some-sandbox").await.unwrap_err();
        assert!(transient(&err), "{endpoint:?}: describe: {err}");
        let err = provider.destroy("some-sandbox").await.unwrap_err();
        assert!(transient(&err), "{endpoint:?}: destroy: {err}");
    }
    // A socket path that does not exist at all is not a configuration error either.
    let err = DockerProvider::connect(
        "docker",
        DockerSettings {
            endpoint: Some(format!("unix:///nonexistent/{}.sock", unique("d"))),
            ..Default::default()
        },
    )
    .err()
    .unwrap();
    assert!(err.is(ErrorKind::Transient), "{err}");
}

#[tokio::test]
async fn a_volume_held_by_a_stopped_sandbox_is_attached_and_cannot_be_removed() {
    let env = TestEnv::new("volhold").await;
    let volumes = env.provider.volumes().unwrap();
    let vol = env.name("vol");
    let owner = env.owner("SandboxVolume", &vol);
    let created = volumes.create_volume(&vol, &owner.labels()).await.unwrap();
    assert!(!created.attached);
    assert!(created.created_at.is_some());

    let name = env.name("sbx");
    let mut request = env.request(&name);
    request.volumes = vec![VolumeMount {
        volume_name: vol.clone(),
        mount_path: "/data".into(),
        read_only: false,
    }];
    let d = env.provider.create(&request).await.unwrap();
    assert_eq!(d.volumes, vec![vol.clone()]);
    env.provider.start(&name).await.unwrap();
    env.sh(&name, "echo keep > /data/file").await;
    env.provider.stop(&name).await.unwrap();
    assert_eq!(
        env.provider.describe(&name).await.unwrap().unwrap().state,
        SandboxState::Stopped
    );

    let info = volumes.get_volume(&vol).await.unwrap().unwrap();
    assert!(info.attached, "a stopped sandbox still owns its volume");
    assert_eq!(info.attached_to, vec![name.clone()]);
    let err = volumes.remove_volume(&vol).await.unwrap_err();
    assert!(
        matches!(&err, m if m.is(ErrorKind::Conflict) && m.message().contains(&name)),
        "{err}"
    );

    env.provider.destroy(&name).await.unwrap();
    let info = volumes.get_volume(&vol).await.unwrap().unwrap();
    assert!(!info.attached, "destroy keeps named volumes, detached");
    volumes.remove_volume(&vol).await.unwrap();
    assert_eq!(volumes.get_volume(&vol).await.unwrap(), None);
    volumes.remove_volume(&vol).await.unwrap();
}

#[tokio::test]
async fn a_sandbox_cannot_mount_a_volume_that_does_not_exist() {
    let env = TestEnv::new("volmissing").await;
    let name = env.name("sbx");
    let vol = env.name("vol");
    let mut request = env.request(&name);
    request.volumes = vec![VolumeMount {
        volume_name: vol.clone(),
        mount_path: "/data".into(),
        read_only: false,
    }];
    let err = env.provider.create(&request).await.unwrap_err();
    assert!(err.is(ErrorKind::NotFound), "{err}");
    assert_eq!(env.provider.describe(&name).await.unwrap(), None);
    assert_eq!(
        env.provider
            .volumes()
            .unwrap()
            .get_volume(&vol)
            .await
            .unwrap(),
        None,
        "Docker's silent auto-create must not happen"
    );
}

#[tokio::test]
async fn volume_creation_is_idempotent_for_its_owner_only() {
    let env = TestEnv::new("volown").await;
    let volumes = env.provider.volumes().unwrap();
    let vol = env.name("vol");
    let owner = env.owner("SandboxVolume", &vol);
    volumes.create_volume(&vol, &owner.labels()).await.unwrap();
    let again = volumes.create_volume(&vol, &owner.labels()).await.unwrap();
    assert_eq!(again.labels[OWNER_UID], owner.uid);
    let other = env.owner("SandboxVolume", &vol);
    let err = volumes
        .create_volume(&vol, &other.labels())
        .await
        .unwrap_err();
    assert!(err.is(ErrorKind::Conflict), "{err}");
}

#[tokio::test]
async fn list_volumes_filters_by_prefix_labels_and_attachment() {
    let env = TestEnv::new("vollist").await;
    let volumes = env.provider.volumes().unwrap();
    let prefix = env.name("vl");
    let (used, free) = (format!("{prefix}-used"), format!("{prefix}-free"));
    for vol in [&used, &free] {
        let mut labels = env.owner("SandboxVolume", vol).labels();
        labels.insert("tier".into(), vol.rsplit('-').next().unwrap().into());
        volumes.create_volume(vol, &labels).await.unwrap();
    }
    let name = env.name("sbx");
    let mut request = env.request(&name);
    request.volumes = vec![VolumeMount {
        volume_name: used.clone(),
        mount_path: "/data".into(),
        read_only: true,
    }];
    env.provider.create(&request).await.unwrap(); // never started: still attached

    let names = |v: Vec<sandbox_operator::provider::VolumeInfo>| {
        v.into_iter().map(|i| i.name).collect::<Vec<_>>()
    };
    let query = |attached: Option<bool>| VolumeQuery {
        name_prefix: Some(prefix.clone()),
        labels: env.instance_labels(),
        attached,
    };
    let mut both = vec![free.clone(), used.clone()];
    both.sort();
    assert_eq!(
        names(volumes.list_volumes(&query(None)).await.unwrap()),
        both
    );
    let attached = volumes.list_volumes(&query(Some(true))).await.unwrap();
    assert_eq!(attached[0].attached_to, vec![name.clone()]);
    assert_eq!(names(attached), vec![used.clone()]);
    assert_eq!(
        names(volumes.list_volumes(&query(Some(false))).await.unwrap()),
        vec![free.clone()]
    );
    let mut labels = env.instance_labels();
    labels.insert("tier".into(), "free".into());
    let by_label = volumes
        .list_volumes(&VolumeQuery {
            labels,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(names(by_label), vec![free.clone()]);
    let nothing = volumes
        .list_volumes(&VolumeQuery {
            name_prefix: Some(format!("{prefix}-nope")),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(nothing.is_empty());
}

#[tokio::test]
async fn a_committed_template_boots_with_rootfs_and_volume_files() {
    let env = TestEnv::new("tmplboot").await;
    let volumes = env.provider.volumes().unwrap();
    let templates = env.provider.templates().unwrap();
    let vol = env.name("vol");
    volumes
        .create_volume(&vol, &env.owner("SandboxVolume", &vol).labels())
        .await
        .unwrap();
    let source = env.name("src");
    let mut request = env.request(&source);
    request.labels.insert("team".into(), "blue".into());
    request.volumes = vec![VolumeMount {
        volume_name: vol.clone(),
        mount_path: "/data".into(),
        read_only: false,
    }];
    env.provider.create(&request).await.unwrap();
    env.provider.start(&source).await.unwrap();
    env.sh(
        &source,
        "mkdir -p /opt/app /data/project/sub && echo rootfs > /opt/app/rootfs.txt \
         && echo on-volume > /data/project/sub/file.txt \
         && printf '#!/bin/sh\\n' > /data/project/suid && chmod 4755 /data/project/suid \
         && ln -s sub/file.txt /data/project/link \
         && echo not-captured > /data/elsewhere.txt",
    )
    .await;

    let id = env.name("tmpl");
    let owner = env.owner("SandboxTemplate", &id);
    let template = templates
        .commit(&CommitRequest {
            sandbox_id: source.clone(),
            template_id: id.clone(),
            capture_paths: vec!["/data/project".into(), "/opt/app".into()],
            label: Some("first capture".into()),
            owner: owner.clone(),
        })
        .await
        .unwrap();
    assert_eq!(template.id, id);
    assert!(template.reference.starts_with("sha256:"));
    assert_eq!(template.label.as_deref(), Some("first capture"));
    assert_eq!(template.labels[OWNER_UID], owner.uid);
    assert!(template.created_at.is_some());
    assert!(template.size_bytes.is_some());
    assert!(
        !template.in_use,
        "the source runs the base image, not the template"
    );
    assert_eq!(
        template.labels.get("team").map(String::as_str),
        Some(""),
        "the source's own labels are blanked, not inherited"
    );

    let got = templates.get_template(&id).await.unwrap().unwrap();
    assert_eq!(got.reference, template.reference);
    let listed = templates.list_templates(Some(&id)).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].reference, template.reference);

    // Boot from it, without the volume: the captured files are in the image.
    let booted = env.name("boot");
    let mut request = env.request(&booted);
    request.template = Some(id.clone());
    request.image = Some("ignored-when-a-template-is-given".into());
    let d = env.provider.create(&request).await.unwrap();
    assert_eq!(d.template_ref.as_deref(), Some(id.as_str()));
    assert_eq!(d.labels[TEMPLATE], id);
    assert_eq!(d.labels.get("team").map(String::as_str), Some(""));
    env.provider.start(&booted).await.unwrap();
    assert_eq!(env.sh(&booted, "cat /opt/app/rootfs.txt").await, "rootfs\n");
    assert_eq!(
        env.sh(&booted, "cat /data/project/sub/file.txt").await,
        "on-volume\n"
    );
    assert_eq!(
        env.sh(&booted, "cat /data/project/link").await,
        "on-volume\n"
    );
    assert_eq!(
        env.sh(&booted, "stat -c '%a %u' /data/project/suid").await,
        "755 0\n",
        "setuid never survives a capture"
    );
    assert_eq!(
        env.sh(
            &booted,
            "test -e /data/elsewhere.txt && echo yes || echo no"
        )
        .await,
        "no\n",
        "only capture paths are copied from the volume"
    );

    assert!(templates.get_template(&id).await.unwrap().unwrap().in_use);
    assert!(templates.list_templates(Some(&id)).await.unwrap()[0].in_use);

    // Re-committing replaces it, also from a stopped sandbox (volume paths included).
    env.sh(&source, "echo second > /opt/app/rootfs.txt").await;
    env.provider.stop(&source).await.unwrap();
    let second = templates
        .commit(&CommitRequest {
            sandbox_id: source.clone(),
            template_id: id.clone(),
            capture_paths: vec!["/opt/app".into(), "/data/project/sub".into()],
            label: None,
            owner,
        })
        .await
        .unwrap();
    assert_ne!(second.reference, template.reference);
    assert!(
        second.in_use,
        "the old capture still backs a sandbox booted from this id"
    );
    assert_eq!(templates.list_templates(Some(&id)).await.unwrap().len(), 1);
    let rebooted = env.name("boot2");
    let mut request = env.request(&rebooted);
    request.template = Some(id.clone());
    env.provider.create(&request).await.unwrap();
    env.provider.start(&rebooted).await.unwrap();
    assert_eq!(
        env.sh(&rebooted, "cat /opt/app/rootfs.txt").await,
        "second\n"
    );
    assert_eq!(
        env.sh(&rebooted, "cat /data/project/sub/file.txt").await,
        "on-volume\n"
    );
    assert_eq!(
        env.sh(&rebooted, "ls /data/project").await,
        "sub\n",
        "only the captured subtree, under a scaffolded parent"
    );
}

#[tokio::test]
async fn a_template_that_backs_a_sandbox_cannot_be_removed() {
    let env = TestEnv::new("tmplrm").await;
    let templates = env.provider.templates().unwrap();
    let source = env.name("src");
    env.provider.create(&env.request(&source)).await.unwrap();
    let id = env.name("tmpl");
    templates
        .commit(&CommitRequest {
            sandbox_id: source.clone(),
            template_id: id.clone(),
            capture_paths: vec![],
            label: None,
            owner: env.owner("SandboxTemplate", &id),
        })
        .await
        .unwrap();

    let user = env.name("user");
    let mut request = env.request(&user);
    request.template = Some(id.clone());
    env.provider.create(&request).await.unwrap(); // never started still counts

    assert!(templates.get_template(&id).await.unwrap().unwrap().in_use);
    let err = templates.remove_template(&id).await.unwrap_err();
    assert!(
        matches!(&err, m if m.is(ErrorKind::Conflict) && m.message().contains(&user)),
        "{err}"
    );
    assert!(templates.get_template(&id).await.unwrap().is_some());

    env.provider.destroy(&user).await.unwrap();
    assert!(!templates.get_template(&id).await.unwrap().unwrap().in_use);
    templates.remove_template(&id).await.unwrap();
    assert_eq!(templates.get_template(&id).await.unwrap(), None);
    templates.remove_template(&id).await.unwrap();
}

#[tokio::test]
async fn template_lookups_distinguish_absent_from_unknown() {
    let env = TestEnv::new("tmplabsent").await;
    let templates = env.provider.templates().unwrap();
    let id = unique("absent");
    assert_eq!(templates.get_template(&id).await.unwrap(), None);
    templates.remove_template(&id).await.unwrap();
    assert!(
        templates
            .list_templates(Some(&id))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        templates.get_template("Not A Valid Id").await,
        Err(e) if e.is(ErrorKind::Invalid)
    ));
    // No store is configured: an honest refusal, not a silent success.
    assert!(matches!(
        templates.publish(&id).await,
        Err(e) if e.is(ErrorKind::Unsupported)
    ));
    assert!(matches!(
        templates.fetch(&id).await,
        Err(e) if e.is(ErrorKind::Unsupported)
    ));
}

#[tokio::test]
async fn commit_refuses_capture_paths_that_do_not_exist() {
    let env = TestEnv::new("tmplpath").await;
    let templates = env.provider.templates().unwrap();
    let source = env.name("src");
    env.provider.create(&env.request(&source)).await.unwrap();
    let id = env.name("tmpl");
    let err = templates
        .commit(&CommitRequest {
            sandbox_id: source.clone(),
            template_id: id.clone(),
            capture_paths: vec!["/no/such/dir".into()],
            label: None,
            owner: env.owner("SandboxTemplate", &id),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, m if m.is(ErrorKind::Invalid) && m.message().contains("/no/such/dir")),
        "{err}"
    );
    let err = templates
        .commit(&CommitRequest {
            sandbox_id: source,
            template_id: id.clone(),
            capture_paths: vec!["/a/../etc".into()],
            label: None,
            owner: env.owner("SandboxTemplate", &id),
        })
        .await
        .unwrap_err();
    assert!(err.is(ErrorKind::Invalid), "{err}");
    assert_eq!(templates.get_template(&id).await.unwrap(), None);
}

const COUNTER: &str = "trap 'exit 0' TERM; i=0; while true; do i=$((i+1)); echo $i > /tmp/count; \
                       echo $i >> /tmp/log; sleep 0.2; done";

async fn count(env: &TestEnv, id: &str) -> u64 {
    env.sh(id, "cat /tmp/count")
        .await
        .trim()
        .parse()
        .unwrap_or(0)
}

async fn restarts_in_log(env: &TestEnv, id: &str) -> usize {
    env.sh(id, "cat /tmp/log")
        .await
        .lines()
        .filter(|l| *l == "1")
        .count()
}

#[tokio::test]
async fn hibernate_pauses_and_resume_keeps_the_processes() {
    let env = TestEnv::new("hibpause").await;
    let hib = env.provider.hibernation().unwrap();
    let name = env.name("sbx");
    let mut request = env.request(&name);
    request.command = Some(argv(&["sh", "-c", COUNTER]));
    env.provider.create(&request).await.unwrap();
    env.provider.start(&name).await.unwrap();
    wait_for("the counter to reach 3", WAIT, || async {
        (count(&env, &name).await >= 3).then_some(())
    })
    .await;
    let start_before = pid1_start(&env, &name).await;

    let out = hib.hibernate(&name).await.unwrap();
    assert!(out.processes_preserved, "{out:?}");
    assert_eq!(out.mechanism, "pause");
    assert_eq!(
        env.provider.describe(&name).await.unwrap().unwrap().state,
        SandboxState::Sleeping
    );
    let again = hib.hibernate(&name).await.unwrap();
    assert!(
        again.processes_preserved,
        "pausing a paused sandbox keeps it"
    );

    let out = hib.resume(&name).await.unwrap();
    assert!(out.processes_preserved, "{out:?}");
    let frozen_at = count(&env, &name).await;
    assert!(frozen_at >= 3, "the counter did not reset: {frozen_at}");
    wait_for("the counter to continue", WAIT, || async {
        (count(&env, &name).await > frozen_at).then_some(())
    })
    .await;
    assert_eq!(restarts_in_log(&env, &name).await, 1, "never restarted");
    assert_eq!(pid1_start(&env, &name).await, start_before, "same pid 1");

    // Resuming a running sandbox reports the truth: nothing was lost.
    assert!(hib.resume(&name).await.unwrap().processes_preserved);
}

#[tokio::test]
async fn resume_of_a_stopped_sandbox_reports_lost_processes() {
    let env = TestEnv::new("hibstop").await;
    let hib = env.provider.hibernation().unwrap();
    let name = env.name("sbx");
    let mut request = env.request(&name);
    request.command = Some(argv(&["sh", "-c", COUNTER]));
    env.provider.create(&request).await.unwrap();
    env.provider.start(&name).await.unwrap();
    wait_for("the counter to reach 3", WAIT, || async {
        (count(&env, &name).await >= 3).then_some(())
    })
    .await;
    let start_before = pid1_start(&env, &name).await;

    env.provider.stop(&name).await.unwrap();
    let out = hib.hibernate(&name).await.unwrap();
    assert!(!out.processes_preserved, "nothing ran to preserve: {out:?}");

    let out = hib.resume(&name).await.unwrap();
    assert!(!out.processes_preserved, "{out:?}");
    assert_eq!(out.mechanism, "start");
    wait_for("the counter to start again from 1", WAIT, || async {
        (restarts_in_log(&env, &name).await == 2).then_some(())
    })
    .await;
    assert_ne!(pid1_start(&env, &name).await, start_before, "a new pid 1");
}

#[tokio::test]
async fn sleep_wake_and_stop_are_idempotent() {
    let env = TestEnv::new("sleepwake").await;
    let name = env.name("sbx");
    env.provider.create(&env.request(&name)).await.unwrap();
    env.provider.start(&name).await.unwrap();
    env.provider.sleep(&name).await.unwrap();
    env.provider.sleep(&name).await.unwrap();
    assert_eq!(
        env.provider.describe(&name).await.unwrap().unwrap().state,
        SandboxState::Sleeping
    );
    env.provider.wake(&name).await.unwrap();
    env.provider.wake(&name).await.unwrap();
    assert_eq!(
        env.provider.describe(&name).await.unwrap().unwrap().state,
        SandboxState::Running
    );
    // Stopping a sleeping sandbox works (and is prompt: it is thawed first).
    env.provider.sleep(&name).await.unwrap();
    let t = Instant::now();
    env.provider.stop(&name).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    env.provider.stop(&name).await.unwrap();
    assert!(matches!(
        env.provider.sleep(&name).await,
        Err(e) if e.is(ErrorKind::Conflict)
    ));
    // Waking a stopped sandbox starts it.
    env.provider.wake(&name).await.unwrap();
    assert_eq!(
        env.provider.describe(&name).await.unwrap().unwrap().state,
        SandboxState::Running
    );
    // A sleeping sandbox can be destroyed.
    env.provider.sleep(&name).await.unwrap();
    env.provider.destroy(&name).await.unwrap();
    assert_eq!(env.provider.describe(&name).await.unwrap(), None);
    assert!(matches!(
        env.provider.wake(&name).await,
        Err(e) if e.is(ErrorKind::NotFound)
    ));
}

#[tokio::test]
async fn set_resources_changes_limits_in_place_and_refuses_disk() {
    let env = TestEnv::new("resources").await;
    let res = env.provider.resources().unwrap();
    let name = env.name("sbx");
    let mut request = env.request(&name);
    request.resources = Resources {
        cpu_millis: Some(500),
        memory_bytes: Some(64 << 20),
        disk_bytes: None,
        pids: Some(64),
    };
    env.provider.create(&request).await.unwrap();
    env.provider.start(&name).await.unwrap();

    let applied = res
        .set_resources(
            &name,
            &Resources {
                cpu_millis: Some(250),
                memory_bytes: Some(128 << 20),
                disk_bytes: None,
                pids: Some(50),
            },
        )
        .await
        .unwrap();
    assert_eq!(applied.cpu_millis, Some(250));
    assert_eq!(applied.memory_bytes, Some(128 << 20));
    assert_eq!(applied.pids, Some(50));
    assert!(!applied.disk_enforced);
    let host = raw_inspect(&name).await.host_config.unwrap();
    assert_eq!(host.memory, Some(128 << 20));
    assert_eq!(host.memory_swap, Some(128 << 20), "swap moves with memory");
    assert_eq!(host.nano_cpus, Some(250_000_000));
    assert_eq!(host.pids_limit, Some(50));

    // Only the fields present change.
    let applied = res
        .set_resources(
            &name,
            &Resources {
                memory_bytes: Some(32 << 20),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(applied.memory_bytes, Some(32 << 20));
    assert_eq!(applied.cpu_millis, Some(250));
    assert_eq!(applied.pids, Some(50));

    let err = res
        .set_resources(
            &name,
            &Resources {
                memory_bytes: Some(256 << 20),
                disk_bytes: Some(1 << 30),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorKind::Unsupported), "{err}");
    assert_eq!(
        raw_inspect(&name).await.host_config.unwrap().memory,
        Some(32 << 20),
        "a refused change changes nothing"
    );
    assert!(matches!(
        res.set_resources(&unique("absent"), &Resources::default())
            .await,
        Err(e) if e.is(ErrorKind::NotFound)
    ));
}

#[tokio::test]
async fn egress_allow_lists_are_refused_and_an_empty_one_cuts_the_network() {
    let env = TestEnv::new("egress").await;
    let name = env.name("sbx");
    let mut request = env.request(&name);
    request.allowed_domains = Some(vec!["example.com".into()]);
    let err = env.provider.create(&request).await.unwrap_err();
    assert!(
        matches!(&err, m if m.is(ErrorKind::Unsupported) && m.message().contains("cannot filter egress by domain")),
        "{err}"
    );
    assert_eq!(env.provider.describe(&name).await.unwrap(), None);

    request.allowed_domains = Some(vec![]);
    env.provider.create(&request).await.unwrap();
    let host = raw_inspect(&name).await.host_config.unwrap();
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    env.provider.start(&name).await.unwrap();
    let interfaces = env.sh(&name, "cat /proc/net/dev").await;
    assert!(
        !interfaces.contains("eth0"),
        "no network interface but loopback: {interfaces}"
    );
}

/// Not a correctness test: measures create+start through the provider against
/// `docker run -d` and raw bollard create+start of the same image, and prints medians.
/// Run with `cargo test --test docker_provider -- --ignored --nocapture bench_`.
#[tokio::test]
#[ignore]
async fn bench_create_start_vs_docker_run() {
    const ROUNDS: usize = 10;
    let env = TestEnv::new("bench").await;
    let docker = engine().await;
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (mut provider_times, mut cli_times, mut raw_times) = (vec![], vec![], vec![]);
    for round in 0..ROUNDS {
        // Interleaved, so drift on a shared machine hits all three alike.
        let name = env.name(&format!("p{round}"));
        let request = env.request(&name);
        let t = Instant::now();
        env.provider.create(&request).await.unwrap();
        env.provider.start(&name).await.unwrap();
        provider_times.push(t.elapsed());

        let name = env.name(&format!("c{round}"));
        let label = format!("{MANAGED_BY}={}", env.instance);
        let t = Instant::now();
        let status = std::process::Command::new("docker")
            .args([
                "run",
                "-d",
                "--name",
                &name,
                "--label",
                &label,
                &base_image(),
            ])
            .args(IDLE)
            .output()
            .unwrap();
        cli_times.push(t.elapsed());
        assert!(status.status.success());

        let name = env.name(&format!("r{round}"));
        let t = Instant::now();
        docker
            .create_container(
                Some(
                    bollard::query_parameters::CreateContainerOptionsBuilder::default()
                        .name(&name)
                        .build(),
                ),
                bollard::models::ContainerCreateBody {
                    image: Some(base_image()),
                    cmd: Some(argv(IDLE)),
                    labels: Some(
                        [(MANAGED_BY.to_string(), env.instance.clone())]
                            .into_iter()
                            .collect(),
                    ),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        docker
            .start_container(
                &name,
                None::<bollard::query_parameters::StartContainerOptions>,
            )
            .await
            .unwrap();
        raw_times.push(t.elapsed());
    }
    let (p, c, r) = (median(provider_times), median(cli_times), median(raw_times));
    println!(
        "create+start median over {ROUNDS}: provider {:.1} ms, `docker run -d` {:.1} ms, raw bollard {:.1} ms; \
         provider/docker-run = {:.2}, provider/raw = {:.2}",
        p.as_secs_f64() * 1e3,
        c.as_secs_f64() * 1e3,
        r.as_secs_f64() * 1e3,
        p.as_secs_f64() / c.as_secs_f64(),
        p.as_secs_f64() / r.as_secs_f64(),
    );
}

/// Not a correctness test: how long `find` takes over many labelled containers (a sweep
/// enumerates every one), against the bare list call it starts with. `SANDBOX_BENCH_FIND_N`
/// containers (default 300) are created with the docker CLI, never started.
/// Run with `cargo test --test docker_provider -- --ignored --nocapture bench_`.
#[tokio::test]
#[ignore]
async fn bench_find_over_many_containers() {
    let n: usize = std::env::var("SANDBOX_BENCH_FIND_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let env = TestEnv::new("benchfind").await;
    let label = format!("{MANAGED_BY}={}", env.instance);
    let script = format!(
        "seq {n} | xargs -P 8 -I{{}} docker create --label {label} --name {}-{{}} {} >/dev/null",
        env.instance,
        base_image()
    );
    let status = std::process::Command::new("sh")
        .args(["-c", &script])
        .status()
        .unwrap();
    assert!(status.success());

    let query = SandboxQuery {
        labels: env.instance_labels(),
        ..Default::default()
    };
    let t = Instant::now();
    let found = env.provider.find(&query).await.unwrap();
    let find = t.elapsed();
    assert_eq!(found.len(), n);

    let docker = engine().await;
    let filters = std::collections::HashMap::from([("label".to_string(), vec![label.clone()])]);
    let t = Instant::now();
    let listed = docker
        .list_containers(Some(
            bollard::query_parameters::ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap();
    let list = t.elapsed();
    assert_eq!(listed.len(), n);
    println!(
        "find over {n} containers: {:.0} ms ({:.2} ms each; {:.1} s per 10,000); the list call alone: {:.0} ms",
        find.as_secs_f64() * 1e3,
        find.as_secs_f64() * 1e3 / n as f64,
        find.as_secs_f64() * 10_000.0 / n as f64,
        list.as_secs_f64() * 1e3,
    );
}
