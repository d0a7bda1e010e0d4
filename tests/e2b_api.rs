//! The E2B-compatible API (src/e2bapi) driven by the official E2B SDKs — Python (`e2b`
//! from PyPI, pinned in tests/setup/e2b-py.sh, tests/e2b/driver.py) and JS (`e2b` from npm,
//! pinned in tests/setup/e2b-js.sh, tests/e2b/driver.mjs) — against the real API server, on
//! the Docker provider and on the Kubernetes provider (Pods on the test nodes). API keys are
//! Secrets in two namespaces, each key acting as a ServiceAccount whose Role allows
//! Sandboxes. One body ([`rest_api`]) runs with each SDK and provider; it also checks that
//! `set_timeout` is enforced and that envd opens a sandbox to its own token only.

mod harness;

use sandbox_doubles::ports::quiet_port;
use std::time::Duration;

use harness::cluster::{apply_yaml_ok, kubectl, kubectl_ok, namespace};
use harness::e2b_sdk::{Sdk, SdkKind, api_config, api_up, ensure_sleep_crd, key_for, options};
use harness::kubernetes::Kubernetes;
use harness::objects::{wait_gone, wait_ready_within};
use harness::operator::{Operator, OperatorOptions};
use harness::tenant::tenant;
use harness::world::World;
use harness::{unique, wait_for};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use sandbox_operator::api::{LifetimeAction, Sandbox};
use sandbox_operator::e2bapi::id;
use serde_json::{Value, json};

fn ids(answer: &Value) -> Vec<String> {
    let mut ids: Vec<String> = answer["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_str().expect("id").to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn the_python_sdk_drives_the_rest_api_on_docker() {
    on_docker(Sdk::python).await;
}

#[tokio::test]
async fn the_js_sdk_drives_the_rest_api_on_docker() {
    on_docker(Sdk::js).await;
}

/// The REST body with `sdk` against an operator on the Docker provider.
async fn on_docker(sdk: fn(u16) -> Sdk) {
    ensure_sleep_crd();
    let port = quiet_port();
    let a = tenant("e2b-a", &options(port)).await;
    let b = namespace("e2b-b").await;
    // The other key's sandboxes run too: create answers once a sandbox runs.
    let _op_b = Operator::start(&b, &b, &OperatorOptions::default());
    api_up(port).await;
    let home = Home {
        ns: &a.ns,
        api: &a.api,
        op: &a.op,
        pods: None,
        port,
    };
    rest_api(&sdk(port).serving(), &home, &b).await;
}

/// The REST body with the Python SDK against an operator on the Kubernetes provider: every
/// sandbox made through the API is a Ready Pod on a test node, and its Pod is gone after
/// kill. The template alias boots the base image, which the test nodes have imported.
#[tokio::test]
async fn the_python_sdk_drives_the_rest_api_on_kubernetes() {
    on_kubernetes(Sdk::python, |sdk, home, b| Box::pin(rest_api(sdk, home, b))).await;
}

/// The same with the JS SDK.
#[tokio::test]
async fn the_js_sdk_drives_the_rest_api_on_kubernetes() {
    on_kubernetes(Sdk::js, |sdk, home, b| Box::pin(rest_api(sdk, home, b))).await;
}

/// autoPause on the Kubernetes provider: at its timeout the sandbox must sleep (its Pod
/// stopped), and connect runs it again.
#[tokio::test]
async fn auto_pause_on_kubernetes_sleeps_the_sandbox() {
    on_kubernetes(Sdk::python, |sdk, home, _| {
        Box::pin(async move {
            let key = key_for(home.ns);
            once_key_read(sdk, &key, "list", json!({}));
            auto_pause(sdk, &key, home.api).await;
        })
    })
    .await;
}

type Body = for<'a> fn(
    &'a Sdk,
    &'a Home<'a>,
    &'a str,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>>;

/// `body` with `sdk` against an operator on the Kubernetes provider, with a second
/// namespace for the other key.
async fn on_kubernetes(sdk: fn(u16) -> Sdk, body: Body) {
    ensure_sleep_crd();
    let port = quiet_port();
    let world = World::<Kubernetes>::kubernetes("e2b-k").await;
    let op = world.operator(&api_config(port), vec![]);
    let b = namespace("e2b-kb").await;
    let b_options = OperatorOptions {
        config_extra: world.config("", ""),
        ..OperatorOptions::default()
    };
    let op_b = Operator::start(&b, &b, &b_options);
    api_up(port).await;
    let pods = world.pods().await;
    let home = Home {
        ns: &world.ns,
        api: &world.api,
        op: &op,
        pods: Some(&pods),
        port,
    };
    body(&sdk(port).serving(), &home, &b).await;
    drop((op, op_b));
    for ns in [&world.ns, &b] {
        let _ = kubectl(&["delete", "namespace", ns, "--wait=false"], None);
    }
}

/// The namespace the first key maps to, and what runs its sandboxes.
struct Home<'a> {
    ns: &'a str,
    api: &'a Api<Sandbox>,
    op: &'a Operator,
    /// The provider's Pods, on the Kubernetes provider.
    pods: Option<&'a Api<Pod>>,
    /// The E2B API's (and envd's) port on loopback.
    port: u16,
}

