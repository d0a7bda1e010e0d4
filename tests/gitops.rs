//! GitOps health, against the real API server and the operator binary:
//!
//! - kstatus (sigs.k8s.io/cli-utils, what Flux reads health with, built by
//!   tests/setup/tools.sh) reads the operator's status correctly: Ready at the current generation
//!   is Current, a generation bump is InProgress until reconciled, Reconciling is InProgress,
//!   Stalled is Failed;
//! - the Argo CD health check (deploy/argocd/health.lua), run by Lua 5.1 (Argo CD's gopher-lua
//!   dialect) and 5.4 on sample objects and on the same live objects;
//! - the operator never writes spec: applying the GitOps example twice with server-side apply
//!   changes nothing, stores the spec exactly as written (no defaults), `kubectl diff` finds
//!   no drift, and the managed fields show no other owner of any spec field.

mod harness;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use harness::cluster::*;
use harness::docker::*;
use harness::operator::*;
use harness::tools::*;
use harness::{repo, wait_for};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(90);
const LUAS: [&str; 2] = ["lua5.1", "lua5.4"];

fn idle() -> Value {
    json!(["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"])
}

fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn apply_json(object: &Value) {
    kubectl_ok(&["apply", "-f", "-"], Some(&object.to_string()));
}

/// Polls until kstatus reads `want` for the object and `extra` accepts it; returns the object.
async fn wait_kstatus(
    resource: &str,
    name: &str,
    ns: &str,
    want: &str,
    extra: impl Fn(&Value) -> Result<(), String>,
) -> Value {
    let what = format!("kstatus {want} for {resource}/{name}");
    wait_for(&what, TIMEOUT, || {
        let result = get_json(resource, name, ns).and_then(|text| {
            let (status, message) = kstatus(&text);
            let object: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            if status != want {
                return Err(format!(
                    "kstatus {status}: {message}; status {}",
                    object["status"]
                ));
            }
            extra(&object)?;
            Ok(object)
        });
        async move { result }
    })
    .await
}

/// Both Lua interpreters agree with `want` on the object; returns the message.
fn assert_argocd(object: &Value, want: &str) -> String {
    let text = object.to_string();
    let mut message = String::new();
    for lua in LUAS {
        let (status, m) = argocd_health(lua, &text);
        assert_eq!(status, want, "{lua}: {m}\nobject: {object}");
        message = m;
    }
    message
}

fn sandbox(ns: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    })
}

// ---- the Argo CD health check on sample objects ---------------------------------------------

fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2})
}

fn object(kind: &str, generation: i64, spec: Value, status: Option<Value>) -> Value {
    let mut o = json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "x", "namespace": "team-a", "generation": generation, "uid": "0000"},
        "spec": spec,
    });
    if let Some(s) = status {
        o["status"] = s;
    }
    o
}

