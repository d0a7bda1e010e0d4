//! SandboxTemplates end to end: `kubectl apply` → the operator → real Docker images and a
//! real SigV4 S3 store, through a real kube-apiserver. Each test has its own namespace(s),
//! operator instance(s), template repository and store prefix.
//!
//! Most tests run the operator binary. Two run the library's controllers (or its sweeper) in
//! the test process instead, because they need a provider the binary cannot be configured
//! with: Docker with its native templates hidden, standing in for Fly Machines and E2B.

mod harness;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use harness::cluster::*;
use harness::docker::*;
use harness::objects::wait_ready_within;
use harness::operator::*;
use harness::{unique, wait_for};
use kube::Api;
use kube::api::DeleteParams;
use sandbox_operator::api::{Sandbox, SandboxTemplate, condition};
use sandbox_operator::templates::manifest::{Keys, ManifestOwner};
use sandbox_operator::templates::service::TemplateService;
use sandbox_operator::templates::store::TemplateStore;
use sandbox_operator::templates::transfer::{self, Limits};

use harness::s3::{PurgePrefix, put_owned_manifest, s3_env};

const TIMEOUT: Duration = Duration::from_secs(180);

/// The store the operators of a test share, for looking at what they published.
fn store(prefix: &str) -> Arc<TemplateStore> {
    Arc::new(harness::s3::store(prefix, None))
}

/// An operator whose Docker provider has its own template repository and the shared store
/// under `prefix` (credentials by environment reference, as a deployment would have them).
fn operator(ns: &str, repository: &str, prefix: &str) -> Operator {
    let env = s3_env();
    let config = format!(
        r#"providers:
  - name: docker
    type: docker
    templateStore: s3
    docker:
      defaultImage: {image}
      templateRepository: {repository}
templateStores:
  - name: s3
    bucket: {bucket}
    endpoint: {endpoint}
    pathStyle: true
    prefix: {prefix}
    accessKeyId: {{ env: E2E_S3_ACCESS_KEY }}
    secretAccessKey: {{ env: E2E_S3_SECRET_KEY }}
"#,
        image = base_image(),
        bucket = env["SANDBOX_S3_BUCKET"],
        endpoint = env["SANDBOX_S3_ENDPOINT"],
    );
    Operator::start(
        ns,
        ns,
        &OperatorOptions {
            env: vec![
                (
                    "E2E_S3_ACCESS_KEY".into(),
                    env["SANDBOX_S3_ACCESS_KEY"].clone(),
                ),
                (
                    "E2E_S3_SECRET_KEY".into(),
                    env["SANDBOX_S3_SECRET_KEY"].clone(),
                ),
            ],
            config_extra: config,
            ..OperatorOptions::default()
        },
    )
}

/// Removes every image of a template repository when dropped (after the operator's own
/// cleanup; a failed test leaves nothing behind).
struct Repository(String);

impl Drop for Repository {
    fn drop(&mut self) {
        let out = Command::new("docker")
            .args(["images", "-q", "--no-trunc", &self.0])
            .output();
        if let Ok(out) = out {
            let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect();
            if !ids.is_empty() {
                let _ = Command::new("docker")
                    .args(["rmi", "-f"])
                    .args(&ids)
                    .output();
            }
        }
    }
}

