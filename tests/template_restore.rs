//! Templates through the shared S3 store and the controller-side templates service, against
//! the real Docker engine, the real SigV4 S3 server (tests/setup/s3.sh) and the real GNU tar
//! 1.34 of the base image:
//!
//! - capture → publish → fetch (on a second provider instance) → boot keeps file contents
//!   and modes, and drops ownership and setuid/setgid; the fetched template carries the
//!   fetching owner's labels;
//! - on a provider WITHOUT native templates (Docker with its `templates()` hidden), capture
//!   goes over exec into the store, and a sandbox boots the manifest's base image and gets
//!   the archive restored after start;
//! - the restore is the security boundary: hostile archives are refused or neutralised and
//!   nothing lands outside the capture paths — checked inside the restoring container itself;
//! - a fetch whose restore is refused leaves no container and tags no image;
//! - a failed store lookup is an error, an absent template is `None` and makes nothing;
//! - the time to boot from a template next to the time to build the same state from scratch.

mod harness;

use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::docker::TestEnv;
use harness::no_native_templates::NoNativeTemplates;
use harness::s3::PurgePrefix;
use harness::unique;
use sandbox_operator::provider::ErrorKind;
use sandbox_operator::provider::docker::{DockerProvider, DockerSettings};
use sandbox_operator::provider::{CommitRequest, ExecRequest, Provider, Templates};
use sandbox_operator::templates::manifest::{Keys, MANIFEST_SCHEMA, Manifest, ManifestOwner};
use sandbox_operator::templates::service::{Boot, TemplateService};
use sandbox_operator::templates::store::TemplateStore;
use sandbox_operator::templates::transfer::{self, Limits};

const APP: &str = "/workspace/app";

/// A store under a prefix of its own; `secret` overrides the secret key (a wrong one makes
/// every request fail its signature check).
fn store(prefix: &str, secret: Option<&str>) -> Arc<TemplateStore> {
    Arc::new(harness::s3::store(prefix, secret))
}

fn limits() -> Limits {
    Limits {
        transfer: Duration::from_secs(300),
        ..Limits::default()
    }
}

/// The templates service with `store` (when given) assigned to the test env's provider and
/// to [`other_host`].
fn service(store: Option<Arc<TemplateStore>>) -> TemplateService {
    let mut service = TemplateService::new(limits());
    if let Some(store) = store {
        let name = store.settings().name.clone();
        service.add_store(store);
        for provider in ["docker-test", "docker-other"] {
            service.assign(provider, &name);
        }
    }
    service
}

/// A second provider instance on the same engine, standing in for another host: its own
/// template repository, so its templates are not the first one's images.
async fn other_host() -> DockerProvider {
    DockerProvider::connect_negotiated(
        "docker-other",
        harness::s3::reaching_store(DockerSettings {
            default_image: Some(harness::docker::base_image()),
            template_repository: unique("sandbox-operator/template-other"),
            ..Default::default()
        }),
    )
    .await
    .expect("engine")
}

/// Removes images by reference when dropped (templates fetched without an owner carry no
/// instance label, so the TestEnv's cleanup does not see them).
struct Images(Vec<String>);

impl Drop for Images {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let _ = Command::new("docker")
                .args(["rmi", "-f"])
                .args(&self.0)
                .output();
        }
    }
}

fn image_exists(reference: &str) -> bool {
    Command::new("docker")
        .args(["image", "inspect", reference])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Containers (any state) whose name contains `needle`.
fn containers_named(needle: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args(["ps", "-a", "--format", "{{.Names}}"])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|n| n.contains(needle))
        .map(str::to_string)
        .collect()
}

