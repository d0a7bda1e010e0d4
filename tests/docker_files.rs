//! Integration tests of the Docker provider's exec, file, bulk, capacity, egress and event
//! capabilities against a real engine.
//!
//! Self-contained: containers are set up directly with bollard (not through the provider's
//! own create), each test uses unique names and removes what it made through a guard, and
//! nothing waits by sleeping — anything asynchronous is polled against a deadline.
//!
//! Needs a Docker engine at the default socket (or `DOCKER_HOST`) and the base image
//! (`SANDBOX_BASE_IMAGE`, default `sandbox-operator/base:bookworm`; see tests/setup).

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, VolumeCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder, RemoveVolumeOptionsBuilder,
    StopContainerOptionsBuilder,
};
use futures::StreamExt;
use sha2::{Digest, Sha256};

use sandbox_operator::provider::ErrorKind;
use sandbox_operator::provider::docker::{DockerProvider, DockerSettings};
use sandbox_operator::provider::labels::Owner;
use sandbox_operator::provider::{
    BulkFiles, CapacityProbe, Egress, EgressState, EntryKind, ExecOutput, ExecRequest, Files,
    Provider, ProviderError, ProviderEvents,
};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn base_image() -> String {
    std::env::var("SANDBOX_BASE_IMAGE").unwrap_or_else(|_| "sandbox-operator/base:bookworm".into())
}

/// A name no other test (or earlier run) uses.
fn unique(what: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "sbxtest-files-{what}-{}-{}-{nanos:x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

async fn raw() -> Docker {
    Docker::connect_with_defaults()
        .expect("docker client")
        .negotiate_version()
        .await
        .expect("the Docker engine must be reachable for these tests")
}

async fn provider() -> DockerProvider {
    DockerProvider::connect_negotiated("docker", DockerSettings::default())
        .await
        .expect("provider connects to the local engine")
}

/// Removes a container (and its anonymous volumes) when dropped, even when the test panics.
struct ContainerGuard(String);

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        let name = self.0.clone();
        // A fresh runtime on a fresh thread: Drop may run inside (or outside) a runtime.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let docker = raw().await;
                let _ = docker
                    .remove_container(
                        &name,
                        Some(
                            RemoveContainerOptionsBuilder::default()
                                .force(true)
                                .v(true)
                                .build(),
                        ),
                    )
                    .await;
            });
        })
        .join();
    }
}

/// Removes a volume when dropped.
struct VolumeGuard(String);

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        let name = self.0.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let docker = raw().await;
                let _ = docker
                    .remove_volume(
                        &name,
                        Some(RemoveVolumeOptionsBuilder::default().force(true).build()),
                    )
                    .await;
            });
        })
        .join();
    }
}

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