#[test]
fn argocd_health_check_reads_sample_objects() {
    let image = json!({"image": "debian:bookworm"});
    let ready = cond("Ready", "True", "Running", "the sandbox is running");
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "no status yet",
            object("Sandbox", 1, image.clone(), None),
            "Progressing",
            "Waiting for the operator",
        ),
        (
            "status without observedGeneration (external name recorded first)",
            object(
                "Sandbox",
                1,
                image.clone(),
                Some(json!({"externalName": "sbx-0000", "provider": "docker"})),
            ),
            "Progressing",
            "observe generation 1",
        ),
        (
            "Ready at the current generation",
            object(
                "Sandbox",
                2,
                image.clone(),
                Some(json!({"observedGeneration": 2, "conditions": [ready]})),
            ),
            "Healthy",
            "Running: the sandbox is running",
        ),
        (
            "generation bumped, not yet reconciled",
            object(
                "Sandbox",
                3,
                image.clone(),
                Some(json!({"observedGeneration": 2, "conditions": [ready]})),
            ),
            "Progressing",
            "generation 3 (observed 2)",
        ),
        (
            "Ready condition of an older generation",
            object(
                "Sandbox",
                3,
                image.clone(),
                Some(json!({"observedGeneration": 3, "conditions": [ready]})),
            ),
            "Progressing",
            "Ready condition of generation 3",
        ),
        (
            "Reconciling",
            object(
                "Sandbox",
                2,
                image.clone(),
                Some(json!({"observedGeneration": 2, "conditions": [
                    cond("Ready", "False", "VolumeNotFound", "waiting for SandboxVolume data"),
                    cond("Reconciling", "True", "VolumeNotFound", "waiting for SandboxVolume data"),
                ]})),
            ),
            "Progressing",
            "VolumeNotFound: waiting for SandboxVolume data",
        ),
        (
            "Stalled",
            object(
                "Sandbox",
                2,
                json!({"image": "x", "provider": "nowhere"}),
                Some(json!({"observedGeneration": 2, "conditions": [
                    cond("Ready", "False", "ProviderNotConfigured", "no provider named nowhere"),
                    cond("Stalled", "True", "ProviderNotConfigured", "no provider named nowhere"),
                ]})),
            ),
            "Degraded",
            "ProviderNotConfigured: no provider named nowhere",
        ),
        (
            "settled but not ready (main process exited)",
            object(
                "Sandbox",
                2,
                image.clone(),
                Some(json!({"observedGeneration": 2, "conditions": [
                    cond("Ready", "False", "ProcessExited", "the main process exited with code 1"),
                ]})),
            ),
            "Degraded",
            "ProcessExited",
        ),
        (
            "Ready Unknown",
            object(
                "Sandbox",
                2,
                image.clone(),
                Some(
                    json!({"observedGeneration": 2, "conditions": [cond("Ready", "Unknown", "Checking", "")]}),
                ),
            ),
            "Progressing",
            "Checking",
        ),
        (
            "observed, no Ready condition yet",
            object(
                "Sandbox",
                2,
                image.clone(),
                Some(json!({"observedGeneration": 2, "conditions": []})),
            ),
            "Progressing",
            "Waiting for the Ready condition",
        ),
        (
            "Sleeping as asked",
            object(
                "Sandbox",
                2,
                json!({"image": "x", "state": "Sleeping"}),
                Some(json!({"observedGeneration": 2, "conditions": [
                    cond("Ready", "True", "Sleeping", "the sandbox is hibernated"),
                ]})),
            ),
            "Suspended",
            "Sleeping: the sandbox is hibernated",
        ),
        (
            "Stopped as asked",
            object(
                "Sandbox",
                2,
                json!({"image": "x", "state": "Stopped"}),
                Some(json!({"observedGeneration": 2, "conditions": [
                    cond("Ready", "True", "Stopped", "the sandbox is stopped"),
                ]})),
            ),
            "Suspended",
            "Stopped",
        ),
        (
            "on its way to sleep",
            object(
                "Sandbox",
                2,
                json!({"image": "x", "state": "Sleeping"}),
                Some(json!({"observedGeneration": 2, "conditions": [
                    cond("Ready", "False", "Converging", "sandbox is Running, want Sleeping"),
                    cond("Reconciling", "True", "Converging", "sandbox is Running, want Sleeping"),
                ]})),
            ),
            "Progressing",
            "Converging",
        ),
        (
            "being deleted",
            {
                let mut o = object(
                    "Sandbox",
                    2,
                    image.clone(),
                    Some(json!({"observedGeneration": 2, "conditions": [ready]})),
                );
                o["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                o
            },
            "Progressing",
            "being deleted",
        ),
        (
            "SandboxVolume ready",
            object(
                "SandboxVolume",
                2,
                json!({"reclaimPolicy": "Retain"}),
                Some(
                    json!({"observedGeneration": 2, "attached": false, "conditions": [
                        cond("Ready", "True", "VolumeReady", "volume sbxv-0000 exists"),
                    ]}),
                ),
            ),
            "Healthy",
            "VolumeReady",
        ),
        (
            "SandboxVolume waiting to be deleted while attached",
            object(
                "SandboxVolume",
                2,
                json!({"reclaimPolicy": "Delete"}),
                Some(json!({"observedGeneration": 2, "conditions": [
                    cond("Ready", "False", "VolumeAttached", "waiting to delete: attached to sbx-1"),
                    cond("Reconciling", "True", "VolumeAttached", "waiting to delete: attached to sbx-1"),
                ]})),
            ),
            "Progressing",
            "VolumeAttached",
        ),
        (
            "SandboxTemplate ready and in use",
            object(
                "SandboxTemplate",
                2,
                json!({"sandboxRef": {"name": "dev"}, "capturePaths": ["/opt"], "state": "Sleeping"}),
                Some(
                    json!({"observedGeneration": 2, "inUse": true, "conditions": [
                        cond("InUse", "True", "BackingSandboxes", "1 sandbox boots from it"),
                        cond("Ready", "True", "Captured", "captured /opt"),
                    ]}),
                ),
            ),
            "Healthy",
            "Captured",
        ),
        (
            "SandboxTemplate whose source sandbox is gone",
            object(
                "SandboxTemplate",
                2,
                json!({"sandboxRef": {"name": "dev"}, "capturePaths": ["/opt"]}),
                Some(json!({"observedGeneration": 2, "conditions": [
                    cond("Ready", "False", "SandboxNotFound", "spec.sandboxRef: Sandbox dev does not exist"),
                    cond("Stalled", "True", "SandboxNotFound", "spec.sandboxRef: Sandbox dev does not exist"),
                ]})),
            ),
            "Degraded",
            "SandboxNotFound",
        ),
    ];
    let mut wrong = Vec::new();
    for lua in LUAS {
        for (what, o, want, message) in &cases {
            let (status, m) = argocd_health(lua, &o.to_string());
            if status != *want || !m.contains(message) {
                wrong.push(format!(
                    "{lua}, {what}: got {status} {m:?}, want {want} containing {message:?}"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "health.lua:\n  {}", wrong.join("\n  "));
}

#[test]
fn argocd_cm_carries_the_health_check_for_each_kind() {
    let script = std::fs::read_to_string(repo().join("deploy/argocd/health.lua")).unwrap();
    let cm: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("deploy/argocd/argocd-cm.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(cm["kind"].as_str(), Some("ConfigMap"));
    assert_eq!(cm["metadata"]["name"].as_str(), Some("argocd-cm"));
    for kind in ["Sandbox", "SandboxVolume", "SandboxTemplate"] {
        let key = format!("resource.customizations.health.sandboxes.dev_{kind}");
        let embedded = cm["data"][key.as_str()]
            .as_str()
            .unwrap_or_else(|| panic!("argocd-cm.yaml has no {key}"));
        assert!(
            embedded == script,
            "{key} differs from deploy/argocd/health.lua: copy it again"
        );
    }
    // Argo CD's sandbox has no io/os: the script must not reach for them.
    for forbidden in ["io.", "os.", "require", "dofile", "loadfile"] {
        assert!(!script.contains(forbidden), "health.lua uses {forbidden}");
    }
}

// ---- kstatus and Argo CD on the operator's live status ---------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn kstatus_and_argocd_read_the_operators_status() {
    let ns = namespace("gitops-health").await;
    let _purge = Purge(ns.clone());
    let mut op = Operator::start(&ns, &ns, &OperatorOptions::default());
    let base = base_image();

    // Ready at the current generation: Current / Healthy.
    apply_json(&sandbox(
        &ns,
        "ok",
        json!({"image": base, "command": idle()}),
    ));
    let ok = wait_kstatus("sbx", "ok", &ns, "Current", |o| {
        match condition(o, "Ready") {
            Some(c) if c["status"] == "True" => Ok(()),
            other => Err(format!("Ready {other:?}")),
        }
    })
    .await;
    assert_eq!(
        ok["status"]["observedGeneration"],
        ok["metadata"]["generation"]
    );
    assert_argocd(&ok, "Healthy");
    let generation = ok["metadata"]["generation"].as_i64().unwrap();

    // A generation bump reads InProgress until the operator has reconciled it. The operator
    // is stopped meanwhile, so "until" is not a race.
    op.terminate();
    kubectl_ok(
        &[
            "patch",
            "sbx",
            "ok",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"resources":{"pids":256}}}"#,
        ],
        None,
    );
    let bumped: Value = serde_json::from_str(&get_json("sbx", "ok", &ns).unwrap()).unwrap();
    assert_eq!(
        bumped["metadata"]["generation"].as_i64(),
        Some(generation + 1)
    );
    let (status, message) = kstatus(&bumped.to_string());
    assert_eq!(status, "InProgress", "{message}");
    assert!(
        message.contains(&format!(
            "generation is {}, but latest observed generation is {generation}",
            generation + 1
        )),
        "{message}"
    );
    assert_argocd(&bumped, "Progressing");
    let op = Operator::start(&ns, &ns, &OperatorOptions::default());
    let ok = wait_kstatus("sbx", "ok", &ns, "Current", |o| {
        if o["status"]["observedGeneration"] == o["metadata"]["generation"] {
            Ok(())
        } else {
            Err("not observed".into())
        }
    })
    .await;
    assert_eq!(ok["metadata"]["generation"].as_i64(), Some(generation + 1));
    assert_argocd(&ok, "Healthy");

    // Reconciling=True at the current generation reads InProgress too (waiting for a volume).
    let volumes = json!([{"volumeRef": {"name": "later"}, "mountPath": "/data"}]);
    apply_json(&sandbox(
        &ns,
        "waits",
        json!({"image": base, "command": idle(), "volumes": volumes}),
    ));
    let waits = wait_kstatus("sbx", "waits", &ns, "InProgress", |o| {
        let observed = o["status"]["observedGeneration"] == o["metadata"]["generation"];
        match condition(o, "Reconciling") {
            Some(c) if c["status"] == "True" && observed && c["reason"] == "VolumeNotFound" => {
                Ok(())
            }
            other => Err(format!("Reconciling {other:?}, observed {observed}")),
        }
    })
    .await;
    let message = assert_argocd(&waits, "Progressing");
    assert!(message.contains("VolumeNotFound"), "{message}");
    apply_json(&json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": "SandboxVolume",
        "metadata": {"name": "later", "namespace": ns},
        "spec": {"reclaimPolicy": "Delete"},
    }));
    let volume = wait_kstatus("sbxv", "later", &ns, "Current", |o| {
        match condition(o, "Ready") {
            Some(c) if c["status"] == "True" => Ok(()),
            other => Err(format!("Ready {other:?}")),
        }
    })
    .await;
    assert_argocd(&volume, "Healthy");
    let waits = wait_kstatus("sbx", "waits", &ns, "Current", |o| {
        match condition(o, "Ready") {
            Some(c) if c["status"] == "True" => Ok(()),
            other => Err(format!("Ready {other:?}")),
        }
    })
    .await;
    assert_argocd(&waits, "Healthy");

    // An invalid spec (a provider the operator does not have) reads Failed through Stalled.
    apply_json(&sandbox(
        &ns,
        "stuck",
        json!({"image": base, "provider": "nowhere"}),
    ));
    let stuck = wait_kstatus("sbx", "stuck", &ns, "Failed", |_| Ok(())).await;
    let stalled = condition(&stuck, "Stalled").expect("Stalled condition");
    assert_eq!(stalled["status"], "True");
    assert_eq!(
        condition(&stuck, "Ready").expect("Ready")["status"],
        "False"
    );
    assert_eq!(
        stuck["status"]["observedGeneration"],
        stuck["metadata"]["generation"]
    );
    let (_, kmessage) = kstatus(&stuck.to_string());
    assert_eq!(kmessage, stalled["message"].as_str().unwrap());
    let message = assert_argocd(&stuck, "Degraded");
    assert!(
        message.contains(stalled["reason"].as_str().unwrap()),
        "{message}"
    );

    // Asleep on purpose: Current for kstatus, Suspended for Argo CD.
    kubectl_ok(
        &[
            "patch",
            "sbx",
            "ok",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"state":"Sleeping"}}"#,
        ],
        None,
    );
    let asleep = wait_kstatus("sbx", "ok", &ns, "Current", |o| {
        let observed = o["status"]["observedGeneration"] == o["metadata"]["generation"];
        match condition(o, "Ready") {
            Some(c) if observed && c["status"] == "True" && c["reason"] == "Sleeping" => Ok(()),
            other => Err(format!("Ready {other:?}, observed {observed}")),
        }
    })
    .await;
    assert_argocd(&asleep, "Suspended");
    drop(op);
}

