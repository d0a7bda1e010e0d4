//! Tenancy of templates, end to end through the API server, the operator binary, the real
//! Docker engine and the real SigV4 S3 store (tests/setup/s3.sh):
//!
//! - a capture never stores a secret value: env from `envFrom`, env from `selfDeliveredEnv`
//!   and the self-delivered file are in none of the template image's `Config.Env`, its
//!   filesystem, the published archive or the manifest; a Sandbox restored from it has only
//!   its own env;
//! - a change of `spec.sharedWith` reaches the published manifest;
//! - a fetch the store's owner check refuses settles on `Stalled` and stays there.

mod harness;

use std::process::Command;
use std::time::{Duration, Instant};

use harness::cluster::*;
use harness::docker::{Images, Purge, base_image, docker_sh, engine};
use harness::objects::{patch_spec, wait_ready_within};
use harness::operator::{Operator, OperatorOptions};
use harness::s3::{PurgePrefix, put_owned_template, store, store_config};
use harness::{unique, wait_for};
use kube::Api;
use sandbox_operator::api::{Sandbox, SandboxTemplate, condition};
use sandbox_operator::templates::manifest::{Keys, ManifestOwner};
use sandbox_operator::templates::store::TemplateStore;
use sandbox_operator::templates::transfer;

const TIMEOUT: Duration = Duration::from_secs(180);
/// The `envFrom` Secret's value.
const TOKEN: &str = "team-a-token-value-7f3a";
/// The `selfDeliveredEnv` Secret's value.
const SELF_TOKEN: &str = "team-a-self-delivered-value-91c2";
/// Where the operator delivers `selfDeliveredEnv`.
const ENV_FILE: &str = "/run/sandboxes.dev/env";

/// An operator watching `ns`, its Docker provider with its own template repository and the
/// test store under `prefix`.
fn operator(ns: &str, repository: &str, prefix: &str) -> Operator {
    let (stores, env) = store_config(prefix);
    let config = format!(
        "providers:\n  - name: docker\n    type: docker\n    templateStore: s3\n    docker:\n      \
         defaultImage: {}\n      templateRepository: {repository}\n{stores}",
        base_image()
    );
    let opts = OperatorOptions {
        env,
        config_extra: config,
        ..OperatorOptions::default()
    };
    Operator::start(ns, ns, &opts)
}

/// One test's world: a namespace watched by an operator of its own, with its own template
/// repository and store prefix; everything of it is removed when dropped (the operator
/// first).
struct World {
    ns: String,
    repository: String,
    op: Operator,
    sandboxes: Api<Sandbox>,
    templates: Api<SandboxTemplate>,
    store: TemplateStore,
    _objects: PurgePrefix,
    _purge: Purge,
}

impl World {
    async fn new(prefix: &str) -> World {
        let ns = namespace(prefix).await;
        let _purge = Purge(ns.clone());
        let repository = format!("sandbox-operator/tnt-{ns}");
        let prefix = format!("tnt-{ns}");
        let client = client().await;
        World {
            op: operator(&ns, &repository, &prefix),
            sandboxes: Api::namespaced(client.clone(), &ns),
            templates: Api::namespaced(client, &ns),
            store: store(&prefix, None),
            _objects: PurgePrefix(prefix),
            _purge,
            repository,
            ns,
        }
    }

    /// Applies the Sandbox `src` and waits until it is Ready and `check` succeeds in it;
    /// what `check` printed.
    async fn source(&self, yaml: &str, check: &str) -> String {
        apply_yaml_ok(yaml, &self.ns);
        let src = wait_ready_within(&self.sandboxes, "src", &self.op, TIMEOUT).await;
        let id = src.status.clone().and_then(|s| s.sandbox_id).expect("id");
        wait_for("the source sandbox", TIMEOUT, || async {
            docker_sh(&id, check)
        })
        .await
    }

    /// Applies the SandboxTemplate `tpl` capturing `paths` of `src` and published, shared
    /// with `shared` (YAML lists), and waits until it is Ready; its template id.
    async fn template(&self, paths: &str, shared: &str) -> String {
        let yaml = format!(
            "apiVersion: sandboxes.dev/v1alpha1\nkind: SandboxTemplate\nmetadata:\n  name: tpl\n\
             spec:\n  sandboxRef:\n    name: src\n  capturePaths: {paths}\n  publish: true\n  \
             sharedWith: {shared}\n"
        );
        apply_yaml_ok(&yaml, &self.ns);
        let t = wait_ready_within(&self.templates, "tpl", &self.op, TIMEOUT).await;
        t.status.clone().and_then(|s| s.template_id).expect("id")
    }
}

