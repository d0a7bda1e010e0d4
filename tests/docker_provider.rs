//! Docker-only behaviour of the Docker provider, asserted against what the engine itself
//! holds (raw inspect, pid 1, network mode). Everything the seam promises of every provider
//! is in the conformance suite (`tests/conformance/`, run for Docker by
//! `tests/conformance_docker.rs`); this file keeps only what is specific to Docker.
//!
//! Needs a running engine and the base image (`tests/setup/docker.sh`,
//! `tests/setup/base-image.sh`; `SANDBOX_BASE_IMAGE` overrides the tag).

mod harness;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bollard::query_parameters::InspectContainerOptions;
use harness::docker::{IDLE, TestEnv, base_image, engine};
use harness::{unique, wait_for};
use sandbox_operator::provider::ErrorKind;
use sandbox_operator::provider::docker::{DockerProvider, DockerSettings};
use sandbox_operator::provider::labels::MANAGED_BY;
use sandbox_operator::provider::{
    CommitRequest, Provider, Resources, RestartPolicy, SandboxQuery, SandboxState, VolumeMount,
};

const WAIT: Duration = Duration::from_secs(20);

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
async fn create_leaves_the_container_created_and_stop_records_the_exit() {
    let env = TestEnv::new("lifecycle").await;
    let name = env.name("sbx");
    let created = env.provider.create(&env.request(&name)).await.unwrap();
    assert_eq!(
        created.id, name,
        "a Docker sandbox's id is its container name"
    );
    let raw = raw_inspect(&name).await;
    assert_eq!(
        raw.state.unwrap().status.unwrap().to_string(),
        "created",
        "create must not start the container"
    );
    env.provider.start(&name).await.unwrap();
    env.provider.stop(&name).await.unwrap();
    let stopped = env.provider.describe(&name).await.unwrap().unwrap();
    assert_eq!(
        stopped.exit_code,
        Some(0),
        "the idle process exits 0 on SIGTERM"
    );
}

#[tokio::test]
async fn create_maps_command_restart_policy_env_and_limits_onto_the_engine() {
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

    // Through the provider: disk is advisory on Docker.
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
        (!out.is_empty())
            .then_some(out)
            .ok_or("no greeting yet".to_string())
    })
    .await;
    assert_eq!(greeting, "hello world\n");
}

#[tokio::test]
async fn templates_never_fall_back_to_the_image_and_never_pulls_nothing() {
    let env = TestEnv::new("notemplate").await;
    let name = env.name("sbx");
    let mut request = env.request(&name);
    request.template = Some(unique("absent-template"));
    let err = env.provider.create(&request).await.unwrap_err();
    assert!(
        err.is(ErrorKind::NotFound) && err.message().contains("never booted from the base image"),
        "{err}"
    );
    // A plain image that is not on the engine under imagePullPolicy Never: not pulled
    // (tests/docker_pull.rs covers the other policies against a real registry).
    let mut request = env.request(&name);
    request.image = Some("sandbox-operator/not-here:never".into());
    request.image_pull_policy = sandbox_operator::provider::ImagePullPolicy::Never;
    let err = env.provider.create(&request).await.unwrap_err();
    assert!(
        err.is(ErrorKind::NotFound) && err.message().contains("imagePullPolicy is Never"),
        "{err}"
    );
    assert_eq!(env.provider.describe(&name).await.unwrap(), None);
}