impl Home<'_> {
    /// The Sandbox `name` once Ready (on Kubernetes: its Pod Ready on a test node).
    async fn ready(&self, name: &str) -> Sandbox {
        let within = match self.pods {
            Some(_) => harness::kubernetes::READY_TIMEOUT,
            None => harness::objects::READY_TIMEOUT,
        };
        let sandbox = wait_ready_within(self.api, name, self.op, within).await;
        if let Some(pods) = self.pods {
            let pod = pod_of(&sandbox);
            let pod = pods.get(&pod).await.expect("the sandbox's Pod");
            assert!(pod_ready(&pod), "{:?}", pod.status);
            let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
            assert!(node.starts_with("sbx-node-"), "scheduled on {node:?}");
        }
        sandbox
    }

    /// The Sandbox `name` and, on Kubernetes, its Pod are gone.
    async fn gone(&self, name: &str, pod: Option<String>) {
        let within = Duration::from_secs(90);
        wait_gone(self.api, name, within).await;
        if let (Some(pods), Some(pod)) = (self.pods, pod) {
            wait_for("the sandbox's Pod to be gone", within, || async {
                match pods.get_opt(&pod).await {
                    Ok(None) => Ok(()),
                    Ok(Some(_)) => Err("still there".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            })
            .await;
        }
    }
}

/// The provider id of a Ready sandbox (the Pod's name on Kubernetes).
fn pod_of(sandbox: &Sandbox) -> String {
    sandbox
        .status
        .as_ref()
        .and_then(|s| s.sandbox_id.clone())
        .expect("a provider id")
}

fn pod_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Every REST call of the SDK: create, list (metadata query, paging, isolation), get,
/// set timeout, pause and connect, autoPause, RBAC refusal, a wrong key, kill.
async fn rest_api(sdk: &Sdk, a: &Home<'_>, b: &str) {
    let (key_a, key_b) = (key_for(a.ns), key_for(b));
    let suite = unique("suite");
    for key in [&key_a, &key_b] {
        let empty = once_key_read(sdk, key, "list", json!({"metadata": {"suite": suite}}));
        assert_eq!(empty, json!({"ids": [], "pages": 1}), "{empty}");
    }

    // A wrong key is a 401, which the SDK raises as its authentication error with the
    // API's message.
    let wrong = sdk.run("e2b_not_a_key_of_anyone", "list", json!({}));
    assert_eq!(wrong["error"], sdk.error_name("Authentication"), "{wrong}");
    let message = wrong["message"].as_str().unwrap_or_default();
    assert!(message.contains("X-API-KEY"), "{wrong}");
    if sdk.kind() == SdkKind::Python {
        assert!(message.contains("401"), "{wrong}");
    }

    // Create with metadata, envs and a timeout: a Sandbox in the key's namespace.
    let created = sdk.ok(
        &key_a,
        "create",
        json!({"timeout": 300, "metadata": {"suite": suite, "user": "alice"},
               "envs": {"GREETING": "hello"}}),
    );
    let alice = created["sandbox_id"].as_str().expect("id").to_string();
    assert_eq!(created["has_token"], true, "{created}");
    let object = id::parse(&alice).expect("an id of this API");
    assert_eq!(object.namespace, a.ns);
    let sandbox = a.ready(&object.name).await;
    check_mapping(&sandbox, a.ns);
    let listed = kubectl_ok(&["get", "sbx", "-n", a.ns, "-o", "name"], None);
    assert!(listed.contains(&object.name), "{listed}");

    let bob = sdk.ok(
        &key_a,
        "create",
        json!({"timeout": 300, "metadata": {"suite": suite, "user": "bob"}}),
    );
    let bob = bob["sandbox_id"].as_str().expect("id").to_string();
    let other = sdk.ok(
        &key_b,
        "create",
        json!({"timeout": 300, "metadata": {"suite": suite, "user": "alice"}}),
    );
    let other = other["sandbox_id"].as_str().expect("id").to_string();

    list_and_isolation(sdk, (&key_a, &key_b), &suite, (&alice, &bob, &other));
    info_and_timeout(sdk, &key_a, &alice, &suite);
    pause_and_connect(sdk, &key_a, a.api, &bob).await;
    not_allowed_by_rbac(sdk, b);
    // On Kubernetes autoPause is its own test (see auto_pause_on_kubernetes_sleeps_the_sandbox).
    if a.pods.is_none() {
        auto_pause(sdk, &key_a, a.api).await;
    }
    envd_refuses_other_tenants(sdk, a.port, (&key_a, &key_b), (&alice, &other)).await;
    kill_and_gone(sdk, &key_a, a, (&alice, pod_of(&sandbox)), (&other, b)).await;
    timeout_enforced(sdk, &key_a, a, &bob).await;

    assert_eq!(
        sdk.ok(&key_b, "kill", json!({"sandbox_id": other}))["killed"],
        true
    );
    let _ = kubectl(&["delete", "namespace", b, "--wait=false"], None);
}

/// The object carries what the SDK asked for, and who asked.
fn check_mapping(sandbox: &Sandbox, ns: &str) {
    let env = sandbox.spec.env.as_ref().expect("env");
    assert!(
        env.iter()
            .any(|e| e.name == "GREETING" && e.value == "hello"),
        "{env:?}"
    );
    let lifetime = sandbox.spec.lifetime.as_ref().expect("lifetime");
    assert_eq!(lifetime.action, Some(LifetimeAction::Delete));
    assert!(lifetime.shutdown_at.is_some());
    let annotations = sandbox.metadata.annotations.as_ref().expect("annotations");
    assert_eq!(
        annotations["e2b.sandboxes.dev/created-by"],
        format!("system:serviceaccount:{ns}:agent")
    );
    let managers: Vec<_> = sandbox
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.as_deref())
        .collect();
    assert!(
        managers.contains(&"sandbox-operator-e2b-api"),
        "{managers:?}"
    );
}