/// Creates (and by default starts) a container of the base image running `sleep infinity`.
async fn container(what: &str, spec: Spec) -> (String, ContainerGuard) {
    let docker = raw().await;
    let name = unique(what);
    let guard = ContainerGuard(name.clone());
    let body = ContainerCreateBody {
        image: Some(base_image()),
        cmd: Some(vec!["sleep".into(), "infinity".into()]),
        labels: Some(spec.labels),
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
    raw()
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

fn sha256_hex(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

/// Deterministic pseudo-random bytes (xorshift64*), so a failure is reproducible.
fn random_bytes(len: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        out.extend_from_slice(&seed.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A raw tar header with any name (the tar crate refuses to write hostile ones).
fn raw_entry(
    out: &mut Vec<u8>,
    name: &str,
    kind: tar::EntryType,
    mode: u32,
    uid: u64,
    data: &[u8],
) {
    let mut h = tar::Header::new_old();
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(uid);
    h.set_gid(uid);
    h.set_mtime(1_700_000_000);
    h.set_size(data.len() as u64);
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out.extend(std::iter::repeat_n(0u8, (512 - data.len() % 512) % 512));
}

fn end_archive(mut out: Vec<u8>) -> Vec<u8> {
    out.extend(std::iter::repeat_n(0u8, 1024));
    out
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
// the seam
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn every_capability_is_offered_through_the_provider_seam() {
    let p = provider().await;
    let (id, _g) = container("seam", Spec::default()).await;
    let seam: &dyn Provider = &p;
    let files = seam.files().expect("files capability");
    files
        .write_file(&id, "/tmp/seam", b"via dyn", 0o644)
        .await
        .unwrap();
    assert_eq!(files.read_file(&id, "/tmp/seam").await.unwrap(), b"via dyn");
    assert!(seam.bulk_files().is_some(), "bulk files capability");
    assert!(seam.capacity().is_some(), "capacity capability");
    assert!(seam.events().is_some(), "events capability");
    let egress = seam.egress().expect("egress capability");
    assert_eq!(
        egress.egress_verdict(&id).await.unwrap().state,
        EgressState::Open
    );
}

// ---------------------------------------------------------------------------------------------
// exec
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn exec_returns_stdout_stderr_and_a_nonzero_exit_as_data() {
    let p = provider().await;
    let (id, _g) = container("exec", Spec::default()).await;

    let out = sh(&p, &id, "printf 'to out'; printf 'to err' >&2; exit 3").await;
    assert_eq!(out.stdout, b"to out");
    assert_eq!(out.stderr, b"to err");
    assert_eq!(
        out.exit_code, 3,
        "a non-zero exit is returned as data, not an error"
    );

    // argv crosses without re-parsing; cwd and env apply to this command only.
    let request = ExecRequest {
        argv: vec![
            "sh".into(),
            "-c".into(),
            "pwd; printf '%s|%s' \"$GREETING\" \"$1\"".into(),
            "argv0".into(),
            "a b;c".into(),
        ],
        cwd: Some("/tmp".into()),
        env: BTreeMap::from([("GREETING".to_string(), "hello world".to_string())]),
        timeout: Duration::from_secs(30),
    };
    let out = p.exec(&id, &request).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "/tmp\nhello world|a b;c"
    );
    assert_eq!(out.exit_code, 0);

    // A program that does not exist is an exit code too (126/127), not a provider error.
    let out = p
        .exec(
            &id,
            &ExecRequest {
                argv: vec!["no-such-program".into()],
                cwd: None,
                env: BTreeMap::new(),
                timeout: Duration::from_secs(30),
            },
        )
        .await
        .unwrap();
    assert!(matches!(out.exit_code, 126 | 127), "exit {}", out.exit_code);
}

#[tokio::test]
async fn exec_timeout_is_transient_and_returns_within_its_bound() {
    let p = provider().await;
    let (id, _g) = container("exec-timeout", Spec::default()).await;
    let started = Instant::now();
    let err = p
        .exec(&id, &ExecRequest::shell("sleep 30", Duration::from_secs(1)))
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert!(err.is(ErrorKind::Transient), "{err:?}");
    assert!(
        err.message().contains("timeout") && err.message().contains("sleep 30"),
        "{err}"
    );
    assert!(
        elapsed < Duration::from_secs(10),
        "took {elapsed:?} for a 1 s bound"
    );
}

#[tokio::test]
async fn exec_in_an_absent_sandbox_is_not_found_and_in_a_stopped_one_conflict() {
    let p = provider().await;
    let err = p
        .exec(
            &unique("absent"),
            &ExecRequest::shell("true", Duration::from_secs(10)),
        )
        .await
        .unwrap_err();
    assert!(err.is(ErrorKind::NotFound), "{err:?}");

    let (id, _g) = container(
        "exec-stopped",
        Spec {
            start: false,
            ..Default::default()
        },
    )
    .await;
    let err = p
        .exec(&id, &ExecRequest::shell("true", Duration::from_secs(10)))
        .await
        .unwrap_err();
    assert!(err.is(ErrorKind::Conflict), "{err:?}");
    assert!(err.message().contains("not running"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// files
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn reading_an_absent_file_is_not_found_never_empty_bytes() {
    let p = provider().await;
    let (id, _g) = container("read-absent", Spec::default()).await;
    let err = p.read_file(&id, "/no/such/file").await.unwrap_err();
    assert!(err.is(ErrorKind::NotFound), "{err:?}");
    let err = p.read_file(&id, "/etc").await.unwrap_err();
    assert!(
        err.is(ErrorKind::Invalid),
        "a directory is not a file: {err:?}"
    );
    let err = p.read_file(&id, "relative/path").await.unwrap_err();
    assert!(err.is(ErrorKind::Invalid), "{err:?}");
    let err = p
        .read_file(&unique("gone"), "/etc/hostname")
        .await
        .unwrap_err();
    assert!(err.is(ErrorKind::NotFound), "{err:?}");
    // An empty file is empty bytes — the only way to get them.
    sh_ok(&p, &id, ": > /tmp/empty").await;
    assert_eq!(
        p.read_file(&id, "/tmp/empty").await.unwrap(),
        Vec::<u8>::new()
    );
}

#[tokio::test]
async fn bytes_cross_unchanged_both_ways() {
    let p = provider().await;
    let (id, _g) = container("bytes", Spec::default()).await;
    let all_bytes: Vec<u8> = (0..=255u8).collect();
    let blob = random_bytes(1024 * 1024, 0x5eed);
    let text = b"\xEF\xBB\xBFline one\r\nline two\r\n\r\nno newline at end".to_vec();
    for (path, data) in [
        ("/tmp/bytes/all.bin", &all_bytes),
        ("/tmp/bytes/blob.bin", &blob),
        ("/tmp/bytes/crlf-bom.txt", &text),
    ] {
        p.write_file(&id, path, data, 0o644).await.unwrap();
        let back = p.read_file(&id, path).await.unwrap();
        assert_eq!(back.len(), data.len(), "{path}: length");
        assert!(back == *data, "{path}: bytes changed on the way");
        // Independently of our own read: the bytes inside the sandbox are the bytes sent.
        let inside = sh_ok(&p, &id, &format!("sha256sum {path} | cut -d' ' -f1")).await;
        assert_eq!(inside, sha256_hex(data), "{path}: bytes inside the sandbox");
    }
    // Written in the sandbox, read out exactly.
    sh_ok(
        &p,
        &id,
        "printf '\\000\\001\\377\\r\\n' > /tmp/bytes/from-inside",
    )
    .await;
    assert_eq!(
        p.read_file(&id, "/tmp/bytes/from-inside").await.unwrap(),
        b"\x00\x01\xff\r\n"
    );
}

#[tokio::test]
async fn write_creates_parents_replaces_whole_files_and_leaves_existing_dirs_alone() {
    let p = provider().await;
    let (id, _g) = container("write", Spec::default()).await;
    let path = "/srv/new/deeper/still/file.txt";
    p.write_file(&id, path, b"a long first version of the file", 0o640)
        .await
        .unwrap();
    p.write_file(&id, path, b"short", 0o640).await.unwrap();
    assert_eq!(
        p.read_file(&id, path).await.unwrap(),
        b"short",
        "replaced, not appended or overlaid"
    );
    assert_eq!(
        sh_ok(&p, &id, "stat -c '%a %u:%g' /srv/new /srv/new/deeper /srv/new/deeper/still /srv/new/deeper/still/file.txt").await,
        "755 0:0\n755 0:0\n755 0:0\n640 0:0"
    );
    // Writing into an existing directory does not touch that directory's mode.
    p.write_file(&id, "/tmp/x", b"x", 0o644).await.unwrap();
    assert_eq!(sh_ok(&p, &id, "stat -c %a /tmp").await, "1777");
    // Through a symlinked parent.
    sh_ok(&p, &id, "mkdir -p /real && ln -s /real /alias").await;
    p.write_file(&id, "/alias/via-link", b"linked", 0o644)
        .await
        .unwrap();
    assert_eq!(sh_ok(&p, &id, "cat /real/via-link").await, "linked");
    assert_eq!(
        p.read_file(&id, "/alias/via-link").await.unwrap(),
        b"linked"
    );
}

#[tokio::test]
async fn write_never_sets_setuid_and_never_replaces_a_directory() {
    let p = provider().await;
    let (id, _g) = container("write-mode", Spec::default()).await;
    p.write_file(&id, "/tmp/tool", b"#!/bin/sh\n", 0o4755)
        .await
        .unwrap();
    p.write_file(&id, "/tmp/tool2", b"#!/bin/sh\n", 0o2775)
        .await
        .unwrap();
    assert_eq!(
        sh_ok(&p, &id, "stat -c '%a %u' /tmp/tool /tmp/tool2").await,
        "755 0\n775 0"
    );

    sh_ok(
        &p,
        &id,
        "mkdir -p /tmp/dir/inner && echo keep > /tmp/dir/inner/f",
    )
    .await;
    let err = p
        .write_file(&id, "/tmp/dir", b"clobber", 0o644)
        .await
        .unwrap_err();
    assert!(err.is(ErrorKind::Invalid), "{err:?}");
    assert_eq!(sh_ok(&p, &id, "cat /tmp/dir/inner/f").await, "keep");
    // A parent that is a file.
    let err = p
        .write_file(&id, "/tmp/tool/child", b"x", 0o644)
        .await
        .unwrap_err();
    assert!(err.is(ErrorKind::Invalid), "{err:?}");
    let err = p.write_file(&id, "/", b"x", 0o644).await.unwrap_err();
    assert!(err.is(ErrorKind::Invalid), "{err:?}");
}

#[tokio::test]
async fn list_dir_is_one_level_exact_and_rejects_what_is_absent() {
    let p = provider().await;
    let (id, _g) = container("list", Spec::default()).await;
    p.write_file(&id, "/data/a.txt", b"12345", 0o644)
        .await
        .unwrap();
    p.write_file(&id, "/data/sub/deep.txt", b"x", 0o644)
        .await
        .unwrap();
    sh_ok(&p, &id, "ln -s /etc/hostname /data/link && touch \"/data/$(printf 'new\\nline\\ttab')\" && mkdir /empty").await;

    let listed = p.list_dir(&id, "/data").await.unwrap();
    let names: Vec<&str> = listed.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        ["a.txt", "link", "new\nline\ttab", "sub"],
        "one level, names only, exact"
    );
    let a = &listed[0];
    assert_eq!((a.kind, a.size), (EntryKind::File, Some(5)));
    assert_eq!(listed[1].kind, EntryKind::Symlink);
    assert_eq!(listed[1].symlink_target.as_deref(), Some("/etc/hostname"));
    assert_eq!(listed[3].kind, EntryKind::Directory);

    assert_eq!(
        p.list_dir(&id, "/empty").await.unwrap(),
        vec![],
        "exists and is empty"
    );
    let err = p.list_dir(&id, "/no/such/dir").await.unwrap_err();
    assert!(err.is(ErrorKind::NotFound), "{err:?}");
    let err = p.list_dir(&id, "/data/a.txt").await.unwrap_err();
    assert!(err.is(ErrorKind::Invalid), "{err:?}");
    let root: Vec<String> = p
        .list_dir(&id, "/")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    for expected in ["etc", "tmp", "data", "empty"] {
        assert!(
            root.iter().any(|n| n == expected),
            "/ lists {expected}: {root:?}"
        );
    }
    assert!(
        root.iter().all(|n| !n.contains('/')),
        "names, never paths: {root:?}"
    );

    // A stopped sandbox is listed from its archive, with the same answer.
    stop(&id).await;
    let stopped = p.list_dir(&id, "/data").await.unwrap();
    assert_eq!(stopped, listed, "archive fallback agrees with find");
    assert_eq!(p.list_dir(&id, "/empty").await.unwrap(), vec![]);
    let err = p.list_dir(&id, "/no/such/dir").await.unwrap_err();
    assert!(err.is(ErrorKind::NotFound), "{err:?}");
}

#[tokio::test]
async fn files_work_on_a_stopped_sandbox_and_delete_needs_a_running_one() {
    let p = provider().await;
    let (id, _g) = container(
        "stopped-files",
        Spec {
            start: false,
            ..Default::default()
        },
    )
    .await;
    p.write_file(&id, "/opt/cold/file", b"written while stopped", 0o600)
        .await
        .unwrap();
    assert_eq!(
        p.read_file(&id, "/opt/cold/file").await.unwrap(),
        b"written while stopped"
    );
    let err = p.delete_path(&id, "/opt/cold/file").await.unwrap_err();
    assert!(err.is(ErrorKind::Conflict), "{err:?}");

    raw().await.start_container(&id, None).await.unwrap();
    p.delete_path(&id, "/opt/cold/file").await.unwrap();
    let err = p.read_file(&id, "/opt/cold/file").await.unwrap_err();
    assert!(err.is(ErrorKind::NotFound), "{err:?}");
    // Trees, absent paths (success) and "/" (refused).
    p.write_file(&id, "/opt/tree/a/b/c", b"x", 0o644)
        .await
        .unwrap();
    p.delete_path(&id, "/opt/tree").await.unwrap();
    assert!(matches!(
        p.list_dir(&id, "/opt/tree").await,
        Err(e) if e.is(ErrorKind::NotFound)
    ));
    p.delete_path(&id, "/opt/never-existed").await.unwrap();
    for bad in ["/", "//", "/opt/.."] {
        let err = p.delete_path(&id, bad).await.unwrap_err();
        assert!(err.is(ErrorKind::Invalid), "{bad}: {err:?}");
    }
    assert_eq!(sh_ok(&p, &id, "test -d /etc && echo alive").await, "alive");
}

// ---------------------------------------------------------------------------------------------
// bulk
// ---------------------------------------------------------------------------------------------

async fn collect(p: &DockerProvider, id: &str, path: &str) -> Vec<u8> {
    let mut stream = p.export(id, path).await.unwrap();
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    out
}

fn tar_listing(archive: &[u8]) -> BTreeMap<String, (tar::EntryType, Vec<u8>)> {
    let mut ar = tar::Archive::new(archive);
    ar.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            (
                String::from_utf8(e.path_bytes().into_owned()).unwrap(),
                (e.header().entry_type(), data),
            )
        })
        .collect()
}

#[tokio::test]
async fn export_is_rooted_at_the_last_segment_and_import_is_its_inverse() {
    let p = provider().await;
    let (id, _g) = container("export", Spec::default()).await;
    let blob = random_bytes(300_000, 7);
    p.write_file(&id, "/workspace/app/src/main.rs", b"fn main() {}\n", 0o644)
        .await
        .unwrap();
    p.write_file(&id, "/workspace/app/data.bin", &blob, 0o600)
        .await
        .unwrap();

    let archive = collect(&p, &id, "/workspace/app").await;
    let listing = tar_listing(&archive);
    assert!(
        listing.keys().all(|k| k == "app/" || k.starts_with("app/")),
        "rooted at app/: {:?}",
        listing.keys()
    );
    assert_eq!(listing["app/src/main.rs"].1, b"fn main() {}\n");
    assert!(listing["app/data.bin"].1 == blob);

    // The inverse: import(dirname(path)) into another sandbox reproduces the tree.
    let (other, _g2) = container("import-target", Spec::default()).await;
    p.import(&other, "/workspace", archive).await.unwrap();
    assert_eq!(
        p.read_file(&other, "/workspace/app/src/main.rs")
            .await
            .unwrap(),
        b"fn main() {}\n"
    );
    assert!(
        p.read_file(&other, "/workspace/app/data.bin")
            .await
            .unwrap()
            == blob
    );

    let err = p.export(&id, "/").await.err().unwrap();
    assert!(err.is(ErrorKind::Invalid), "{err:?}");
    let err = p.export(&id, "/workspace/none").await.err().unwrap();
    assert!(err.is(ErrorKind::NotFound), "{err:?}");
}

#[tokio::test]
async fn import_never_restores_setuid_or_ownership_and_refuses_escapes() {
    let p = provider().await;
    let (id, _g) = container("import", Spec::default()).await;

    let mut a = Vec::new();
    raw_entry(&mut a, "bin/", tar::EntryType::Directory, 0o6777, 1234, b"");
    raw_entry(
        &mut a,
        "bin/escalate",
        tar::EntryType::Regular,
        0o4755,
        1234,
        b"#!/bin/sh\nid\n",
    );
    raw_entry(
        &mut a,
        "bin/group",
        tar::EntryType::Regular,
        0o2755,
        1234,
        b"g",
    );
    raw_entry(&mut a, "dev-node", tar::EntryType::Char, 0o666, 0, b"");
    p.import(&id, "/imported/here", end_archive(a))
        .await
        .unwrap();
    assert_eq!(
        sh_ok(&p, &id, "stat -c '%a %u:%g' /imported/here/bin /imported/here/bin/escalate /imported/here/bin/group").await,
        "777 0:0\n755 0:0\n755 0:0"
    );
    assert_eq!(
        sh_ok(
            &p,
            &id,
            "test -e /imported/here/dev-node && echo present || echo absent"
        )
        .await,
        "absent"
    );

    for (hostile, name) in [("../escape", "escape"), ("/abs-escape", "abs-escape")] {
        let mut a = Vec::new();
        raw_entry(
            &mut a,
            "fine.txt",
            tar::EntryType::Regular,
            0o644,
            0,
            b"fine",
        );
        raw_entry(&mut a, hostile, tar::EntryType::Regular, 0o644, 0, b"evil");
        let err = p.import(&id, "/target", end_archive(a)).await.unwrap_err();
        assert!(err.is(ErrorKind::Invalid), "{hostile}: {err:?}");
        // Refused whole: nothing landed, not even the harmless member before it.
        assert_eq!(
            sh_ok(
                &p,
                &id,
                &format!("ls /{name} /target/fine.txt 2>/dev/null | wc -l")
            )
            .await,
            "0",
            "{hostile}"
        );
    }
    // Symlink, then write through it.
    let mut a = Vec::new();
    let mut link = tar::Header::new_gnu();
    link.set_entry_type(tar::EntryType::Symlink);
    link.set_size(0);
    let mut b = tar::Builder::new(Vec::new());
    b.append_link(&mut link, "etc-link", "/etc").unwrap();
    a.extend_from_slice(&b.into_inner().unwrap()[..512]);
    raw_entry(
        &mut a,
        "etc-link/evil.conf",
        tar::EntryType::Regular,
        0o644,
        0,
        b"evil",
    );
    let err = p.import(&id, "/target2", end_archive(a)).await.unwrap_err();
    assert!(err.is(ErrorKind::Invalid), "{err:?}");
    assert_eq!(
        sh_ok(
            &p,
            &id,
            "test -e /etc/evil.conf && echo present || echo absent"
        )
        .await,
        "absent"
    );
}

// ---------------------------------------------------------------------------------------------
// capacity
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn capacity_of_the_local_engine_is_measured() {
    let p = provider().await;
    let c = CapacityProbe::capacity(&p).await.unwrap();
    assert!(c.disk_bytes.is_some_and(|b| b > 0), "{c:?}");
    assert!(c.inodes.is_some_and(|i| i > 0), "{c:?}");
    assert!(c.memory_bytes.is_some_and(|m| m > 0), "{c:?}");
    assert_eq!(c.admits, None);
    assert!(c.detail.contains("measured"), "{c:?}");
}

#[tokio::test]
async fn capacity_of_an_unreachable_engine_is_an_error_not_zeros() {
    let p = DockerProvider::connect(
        "docker",
        DockerSettings {
            endpoint: Some("tcp://127.0.0.1:1".into()),
            ..Default::default()
        },
    )
    .unwrap();
    let err = CapacityProbe::capacity(&p).await.unwrap_err();
    assert!(err.is(ErrorKind::Transient), "{err:?}");
}

// ---------------------------------------------------------------------------------------------
// egress
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn egress_verdicts_are_observations() {
    let p = provider().await;
    let (none, _g1) = container(
        "egress-none",
        Spec {
            network_mode: Some("none"),
            ..Default::default()
        },
    )
    .await;
    let (bridged, _g2) = container("egress-bridge", Spec::default()).await;
    let (stopped, _g3) = container(
        "egress-stopped",
        Spec {
            network_mode: Some("none"),
            start: false,
            ..Default::default()
        },
    )
    .await;

    let v = p.egress_verdict(&none).await.unwrap();
    assert_eq!(v.state, EgressState::Filtered, "{v:?}");
    assert!(v.detail.contains("loopback"), "{v:?}");
    assert_eq!(v.remediation, None);

    let v = p.egress_verdict(&bridged).await.unwrap();
    assert_eq!(v.state, EgressState::Open, "{v:?}");
    assert!(
        v.remediation
            .as_deref()
            .is_some_and(|r| r.contains("allowedDomains")),
        "{v:?}"
    );

    let v = p.egress_verdict(&stopped).await.unwrap();
    assert_eq!(
        v.state,
        EgressState::Inconclusive,
        "a stopped sandbox cannot be observed: {v:?}"
    );

    let err = p.egress_verdict(&unique("absent")).await.unwrap_err();
    assert!(err.is(ErrorKind::NotFound), "{err:?}");
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
    let p = provider().await;
    let docker = raw().await;
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
    let _vg = VolumeGuard(volume.clone());
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