/// `sh -c script` on the host: stdout (panics when it fails).
fn host_sh(script: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", script])
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_no_secret(what: &str, text: &str) {
    for secret in [TOKEN, SELF_TOKEN] {
        assert!(
            !text.contains(secret),
            "{what} holds a secret value: {text}"
        );
    }
}

/// Namespace `a`'s source Sandbox: `TOKEN` from a Secret through `envFrom`, `SELF_TOKEN`
/// self-delivered, and a project file.
fn source_sandbox() -> String {
    format!(
        r#"apiVersion: sandboxes.dev/v1alpha1
kind: Sandbox
metadata:
  name: src
spec:
  image: {image}
  envFrom:
    - secretRef:
        name: team-a-token
  selfDeliveredEnv:
    name: team-a-self
  env:
    - name: PLAIN
      value: plain-value
  command: ["sh", "-c", "mkdir -p /workspace/app && echo project > /workspace/app/hello.txt && touch /workspace/app/.ready; trap 'exit 0' TERM; while :; do sleep 1; done"]
"#,
        image = base_image()
    )
}

const RESTORED: &str = r#"apiVersion: sandboxes.dev/v1alpha1
kind: Sandbox
metadata:
  name: user
spec:
  templateRef:
    name: tpl
  command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
"#;

/// Every file of the published archive, concatenated (downloaded with a presigned GET).
async fn archive_contents(store: &TemplateStore, id: &str) -> String {
    let keys = Keys::new(&store.settings().prefix, id);
    let url = store
        .presign_get(&keys.archive(), Duration::from_secs(300))
        .await
        .expect("presign");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("archive.tar.gz");
    let file = file.display();
    host_sh(&format!(
        "curl -sSf -o '{file}' '{url}' && tar -tzf '{file}' && tar -xzOf '{file}'"
    ))
}

/// The template image's `Config.Env`, read from the engine.
async fn image_env(image: &str) -> Vec<String> {
    let inspect = engine()
        .await
        .inspect_image(image)
        .await
        .expect("the template image");
    inspect.config.and_then(|c| c.env).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_capture_stores_no_secret_value_and_a_restore_has_only_its_own_env() {
    let w = World::new("tnt-tpl").await;
    let (ns, store) = (&w.ns, &w.store);
    create_secret(
        ns,
        "team-a-token",
        None,
        serde_json::json!({"TOKEN": TOKEN}),
    )
    .await;
    create_secret(
        ns,
        "team-a-self",
        None,
        serde_json::json!({"SELF_TOKEN": SELF_TOKEN}),
    )
    .await;

    // The source really holds both values: what follows can fail.
    let check = format!("test -f /workspace/app/.ready && env && cat {ENV_FILE}");
    let seen = w.source(&source_sandbox(), &check).await;
    assert!(seen.contains(TOKEN) && seen.contains(SELF_TOKEN), "{seen}");

    // Capture (the self-delivered file's directory among the paths) and publish.
    let id = w
        .template(r#"["/workspace/app", "/run/sandboxes.dev"]"#, "[]")
        .await;
    let image = format!("{}:{id}", w.repository);
    let _images = Images(vec![image.clone()]);

    // The image config: the plain env is kept, no value from a Secret.
    let env = image_env(&image).await;
    assert_no_secret("the template image's Config.Env", &env.join("\n"));
    assert!(
        !env.iter().any(|e| e.starts_with("TOKEN=")),
        "TOKEN is stored in the image: {env:?}"
    );
    assert!(env.contains(&"PLAIN=plain-value".to_string()), "{env:?}");
    // The image's filesystem: no self-delivered file.
    let files = host_sh(&format!(
        "docker run --rm --network none --entrypoint sh {image} -c 'cat {ENV_FILE} 2>/dev/null; \
         cat /workspace/app/hello.txt'"
    ));
    assert_no_secret("the template image's filesystem", &files);
    assert!(files.contains("project"), "the capture is intact: {files}");
    // The store: neither the archive nor the manifest.
    assert_no_secret("the archive", &archive_contents(store, &id).await);
    let keys = Keys::new(&store.settings().prefix, &id);
    let manifest = store.get_text(&keys.manifest()).await.expect("read");
    assert_no_secret("the manifest", &manifest.expect("published"));

    // Restored in `a`: its own env only, the project there.
    apply_yaml_ok(RESTORED, ns);
    let user = wait_ready_within(&w.sandboxes, "user", &w.op, TIMEOUT).await;
    let user_id = user.status.clone().and_then(|s| s.sandbox_id).expect("id");
    let seen = docker_sh(
        &user_id,
        &format!("env; cat {ENV_FILE} 2>/dev/null; cat /workspace/app/hello.txt"),
    )
    .expect("exec");
    assert_no_secret("the restored sandbox", &seen);
    assert!(!seen.contains("TOKEN="), "{seen}");
    assert!(seen.contains("project"), "{seen}");
}

/// A sandbox to capture, with only a project file.
const PLAIN_SOURCE: &str = r#"apiVersion: sandboxes.dev/v1alpha1
kind: Sandbox
metadata:
  name: src
spec:
  command: ["sh", "-c", "mkdir -p /workspace/app && echo project > /workspace/app/hello.txt; trap 'exit 0' TERM; while :; do sleep 1; done"]
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_change_of_shared_with_reaches_the_published_manifest() {
    let w = World::new("tnt-share").await;
    w.source(PLAIN_SOURCE, "test -f /workspace/app/hello.txt")
        .await;
    let id = w.template(r#"["/workspace/app"]"#, r#"["team-x"]"#).await;
    let _images = Images(vec![format!("{}:{id}", w.repository)]);
    let shared = |want: Vec<&'static str>| {
        let (store, id) = (&w.store, &id);
        async move {
            let m = transfer::manifest(store, id)
                .await
                .map_err(|e| e.to_string())?;
            let got = m.map(|m| m.shared_with).unwrap_or_default();
            (got == want)
                .then_some(())
                .ok_or(format!("sharedWith {got:?}"))
        }
    };
    wait_for("the first sharing", TIMEOUT, || shared(vec!["team-x"])).await;

    // A new sharing, then a revocation: each reaches the manifest without a recapture.
    patch_spec(
        &w.templates,
        "tpl",
        serde_json::json!({"sharedWith": ["team-y"]}),
    )
    .await;
    wait_for("the new sharing", TIMEOUT, || shared(vec!["team-y"])).await;
    patch_spec(&w.templates, "tpl", serde_json::json!({"sharedWith": []})).await;
    wait_for("the revocation", TIMEOUT, || shared(vec![])).await;
}

/// `(status, reason)` of the Ready condition.
fn ready_of(t: &SandboxTemplate) -> (String, String) {
    let conditions = t.status.clone().unwrap_or_default().conditions;
    condition(&conditions, "Ready")
        .map(|c| (c.status.clone(), c.reason.clone()))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_fetch_settles_on_stalled_and_stays_there() {
    let w = World::new("tnt-refused").await;
    let id = unique("tpl-of-a");
    let owner = ManifestOwner {
        namespace: "team-a".into(),
        uid: "uid-of-the-owner".into(),
    };
    put_owned_template(&w.store, &id, owner, Default::default(), "not restored").await;
    apply_yaml_ok(
        &format!(
            "apiVersion: sandboxes.dev/v1alpha1\nkind: SandboxTemplate\nmetadata:\n  name: \
             theirs\nspec:\n  source: Store\n  templateId: {id}\n"
        ),
        &w.ns,
    );
    let stalled = |t: &SandboxTemplate| {
        let st = t.status.clone().unwrap_or_default();
        let stall = condition(&st.conditions, "Stalled").is_some_and(|c| c.status == "True");
        let (ready, reason) = ready_of(t);
        (stall && ready == "False" && reason == "TemplateNotShared")
            .then_some(())
            .ok_or(format!("Ready={ready} {reason}, Stalled={stall}"))
    };
    wait_for("Stalled TemplateNotShared", TIMEOUT, || async {
        let t = w.templates.get("theirs").await.map_err(|e| e.to_string())?;
        stalled(&t)
    })
    .await;

    // It stays there: every read over the window is the same stall, never Fetching again.
    let (mut reads, mut flips) = (0, Vec::new());
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        let t = w.templates.get("theirs").await.expect("read");
        if let Err(seen) = stalled(&t) {
            flips.push(seen);
        }
        reads += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reads > 50, "only {reads} reads");
    assert!(
        flips.is_empty(),
        "{} of {reads} reads left the stall: {flips:?}",
        flips.len()
    );
}