/// The metadata query selects exactly; paging walks every page; a key never sees another
/// namespace's sandboxes.
fn list_and_isolation(
    sdk: &Sdk,
    (key_a, key_b): (&str, &str),
    suite: &str,
    (alice, bob, other): (&str, &str, &str),
) {
    let only_alice = sdk.ok(
        key_a,
        "list",
        json!({"metadata": {"suite": suite, "user": "alice"}}),
    );
    assert_eq!(ids(&only_alice), [alice.to_string()], "{only_alice}");
    let both = sdk.ok(
        key_a,
        "list",
        json!({"metadata": {"suite": suite}, "limit": 1}),
    );
    let mut want = vec![alice.to_string(), bob.to_string()];
    want.sort();
    assert_eq!(ids(&both), want, "{both}");
    assert!(both["pages"].as_u64().expect("pages") >= 2, "{both}");
    let theirs = sdk.ok(key_b, "list", json!({"metadata": {"suite": suite}}));
    assert_eq!(ids(&theirs), [other.to_string()], "{theirs}");
    let cross = sdk.run(key_a, "info", json!({"sandbox_id": other}));
    assert_eq!(cross["error"], sdk.error_name("SandboxNotFound"), "{cross}");
}

/// get_info reads the object back; set_timeout moves its end.
fn info_and_timeout(sdk: &Sdk, key: &str, sid: &str, suite: &str) {
    let info = sdk.ok(key, "info", json!({"sandbox_id": sid}));
    assert_eq!(info["sandbox_id"], sid);
    assert_eq!(info["template_id"], "base");
    assert_eq!(info["state"], "running");
    assert_eq!(info["metadata"], json!({"suite": suite, "user": "alice"}));
    let before = chrono::DateTime::parse_from_rfc3339(info["end_at"].as_str().expect("end"))
        .expect("end_at");
    sdk.ok(
        key,
        "set_timeout",
        json!({"sandbox_id": sid, "timeout": 3600}),
    );
    let after = sdk.ok(key, "info", json!({"sandbox_id": sid}));
    let after = chrono::DateTime::parse_from_rfc3339(after["end_at"].as_str().expect("end"))
        .expect("end_at");
    let moved = (after - before).num_seconds();
    assert!((3000..=3400).contains(&moved), "end moved by {moved}s");
}

