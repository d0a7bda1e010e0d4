//! The kubectl experience, against the real API server (and the operator where status matters):
//! `kubectl explain` describes every field, `kubectl get` shows useful columns (and the
//! `sandboxes` category lists all three kinds), `kubectl wait --for=condition=Ready` works.

mod harness;

use harness::cluster::*;
use harness::docker::*;
use harness::operator::*;
use serde_json::{Value, json};

fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Every documented field path below `prefix` in an OpenAPI schema, with its description
/// (array items are walked through, as `kubectl explain` does).
fn fields(schema: &Value, prefix: &str, depth: usize, out: &mut Vec<(String, String)>) {
    let schema = if schema["type"] == "array" {
        &schema["items"]
    } else {
        schema
    };
    let Some(props) = schema["properties"].as_object() else {
        return;
    };
    for (name, sub) in props {
        let path = format!("{prefix}.{name}");
        out.push((
            path.clone(),
            sub["description"].as_str().unwrap_or_default().to_string(),
        ));
        if depth > 1 {
            fields(sub, &path, depth - 1, out);
        }
    }
}

#[test]
fn kubectl_explain_describes_every_field() {
    let mut cases = Vec::new();
    for (kind, crd) in [
        ("sandbox", "sandboxes.sandboxes.dev"),
        ("sandboxvolume", "sandboxvolumes.sandboxes.dev"),
        ("sandboxtemplate", "sandboxtemplates.sandboxes.dev"),
    ] {
        // The schema the API server serves, not the file: explain reads the same.
        let crd: Value =
            serde_json::from_str(&kubectl_ok(&["get", "crd", crd, "-o", "json"], None)).unwrap();
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        assert!(
            schema["description"].as_str().is_some_and(|d| d.len() > 40),
            "{kind} has no description"
        );
        cases.push((
            kind.to_string(),
            schema["description"].as_str().unwrap().to_string(),
        ));
        let mut found = Vec::new();
        fields(
            &schema["properties"]["spec"],
            &format!("{kind}.spec"),
            3,
            &mut found,
        );
        fields(
            &schema["properties"]["status"],
            &format!("{kind}.status"),
            2,
            &mut found,
        );
        assert!(found.len() > 5, "{kind}: only {} fields", found.len());
        cases.extend(found);
    }
    let undocumented: Vec<&String> = cases
        .iter()
        .filter(|(path, d)| {
            let leaf = path.rsplit('.').next().unwrap_or_default();
            d.len() < 15 || d.eq_ignore_ascii_case(leaf)
        })
        .map(|(p, _)| p)
        .collect();
    assert!(
        undocumented.is_empty(),
        "fields without a real description: {undocumented:?}"
    );

    // Ask kubectl, several at a time: the description it prints is the schema's.
    let failures: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .chunks(cases.len().div_ceil(6))
            .map(|chunk| {
                scope.spawn(move || {
                    let mut failures = Vec::new();
                    for (path, description) in chunk {
                        let out = kubectl(&["explain", path], None);
                        let text = String::from_utf8_lossy(&out.stdout);
                        let shown = text
                            .split_once("DESCRIPTION:")
                            .map(|(_, d)| squash(d))
                            .unwrap_or_default();
                        let want: String = squash(description).chars().take(60).collect();
                        if !out.status.success() || !shown.starts_with(&want) {
                            failures.push(format!(
                                "kubectl explain {path}: want {want:?}, got {shown:.80?} ({})",
                                String::from_utf8_lossy(&out.stderr).trim()
                            ));
                        }
                    }
                    failures
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(cases.len() > 60, "only {} fields checked", cases.len());

    // A few that users look up, by the short names too.
    for (path, words) in [
        ("sbx.spec.image", "Image to boot from"),
        ("sbx.spec.selfDeliveredEnv", "/run/sandboxes.dev/env"),
        (
            "sbx.spec.egress.allowedDomains",
            "An empty list: no outbound network at all",
        ),
        ("sbx.spec.lifetime.action", "Delete"),
        ("sbx.status.conditions", "Stalled"),
        ("sbxv.spec.reclaimPolicy", "Retain"),
        ("sbxt.spec.capturePaths", "Absolute paths to capture"),
    ] {
        let text = squash(&kubectl_ok(&["explain", path], None));
        assert!(
            text.contains(words),
            "kubectl explain {path}: no {words:?} in {text}"
        );
    }
}

fn table(text: &str) -> Vec<Vec<String>> {
    // Columns are separated by 2+ spaces; an empty cell shows as a wider gap, so split on the
    // header's column starts instead.
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = lines.next().unwrap_or_default();
    let mut starts = Vec::new();
    let bytes: Vec<char> = header.chars().collect();
    for (i, c) in bytes.iter().enumerate() {
        if *c != ' ' && (i == 0 || bytes[i - 1] == ' ') {
            starts.push(i);
        }
    }
    let cut = |line: &str| -> Vec<String> {
        let chars: Vec<char> = line.chars().collect();
        starts
            .iter()
            .enumerate()
            .map(|(k, &s)| {
                let e = starts
                    .get(k + 1)
                    .copied()
                    .unwrap_or(chars.len())
                    .min(chars.len());
                chars
                    .get(s.min(chars.len())..e)
                    .map(|c| c.iter().collect::<String>())
                    .unwrap_or_default()
                    .trim()
                    .to_string()
            })
            .collect()
    };
    std::iter::once(header).chain(lines).map(cut).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_get_shows_useful_columns() {
    let ns = namespace("ux-get").await;
    let _purge = Purge(ns.clone());
    let op = Operator::start(&ns, &ns, &OperatorOptions::default());
    let sandbox = json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "image": base_image(),
            "command": ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
            "state": "Running",
            "ports": [{"name": "http", "port": 8080}],
        },
    });
    let volume = json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": "SandboxVolume",
        "metadata": {"name": "data", "namespace": ns},
        "spec": {"reclaimPolicy": "Delete"},
    });
    kubectl_ok(&["apply", "-f", "-"], Some(&format!("{sandbox}\n{volume}")));
    kubectl_ok(
        &[
            "wait",
            "--for=condition=Ready",
            "sbx/web",
            "sbxv/data",
            "-n",
            &ns,
            "--timeout=90s",
        ],
        None,
    );

    let rows = table(&kubectl_ok(&["get", "sbx", "-n", &ns], None));
    assert_eq!(
        rows[0],
        ["NAME", "PROVIDER", "STATE", "READY", "REASON", "URL", "AGE"]
    );
    let web = &rows[1];
    let url = get_json("sbx", "web", &ns)
        .map(|t| serde_json::from_str::<Value>(&t).unwrap()["status"]["url"].clone())
        .unwrap();
    let url = url.as_str().expect("status.url");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert_eq!(
        &web[..6],
        ["web", "docker", "Running", "True", "Running", url]
    );
    assert!(!web[6].is_empty(), "no AGE");

    let rows = table(&kubectl_ok(&["get", "sbxv", "-n", &ns], None));
    assert_eq!(
        rows[0],
        ["NAME", "PROVIDER", "READY", "ATTACHED", "RECLAIM", "AGE"]
    );
    assert_eq!(&rows[1][..5], ["data", "docker", "True", "false", "Delete"]);

    // A template in a namespace no operator watches (so nothing is ever captured): the
    // columns are there before any status is.
    let quiet = namespace("ux-get-t").await;
    kubectl_ok(
        &["apply", "-f", "-"],
        Some(
            &json!({
                "apiVersion": "sandboxes.dev/v1alpha1",
                "kind": "SandboxTemplate",
                "metadata": {"name": "tools", "namespace": quiet},
                "spec": {"sandboxRef": {"name": "web"}, "capturePaths": ["/opt"]},
            })
            .to_string(),
        ),
    );
    let rows = table(&kubectl_ok(&["get", "sbxt", "-n", &quiet], None));
    assert_eq!(
        rows[0],
        [
            "NAME",
            "PROVIDER",
            "READY",
            "INUSE",
            "PUBLISHED",
            "SIZE",
            "AGE"
        ]
    );
    assert_eq!(rows[1][0], "tools");

    // The `sandboxes` category lists every kind at once.
    let all = kubectl_ok(&["get", "sandboxes", "-n", &ns], None);
    for name in [
        "sandbox.sandboxes.dev/web",
        "sandboxvolume.sandboxes.dev/data",
    ] {
        assert!(
            all.contains(name),
            "`kubectl get sandboxes` does not list {name}:\n{all}"
        );
    }
    let all = kubectl_ok(&["get", "sandboxes", "-n", &quiet], None);
    assert!(all.contains("sandboxtemplate.sandboxes.dev/tools"), "{all}");
    // Wide output adds nothing hidden, but the columns survive it.
    let wide = table(&kubectl_ok(
        &["get", "sbx", "web", "-n", &ns, "-o", "wide"],
        None,
    ));
    assert_eq!(
        wide[0][..6],
        ["NAME", "PROVIDER", "STATE", "READY", "REASON", "URL"]
    );
    drop(op);
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_wait_for_condition_ready_works() {
    let ns = namespace("ux-wait").await;
    let _purge = Purge(ns.clone());
    let op = Operator::start(&ns, &ns, &OperatorOptions::default());
    let sandbox = |name: &str, extra: Value| {
        let mut spec = json!({
            "image": base_image(),
            "command": ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"],
        });
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({
            "apiVersion": "sandboxes.dev/v1alpha1",
            "kind": "Sandbox",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        })
        .to_string()
    };
    kubectl_ok(&["apply", "-f", "-"], Some(&sandbox("quick", json!({}))));
    let out = kubectl(
        &[
            "wait",
            "--for=condition=Ready",
            "sbx/quick",
            "-n",
            &ns,
            "--timeout=90s",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "kubectl wait failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        op.log_tail()
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("sandbox.sandboxes.dev/quick condition met")
    );
    // What the wait saw is what status says.
    let s: Value = serde_json::from_str(&get_json("sbx", "quick", &ns).unwrap()).unwrap();
    let ready = s["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["status"], "True");

    // A sandbox that cannot become Ready: waiting for Ready times out (exit status 1), while
    // waiting for the condition the operator does report succeeds.
    kubectl_ok(
        &["apply", "-f", "-"],
        Some(&sandbox("stuck", json!({"provider": "nowhere"}))),
    );
    kubectl_ok(
        &[
            "wait",
            "--for=condition=Stalled",
            "sbx/stuck",
            "-n",
            &ns,
            "--timeout=90s",
        ],
        None,
    );
    kubectl_ok(
        &[
            "wait",
            "--for=condition=Ready=False",
            "sbx/stuck",
            "-n",
            &ns,
            "--timeout=10s",
        ],
        None,
    );
    let out = kubectl(
        &[
            "wait",
            "--for=condition=Ready",
            "sbx/stuck",
            "-n",
            &ns,
            "--timeout=2s",
        ],
        None,
    );
    assert!(
        !out.status.success(),
        "kubectl wait said a stalled sandbox is Ready"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("timed out"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Waiting on several at once, by label, as scripts do.
    kubectl_ok(&["label", "sbx", "quick", "-n", &ns, "tier=batch"], None);
    kubectl_ok(
        &[
            "wait",
            "--for=condition=Ready",
            "sbx",
            "-l",
            "tier=batch",
            "-n",
            &ns,
            "--timeout=30s",
        ],
        None,
    );
    drop(op);
}
