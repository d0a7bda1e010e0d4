//! What a test process leaves on the Docker engine when it does not end in an orderly way:
//! every double labels its containers with the process's pid, `tests/cluster/gc.sh` removes
//! those of exited processes (and only those), and a dropped double removes its own.
//! Run with `cargo test -p sandbox-doubles --test leftovers`.

use std::process::{Command, Output};

use reqwest::StatusCode;
use sandbox_doubles::pid_label::TEST_PID_LABEL;
use sandbox_doubles::sprites::{self, SpritesOptions};
use sandbox_doubles::{e2b, fly};
use serde_json::{Value, json};

const IMAGE: &str = "sandbox-operator/base:bookworm";

fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .output()
        .expect("the docker CLI runs")
}

/// The value of `key` on container or volume `name`; `None` when the object is absent.
fn label(kind: &str, name: &str, key: &str) -> Option<String> {
    let format = match kind {
        "volume" => format!("{{{{index .Labels \"{key}\"}}}}"),
        _ => format!("{{{{index .Config.Labels \"{key}\"}}}}"),
    };
    let out = docker(&[kind, "inspect", "--format", &format, name]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn exists(kind: &str, name: &str) -> bool {
    label(kind, name, TEST_PID_LABEL).is_some()
}

/// The pid of a process that has exited (and been reaped).
fn exited_pid() -> String {
    let mut child = Command::new("true").spawn().expect("spawn true");
    child.wait().expect("wait for true");
    child.id().to_string()
}

/// Removes this test's containers and volumes however it ends.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for suffix in ["dead", "live", "unlabelled"] {
            let name = format!("{}-{suffix}", self.0);
            docker(&["rm", "-f", "-v", &name]);
            docker(&["volume", "rm", "-f", &name]);
        }
    }
}

fn create(kind: &str, name: &str, pid: Option<&str>) {
    let label = pid.map(|p| format!("{TEST_PID_LABEL}={p}"));
    let mut args = vec![kind, "create"];
    if kind == "container" {
        args.extend(["--name", name]);
    }
    if let Some(label) = &label {
        args.extend(["--label", label]);
    }
    args.push(if kind == "container" { IMAGE } else { name });
    let out = docker(&args);
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn gc_removes_the_containers_and_volumes_of_exited_processes_only() {
    let run = format!("gc-test-{:012x}", fastrand::u64(..) >> 16);
    let _cleanup = Cleanup(run.clone());
    let dead_pid = exited_pid();
    let live_pid = std::process::id().to_string();
    let [dead, live, unlabelled] = ["dead", "live", "unlabelled"].map(|s| format!("{run}-{s}"));
    create("container", &dead, Some(&dead_pid));
    create("container", &live, Some(&live_pid));
    create("container", &unlabelled, None);
    create("volume", &dead, Some(&dead_pid));
    create("volume", &live, Some(&live_pid));
    create("volume", &unlabelled, None);

    // The checkout's own script, read at run time: a test binary reused by another checkout
    // (a shared target directory whose fingerprint matched) would name the first one's.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR");
    let gc = Command::new("bash")
        .arg(format!("{manifest}/../cluster/gc.sh"))
        .output()
        .expect("gc.sh runs");
    let log = String::from_utf8_lossy(&gc.stderr);
    assert!(gc.status.success(), "gc.sh failed: {log}");

    for kind in ["container", "volume"] {
        assert!(
            !exists(kind, &dead),
            "{kind} of pid {dead_pid} (exited) removed: {log}"
        );
        assert_eq!(
            label(kind, &live, TEST_PID_LABEL).as_deref(),
            Some(live_pid.as_str()),
            "{kind} of a running process kept"
        );
        assert_eq!(
            label(kind, &unlabelled, TEST_PID_LABEL).as_deref(),
            Some(""),
            "{kind} without the label kept"
        );
    }
}

fn own_pid() -> Option<String> {
    Some(std::process::id().to_string())
}

/// POSTs `body` as JSON to `url` with `auth` and returns the status and the JSON reply.
async fn post(url: String, auth: (&str, &str), body: Value) -> (StatusCode, Value) {
    let reply = reqwest::Client::new()
        .post(url)
        .header(auth.0, auth.1)
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = reply.status();
    (status, reply.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_fly_double_labels_its_containers_and_volumes_and_removes_them_when_dropped() {
    let double = fly::spawn(fly::FlyDoubleOptions::default())
        .await
        .expect("double");
    let base = format!("{}/v1/apps/{}", double.base_url(), double.app());
    let bearer = format!("Bearer {}", double.token());
    let auth = ("authorization", bearer.as_str());
    let (status, vol) = post(format!("{base}/volumes"), auth, json!({"name": "data"})).await;
    assert_eq!(status, StatusCode::OK, "{vol}");
    let (status, machine) = post(
        format!("{base}/machines"),
        auth,
        json!({"config": {"image": IMAGE, "init": {"exec": ["sleep", "infinity"]}},
               "skip_launch": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{machine}");
    let container = double
        .container_name(machine["id"].as_str().expect("id"))
        .expect("the machine's container");
    let volume = double
        .docker_volume(vol["id"].as_str().expect("id"))
        .expect("the volume's Docker volume");
    assert_eq!(label("container", &container, TEST_PID_LABEL), own_pid());
    assert_eq!(label("volume", &volume, TEST_PID_LABEL), own_pid());
    drop(double);
    assert!(
        !exists("container", &container),
        "container removed on drop"
    );
    assert!(!exists("volume", &volume), "volume removed on drop");
}

#[tokio::test]
async fn an_e2b_double_labels_its_containers_and_removes_them_when_dropped() {
    let double = e2b::spawn(e2b::E2bDoubleOptions::default())
        .await
        .expect("double");
    let (status, created) = post(
        format!("{}/sandboxes", double.api_url()),
        ("x-api-key", double.api_key()),
        json!({"templateID": "base", "timeout": 60}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["sandboxID"].as_str().expect("id");
    let container = double.sandbox(id).await.expect("held").container;
    assert_eq!(label("container", &container, TEST_PID_LABEL), own_pid());
    drop(double);
    assert!(
        !exists("container", &container),
        "container removed on drop"
    );
}

#[tokio::test]
async fn a_sprites_double_labels_its_containers_and_removes_them_when_dropped() {
    let double = sprites::spawn(SpritesOptions::new(IMAGE)).await;
    let created = reqwest::Client::new()
        .post(format!("{}/v1/sprites", double.base_url))
        .bearer_auth(&double.token)
        .json(&json!({"name": "leftover"}))
        .send()
        .await
        .expect("create");
    assert_eq!(created.status(), StatusCode::CREATED);
    let container = format!("{}-leftover", double.tag());
    assert_eq!(label("container", &container, TEST_PID_LABEL), own_pid());
    drop(double);
    assert!(
        !exists("container", &container),
        "a double dropped without shutdown (a panicking test) removes its containers"
    );
}