async fn run(env: &TestEnv, id: &str, script: &str) -> (i64, String, String) {
    let out = env
        .provider
        .exec(id, &ExecRequest::shell(script, Duration::from_secs(120)))
        .await
        .unwrap_or_else(|e| panic!("exec {script:?}: {e}"));
    (
        out.exit_code,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn started(env: &TestEnv, prefix: &str) -> String {
    let name = env.name(prefix);
    env.provider
        .create(&env.request(&name))
        .await
        .expect("create");
    env.provider.start(&name).await.expect("start");
    name
}

// ---- hostile archives -----------------------------------------------------------------

/// One tar member, written header by header: the `tar` crate's builder refuses `..` and
/// absolute names itself, and a hostile archive is exactly what it would refuse to write.
struct Member {
    name: &'static str,
    kind: tar::EntryType,
    mode: u32,
    data: &'static [u8],
    link: &'static str,
}

fn file(name: &'static str, data: &'static [u8]) -> Member {
    Member {
        name,
        kind: tar::EntryType::Regular,
        mode: 0o644,
        data,
        link: "",
    }
}

fn dir(name: &'static str) -> Member {
    Member {
        name,
        kind: tar::EntryType::Directory,
        mode: 0o755,
        data: b"",
        link: "",
    }
}

fn link(name: &'static str, kind: tar::EntryType, target: &'static str) -> Member {
    Member {
        name,
        kind,
        mode: 0o777,
        data: b"",
        link: target,
    }
}

fn with_mode(mut m: Member, mode: u32) -> Member {
    m.mode = mode;
    m
}

/// A gzipped tar of `members`, preceded by a harmless `workspace/app/ok.txt`.
fn archive(members: &[Member]) -> Vec<u8> {
    let mut raw = Vec::new();
    let base = [dir("workspace/app/"), file("workspace/app/ok.txt", b"ok\n")];
    for m in base.iter().chain(members) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(m.kind);
        h.set_mode(m.mode);
        h.set_uid(1000);
        h.set_gid(1000);
        h.set_mtime(1_700_000_000);
        h.set_size(m.data.len() as u64);
        if matches!(m.kind, tar::EntryType::Char | tar::EntryType::Block) {
            h.set_device_major(1).expect("major");
            h.set_device_minor(3).expect("minor");
        }
        {
            let old = h.as_old_mut();
            old.name = [0; 100];
            old.name[..m.name.len()].copy_from_slice(m.name.as_bytes());
            old.linkname = [0; 100];
            old.linkname[..m.link.len()].copy_from_slice(m.link.as_bytes());
        }
        h.set_cksum();
        raw.extend_from_slice(h.as_bytes());
        raw.extend_from_slice(m.data);
        raw.resize(raw.len().div_ceil(512) * 512, 0);
    }
    raw.extend_from_slice(&[0u8; 1024]);
    let mut gzip = Command::new("gzip")
        .arg("-c")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("gzip");
    gzip.stdin
        .take()
        .expect("stdin")
        .write_all(&raw)
        .expect("write");
    let out = gzip.wait_with_output().expect("gzip output");
    assert!(out.status.success());
    out.stdout
}

/// Puts `archive` into the store as template `id` with a control-plane manifest naming
/// `/workspace/app` as the only capture path.
async fn upload(store: &TemplateStore, id: &str, archive: &[u8]) {
    let keys = Keys::new(&store.settings().prefix, id);
    let url = store
        .presign_put(&keys.archive(), Duration::from_secs(300))
        .await
        .expect("presign");
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("a.tar.gz");
    std::fs::write(&path, archive).expect("write archive");
    let put = Command::new("curl")
        .args(["--fail-with-body", "-sS", "-X", "PUT", "-T"])
        .arg(&path)
        .arg(&url)
        .output()
        .expect("curl");
    assert!(
        put.status.success(),
        "upload: {}",
        String::from_utf8_lossy(&put.stdout)
    );
    let m = Manifest {
        schema: MANIFEST_SCHEMA,
        id: id.to_string(),
        capture_paths: vec![APP.to_string()],
        created_at: "2026-01-01T00:00:00Z".into(),
        size_bytes: archive.len() as u64,
        label: None,
        base_image: None,
        labels: Default::default(),
        // Owned by the namespace of the test's owners: what is judged is the archive.
        owner: Some(ManifestOwner {
            namespace: "test".into(),
            uid: "uploader".into(),
        }),
        shared_with: Vec::new(),
    };
    store
        .put_text(
            &keys.manifest(),
            &serde_json::to_string(&m).expect("json"),
            "application/json",
        )
        .await
        .expect("manifest");
}

/// What must hold in the restoring container after ANY restore, refused or not: nothing
/// outside the capture path changed.
const OUTSIDE_UNTOUCHED: &str = r#"
fail=0
for f in /etc/evil /tmp/escaped /workspace/other /workspace/appX /escaped /evil; do
  if [ -e "$f" ] || [ -L "$f" ]; then echo "present: $f"; fail=1; fi
done
if [ "$(sha256sum < /etc/passwd)" != "$PASSWD" ]; then echo "/etc/passwd changed"; fail=1; fi
if [ "$(sha256sum < /etc/shadow)" != "$SHADOW" ]; then echo "/etc/shadow changed"; fail=1; fi
if [ "$(stat -c %h /etc/passwd)" != 1 ] || [ "$(stat -c %h /etc/shadow)" != 1 ]; then echo "a hard link to /etc/passwd or /etc/shadow exists"; fail=1; fi
exit $fail
"#;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// The restore fails (the caller destroys the sandbox).
    Refused,
    /// The restore succeeds, and the hostile part did not land.
    Neutralised,
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_archives_are_refused_or_neutralised_and_nothing_lands_outside() {
    use tar::EntryType as E;
    let env = TestEnv::with_store("hostile").await;
    let prefix = unique("t-hostile");
    let store = store(&prefix, None);
    let _objects = PurgePrefix(prefix.clone());
    // Fingerprints of the fresh base image's account files, to compare against.
    let probe = started(&env, "probe").await;
    let passwd = env
        .sh(&probe, "sha256sum < /etc/passwd")
        .await
        .trim()
        .to_string();
    let shadow = env
        .sh(&probe, "sha256sum < /etc/shadow")
        .await
        .trim()
        .to_string();
    env.provider.destroy(&probe).await.expect("destroy probe");

    type Case = (
        &'static str,
        Vec<Member>,
        Expect,
        &'static str,
        Option<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (
            "member outside the capture paths",
            vec![
                file("etc/evil", b"evil\n"),
                file("workspace/other", b"x\n"),
                file("workspace/appX/evil", b"x\n"),
            ],
            Expect::Neutralised,
            "test -f /workspace/app/ok.txt",
            None,
        ),
        (
            "member with ..",
            vec![file("workspace/app/../../etc/evil", b"evil\n")],
            Expect::Refused,
            "true",
            None,
        ),
        (
            "absolute member",
            vec![
                file("/etc/evil", b"evil\n"),
                file("/tmp/escaped", b"evil\n"),
            ],
            Expect::Neutralised,
            "test -f /workspace/app/ok.txt",
            None,
        ),
        (
            "symlink escape (absolute target, then a file through it)",
            vec![
                link("workspace/app/lnk", E::Symlink, "/etc"),
                file("workspace/app/lnk/evil", b"evil\n"),
            ],
            Expect::Refused,
            "true",
            None,
        ),
        (
            "symlink escape (relative target with ..)",
            vec![
                link("workspace/app/lnk", E::Symlink, "../../tmp"),
                file("workspace/app/lnk/escaped", b"evil\n"),
            ],
            Expect::Refused,
            "true",
            None,
        ),
        (
            "symlink to / then a file two levels through it",
            vec![
                link("workspace/app/root", E::Symlink, "/"),
                file("workspace/app/root/tmp/escaped", b"evil\n"),
            ],
            Expect::Refused,
            "true",
            None,
        ),
        (
            "setuid and setgid files and a setgid directory",
            vec![
                with_mode(file("workspace/app/su", b"#!/bin/sh\n"), 0o4755),
                with_mode(file("workspace/app/sg", b"x"), 0o2755),
                with_mode(dir("workspace/app/sgdir/"), 0o2775),
            ],
            Expect::Neutralised,
            r#"test -f /workspace/app/su && test -f /workspace/app/sg && test -d /workspace/app/sgdir &&
               test -z "$(find /workspace/app -perm /6000)" &&
               test "$(stat -c %a /workspace/app/su)" = 755 && test "$(stat -c %u /workspace/app/su)" = 0"#,
            None,
        ),
        (
            "hard link to etc/passwd",
            vec![link("workspace/app/pw", E::Link, "etc/passwd")],
            Expect::Refused,
            "! test -e /workspace/app/pw",
            None,
        ),
        (
            "hard link to /etc/shadow (absolute)",
            vec![link("workspace/app/sh", E::Link, "/etc/shadow")],
            Expect::Refused,
            "! test -e /workspace/app/sh",
            None,
        ),
        (
            "hard link through an extracted symlink",
            vec![
                link("workspace/app/lnk", E::Symlink, "/etc"),
                link("workspace/app/pw", E::Link, "workspace/app/lnk/passwd"),
            ],
            Expect::Refused,
            "! test -e /workspace/app/pw",
            None,
        ),
        (
            "file through a symlink the restoring sandbox already has",
            vec![file("workspace/app/pre/evil", b"evil\n")],
            Expect::Refused,
            "true",
            // As a base image that ships /workspace/app/pre -> /etc would.
            Some("mkdir -p /workspace/app && ln -s /etc /workspace/app/pre"),
        ),
        (
            "device node",
            vec![Member {
                name: "workspace/app/mem",
                kind: E::Char,
                mode: 0o666,
                data: b"",
                link: "",
            }],
            Expect::Refused,
            "! test -e /workspace/app/mem",
            None,
        ),
    ];

    let mut report = Vec::new();
    for (what, members, expect, check, prepare) in cases {
        let id = unique("hostile");
        upload(&store, &id, &archive(&members)).await;
        let sandbox = started(&env, "restore").await;
        if let Some(script) = prepare {
            env.sh(&sandbox, script).await;
        }
        let result = transfer::restore(&env.provider, &sandbox, &store, &id, limits()).await;
        let outcome = match (&result, expect) {
            (Err(e), Expect::Refused) if e.is(ErrorKind::Invalid) => {
                format!("refused: {}", e.message())
            }
            (Ok(Some(_)), Expect::Neutralised) => "neutralised".to_string(),
            (other, _) => panic!("{what}: expected {expect:?}, got {other:?}"),
        };
        // Inspect the restoring container before it goes: nothing outside the tree.
        let script = format!("PASSWD='{passwd}'; SHADOW='{shadow}'\n{OUTSIDE_UNTOUCHED}");
        let (code, out, err) = run(&env, &sandbox, &script).await;
        assert_eq!(
            code, 0,
            "{what}: something landed outside the capture path: {out}{err}"
        );
        let (code, out, err) = run(&env, &sandbox, check).await;
        assert_eq!(code, 0, "{what}: case check {check:?} failed: {out}{err}");
        env.provider.destroy(&sandbox).await.expect("destroy");
        transfer::remove(&store, &id, limits())
            .await
            .expect("remove");
        report.push(format!("{what}: {outcome}"));
    }
    println!("hostile archives:\n  {}", report.join("\n  "));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_fetch_destroys_its_sandbox_and_tags_nothing() {
    use tar::EntryType as E;
    let env = TestEnv::with_store("refusedfetch").await;
    let prefix = unique("t-refused");
    let store = store(&prefix, None);
    let _objects = PurgePrefix(prefix.clone());
    let (provider, service) = (&env.provider, service(Some(store.clone())));
    let owner = env.owner("SandboxTemplate", "refused");
    for members in [
        vec![
            link("workspace/app/lnk", E::Symlink, "/etc"),
            file("workspace/app/lnk/evil", b"evil\n"),
        ],
        vec![link("workspace/app/pw", E::Link, "etc/passwd")],
        vec![file("workspace/app/../../etc/evil", b"evil\n")],
    ] {
        let id = unique("refused");
        let _images = Images(vec![format!(
            "{}:{id}",
            provider.settings().template_repository
        )]);
        upload(&store, &id, &archive(&members)).await;
        let err = service
            .fetch(provider, &id, &owner)
            .await
            .expect_err("a hostile archive is refused");
        assert!(err.is(ErrorKind::Invalid), "{err:?}");
        assert!(
            containers_named(&id).is_empty(),
            "the restore sandbox is destroyed, never handed out: {:?}",
            containers_named(&id)
        );
        assert!(
            !image_exists(&format!("{}:{id}", provider.settings().template_repository)),
            "nothing is tagged as template {id}"
        );
        assert!(provider.get_template(&id).await.expect("lookup").is_none());
        // The restore lease was released: the template can be removed at once.
        let keys = Keys::new(&store.settings().prefix, &id);
        assert!(store.list(&keys.leases()).await.expect("leases").is_empty());
        transfer::remove(&store, &id, limits())
            .await
            .expect("remove");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn fetch_is_none_when_absent_and_an_error_when_the_store_cannot_be_read() {
    let env = TestEnv::with_store("fetchlookup").await;
    let prefix = unique("t-lookup");
    let owner = env.owner("SandboxTemplate", "lookup");
    let good = service(Some(store(&prefix, None)));
    let id = unique("absent");
    assert_eq!(
        good.fetch(&env.provider, &id, &owner)
            .await
            .expect("lookup"),
        None,
        "absent is None"
    );
    assert!(
        containers_named(&id).is_empty(),
        "no sandbox is made for an absent template"
    );
    let bad = service(Some(store(&prefix, Some("wrong-secret"))));
    let err = bad
        .fetch(&env.provider, &id, &owner)
        .await
        .expect_err("a failed lookup is never read as absent");
    assert!(err.is(ErrorKind::Transient), "{err:?}");
    let err = bad
        .publish(&env.provider, &id, &[])
        .await
        .expect_err("nothing to publish");
    assert!(err.is(ErrorKind::NotFound), "{err:?}");
    // Without a store, sharing stays Unsupported and names the setting.
    let none = service(None);
    for err in [
        none.fetch(&env.provider, &id, &owner)
            .await
            .expect_err("no store"),
        none.publish(&env.provider, &id, &[])
            .await
            .expect_err("no store"),
    ] {
        assert!(
            err.is(ErrorKind::Unsupported) && err.message().contains("templateStore"),
            "{err:?}"
        );
    }
}

/// Writes a small tree with distinct modes (and one setuid file) under /workspace/app.
const POPULATE: &str = r#"set -e
mkdir -p /workspace/app/src/nested /workspace/app/private
printf 'hello template\n' > /workspace/app/README
printf '#!/bin/sh\necho run\n' > /workspace/app/run.sh
printf 'secret\n' > /workspace/app/private/key
head -c 300000 /dev/urandom > /workspace/app/src/nested/blob.bin
printf 'suid\n' > /workspace/app/suid
chmod 0644 /workspace/app/README; chmod 0755 /workspace/app/run.sh; chmod 0600 /workspace/app/private/key
chmod 0750 /workspace/app/private; chmod 4755 /workspace/app/suid
ln -s src/nested/blob.bin /workspace/app/blob-link
chown -R 1000:1000 /workspace/app/src
"#;

/// Mode, owner, type and content digest of every entry under /workspace/app, sorted.
const FINGERPRINT: &str = r#"cd /workspace/app && find . -mindepth 1 | sort | while read -r p; do
  if [ -L "$p" ]; then echo "$p link $(readlink "$p")";
  elif [ -d "$p" ]; then echo "$p dir $(stat -c %a "$p")";
  else echo "$p file $(stat -c '%a %u' "$p") $(sha256sum < "$p" | cut -c1-16)"; fi
done"#;

#[tokio::test(flavor = "multi_thread")]
async fn capture_publish_fetch_boot_round_trip_keeps_contents_and_modes() {
    let env = TestEnv::with_store("roundtrip").await;
    let prefix = unique("t-roundtrip");
    let store = store(&prefix, None);
    let _objects = PurgePrefix(prefix.clone());
    let (here, service) = (&env.provider, service(Some(store.clone())));
    let source = started(&env, "source").await;
    env.sh(&source, POPULATE).await;
    let before = env.sh(&source, FINGERPRINT).await;

    let id = unique("tpl");
    let owner = env.owner("SandboxTemplate", "roundtrip");
    here.commit(&CommitRequest {
        sandbox_id: source.clone(),
        template_id: id.clone(),
        capture_paths: vec![APP.into()],
        label: Some("round trip".into()),
        owner: owner.clone(),
        env: Default::default(),
        secret_files: Vec::new(),
    })
    .await
    .expect("commit");
    service.publish(here, &id, &[]).await.expect("publish");
    assert!(
        containers_named(&format!("publish-{id}")).is_empty(),
        "publish helper destroyed"
    );
    let m = transfer::manifest(&store, &id)
        .await
        .expect("lookup")
        .expect("published");
    assert_eq!(m.capture_paths, vec![APP.to_string()]);
    assert_eq!(m.label.as_deref(), Some("round trip"));
    assert!(
        m.size_bytes > 200_000,
        "the archive holds the blob: {}",
        m.size_bytes
    );
    assert_eq!(
        m.base_image,
        Some(harness::docker::base_image()),
        "the base image is recorded"
    );
    assert_eq!(m.labels, owner.labels(), "and so is the capturing owner");

    // Another host: nothing local, so fetch restores from the store, with the fetching
    // object's owner labels on the result (a sweeper of this instance can claim it).
    let there = other_host().await;
    let _images = Images(vec![format!(
        "{}:{id}",
        there.settings().template_repository
    )]);
    assert!(there.get_template(&id).await.expect("lookup").is_none());
    let fetcher = env.owner("SandboxTemplate", "fetcher");
    let fetched = service
        .fetch(&there, &id, &fetcher)
        .await
        .expect("fetch")
        .expect("in the store");
    assert_eq!(fetched.id, id);
    for (key, value) in fetcher.labels() {
        assert_eq!(fetched.labels.get(&key), Some(&value), "owner label {key}");
    }
    assert!(
        containers_named(&format!("fetch-{id}")).is_empty(),
        "restore helper destroyed"
    );
    assert_eq!(
        fetched
            .labels
            .get("sandboxes.dev/capture-paths")
            .map(String::as_str),
        Some(r#"["/workspace/app"]"#)
    );

    // Boot from it on the other host.
    let name = env.name("booted");
    let mut request = env.request(&name);
    request.image = None;
    request.template = Some(id.clone());
    there
        .create(&request)
        .await
        .expect("create from the fetched template");
    there.start(&name).await.expect("start");
    let after = env.sh(&name, FINGERPRINT).await;

    // Same tree, same contents and modes; ownership is the restorer's (root), and the
    // setuid bit did not survive the restore.
    let expected = before
        .replace("1000 ", "0 ")
        .replace("./suid file 4755 0", "./suid file 755 0");
    assert_eq!(after, expected, "before:\n{before}\nafter:\n{after}");
    assert!(before.contains("./suid file 4755 0"), "{before}");
    there.destroy(&name).await.expect("destroy");
    there.remove_template(&id).await.expect("remove fetched");
    transfer::remove(&store, &id, limits())
        .await
        .expect("remove published");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_native_templates_capture_goes_over_exec_and_boot_restores_after_start() {
    use tar::EntryType as E;
    let env = TestEnv::with_store("nonative").await;
    let prefix = format!("t-nonative-{:08x}", fastrand::u32(..));
    let store = store(&prefix, None);
    let _objects = PurgePrefix(prefix.clone());
    let service = service(Some(store.clone()));
    let fly = NoNativeTemplates(env.provider.clone());
    assert!(fly.templates().is_none());
    assert!(service.always_published(&fly));

    // Capture: over exec, straight into the store; the template IS the archive.
    let source = started(&env, "source").await;
    env.sh(&source, POPULATE).await;
    let before = env.sh(&source, FINGERPRINT).await;
    let id = unique("exec");
    let owner = env.owner("SandboxTemplate", "nonative");
    let t = service
        .commit(
            &fly,
            &CommitRequest {
                sandbox_id: source.clone(),
                template_id: id.clone(),
                capture_paths: vec![APP.into()],
                label: Some("over exec".into()),
                owner: owner.clone(),
                env: Default::default(),
                secret_files: Vec::new(),
            },
            &[],
        )
        .await
        .expect("capture over exec");
    assert!(t.reference.starts_with("s3://"), "{}", t.reference);
    assert_eq!(t.capture_paths, vec![APP.to_string()]);
    assert_eq!(t.base_image, Some(harness::docker::base_image()));
    assert_eq!(t.labels, owner.labels());
    assert!(
        env.provider
            .get_template(&id)
            .await
            .expect("lookup")
            .is_none(),
        "no image was committed"
    );
    let seen = service
        .get(&fly, &id)
        .await
        .expect("lookup")
        .expect("in the store");
    assert!(!seen.in_use, "no restore is in flight");

    // Boot: the manifest's base image, then the archive restored after start.
    let boot = service.boot(&fly, &id, &owner).await.expect("boot plan");
    assert_eq!(
        boot,
        Some(Boot::Restore {
            image: Some(harness::docker::base_image())
        })
    );
    let name = started(&env, "booted").await;
    let m = service.restore(&fly, &name, &id).await.expect("restore");
    assert_eq!(m.capture_paths, vec![APP.to_string()]);
    let after = env.sh(&name, FINGERPRINT).await;
    let expected = before
        .replace("1000 ", "0 ")
        .replace("./suid file 4755 0", "./suid file 755 0");
    assert_eq!(after, expected, "before:\n{before}\nafter:\n{after}");

    // The store copy is the template: it cannot be unpublished, only removed.
    let err = service.unpublish(&fly, &id).await.expect_err("unpublish");
    assert!(err.is(ErrorKind::Invalid), "{err:?}");
    service.remove(&fly, &id).await.expect("remove");
    assert!(service.get(&fly, &id).await.expect("lookup").is_none());
    assert_eq!(service.boot(&fly, &id, &owner).await.expect("lookup"), None);

    // A hostile archive is refused by the restore.
    let hostile = unique("hostile");
    let members = [
        link("workspace/app/lnk", E::Symlink, "/etc"),
        file("workspace/app/lnk/evil", b"evil\n"),
    ];
    upload(&store, &hostile, &archive(&members)).await;
    let victim = started(&env, "victim").await;
    let err = service
        .restore(&fly, &victim, &hostile)
        .await
        .expect_err("refused");
    assert!(err.is(ErrorKind::Invalid), "{err:?}");
    // A provider without native templates and without a store cannot hold templates.
    let err = self::service(None).home(&fly).err().expect("no home");
    assert!(
        err.is(ErrorKind::Unsupported) && err.message().contains("templateStore"),
        "{err:?}"
    );
}

/// A realistic dependency install without a network: 2,000 packages, each a generated
/// source file that is compressed and checksummed — many small files and many processes,
/// like `npm ci` or `pip install` unpacking and byte-compiling.
const INSTALL: &str = r#"set -e
mkdir -p /workspace/app/node_modules
cd /workspace/app/node_modules
i=0
while [ $i -lt 2000 ]; do
  i=$((i + 1))
  mkdir -p "pkg-$i/lib"
  printf '{"name":"pkg-%s","version":"1.0.%s"}\n' "$i" "$i" > "pkg-$i/package.json"
  head -c 16384 /dev/urandom | base64 > "pkg-$i/lib/index.js"
  gzip -9 -c "pkg-$i/lib/index.js" > "pkg-$i/lib/index.js.gz"
  sha256sum "pkg-$i/lib/index.js" > "pkg-$i/SHASUMS"
done
find /usr/share/doc -type f | head -3000 | xargs cat | gzip -9 > /workspace/app/docs.gz
echo done > /workspace/app/.installed
"#;

#[tokio::test(flavor = "multi_thread")]
async fn boot_from_template_versus_building_from_scratch() {
    let env = TestEnv::with_store("timing").await;
    let prefix = unique("t-timing");
    let store = store(&prefix, None);
    let _objects = PurgePrefix(prefix.clone());
    let (here, service) = (env.provider.clone(), service(Some(store.clone())));
    let check = "test -f /workspace/app/.installed && test \"$(ls /workspace/app/node_modules | wc -l)\" = 2000";

    // From scratch: create, start, install.
    let t0 = Instant::now();
    let scratch = started(&env, "scratch").await;
    let (code, _, err) = run(&env, &scratch, INSTALL).await;
    assert_eq!(code, 0, "install failed: {err}");
    env.sh(&scratch, check).await;
    let from_scratch = t0.elapsed();

    let id = unique("deps");
    here.commit(&CommitRequest {
        sandbox_id: scratch.clone(),
        template_id: id.clone(),
        capture_paths: vec![APP.into()],
        label: Some("deps".into()),
        owner: env.owner("SandboxTemplate", "timing"),
        env: Default::default(),
        secret_files: Vec::new(),
    })
    .await
    .expect("commit");

    // From the local template: create, start, the same state is there.
    let boot = |provider: DockerProvider, name: String, id: String| {
        let env = &env;
        async move {
            let t = Instant::now();
            let mut request = env.request(&name);
            request.image = None;
            request.template = Some(id);
            provider.create(&request).await.expect("create");
            provider.start(&name).await.expect("start");
            env.sh(&name, check).await;
            t.elapsed()
        }
    };
    let from_template = boot(here.clone(), env.name("warm"), id.clone()).await;

    // Another host: fetch from the store (restore through the boundary), then boot.
    service.publish(&here, &id, &[]).await.expect("publish");
    let there = other_host().await;
    let _images = Images(vec![format!(
        "{}:{id}",
        there.settings().template_repository
    )]);
    let owner = env.owner("SandboxTemplate", "timing-fetch");
    let t1 = Instant::now();
    service
        .fetch(&there, &id, &owner)
        .await
        .expect("fetch")
        .expect("published");
    let fetch = t1.elapsed();
    let fetched_boot = boot(there.clone(), env.name("remote"), id.clone()).await;

    // A provider without native templates: the template is the store's archive, and a boot
    // is create + start from the base image + restore after start.
    let fly = NoNativeTemplates(env.provider.clone());
    let exec_id = unique("deps-exec");
    let capture = CommitRequest {
        sandbox_id: scratch.clone(),
        template_id: exec_id.clone(),
        capture_paths: vec![APP.into()],
        label: None,
        owner: env.owner("SandboxTemplate", "timing-exec"),
        env: Default::default(),
        secret_files: Vec::new(),
    };
    service
        .commit(&fly, &capture, &[])
        .await
        .expect("capture over exec");
    let t2 = Instant::now();
    let restored = started(&env, "restored").await;
    service
        .restore(&fly, &restored, &exec_id)
        .await
        .expect("restore");
    env.sh(&restored, check).await;
    let restore_boot = t2.elapsed();

    let ratio = |t: Duration| from_scratch.as_secs_f64() / t.as_secs_f64();
    let figures = format!(
        "template boot vs from scratch (same run; 2,000-package install simulation):\n  \
         from scratch (create + start + install): {:.2} s\n  \
         boot from local template (create + start + check): {:.2} s  → {:.0}× faster\n  \
         fetch from S3 store on another provider instance: {:.2} s, then boot {:.2} s → {:.1}× faster in total\n  \
         no native templates (create + start + restore from S3 + check): {:.2} s → {:.1}× faster\n",
        from_scratch.as_secs_f64(),
        from_template.as_secs_f64(),
        ratio(from_template),
        fetch.as_secs_f64(),
        fetched_boot.as_secs_f64(),
        ratio(fetch + fetched_boot),
        restore_boot.as_secs_f64(),
        ratio(restore_boot),
    );
    service
        .remove(&fly, &exec_id)
        .await
        .expect("remove exec template");
    println!("{figures}");
    let out =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/template-boot-timing.txt");
    let _ = std::fs::write(out, &figures);
    transfer::remove(&store, &id, limits())
        .await
        .expect("remove published");
}