/// pause sleeps the sandbox (Docker: paused, processes kept) until connect runs it again.
async fn pause_and_connect(sdk: &Sdk, key: &str, api: &Api<Sandbox>, sid: &str) {
    let name = id::parse(sid).expect("id").name;
    assert_eq!(
        sdk.ok(key, "pause", json!({"sandbox_id": sid}))["paused"],
        true
    );
    let paused = api.get(&name).await.expect("sandbox");
    assert_eq!(
        paused.spec.state,
        Some(sandbox_operator::api::DesiredState::Sleeping)
    );
    assert_eq!(
        sdk.ok(key, "info", json!({"sandbox_id": sid}))["state"],
        "paused"
    );
    // A second pause is a 409, which the SDK reports as "already paused".
    assert_eq!(
        sdk.ok(key, "pause", json!({"sandbox_id": sid}))["paused"],
        false
    );
    let connected = sdk.ok(key, "connect", json!({"sandbox_id": sid, "timeout": 120}));
    assert_eq!(connected["sandbox_id"], sid);
    assert_eq!(
        sdk.ok(key, "info", json!({"sandbox_id": sid}))["state"],
        "running"
    );
    let running = api.get(&name).await.expect("sandbox");
    assert_eq!(running.spec.state, None);
    assert!(
        running
            .spec
            .lifetime
            .is_some_and(|l| l.shutdown_at.is_some())
    );
}

/// `lifecycle={"on_timeout": "pause"}` (autoPause): at its timeout the operator suspends
/// the sandbox instead of deleting it, and connect runs it again.
async fn auto_pause(sdk: &Sdk, key: &str, api: &Api<Sandbox>) {
    let args = json!({"timeout": 3, "lifecycle": {"on_timeout": "pause"}});
    let sid = sdk.ok(key, "create", args)["sandbox_id"]
        .as_str()
        .expect("id")
        .to_string();
    let name = id::parse(&sid).expect("id").name;
    let phase = |want: &'static str| {
        let (api, name) = (api.clone(), name.clone());
        move || {
            let (api, name) = (api.clone(), name.clone());
            async move {
                let s = api.get(&name).await.map_err(|e| e.to_string())?;
                let phase = s.status.and_then(|st| st.phase).unwrap_or_default();
                (phase == want)
                    .then_some(())
                    .ok_or(format!("phase {phase:?}"))
            }
        }
    };
    wait_for(
        "the auto-paused sandbox to sleep",
        Duration::from_secs(90),
        phase("Sleeping"),
    )
    .await;
    let slept = api.get(&name).await.expect("sandbox");
    assert_eq!(
        slept.spec.lifetime.and_then(|l| l.action),
        Some(LifetimeAction::Sleep)
    );
    assert_eq!(
        sdk.ok(key, "info", json!({"sandbox_id": sid}))["state"],
        "paused"
    );
    sdk.ok(key, "connect", json!({"sandbox_id": sid, "timeout": 120}));
    wait_for(
        "the connected sandbox to run",
        Duration::from_secs(90),
        phase("Running"),
    )
    .await;
    assert_eq!(
        sdk.ok(key, "kill", json!({"sandbox_id": sid}))["killed"],
        true
    );
}

/// The API acts as the key's ServiceAccount: one without RBAC on Sandboxes is refused by
/// the API server (403), not served with the operator's own rights.
fn not_allowed_by_rbac(sdk: &Sdk, ns: &str) {
    let key = format!("e2b_{}", unique("n").replace('-', ""));
    let yaml = format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: nobody}}\n---\napiVersion: v1\n\
         kind: Secret\nmetadata: {{name: e2b-key-nobody}}\ntype: sandboxes.dev/e2b-api-key\n\
         stringData: {{apiKey: {key}, serviceAccount: nobody}}\n"
    );
    apply_yaml_ok(&yaml, ns);
    let refused = once_key_read(sdk, &key, "create", json!({"timeout": 60}));
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .contains("403"),
        "{refused}"
    );
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .contains("system:serviceaccount"),
        "{refused}"
    );
}

