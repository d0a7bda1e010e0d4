//! End to end on Fly Machines: `kubectl apply` → the operator binary → the Fly double (a
//! Machines API server where every machine is a real Docker container), through a real
//! kube-apiserver. Each test has its own namespace, operator instance and double.

mod harness;

use std::collections::BTreeMap;
use std::time::Duration;

use harness::cluster::*;
use harness::metrics::{PassCount, Passes};
use harness::objects::{READY_TIMEOUT, delete_and_wait_gone, patch_spec, wait_ready};
use harness::wait_for;
use harness::world::{Backend, SWEEPER, foreign_labels, token_file};
use kube::Api;
use reqwest::Method;
use sandbox_doubles::fly::{FlyDouble, FlyDoubleOptions, Matcher, spawn};
use sandbox_operator::api::{Sandbox, condition};
use serde_json::{Value, json};

/// Serves the machine's id on 8080 (perl-base only).
const SERVER: &str = "perl -MIO::Socket::INET -e '$s=IO::Socket::INET->new(LocalPort=>8080,Listen=>5,ReuseAddr=>1) or die; \
    while($c=$s->accept){<$c>; print $c \"HTTP/1.0 200 OK\\r\\n\\r\\n$ENV{FLY_MACHINE_ID}\"; close $c}'";

/// The Fly side of a test's world: a double, the token file the operator reads, and the
/// public ports the provider may hand out.
struct Fly {
    double: FlyDouble,
    token: tempfile::NamedTempFile,
    first_port: u16,
}

impl Backend for Fly {
    const NAME: &'static str = "fly";
    const TYPE: &'static str = "fly";

    fn settings(&self) -> String {
        format!(
            "      apiUrl: {}\n      app: {}\n      token: {{file: {}}}\n      publicHost: {}\n      \
             firstPublicPort: {}\n      lastPublicPort: {}\n      driftIntervalSeconds: 2\n",
            self.double.base_url(),
            self.double.app(),
            self.token.path().display(),
            self.double.publish_host(),
            self.first_port,
            self.first_port + 300,
        )
    }
}

/// One test's world: a namespace (= operator instance) and a Fly double.
type World = harness::world::World<Fly>;

impl World {
    async fn new(prefix: &str) -> World {
        let double = spawn(FlyDoubleOptions::default())
            .await
            .expect("Fly double");
        let fly = Fly {
            token: token_file(double.token()),
            double,
            first_port: sandbox_doubles::ports::quiet_block(501),
        };
        World::around(namespace(prefix).await, fly).await
    }

    async fn shutdown(self) {
        self.backend.double.shutdown().await;
    }
}

impl Fly {
    /// Runs `script` in machine `id` straight through the exec API: (exit code, stdout).
    async fn sh(&self, id: &str, script: &str) -> (i64, String) {
        let url = format!(
            "{}/v1/apps/{}/machines/{id}/exec",
            self.double.base_url(),
            self.double.app()
        );
        let reply: Value = reqwest::Client::new()
            .post(url)
            .bearer_auth(self.double.token())
            .json(&json!({"command": ["sh", "-c", script], "timeout": 30}))
            .send()
            .await
            .expect("exec")
            .json()
            .await
            .expect("exec reply");
        (
            reply["exit_code"].as_i64().unwrap_or(-1),
            reply["stdout"].as_str().unwrap_or("").to_string(),
        )
    }

    /// A machine as the Machines API shows it (straight at the double).
    async fn machine(&self, id: &str) -> Value {
        let url = format!(
            "{}/v1/apps/{}/machines/{id}",
            self.double.base_url(),
            self.double.app()
        );
        reqwest::Client::new()
            .get(url)
            .bearer_auth(self.double.token())
            .send()
            .await
            .expect("get machine")
            .json()
            .await
            .expect("machine json")
    }

    /// Creates a machine straight through the API (a person with flyctl, a crashed
    /// operator elsewhere), started, with `metadata`.
    async fn plant(&self, metadata: Value) -> String {
        let url = format!(
            "{}/v1/apps/{}/machines",
            self.double.base_url(),
            self.double.app()
        );
        let body = json!({"config": {
            "image": harness::docker::base_image(),
            "init": {"exec": ["sleep", "infinity"]},
            "metadata": metadata,
        }});
        let machine: Value = reqwest::Client::new()
            .post(url)
            .bearer_auth(self.double.token())
            .json(&body)
            .send()
            .await
            .expect("plant")
            .json()
            .await
            .expect("planted machine");
        machine["id"].as_str().expect("machine id").to_string()
    }
}