// ---- the GitOps example, applied the way GitOps tools apply it -------------------------------

/// examples/gitops/teams/team-a rendered by kustomize (kubectl's), moved into `ns` (the
/// Namespace object itself dropped: namespaces are per test here).
fn team_manifest(ns: &str) -> Vec<Value> {
    let dir = repo().join("examples/gitops/teams/team-a");
    let yaml = kubectl_ok(&["kustomize", &dir.to_string_lossy()], None);
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(&yaml)
        .map(|d| serde_json::to_value(serde_yaml::Value::deserialize(d).unwrap()).unwrap())
        .filter(|d: &Value| d["kind"] != "Namespace" && !d.is_null())
        .map(|mut d| {
            assert_eq!(
                d["metadata"]["namespace"], "team-a",
                "kustomize did not set the namespace: {d}"
            );
            assert_eq!(
                d["metadata"]["labels"]["team"], "team-a",
                "kustomize did not label: {d}"
            );
            d["metadata"]["namespace"] = json!(ns);
            d
        })
        .collect()
}

fn stream(docs: &[Value]) -> String {
    docs.iter()
        .map(|d| serde_yaml::to_string(d).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

fn resource_of(kind: &str) -> &'static str {
    match kind {
        "Sandbox" => "sandboxes.sandboxes.dev",
        "SandboxVolume" => "sandboxvolumes.sandboxes.dev",
        "SandboxTemplate" => "sandboxtemplates.sandboxes.dev",
        other => panic!("unexpected kind {other}"),
    }
}

/// Removes images committed for templates of an operator instance (a template controller may
/// capture the example's template while the test runs).
struct PurgeImages(String);

impl Drop for PurgeImages {
    fn drop(&mut self) {
        let filter = format!("label=sandboxes.dev/managed-by={}", self.0);
        if let Ok(out) = Command::new("docker")
            .args(["images", "-q", "--filter", &filter])
            .output()
        {
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("docker").args(["rmi", "-f", id]).output();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn gitops_example_renders_and_passes_a_server_side_dry_run() {
    let ns = namespace("gitops-dry").await;
    let docs = team_manifest(&ns);
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for d in &docs {
        *kinds
            .entry(d["kind"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(
        kinds,
        BTreeMap::from([
            ("Sandbox".into(), 3),
            ("SandboxTemplate".into(), 1),
            ("SandboxVolume".into(), 1)
        ])
    );
    let dev = docs
        .iter()
        .find(|d| d["metadata"]["name"] == "dev")
        .unwrap();
    assert_eq!(
        dev["spec"]["resources"]["memory"], "1Gi",
        "team-a's patch was not applied"
    );
    let out = kubectl_ok(
        &["apply", "--server-side", "--dry-run=server", "-f", "-"],
        Some(&stream(&docs)),
    );
    assert_eq!(
        out.matches("serverside-applied (server dry run)").count(),
        docs.len(),
        "{out}"
    );

    // The Argo CD Application and the Flux Kustomization sync that directory.
    for file in [
        "examples/gitops/argocd/team-a.yaml",
        "examples/gitops/flux/team-a.yaml",
    ] {
        let doc: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(repo().join(file)).unwrap()).unwrap();
        let path = doc["spec"]["source"]["path"]
            .as_str()
            .or(doc["spec"]["path"].as_str())
            .expect("path");
        let path = path.trim_start_matches("./");
        assert!(
            repo().join(path).join("kustomization.yaml").exists(),
            "{file}: {path} is not a kustomization"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn server_side_apply_twice_changes_nothing_and_the_operator_owns_no_spec() {
    const MANAGER: &str = "gitops-sync";
    let ns = namespace("gitops-ssa").await;
    let _purge = Purge(ns.clone());
    let _images = PurgeImages(ns.clone());
    let op = Operator::start(&ns, &ns, &OperatorOptions::default());
    let docs = team_manifest(&ns);
    let manifest = stream(&docs);
    let apply = [
        "apply",
        "--server-side",
        "--field-manager",
        MANAGER,
        "-f",
        "-",
    ];
    kubectl_ok(&apply, Some(&manifest));

    // Let the operator do its work: finalizers, status, a running and a sleeping sandbox.
    let ready = |o: &Value| match condition(o, "Ready") {
        Some(c) if c["status"] == "True" => Ok(()),
        other => Err(format!("Ready {other:?}")),
    };
    wait_kstatus("sbxv", "workspace", &ns, "Current", ready).await;
    wait_kstatus("sbx", "dev", &ns, "Current", ready).await;
    let agent = wait_kstatus("sbx", "agent-2", &ns, "Current", ready).await;
    assert_argocd(&agent, "Suspended");

    let read = |d: &Value| -> Value {
        let kind = d["kind"].as_str().unwrap();
        let name = d["metadata"]["name"].as_str().unwrap();
        let text = kubectl_ok(
            &[
                "get",
                resource_of(kind),
                name,
                "-n",
                &ns,
                "-o",
                "json",
                "--show-managed-fields",
            ],
            None,
        );
        serde_json::from_str(&text).unwrap()
    };
    let before: Vec<Value> = docs.iter().map(read).collect();

    // Apply the same manifest again: nothing changes.
    kubectl_ok(&apply, Some(&manifest));
    let after: Vec<Value> = docs.iter().map(read).collect();
    for ((want, b), a) in docs.iter().zip(&before).zip(&after) {
        let what = format!("{} {}", want["kind"], want["metadata"]["name"]);
        assert_eq!(
            a["metadata"]["generation"], b["metadata"]["generation"],
            "{what}: generation moved"
        );
        assert_eq!(a["spec"], b["spec"], "{what}: spec changed on re-apply");
        // Stored exactly as written: no defaults from the schema, nothing from the operator.
        assert_eq!(
            a["spec"], want["spec"],
            "{what}: stored spec differs from the manifest"
        );
    }
    // No drift for a GitOps tool to report.
    let out = kubectl(
        &[
            "diff",
            "--server-side",
            "--field-manager",
            MANAGER,
            "-f",
            "-",
        ],
        Some(&manifest),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "kubectl diff found drift:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Managed fields: only the applier owns spec; the operator owns status (via /status) and
    // the finalizer, nothing else.
    for object in &after {
        let what = format!("{} {}", object["kind"], object["metadata"]["name"]);
        let entries = object["metadata"]["managedFields"]
            .as_array()
            .expect("managedFields");
        let mut spec_owners = Vec::new();
        for e in entries {
            let manager = e["manager"].as_str().unwrap_or_default();
            let fields = &e["fieldsV1"];
            if fields.get("f:spec").is_some() {
                spec_owners.push(manager.to_string());
            }
            if manager != MANAGER {
                let top: Vec<&String> = fields
                    .as_object()
                    .map(|m| m.keys().collect())
                    .unwrap_or_default();
                for key in &top {
                    assert!(
                        *key == "f:status" || *key == "f:metadata",
                        "{what}: manager {manager} owns {key}"
                    );
                }
                if let Some(meta) = fields.get("f:metadata").and_then(Value::as_object) {
                    for key in meta.keys() {
                        assert_eq!(
                            key, "f:finalizers",
                            "{what}: manager {manager} owns metadata {key}"
                        );
                    }
                }
            }
        }
        assert_eq!(
            spec_owners,
            vec![MANAGER.to_string()],
            "{what}: spec owners"
        );
    }
    let dev = after
        .iter()
        .find(|o| o["metadata"]["name"] == "dev")
        .unwrap();
    let status_entry = dev["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["manager"] == "sandbox-operator" && e["subresource"] == "status")
        .unwrap_or_else(|| {
            panic!(
                "no status entry of the operator: {}",
                dev["metadata"]["managedFields"]
            )
        });
    assert_eq!(status_entry["operation"], "Apply");
    drop(op);
}