/// The answer of `scenario` with a new key, once the API's watch has read the key (no 401
/// any more), polled with a deadline.
fn once_key_read(sdk: &Sdk, key: &str, scenario: &str, args: Value) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let answer = sdk.run(key, scenario, args.clone());
        let unread = answer["error"] == sdk.error_name("Authentication");
        if !unread || std::time::Instant::now() > deadline {
            return answer;
        }
    }
}

/// `set_timeout` to a few seconds is enforced: the sandbox (and on Kubernetes its Pod) is
/// gone soon after, with no kill.
async fn timeout_enforced(sdk: &Sdk, key: &str, home: &Home<'_>, sid: &str) {
    let name = id::parse(sid).expect("id").name;
    let pod = pod_of(&home.api.get(&name).await.expect("the sandbox"));
    sdk.ok(key, "set_timeout", json!({"sandbox_id": sid, "timeout": 3}));
    home.gone(&name, Some(pod)).await;
    let gone = sdk.run(key, "info", json!({"sandbox_id": sid}));
    assert_eq!(gone["error"], sdk.error_name("SandboxNotFound"), "{gone}");
}

/// envd opens a's sandbox only to a's own token: b's sandbox token, b's API key and no
/// token at all are refused with 401 `unauthenticated`, for `commands.run` (the Connect
/// stream `process.Process/Start`) and for `files.read` (`GET /files`), before anything is
/// looked up. a's token opening both is the control that the requests are right.
async fn envd_refuses_other_tenants(
    sdk: &Sdk,
    port: u16,
    (key_a, key_b): (&str, &str),
    (sid_a, sid_b): (&str, &str),
) {
    let token = |key: &str, sid: &str| {
        let answer = sdk.ok(key, "token", json!({"sandbox_id": sid}));
        answer["token"].as_str().expect("token").to_string()
    };
    let (token_a, token_b) = (token(key_a, sid_a), token(key_b, sid_b));
    assert_ne!(token_a, token_b);
    for (what, presented) in [
        ("a's token", Some(token_a.as_str())),
        ("b's token", Some(token_b.as_str())),
        ("b's key", Some(key_b)),
        ("no token", None),
    ] {
        let own = what == "a's token";
        for (call, request) in envd_calls(port, sid_a) {
            let request = match presented {
                Some(t) => request.header("X-Access-Token", t),
                None => request.header("X-API-KEY", key_b),
            };
            let answer = request.send().await.expect("envd answers");
            let status = answer.status().as_u16();
            let body = answer.text().await.unwrap_or_default();
            if own {
                assert_eq!(status, 200, "{call} with {what}: {body}");
            } else {
                assert_eq!(status, 401, "{call} with {what}: {body}");
                assert!(
                    body.contains("unauthenticated"),
                    "{call} with {what}: {body}"
                );
            }
        }
    }
}