fn sleeper() -> Value {
    json!({
        "provider": "fly",
        "image": harness::docker::base_image(),
        "command": ["sleep", "infinity"],
    })
}

fn ready(s: &Sandbox) -> Option<(String, String)> {
    let st = s.status.as_ref()?;
    condition(&st.conditions, "Ready").map(|c| (c.status.clone(), c.reason.clone()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fly_sandbox_becomes_ready_and_its_url_reaches_it_alone() {
    let w = World::new("e2e-fly-basic").await;
    let op = w.operator("", vec![]);
    let mut spec = sleeper();
    spec["command"] = json!(["sh", "-c", SERVER]);
    spec["ports"] = json!([{"name": "http", "port": 8080}]);
    spec["resources"] = json!({"cpu": "1", "memory": "256Mi"});
    spec["env"] = json!([{"name": "GREETING", "value": "hello"}]);
    w.apply("web", spec);
    let api = w.api.clone();
    let s = wait_ready(&api, "web", &op).await;
    let status = s.status.clone().expect("status");
    let id = status.sandbox_id.clone().expect("sandboxId");
    assert_eq!(
        w.double.live_machines(w.double.app()),
        std::slice::from_ref(&id)
    );
    let machine = w.machine(&id).await;
    let uid = s.metadata.uid.clone().expect("uid");
    assert_eq!(
        machine["name"],
        format!("sbx-{uid}"),
        "machine name = external name"
    );
    assert_eq!(
        machine["config"]["metadata"]["sandboxes.dev/owner-uid"],
        uid
    );
    assert_eq!(machine["config"]["env"]["GREETING"], "hello");
    assert_eq!(machine["config"]["guest"]["memory_mb"], 256);
    assert_eq!(status.provider.as_deref(), Some("fly"));
    assert!(status.started_at.is_some());

    let url = status.url.clone().expect("status.url");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let body = wait_for("the sandbox URL", Duration::from_secs(30), || async {
        match reqwest::get(&url).await {
            Ok(r) => r.text().await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    assert_eq!(body, id, "the URL reaches this machine");

    delete_and_wait_gone(&api, "web").await;
    assert!(w.double.live_machines(w.double.app()).is_empty());
    w.shutdown().await;
}

/// A resize is a machine update, which Fly applies by rebooting a running machine: status says
/// so (`lastResourceChange.restarted`), and the main process really did start again.
#[tokio::test(flavor = "multi_thread")]
async fn a_resize_says_in_status_that_it_restarted_the_machine() {
    let w = World::new("e2e-fly-resize").await;
    let op = w.operator("", vec![]);
    let mut spec = sleeper();
    spec["resources"] = json!({"memory": "256Mi"});
    w.apply("grow", spec);
    let api = w.api.clone();
    let s = wait_ready(&api, "grow", &op).await;
    let id = s.status.and_then(|st| st.sandbox_id).expect("sandboxId");
    let pid1 = "sed 's/.*) //' /proc/1/stat | cut -d' ' -f20";
    let (code, before) = w.sh(&id, pid1).await;
    assert_eq!(code, 0);

    patch_spec(&api, "grow", json!({"resources": {"memory": "512Mi"}})).await;
    let change = wait_for("status.lastResourceChange", READY_TIMEOUT, || async {
        let s = api.get("grow").await.map_err(|e| e.to_string())?;
        let st = s.status.unwrap_or_default();
        match (st.last_resource_change, st.resources) {
            (Some(c), Some(r)) if r.memory.as_deref() == Some("536870912") => Ok(c),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(change.restarted, "Fly reboots to resize: {change:?}");
    wait_ready(&api, "grow", &op).await;
    assert_eq!(w.machine(&id).await["config"]["guest"]["memory_mb"], 512);
    let (code, after) = w.sh(&id, pid1).await;
    assert_eq!(code, 0);
    assert_ne!(before, after, "the main process started again");
    delete_and_wait_gone(&api, "grow").await;
    w.shutdown().await;
}

async fn wait_hibernation(
    api: &Api<Sandbox>,
    name: &str,
    mechanism: &str,
) -> sandbox_operator::api::HibernationStatus {
    wait_for(
        &format!("lastHibernation by {mechanism}"),
        READY_TIMEOUT,
        || async {
            let s = api.get(name).await.map_err(|e| e.to_string())?;
            match s.status.and_then(|st| st.last_hibernation) {
                Some(h) if h.mechanism == mechanism => Ok(h),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn sleeping_reports_what_really_happened_to_the_processes() {
    let w = World::new("e2e-fly-sleep").await;
    let op = w.operator("", vec![]);
    w.apply("nap", sleeper());
    let api = w.api.clone();
    let s = wait_ready(&api, "nap", &op).await;
    let id = s.status.and_then(|st| st.sandbox_id).expect("sandboxId");

    patch_spec(&api, "nap", json!({"state": "Sleeping"})).await;
    let slept = wait_hibernation(&api, "nap", "suspend").await;
    assert!(slept.processes_preserved);
    wait_ready(&api, "nap", &op).await;
    assert_eq!(w.machine(&id).await["state"], "suspended");

    patch_spec(&api, "nap", json!({"state": "Running"})).await;
    let resumed = wait_hibernation(&api, "nap", "resume").await;
    assert!(resumed.processes_preserved, "{resumed:?}");

    patch_spec(&api, "nap", json!({"state": "Sleeping"})).await;
    wait_hibernation(&api, "nap", "suspend").await;
    wait_ready(&api, "nap", &op).await;
    assert!(w.double.lose_snapshot(&id), "Fly discards the snapshot");
    patch_spec(&api, "nap", json!({"state": "Running"})).await;
    let cold = wait_hibernation(&api, "nap", "cold boot").await;
    assert!(
        !cold.processes_preserved,
        "a cold boot is reported as such: {cold:?}"
    );
    delete_and_wait_gone(&api, "nap").await;
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_between_create_and_status_write_leaves_exactly_one_machine() {
    let w = World::new("e2e-fly-crash").await;
    w.crash_after_create("crashy", sleeper(), "").await;
    let api = w.api.clone();
    assert_eq!(
        w.double.live_machines(w.double.app()).len(),
        1,
        "it happened"
    );

    let op = w.operator("", vec![]);
    let s = wait_ready(&api, "crashy", &op).await;
    let live = w.double.live_machines(w.double.app());
    assert_eq!(live.len(), 1, "adopted, not duplicated");
    assert_eq!(s.status.and_then(|st| st.sandbox_id), Some(live[0].clone()));
    delete_and_wait_gone(&api, "crashy").await;
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sweeper_removes_orphans_and_keeps_foreign_machines() {
    let w = World::new("e2e-fly-sweep").await;
    let orphan = w.plant(w.orphan_labels()).await;
    let foreign = w.plant(foreign_labels()).await;
    let unlabelled = w.plant(json!({"team": "ops"})).await;
    let op = w.operator(SWEEPER, vec![]);
    wait_for("the orphan swept", READY_TIMEOUT, || async {
        let live = w.double.live_machines(w.double.app());
        if live.contains(&orphan) {
            Err(format!("still live: {live:?}"))
        } else {
            Ok(())
        }
    })
    .await;
    let passes = PassCount::now(&op, Passes::Completed);
    passes.wait_more(2.0, "two more sweeper passes").await;
    let live = w.double.live_machines(w.double.app());
    assert!(
        live.contains(&foreign),
        "another instance's machine is kept"
    );
    assert!(live.contains(&unlabelled), "an unlabelled machine is kept");
    let destroys: Vec<String> = w
        .double
        .requests()
        .matching(&Matcher::on(Method::DELETE, "/machines/"))
        .into_iter()
        .filter(|r| !r.path.ends_with("/lease"))
        .map(|r| r.path)
        .collect();
    assert!(
        destroys.iter().all(|p| p.ends_with(&orphan)),
        "only the orphan was destroyed: {destroys:?}"
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_token_stalls_each_object_once_and_deletes_nothing() {
    let w = World::new("e2e-fly-revoked").await;
    let op = w.operator(SWEEPER, vec![]);
    let api = w.api.clone();
    for name in ["one", "two"] {
        w.apply(name, sleeper());
    }
    for name in ["one", "two"] {
        wait_ready(&api, name, &op).await;
    }
    let machines = w.double.live_machines(w.double.app());
    assert_eq!(machines.len(), 2);

    w.double.requests().clear();
    w.double.revoke_tokens();
    let passes = PassCount::now(&op, Passes::Ended);
    for name in ["one", "two"] {
        patch_spec(
            &api,
            name,
            json!({"env": [{"name": "TOUCH", "value": "1"}]}),
        )
        .await;
    }
    for name in ["one", "two"] {
        let what = format!("Sandbox {name} stalled on the refused token");
        wait_for(&what, READY_TIMEOUT, || async {
            let s = api.get(name).await.map_err(|e| e.to_string())?;
            match ready(&s) {
                Some((st, reason)) if st == "False" && reason == "ProviderUnauthorized" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
    let what = "two sweeper passes after the revocation";
    passes.wait_more(2.0, what).await;

    assert_eq!(
        events_per_object(&w.ns, "ProviderUnauthorized").await,
        BTreeMap::from([("one".to_string(), 1), ("two".to_string(), 1)]),
        "one Event per object"
    );
    let destroys: Vec<String> = w
        .double
        .requests()
        .matching(&Matcher::on(Method::DELETE, "/machines/"))
        .into_iter()
        .filter(|r| !r.path.ends_with("/lease"))
        .map(|r| r.path)
        .collect();
    assert!(
        destroys.is_empty(),
        "no destroy is even attempted on a refused token: {destroys:?}"
    );
    assert_eq!(w.double.live_machines(w.double.app()), machines);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_429_storm_is_waited_out_as_retry_after_says() {
    let w = World::new("e2e-fly-429").await;
    const RETRY_AFTER: u64 = 2;
    const STORM: usize = 3;
    // The sandbox's create (the first POST under /machines) is rate-limited: a first
    // reconcile observes nothing (no provider call was made for the object yet), so the
    // create is the first provider call the storm meets.
    let observe = Matcher::on(Method::POST, "/machines");
    w.double
        .faults()
        .rate_limit(observe.clone(), STORM, RETRY_AFTER);
    let op = w.operator("", vec![]);
    w.apply("patient", sleeper());
    let api = w.api.clone();
    wait_ready(&api, "patient", &op).await;
    let calls = w.double.requests().matching(&observe);
    assert!(calls.len() > STORM, "{} create calls", calls.len());
    for pair in calls[..=STORM].windows(2) {
        let gap = pair[1].at.duration_since(pair[0].at);
        assert!(
            gap >= Duration::from_secs(RETRY_AFTER) - Duration::from_millis(100),
            "a retry came {gap:?} after a 429 that said Retry-After: {RETRY_AFTER}"
        );
    }
    delete_and_wait_gone(&api, "patient").await;
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_captured_on_fly_boots_a_second_sandbox() {
    let w = World::new("e2e-fly-tpl").await;
    let prefix = format!("e2e-{}", w.ns);
    let _objects = harness::s3::PurgePrefix(prefix.clone());
    let (store, keys) = harness::s3::store_config(&prefix);
    let op = w.operator_with("    templateStore: s3\n", &store, keys);
    let api = w.api.clone();
    let mut source = sleeper();
    source["command"] = json!([
        "sh",
        "-c",
        "mkdir -p /workspace/app && printf captured > /workspace/app/hello.txt && \
         chmod 640 /workspace/app/hello.txt && touch /workspace/app/.ready; \
         trap 'exit 0' TERM; while :; do sleep 1; done"
    ]);
    w.apply("src", source);
    let src = wait_ready(&api, "src", &op).await;
    let src_id = src.status.and_then(|s| s.sandbox_id).expect("sandboxId");
    wait_for("the source's files", READY_TIMEOUT, || async {
        match w.sh(&src_id, "test -f /workspace/app/.ready").await {
            (0, _) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    let template = json!({
        "apiVersion": "sandboxes.dev/v1alpha1",
        "kind": "SandboxTemplate",
        "metadata": {"name": "tpl"},
        "spec": {"sandboxRef": {"name": "src"}, "capturePaths": ["/workspace/app"]},
    });
    apply_yaml_ok(&serde_yaml::to_string(&template).unwrap(), &w.ns);
    let templates: Api<sandbox_operator::api::SandboxTemplate> =
        Api::namespaced(client().await, &w.ns);
    let st = wait_ready(&templates, "tpl", &op)
        .await
        .status
        .expect("status");
    assert!(
        st.ref_.as_deref().is_some_and(|r| r.starts_with("s3://")),
        "captured into the store: {st:?}"
    );

    let mut user = sleeper();
    user.as_object_mut().unwrap().remove("image");
    user["templateRef"] = json!({"name": "tpl"});
    w.apply("user", user);
    let booted = wait_ready(&api, "user", &op).await;
    let user_id = booted.status.and_then(|s| s.sandbox_id).expect("sandboxId");
    assert_ne!(user_id, src_id);
    let (code, seen) = w
        .sh(
            &user_id,
            "cat /workspace/app/hello.txt; echo; stat -c %a /workspace/app/hello.txt",
        )
        .await;
    assert_eq!((code, seen.as_str()), (0, "captured\n640\n"));
    assert_eq!(w.double.live_machines(w.double.app()).len(), 2);
    for name in ["user", "src"] {
        delete_and_wait_gone(&api, name).await;
    }
    w.shutdown().await;
}