fn image_label(reference: &str, label: &str) -> Option<String> {
    let out = Command::new("docker")
        .args([
            "image",
            "inspect",
            "-f",
            &format!("{{{{index .Config.Labels \"{label}\"}}}}"),
            reference,
        ])
        .output()
        .expect("docker image inspect");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn image_exists(reference: &str) -> bool {
    image_label(reference, "sandboxes.dev/template-id").is_some()
}

fn ready(conditions: &[sandbox_operator::api::Condition]) -> Option<(String, String)> {
    condition(conditions, "Ready").map(|c| (c.status.clone(), c.reason.clone()))
}

/// A sandbox whose main process writes `/workspace/app/hello.txt` (mode 0640) and idles.
fn source_sandbox(name: &str, content: &str) -> String {
    format!(
        r#"apiVersion: sandboxes.dev/v1alpha1
kind: Sandbox
metadata:
  name: {name}
spec:
  image: {image}
  command: ["sh", "-c", "mkdir -p /workspace/app && printf '{content}' > /workspace/app/hello.txt && chmod 640 /workspace/app/hello.txt && touch /workspace/app/.ready; trap 'exit 0' TERM; while :; do sleep 1; done"]
"#,
        image = base_image()
    )
}

fn sandbox_from(name: &str, template: &str) -> String {
    format!(
        r#"apiVersion: sandboxes.dev/v1alpha1
kind: Sandbox
metadata:
  name: {name}
spec:
  templateRef:
    name: {template}
  command: ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
"#
    )
}

fn apply_ok(yaml: &str, ns: &str) {
    apply_yaml_ok(yaml, ns);
}

#[tokio::test(flavor = "multi_thread")]
async fn capture_boot_recapture_and_refused_deletion_through_the_api_server() {
    let ns = namespace("e2e-tpl").await;
    let _purge = Purge(ns.clone());
    let repository = format!("sandbox-operator/e2e-{ns}");
    let _images = Repository(repository.clone());
    let prefix = format!("e2e-{ns}");
    let op = operator(&ns, &repository, &prefix);
    let client = client().await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let templates: Api<SandboxTemplate> = Api::namespaced(client.clone(), &ns);
    let store = store(&prefix);
    let _objects = PurgePrefix(prefix.clone());

    // The Sandbox to capture.
    apply_ok(&source_sandbox("src", "v1"), &ns);
    let src = wait_ready_within(&sandboxes, "src", &op, TIMEOUT).await;
    let src_container = format!("sbx-{}", src.metadata.uid.clone().expect("uid"));
    wait_for("the source's files", TIMEOUT, || async {
        docker_sh(&src_container, "test -f /workspace/app/.ready")
    })
    .await;

    // Capture and publish.
    let template_yaml = |label: &str| {
        format!(
            r#"apiVersion: sandboxes.dev/v1alpha1
kind: SandboxTemplate
metadata:
  name: tpl
spec:
  sandboxRef:
    name: src
  capturePaths: ["/workspace/app"]
  label: {label}
  publish: true
"#
        )
    };
    apply_ok(&template_yaml("v1"), &ns);
    let t = wait_ready_within(&templates, "tpl", &op, TIMEOUT).await;
    let uid = t.metadata.uid.clone().expect("uid");
    let st = t.status.clone().expect("status");
    let id = format!("sbxt-{uid}");
    assert_eq!(st.template_id.as_deref(), Some(id.as_str()));
    assert_eq!(st.provider.as_deref(), Some("docker"));
    assert!(
        st.ref_.as_deref().is_some_and(|r| r.starts_with("sha256:")),
        "{st:?}"
    );
    assert!(
        st.created_at.is_some() && st.size_bytes.is_some_and(|s| s > 0),
        "{st:?}"
    );
    assert_eq!(
        (st.published, st.in_use),
        (Some(true), Some(false)),
        "{st:?}"
    );
    let image = format!("{repository}:{id}");
    assert_eq!(
        image_label(&image, "sandboxes.dev/owner-uid").as_deref(),
        Some(uid.as_str()),
        "the template image carries its owner's labels"
    );
    let m = transfer::manifest(&store, &id)
        .await
        .expect("store lookup")
        .expect("published");
    assert_eq!(m.capture_paths, vec!["/workspace/app".to_string()]);
    assert_eq!(m.label.as_deref(), Some("v1"));
    let first_ref = st.ref_.clone();

    // spec.templateId cannot be set after the fact (immutable).
    let out = kubectl(
        &[
            "patch",
            "sandboxtemplate",
            "tpl",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"templateId":"renamed"}}"#,
        ],
        None,
    );
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("spec.templateId is immutable"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A spec change captures again and replaces the template (and its published copy).
    docker_sh(&src_container, "printf v2 > /workspace/app/hello.txt").expect("write v2");
    apply_ok(&template_yaml("v2"), &ns);
    let t = wait_ready_within(&templates, "tpl", &op, TIMEOUT).await;
    let st2 = t.status.clone().expect("status");
    assert_ne!(st2.ref_, first_ref, "a new capture");
    assert_ne!(st2.capture_hash, st.capture_hash);
    assert_eq!(st2.published, Some(true));
    let m = transfer::manifest(&store, &id)
        .await
        .expect("lookup")
        .expect("published");
    assert_eq!(
        m.label.as_deref(),
        Some("v2"),
        "the published copy was replaced"
    );

    // A Sandbox boots from it, with the captured file and mode.
    apply_ok(&sandbox_from("user", "tpl"), &ns);
    let user = wait_ready_within(&sandboxes, "user", &op, TIMEOUT).await;
    let user_container = format!("sbx-{}", user.metadata.uid.clone().expect("uid"));
    let seen = docker_sh(
        &user_container,
        "cat /workspace/app/hello.txt; echo; stat -c %a /workspace/app/hello.txt",
    )
    .expect("read");
    assert_eq!(seen, "v2\n640\n");
    wait_for("status.inUse true", TIMEOUT, || async {
        let t = templates.get("tpl").await.map_err(|e| e.to_string())?;
        match t.status.and_then(|s| s.in_use) {
            Some(true) => Ok(()),
            other => Err(format!("inUse {other:?}")),
        }
    })
    .await;

    // Deleting the template while it backs a sandbox is refused by checking with the
    // provider: condition + Event, the object and the image stay.
    templates
        .delete("tpl", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for("TemplateInUse condition", TIMEOUT, || async {
        let t = templates.get("tpl").await.map_err(|e| e.to_string())?;
        let st = t.status.clone().unwrap_or_default();
        match condition(&st.conditions, "TemplateInUse") {
            Some(c) if c.status == "True" && c.message.contains(&user_container) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let events = events_about(&ns, "tpl").await;
    assert!(
        events.iter().any(|(ty, reason, note)| ty == "Warning"
            && reason == "TemplateInUse"
            && note.contains("in use")),
        "{events:?}"
    );
    assert!(image_exists(&image), "the template in use is kept");
    assert!(templates.get_opt("tpl").await.expect("get").is_some());

    // Once the sandbox is gone, the template goes: image and published copy.
    sandboxes
        .delete("user", &DeleteParams::default())
        .await
        .expect("delete user");
    wait_for("SandboxTemplate tpl gone", TIMEOUT, || async {
        match templates.get_opt("tpl").await {
            Ok(None) => Ok(()),
            Ok(Some(t)) => Err(format!("still there: {:?}", t.status.map(|s| s.conditions))),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    assert!(!image_exists(&image), "the template image was removed");
    assert_eq!(
        transfer::manifest(&store, &id).await.expect("lookup"),
        None,
        "the published copy was removed"
    );

    // A Sandbox naming the deleted template is Stalled, and never booted from an image.
    apply_ok(&sandbox_from("late", "tpl"), &ns);
    let late = wait_for("Sandbox late Stalled", TIMEOUT, || async {
        let s = sandboxes.get("late").await.map_err(|e| e.to_string())?;
        let st = s.status.clone().unwrap_or_default();
        match condition(&st.conditions, "Stalled") {
            Some(c) if c.status == "True" && c.reason == "TemplateNotFound" => Ok(s),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        container_ids_owned_by(&late.metadata.uid.clone().expect("uid")).is_empty(),
        "no container for a sandbox whose template is gone"
    );
    // A template that never reached the provider (its Sandbox never appeared) is deleted at
    // once: removing a template the provider does not hold succeeds.
    apply_ok(
        r#"apiVersion: sandboxes.dev/v1alpha1
kind: SandboxTemplate
metadata:
  name: never
spec:
  sandboxRef:
    name: does-not-exist
  capturePaths: ["/workspace/app"]
"#,
        &ns,
    );
    wait_for("never: SandboxNotFound", TIMEOUT, || async {
        let t = templates.get("never").await.map_err(|e| e.to_string())?;
        match ready(&t.status.unwrap_or_default().conditions) {
            Some((r, reason)) if r == "False" && reason == "SandboxNotFound" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    templates
        .delete("never", &DeleteParams::default())
        .await
        .expect("delete never");
    wait_for("SandboxTemplate never gone", TIMEOUT, || async {
        match templates.get_opt("never").await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err("still there".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;

    for name in ["late", "src"] {
        sandboxes
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
    wait_for("sandboxes gone", TIMEOUT, || async {
        let left = sandboxes
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        if left.items.is_empty() {
            Ok(())
        } else {
            Err(format!("{} left", left.items.len()))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_published_by_one_operator_is_fetched_and_booted_by_another() {
    let (ns_a, ns_b) = (namespace("e2e-tpl-a").await, namespace("e2e-tpl-b").await);
    let (_purge_a, _purge_b) = (Purge(ns_a.clone()), Purge(ns_b.clone()));
    let prefix = format!("e2e-shared-{ns_a}");
    let (repo_a, repo_b) = (
        format!("sandbox-operator/e2e-{ns_a}"),
        format!("sandbox-operator/e2e-{ns_b}"),
    );
    let (_images_a, _images_b) = (Repository(repo_a.clone()), Repository(repo_b.clone()));
    let op_a = operator(&ns_a, &repo_a, &prefix);
    let op_b = operator(&ns_b, &repo_b, &prefix);
    let client = client().await;
    let store = store(&prefix);
    let _objects = PurgePrefix(prefix.clone());
    let shared = harness::unique("shared");

    // Operator A captures and publishes under a stable id.
    let sandboxes_a: Api<Sandbox> = Api::namespaced(client.clone(), &ns_a);
    let templates_a: Api<SandboxTemplate> = Api::namespaced(client.clone(), &ns_a);
    apply_ok(&source_sandbox("src", "shared bytes"), &ns_a);
    let src = wait_ready_within(&sandboxes_a, "src", &op_a, TIMEOUT).await;
    let src_container = format!("sbx-{}", src.metadata.uid.clone().expect("uid"));
    wait_for("the source's files", TIMEOUT, || async {
        docker_sh(&src_container, "test -f /workspace/app/.ready")
    })
    .await;
    apply_ok(
        &format!(
            r#"apiVersion: sandboxes.dev/v1alpha1
kind: SandboxTemplate
metadata:
  name: deps
spec:
  templateId: {shared}
  sandboxRef:
    name: src
  capturePaths: ["/workspace/app"]
  publish: true
  sharedWith: [{ns_b}]
"#
        ),
        &ns_a,
    );
    wait_ready_within(&templates_a, "deps", &op_a, TIMEOUT).await;

    // Operator B (another "host": its own template repository) fetches it by id.
    let sandboxes_b: Api<Sandbox> = Api::namespaced(client.clone(), &ns_b);
    let templates_b: Api<SandboxTemplate> = Api::namespaced(client.clone(), &ns_b);
    apply_ok(
        &format!(
            r#"apiVersion: sandboxes.dev/v1alpha1
kind: SandboxTemplate
metadata:
  name: deps
spec:
  source: Store
  templateId: {shared}
---
apiVersion: sandboxes.dev/v1alpha1
kind: SandboxTemplate
metadata:
  name: missing
spec:
  source: Store
  templateId: {shared}-missing
"#
        ),
        &ns_b,
    );
    let fetched = wait_ready_within(&templates_b, "deps", &op_b, TIMEOUT).await;
    let st = fetched.status.clone().expect("status");
    assert_eq!(st.template_id.as_deref(), Some(shared.as_str()));
    assert_eq!(st.published, Some(true));
    assert_eq!(
        image_label(&format!("{repo_b}:{shared}"), "sandboxes.dev/owner-uid").as_deref(),
        fetched.metadata.uid.as_deref(),
        "the fetched template carries the fetching SandboxTemplate's owner labels"
    );
    // One that is not in the store waits for it (Reconciling), and is not Ready.
    wait_for("missing: TemplateNotInStore", TIMEOUT, || async {
        let t = templates_b
            .get("missing")
            .await
            .map_err(|e| e.to_string())?;
        let st = t.status.clone().unwrap_or_default();
        match (
            ready(&st.conditions),
            condition(&st.conditions, "Reconciling"),
        ) {
            (Some((r, reason)), Some(c))
                if r == "False" && reason == "TemplateNotInStore" && c.status == "True" =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    apply_ok(&sandbox_from("user", "deps"), &ns_b);
    let user = wait_ready_within(&sandboxes_b, "user", &op_b, TIMEOUT).await;
    let seen = docker_sh(
        &format!("sbx-{}", user.metadata.uid.clone().expect("uid")),
        "cat /workspace/app/hello.txt; echo; stat -c '%a %u' /workspace/app/hello.txt",
    )
    .expect("read");
    assert_eq!(seen, "shared bytes\n640 0\n");

    // B's deletions remove only B's local copy; A's deletion removes the published copy.
    sandboxes_b
        .delete("user", &DeleteParams::default())
        .await
        .expect("delete");
    for name in ["deps", "missing"] {
        templates_b
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
    wait_for("B's templates gone", TIMEOUT, || async {
        let left = templates_b
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        if left.items.is_empty() {
            Ok(())
        } else {
            Err(format!("{} left", left.items.len()))
        }
    })
    .await;
    assert!(!image_exists(&format!("{repo_b}:{shared}")));
    assert!(
        transfer::manifest(&store, &shared)
            .await
            .expect("lookup")
            .is_some(),
        "a Store template does not own the published copy"
    );
    templates_a
        .delete("deps", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for("A's template gone", TIMEOUT, || async {
        match templates_a.get_opt("deps").await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err("still there".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    assert_eq!(
        transfer::manifest(&store, &shared).await.expect("lookup"),
        None
    );
    sandboxes_a
        .delete("src", &DeleteParams::default())
        .await
        .expect("delete");
}

// ---- providers without native templates, and the sweeper, in the test process -----------

/// The library's Sandbox and SandboxTemplate controllers running in this process against the
/// real API server, on one provider the test chose, with `store` as its template store.
/// Stopped (and awaited) on drop.
struct InProcess {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl InProcess {
    async fn start(
        ns: &str,
        provider: Arc<dyn sandbox_operator::provider::Provider>,
        store: Arc<TemplateStore>,
    ) -> InProcess {
        use sandbox_operator::controller::{Context, sandbox, template};
        use sandbox_operator::metrics::Metrics;
        use sandbox_operator::registry::{ProviderHandle, ProviderRegistry};
        let metrics = Metrics::new();
        let mut service = TemplateService::new(limits());
        service.assign(provider.name(), &store.settings().name);
        service.add_store(store);
        let mut providers = ProviderRegistry::new();
        let handle = ProviderHandle::new(provider, 8, Duration::from_secs(120), metrics.clone());
        providers.insert(handle);
        let ctx = Context::new(
            client().await,
            providers,
            Arc::new(service),
            metrics,
            ns.to_string(),
            Duration::from_secs(300),
        );
        let (stop, rx) = tokio::sync::watch::channel(false);
        let stopped = move || {
            let mut rx = rx.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        let namespace = Some(ns.to_string());
        let triggers = futures::stream::empty();
        let tasks = vec![
            tokio::spawn(sandbox::run(
                ctx.clone(),
                triggers,
                stopped(),
                4,
                namespace.clone(),
            )),
            tokio::spawn(template::run(ctx, stopped(), namespace)),
        ];
        InProcess { stop, tasks }
    }
}

impl harness::objects::Logged for InProcess {
    fn where_logged(&self) -> String {
        "controllers in the test process".into()
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn limits() -> Limits {
    Limits {
        transfer: Duration::from_secs(300),
        ..Limits::default()
    }
}

/// Puts a template into the store whose archive the restore must refuse (a symlink to /etc,
/// then a file through it), with a control-plane manifest naming /workspace/app.
async fn upload_hostile(store: &TemplateStore, id: &str, ns: &str) {
    let mut raw = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_mode(0o777);
    h.set_size(0);
    raw.append_link(&mut h, "workspace/app/lnk", "/etc")
        .expect("symlink");
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_size(5);
    raw.append_data(&mut h, "workspace/app/lnk/evil", &b"evil\n"[..])
        .expect("file");
    let dir = tempfile::tempdir().expect("tmp");
    let tar_path = dir.path().join("a.tar");
    std::fs::write(&tar_path, raw.into_inner().expect("tar")).expect("write");
    let gz = Command::new("gzip")
        .arg("-f")
        .arg(&tar_path)
        .output()
        .expect("gzip");
    assert!(gz.status.success());
    let keys = Keys::new(&store.settings().prefix, id);
    let url = store
        .presign_put(&keys.archive(), Duration::from_secs(300))
        .await
        .expect("presign");
    let put = Command::new("curl")
        .args(["--fail-with-body", "-sS", "-X", "PUT", "-T"])
        .arg(dir.path().join("a.tar.gz"))
        .arg(&url)
        .output()
        .expect("curl");
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stdout)
    );
    // Owned by the namespace that fetches it: what is refused is the archive.
    let owner = ManifestOwner {
        namespace: ns.to_string(),
        uid: "uploader".into(),
    };
    put_owned_manifest(store, id, owner, Default::default(), 1).await;
}

fn container_image(container: &str) -> String {
    let out = Command::new("docker")
        .args(["inspect", "-f", "{{.Config.Image}}", container])
        .output()
        .expect("docker inspect");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

async fn delete_and_wait<K>(api: &Api<K>, names: &[&str])
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    for name in names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
    for name in names {
        wait_for(&format!("{name} deleted"), TIMEOUT, || async {
            match api.get_opt(name).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_string()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn without_native_templates_a_sandbox_boots_the_base_image_and_is_restored_after_start() {
    let ns = namespace("e2e-tpl-exec").await;
    let _purge = Purge(ns.clone());
    let prefix = format!("e2e-exec-{ns}");
    let store = store(&prefix);
    let _objects = PurgePrefix(prefix.clone());
    let docker = sandbox_operator::provider::docker::DockerProvider::connect_negotiated(
        "nonative",
        harness::s3::reaching_store(sandbox_operator::provider::docker::DockerSettings {
            default_image: Some(base_image()),
            ..Default::default()
        }),
    )
    .await
    .expect("engine");
    let fly = Arc::new(harness::no_native_templates::NoNativeTemplates(docker));
    let op = InProcess::start(&ns, fly, store.clone()).await;
    let client = client().await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let templates: Api<SandboxTemplate> = Api::namespaced(client.clone(), &ns);

    // Capture: over exec into the store; the template is published by nature.
    apply_ok(&source_sandbox("src", "restored bytes"), &ns);
    let src = wait_ready_within(&sandboxes, "src", &op, TIMEOUT).await;
    let src_id = src.status.clone().and_then(|s| s.sandbox_id).expect("id");
    wait_for("the source's files", TIMEOUT, || async {
        docker_sh(&src_id, "test -f /workspace/app/.ready")
    })
    .await;
    apply_ok(
        r#"apiVersion: sandboxes.dev/v1alpha1
kind: SandboxTemplate
metadata:
  name: deps
spec:
  sandboxRef:
    name: src
  capturePaths: ["/workspace/app"]
"#,
        &ns,
    );
    let t = wait_ready_within(&templates, "deps", &op, TIMEOUT).await;
    let st = t.status.clone().expect("status");
    let id = st.template_id.clone().expect("template id");
    assert_eq!(st.published, Some(true), "kept in the store: published");
    assert!(
        st.ref_.as_deref().is_some_and(|r| r.starts_with("s3://")),
        "{st:?}"
    );
    let m = transfer::manifest(&store, &id)
        .await
        .expect("lookup")
        .expect("in the store");
    assert_eq!(m.base_image, Some(base_image()));
    assert!(
        !image_exists(&format!("sandbox-operator/template:{id}")),
        "no image committed"
    );

    // Boot: the manifest's base image, the archive restored after start, then Ready.
    apply_ok(&sandbox_from("user", "deps"), &ns);
    let user = wait_ready_within(&sandboxes, "user", &op, TIMEOUT).await;
    let ust = user.status.clone().expect("status");
    let user_id = ust.sandbox_id.clone().expect("id");
    assert_eq!(
        ust.template_restored_into.as_deref(),
        Some(user_id.as_str())
    );
    assert_eq!(
        container_image(&user_id),
        base_image(),
        "booted from the base image"
    );
    let seen = docker_sh(
        &user_id,
        "cat /workspace/app/hello.txt; echo; stat -c '%a %u' /workspace/app/hello.txt",
    )
    .expect("read");
    assert_eq!(seen, "restored bytes\n640 0\n");
    let events = events_about(&ns, "user").await;
    assert!(
        events
            .iter()
            .any(|(_, reason, _)| reason == "TemplateRestored"),
        "{events:?}"
    );

    // A template whose archive the restore refuses: the sandbox is destroyed, never handed
    // out, and the Sandbox says why.
    let hostile = format!("hostile-{:08x}", fastrand::u32(..));
    upload_hostile(&store, &hostile, &ns).await;
    apply_ok(
        &format!(
            r#"apiVersion: sandboxes.dev/v1alpha1
kind: SandboxTemplate
metadata:
  name: hostile
spec:
  source: Store
  templateId: {hostile}
"#
        ),
        &ns,
    );
    wait_ready_within(&templates, "hostile", &op, TIMEOUT).await;
    apply_ok(&sandbox_from("victim", "hostile"), &ns);
    let victim = wait_for("victim: TemplateRestoreFailed", TIMEOUT, || async {
        let s = sandboxes.get("victim").await.map_err(|e| e.to_string())?;
        let st = s.status.clone().unwrap_or_default();
        match (ready(&st.conditions), condition(&st.conditions, "Stalled")) {
            (Some((r, reason)), Some(c))
                if r == "False" && reason == "TemplateRestoreFailed" && c.status == "True" =>
            {
                Ok(s)
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let vst = victim.status.clone().expect("status");
    assert_eq!(vst.sandbox_id, None, "{vst:?}");
    let victim_uid = victim.metadata.uid.clone().expect("uid");
    assert!(
        container_ids_owned_by(&victim_uid).is_empty(),
        "destroyed, not handed out"
    );
    let message = condition(&vst.conditions, "Ready").map(|c| c.message.clone());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("destroyed instead of handed out")),
        "{message:?}"
    );

    // Deletion: the captured template leaves the store; the Store one was the publisher's.
    delete_and_wait(&sandboxes, &["user", "victim", "src"]).await;
    delete_and_wait(&templates, &["deps", "hostile"]).await;
    assert_eq!(transfer::manifest(&store, &id).await.expect("lookup"), None);
    assert!(
        transfer::manifest(&store, &hostile)
            .await
            .expect("lookup")
            .is_some()
    );
    drop(op);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fetched_template_is_swept_once_its_sandbox_template_is_gone() {
    use sandbox_operator::config::SweeperConfig;
    use sandbox_operator::controller::sweeper::Sweeper;
    use sandbox_operator::controller::template::owner_of;
    use sandbox_operator::metrics::Metrics;
    use sandbox_operator::provider::docker::{DockerProvider, DockerSettings};
    use sandbox_operator::provider::{CommitRequest, Provider, Templates};
    use sandbox_operator::registry::ProviderHandle;

    let ns = namespace("e2e-tpl-sweep").await;
    let instance = ns.clone();
    let (_purge, _purge_elsewhere) = (
        Purge(instance.clone()),
        Purge(format!("{instance}-elsewhere")),
    );
    let prefix = format!("e2e-sweep-{ns}");
    let store = store(&prefix);
    let _objects = PurgePrefix(prefix.clone());
    let repo = format!("sandbox-operator/e2e-{ns}");
    let _images = Repository(repo.clone());
    let docker = DockerProvider::connect_negotiated(
        "docker",
        harness::s3::reaching_store(DockerSettings {
            default_image: Some(base_image()),
            template_repository: repo.clone(),
            ..Default::default()
        }),
    )
    .await
    .expect("engine");
    let mut service = TemplateService::new(limits());
    service.add_store(store.clone());
    service.assign("docker", &store.settings().name);

    // A template in the store, published from elsewhere (captured here, then the local
    // copy removed).
    let id = format!("swept-{:08x}", fastrand::u32(..));
    let publisher = sandbox_operator::provider::labels::Owner {
        instance: format!("{instance}-elsewhere"),
        kind: "SandboxTemplate".into(),
        namespace: ns.clone(),
        name: "elsewhere".into(),
        uid: unique("uid"),
    };
    let source = unique("sbx-src");
    let mut request = sandbox_operator::provider::CreateRequest {
        name: source.clone(),
        owner: publisher.clone(),
        image: Some(base_image()),
        template: None,
        command: Some(vec!["sleep".into(), "infinity".into()]),
        restart_policy: sandbox_operator::provider::RestartPolicy::Never,
        env: Default::default(),
        labels: Default::default(),
        resources: Default::default(),
        ports: vec![],
        volumes: vec![],
        allowed_domains: None,
        idle_action: None,
        image_pull_policy: Default::default(),
        registry_credentials: Vec::new(),
        secret_env_keys: Default::default(),
    };
    request.owner.kind = "Sandbox".into();
    let created = docker.create(&request).await.expect("create");
    docker.start(&created.id).await.expect("start");
    docker_sh(
        &created.id,
        "mkdir -p /workspace/app && echo hi > /workspace/app/f",
    )
    .expect("write");
    let commit = CommitRequest {
        sandbox_id: created.id.clone(),
        template_id: id.clone(),
        capture_paths: vec!["/workspace/app".into()],
        label: None,
        owner: publisher.clone(),
        env: Default::default(),
        secret_files: Vec::new(),
    };
    service
        .commit(&docker, &commit, &[])
        .await
        .expect("capture");
    service.publish(&docker, &id, &[]).await.expect("publish");
    docker.destroy(&created.id).await.expect("destroy source");
    docker
        .remove_template(&id)
        .await
        .expect("remove the local copy");

    // Fetched for a SandboxTemplate of this instance: it carries that object's labels.
    let client = client().await;
    let templates: Api<SandboxTemplate> = Api::namespaced(client.clone(), &ns);
    let object: SandboxTemplate = serde_json::from_value(serde_json::json!({
        "apiVersion": "sandboxes.dev/v1alpha1", "kind": "SandboxTemplate",
        "metadata": {"name": "fetcher", "namespace": ns},
        "spec": {"source": "Store", "templateId": id}
    }))
    .expect("object");
    let object = templates
        .create(&Default::default(), &object)
        .await
        .expect("create SandboxTemplate");
    let owner = owner_of(&object, &instance);
    let fetched = service
        .fetch(&docker, &id, &owner)
        .await
        .expect("fetch")
        .expect("in the store");
    assert_eq!(
        fetched.labels.get("sandboxes.dev/managed-by"),
        Some(&instance),
        "{:?}",
        fetched.labels
    );
    assert_eq!(
        fetched.labels.get("sandboxes.dev/owner-uid"),
        object.metadata.uid.as_ref()
    );

    // The sweeper keeps it while its SandboxTemplate lives, and reclaims it once it is gone.
    let metrics = Metrics::new();
    let config = SweeperConfig {
        enabled: true,
        interval_secs: 300,
        grace_secs: 0,
        dry_run: false,
        max_deletions_per_pass: 10,
    };
    let sweeper = Sweeper::new(client.clone(), metrics.clone(), &instance, &config)
        .with_grace(Duration::ZERO);
    let handle = ProviderHandle::new(Arc::new(docker.clone()), 4, TIMEOUT, metrics);
    let key = format!("template/{id}");
    let report = sweeper.pass(&handle).await;
    assert!(
        !report.reclaimed().contains(&key),
        "{}",
        report.render_table()
    );
    assert!(docker.get_template(&id).await.expect("lookup").is_some());
    delete_and_wait(&templates, &["fetcher"]).await;
    let report = sweeper.pass(&handle).await;
    assert_eq!(
        report.reclaimed(),
        vec![key.clone()],
        "{}",
        report.render_table()
    );
    assert!(docker.get_template(&id).await.expect("lookup").is_none());
}