/// `commands.run("echo hi")` and `files.read("/etc/hostname")` on envd for `sid`, as the
/// SDKs send them, without a token.
fn envd_calls(port: u16, sid: &str) -> [(&'static str, reqwest::RequestBuilder); 2] {
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let start = br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"]}}"#;
    let mut envelope = vec![0u8];
    envelope.extend_from_slice(&(start.len() as u32).to_be_bytes());
    envelope.extend_from_slice(start);
    let run = http
        .post(format!("{base}/process.Process/Start"))
        .header("Content-Type", "application/connect+json")
        .header("Connect-Protocol-Version", "1")
        .header("E2b-Sandbox-Id", sid)
        .body(envelope);
    let read = http
        .get(format!("{base}/files?path=/etc/hostname"))
        .header("E2b-Sandbox-Id", sid);
    [("commands.run", run), ("files.read", read)]
}

/// kill deletes the object (and on Kubernetes its Pod); a second kill, and a kill of
/// another namespace's id, find none.
async fn kill_and_gone(
    sdk: &Sdk,
    key: &str,
    home: &Home<'_>,
    (sid, pod): (&str, String),
    (foreign, foreign_ns): (&str, &str),
) {
    assert_eq!(
        sdk.ok(key, "kill", json!({"sandbox_id": sid}))["killed"],
        true
    );
    let name = id::parse(sid).expect("id").name;
    home.gone(&name, Some(pod)).await;
    assert_eq!(
        sdk.ok(key, "kill", json!({"sandbox_id": sid}))["killed"],
        false
    );
    assert_eq!(
        sdk.ok(key, "kill", json!({"sandbox_id": foreign}))["killed"],
        false
    );
    let theirs = id::parse(foreign).expect("id").name;
    kubectl_ok(&["get", "sbx", &theirs, "-n", foreign_ns], None);
}

/// `GET /sandboxes/{id}/logs` (and v2) answers the main process's output from the Docker
/// provider's logs capability, in E2B's `SandboxLogs` shape, read with a plain HTTP client
/// and the `X-API-KEY` (the SDKs have no logs call).
#[tokio::test]
async fn logs_answer_the_main_process_output() {
    ensure_sleep_crd();
    let port = quiet_port();
    let a = tenant("e2b-logs", &options(port)).await;
    api_up(port).await;
    let key = key_for(&a.ns);
    let sdk = Sdk::python(port);
    once_key_read(&sdk, &key, "list", json!({}));
    let sid = sdk.ok(&key, "create", json!({"timeout": 300}))["sandbox_id"]
        .as_str()
        .expect("id")
        .to_string();
    // The main process prints three lines (a command change recreates the sandbox).
    let name = id::parse(&sid).expect("id").name;
    let command =
        r#"{"spec":{"command":["sh","-c","echo one; echo two; echo three; exec sleep infinity"]}}"#;
    kubectl_ok(
        &[
            "patch",
            "sbx",
            &name,
            "-n",
            &a.ns,
            "--type=merge",
            "-p",
            command,
        ],
        None,
    );
    let base = format!("http://127.0.0.1:{port}");
    let v1 = format!("{base}/sandboxes/{sid}/logs");
    let answer = wait_for(
        "the three lines in the log",
        Duration::from_secs(90),
        || logs_lines(&v1, &key, "logs", "line", 3),
    )
    .await;
    assert_eq!(answer.1, ["one", "two", "three"], "{}", answer.0);
    let first = &answer.0["logs"][0];
    let start = chrono::DateTime::parse_from_rfc3339(first["timestamp"].as_str().expect("time"))
        .expect("an RFC 3339 timestamp");
    assert_eq!(
        answer.0["logEntries"][2]["message"], "three",
        "{}",
        answer.0
    );

    // v2: newest first, limit, search.
    let v2 = format!("{base}/v2/sandboxes/{sid}/logs?direction=backward&limit=2");
    let (body, lines) = logs_lines(&v2, &key, "logs", "message", 2)
        .await
        .expect("v2");
    assert_eq!(lines, ["three", "two"], "{body}");
    let search = format!("{base}/v2/sandboxes/{sid}/logs?search=tw");
    let (body, lines) = logs_lines(&search, &key, "logs", "message", 1)
        .await
        .expect("search");
    assert_eq!(lines, ["two"], "{body}");
    // v1 start: nothing before it.
    let later = start.timestamp_millis() + 60_000;
    let empty = format!("{base}/sandboxes/{sid}/logs?start={later}");
    let (body, lines) = logs_lines(&empty, &key, "logs", "line", 0)
        .await
        .expect("start");
    assert!(lines.is_empty(), "{body}");

    let http = reqwest::Client::new();
    let nokey = http.get(&v1).send().await.expect("GET");
    assert_eq!(nokey.status(), 401);
    let unknown = format!("{base}/sandboxes/aaaaaaaaaaaa-{}/logs", a.ns);
    let unknown = http
        .get(&unknown)
        .header("X-API-KEY", &key)
        .send()
        .await
        .expect("GET");
    assert_eq!(unknown.status(), 404);
    assert_eq!(
        sdk.ok(&key, "kill", json!({"sandbox_id": sid}))["killed"],
        true
    );
}

/// The log answer at `url` and the `field` of each entry of its `list`, once it has at
/// least `want` entries.
async fn logs_lines(
    url: &str,
    key: &str,
    list: &str,
    field: &str,
    want: usize,
) -> Result<(Value, Vec<String>), String> {
    let response = reqwest::Client::new()
        .get(url)
        .header("X-API-KEY", key)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body: Value = response.json().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {body}"));
    }
    let lines: Vec<String> = body[list]
        .as_array()
        .ok_or(format!("no {list}: {body}"))?
        .iter()
        .map(|e| e[field].as_str().unwrap_or_default().to_string())
        .collect();
    if lines.len() < want {
        return Err(format!("{} lines: {body}", lines.len()));
    }
    Ok((body, lines))
}