/// The conformance suite covers a closed TCP port; these are the engine-specific
/// endpoints: a socket file nobody listens on, and a socket path that does not exist.
#[tokio::test]
async fn unix_socket_endpoints_that_do_not_answer_are_transient() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("docker.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let provider = DockerProvider::connect(
        "docker",
        DockerSettings {
            endpoint: Some(format!("unix://{}", socket.display())),
            ..Default::default()
        },
    )
    .unwrap();
    let err = provider.find(&SandboxQuery::default()).await.unwrap_err();
    assert!(err.is(ErrorKind::Transient), "find: {err}");
    let err = provider.describe("some-sandbox").await.unwrap_err();
    assert!(err.is(ErrorKind::Transient), "describe: {err}");
    // A socket path that does not exist at all is not a configuration error either: a
    // daemon that is still starting.
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
async fn a_committed_template_is_an_image_with_volume_captures_sanitised() {
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
        "mkdir -p /data/project/sub && echo on-volume > /data/project/sub/file.txt \
         && printf '#!/bin/sh\\n' > /data/project/suid && chmod 4755 /data/project/suid \
         && ln -s sub/file.txt /data/project/link",
    )
    .await;

    let id = env.name("tmpl");
    let commit = |paths: &[&str]| CommitRequest {
        sandbox_id: source.clone(),
        template_id: id.clone(),
        capture_paths: paths.iter().map(|p| p.to_string()).collect(),
        label: None,
        owner: env.owner("SandboxTemplate", &id),
        env: Default::default(),
        secret_files: Vec::new(),
    };
    let template = templates.commit(&commit(&["/data/project"])).await.unwrap();
    assert!(template.reference.starts_with("sha256:"), "an image id");
    assert!(template.size_bytes.is_some() && template.created_at.is_some());
    assert_eq!(
        template.labels.get("team").map(String::as_str),
        Some(""),
        "the source's own labels are blanked, not inherited"
    );

    let booted = env.name("boot");
    let mut request = env.request(&booted);
    request.template = Some(id.clone());
    let d = env.provider.create(&request).await.unwrap();
    assert_eq!(d.labels.get("team").map(String::as_str), Some(""));
    env.provider.start(&booted).await.unwrap();
    assert_eq!(
        env.sh(&booted, "cat /data/project/link").await,
        "on-volume\n",
        "symlinks survive the archive copy"
    );
    assert_eq!(
        env.sh(&booted, "stat -c '%a %u' /data/project/suid").await,
        "755 0\n",
        "setuid never survives a capture"
    );

    // A capture path below a directory: only that subtree, under a scaffolded parent.
    templates
        .commit(&commit(&["/data/project/sub"]))
        .await
        .unwrap();
    let rebooted = env.name("boot2");
    let mut request = env.request(&rebooted);
    request.template = Some(id.clone());
    env.provider.create(&request).await.unwrap();
    env.provider.start(&rebooted).await.unwrap();
    assert_eq!(env.sh(&rebooted, "ls /data/project").await, "sub\n");
}

#[tokio::test]
async fn template_ids_are_validated() {
    let env = TestEnv::new("tmplabsent").await;
    let templates = env.provider.templates().unwrap();
    assert!(matches!(
        templates.get_template("Not A Valid Id").await,
        Err(e) if e.is(ErrorKind::Invalid)
    ));
    // Sharing through a store is the templates service's (tests/template_restore.rs).
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
        let n = count(&env, &name).await;
        (n >= 3).then_some(()).ok_or(format!("count {n}"))
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
        let n = count(&env, &name).await;
        (n > frozen_at).then_some(()).ok_or(format!("count {n}"))
    })
    .await;
    assert_eq!(restarts_in_log(&env, &name).await, 1, "never restarted");
    assert_eq!(pid1_start(&env, &name).await, start_before, "same pid 1");
}

#[tokio::test]
async fn a_paused_sandbox_stops_promptly_and_a_stopped_one_cannot_sleep() {
    let env = TestEnv::new("sleepwake").await;
    let name = env.name("sbx");
    env.provider.create(&env.request(&name)).await.unwrap();
    env.provider.start(&name).await.unwrap();
    env.provider.sleep(&name).await.unwrap();
    assert_eq!(
        raw_inspect(&name)
            .await
            .state
            .unwrap()
            .status
            .unwrap()
            .to_string(),
        "paused"
    );
    // Thawed first, so the main process sees SIGTERM instead of waiting for SIGKILL.
    let t = Instant::now();
    env.provider.stop(&name).await.unwrap();
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    assert!(matches!(
        env.provider.sleep(&name).await,
        Err(e) if e.is(ErrorKind::Conflict)
    ));
}

#[tokio::test]
async fn set_resources_is_docker_update_with_swap_moving_with_memory() {
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
    res.set_resources(
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
    let host = raw_inspect(&name).await.host_config.unwrap();
    assert_eq!(host.memory, Some(128 << 20));
    assert_eq!(host.memory_swap, Some(128 << 20), "swap moves with memory");
    assert_eq!(host.nano_cpus, Some(250_000_000));
    assert_eq!(host.pids_limit, Some(50));
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
        Some(128 << 20),
        "a refused change changes nothing in the engine"
    );
}

#[tokio::test]
async fn no_egress_is_network_mode_none_and_domains_are_refused_by_name() {
    let env = TestEnv::new("egress").await;
    let name = env.name("sbx");
    let mut request = env.request(&name);
    request.allowed_domains = Some(vec!["example.com".into()]);
    let err = env.provider.create(&request).await.unwrap_err();
    assert!(
        err.is(ErrorKind::Unsupported) && err.message().contains("cannot filter egress by domain"),
        "{err}"
    );
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
    // Port-forward reaches a port through the sandbox's network: without one, it says so.
    let forward = env.provider.port_forward().expect("Docker forwards ports");
    let err = match forward.connect(&name, 8080).await {
        Ok(_) => panic!("a port of a sandbox without a network was reached"),
        Err(e) => e,
    };
    assert!(
        err.is(ErrorKind::Unsupported) && err.message().contains("no network address"),
        "{err}"
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
