//! The provider conformance suite (`tests/conformance/`) against the E2B provider and the E2B
//! double (`tests/doubles`), whose sandboxes are real local containers; plus what only E2B
//! has: the keep-alive against a double that really ends sandboxes at their timeout, the
//! error bodies, paging, the in-place egress policy, and truncated streams.
//!
//! Five checks of the shared suite assume that `create` does not start a sandbox. E2B starts
//! every sandbox as it creates it (there is no "created" state in its API), so those five run
//! here in an E2B form that asserts what E2B really does instead (`e2b_*` below); everything
//! else runs unchanged. Needs a running Docker engine and the base image
//! (`tests/setup/docker.sh`, `tests/setup/base-image.sh`).

mod harness;
#[macro_use]
mod conformance;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use conformance::support::{Check, OrFail, create, describe, ids, sh, sorted, unique_hex};
use conformance::{Expect, Faults, Fixture, Planter, Skipped};
use sandbox_doubles::e2b::{self as double, E2bDouble, E2bDoubleOptions, FaultAction};
use sandbox_operator::provider::e2b::{E2bProvider, E2bSettings, OnTimeout};
use sandbox_operator::provider::labels::{KIND, MANAGED_BY, OWNER, OWNER_UID, Owner};
use sandbox_operator::provider::{
    ErrorKind, ExecRequest, PortRequest, Provider, RestartPolicy, SandboxQuery, SandboxState,
};
use sandbox_operator::secret::SecretSource;

/// What the E2B provider offers: hibernation, files, bulk files, events and streaming exec
/// (envd's process service: stdin, a PTY with resize, TERM and KILL, and INT and HUP through
/// a second process); no logs (E2B has no main process to follow) and no port-forward; a
/// domain allow-list and "no egress" are enforced by E2B's network policy; command and
/// resource ceilings are refused (E2B sets them per template).
fn expect() -> Expect {
    Expect {
        hibernation: true,
        files: true,
        bulk_files: true,
        events: true,
        streaming_exec: true,
        domain_egress: true,
        no_egress: true,
        egress_policy: true,
        ..Expect::default()
    }
}

/// Settings pointing at `d`, with the key in a file (the provider reads keys by reference
/// only, and resolves them when it is built).
fn settings_for(d: &E2bDouble, key: &str, timeout_secs: u64, watch_secs: u64) -> E2bSettings {
    let file = tempfile::NamedTempFile::new().expect("a key file");
    std::fs::write(file.path(), key).expect("write the key");
    let (_, path) = file.keep().expect("keep the key file");
    E2bSettings {
        api_url: d.api_url(),
        api_key: SecretSource::file(path),
        sandbox_url: Some(d.envd_url()),
        timeout_secs,
        watch_interval_secs: watch_secs,
        ..E2bSettings::default()
    }
}

async fn start_double(options: E2bDoubleOptions) -> E2bDouble {
    double::spawn(options)
        .await
        .expect("the E2B double starts (is Docker running? tests/setup/docker.sh)")
}

/// The suite's world: a double of its own per test, the provider pointed at it, and an
/// unreachable twin pointed at a closed port.
async fn fixture() -> Result<Fixture, Skipped> {
    let d = start_double(E2bDoubleOptions::default()).await;
    let instance = format!("conf-{}", unique_hex());
    let settings = settings_for(&d, d.api_key(), 60, 1);
    let provider = E2bProvider::new("e2b-conformance", settings.clone()).expect("provider");
    let closed = format!("127.0.0.1:{}", sandbox_doubles::ports::quiet_port());
    let unreachable = E2bProvider::new(
        "e2b-unreachable",
        E2bSettings {
            api_url: format!("http://{closed}"),
            sandbox_url: Some(format!("http://{closed}")),
            ..settings
        },
    )
    .expect("unreachable twin");
    let base = sandbox_operator::provider::CreateRequest {
        name: String::new(),
        owner: Owner {
            instance: instance.clone(),
            kind: "Sandbox".into(),
            namespace: String::new(),
            name: String::new(),
            uid: String::new(),
        },
        image: None,
        template: None,
        command: None,
        restart_policy: RestartPolicy::Never,
        env: BTreeMap::new(),
        labels: BTreeMap::new(),
        resources: Default::default(),
        ports: vec![],
        volumes: vec![],
        allowed_domains: None,
        idle_action: None,
        image_pull_policy: sandbox_operator::provider::ImagePullPolicy::IfNotPresent,
        registry_credentials: Vec::new(),
        secret_env_keys: Default::default(),
    };
    let d = Arc::new(d);
    Ok(Fixture {
        provider: Arc::new(provider),
        unreachable: Arc::new(unreachable),
        planter: Some(Arc::new(DoublePlanter(d.clone()))),
        faults: Some(Arc::new(DoubleFaults(d.clone()))),
        history: Some(Arc::new({
            let d = d.clone();
            move |mode| d.faults().set_history(mode)
        })),
        guard: Some(Box::new(d)),
        instance,
        base,
        expect: expect(),
        patience: Duration::from_secs(30),
    })
}

/// Creates sandboxes straight at the double's API, behind the provider's back.
struct DoublePlanter(Arc<E2bDouble>);

#[async_trait]
impl Planter for DoublePlanter {
    async fn plant(&self, labels: &BTreeMap<String, String>) -> Result<String, String> {
        let body = serde_json::json!({ "templateID": "base", "timeout": 300, "metadata": labels });
        let response = reqwest::Client::new()
            .post(format!("{}/sandboxes", self.0.api_url()))
            .header("X-API-Key", self.0.api_key())
            .json(&body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let created: serde_json::Value = response.json().await.map_err(|e| e.to_string())?;
        created["sandboxID"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("planting answered {created}"))
    }
}

/// Every request fails with a 503 until healed.
struct DoubleFaults(Arc<E2bDouble>);

#[async_trait]
impl Faults for DoubleFaults {
    async fn fail_all(&self) {
        self.0
            .faults()
            .inject(None, "/**", FaultAction::status(503), usize::MAX);
    }
    async fn heal(&self) {
        self.0.faults().clear();
    }
}

conformance_suite!(@each fixture;
    rules::rule_01_enumerations_fail_when_they_cannot_look,
    rules::rule_02_absent_files_are_errors_and_bytes_cross_unchanged,
    rules::rule_03_get_template_is_none_only_when_absent,
    rules::rule_04_unknown_attachment_and_use_read_as_in_use,
    rules::rule_05_destroy_and_removal_are_idempotent,
    rules::rule_07_hibernation_reports_what_happened,
    rules::rule_08_unmeasured_capacity_is_absent_never_zero,
    rules::rule_09_egress_verdict_is_an_observation,
    rules::rule_10_unenforceable_fields_are_refused,
    lifecycle::capabilities_are_exactly_the_declared_set,
    lifecycle::identity_after_create_is_the_provider_id,
    lifecycle::create_of_a_taken_name_is_a_conflict,
    lifecycle::a_missing_template_or_image_creates_nothing,
    lifecycle::lifecycle_transitions_are_idempotent,
    lifecycle::operations_on_an_absent_sandbox_are_not_found,
    lifecycle::exec_returns_output_and_exit_code_as_data,
    lifecycle::exec_timeout_is_transient_and_bounded,
    hibernation::capability_hibernation,
    volumes::capability_volumes,
    templates::capability_templates,
    resources::capability_set_resources,
    capacity::capability_capacity,
    files::capability_files,
    bulk::capability_bulk_files,
    egress::capability_egress,
    events::capability_events,
    sweep::sweep_never_deletes_a_started_sandbox_of_a_live_owner,
    interactive::stream_exec_delivers_stdin_and_its_end,
    interactive::stream_exec_passes_the_exit_code_through,
    interactive::stream_exec_keeps_stdout_and_stderr_apart,
    interactive::stream_exec_tty_has_its_size_and_resizes,
    interactive::stream_exec_delivers_signals,
    interactive::stream_exec_carries_a_large_stream,
    interactive::stream_exec_holds_a_fast_producer_for_a_slow_reader,
    interactive::logs_follow_new_lines,
    interactive::port_forward_reaches_an_http_server,
    interactive::stream_capabilities_refuse_absent_and_idle_sandboxes,
);

/// Runs an E2B-specific check like the suite runs its own.
async fn run(check: impl AsyncFnOnce(&Fixture) -> Check) {
    let Some(fx) = conformance::setup(fixture().await) else {
        return;
    };
    let result = check(&fx).await;
    conformance::finish(fx, result).await;
}

// ---- The suite's create-does-not-start checks, as E2B really behaves ----

/// Rule 6 on E2B: create starts the sandbox, so `started_at` is set from the first
/// descriptor on — there is no never-started wreckage to report — and a stopped sandbox
/// keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_rule_06_every_sandbox_has_started_and_keeps_its_start_time() {
    run(async |fx| {
        let request = fx.request();
        let created = create(fx, &request).await?;
        ensure!(
            created.state == SandboxState::Running && created.started_at.time().is_some(),
            "E2B runs a sandbox from create on: {created:?}"
        );
        let found = fx
            .provider
            .find(&fx.owner_query(&request.owner))
            .await
            .or_fail("find")?;
        ensure!(
            found.len() == 1 && found[0].started_at == created.started_at,
            "find agrees with create: {found:?}"
        );
        fx.provider.stop(&created.id).await.or_fail("stop")?;
        let stopped = describe(fx, &created.id).await?;
        ensure!(
            stopped.state == SandboxState::Stopped && stopped.started_at.time().is_some(),
            "a stopped sandbox is not never-started: {stopped:?}"
        );
        Ok(())
    })
    .await;
}

/// Labels, owner labels and the restart policy are stored and reported; env reaches the
/// sandbox. (E2B does not return a sandbox's env, and this provider does not copy it into
/// metadata, where `envFrom` Secret values would show in every list: `env` is reported
/// empty.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_create_stores_labels_and_restart_policy_and_env_reaches_the_sandbox() {
    run(async |fx| {
        let mut request = fx.request();
        request.labels = BTreeMap::from([("team".to_string(), "blue".to_string())]);
        request.env = BTreeMap::from([("GREETING".to_string(), "hello world".to_string())]);
        request.restart_policy = RestartPolicy::OnFailure;
        let d = create(fx, &request).await?;
        ensure!(
            d.labels.get("team").map(String::as_str) == Some("blue"),
            "labels: {:?}",
            d.labels
        );
        ensure!(
            d.labels.get(MANAGED_BY) == Some(&fx.instance)
                && d.labels.get(OWNER_UID) == Some(&request.owner.uid)
                && d.labels.get(KIND).map(String::as_str) == Some("Sandbox")
                && d.labels.get(OWNER)
                    == Some(&format!(
                        "{}.{}",
                        request.owner.namespace, request.owner.name
                    )),
            "owner labels: {:?}",
            d.labels
        );
        ensure!(
            d.restart_policy == RestartPolicy::OnFailure,
            "restart policy: {:?}",
            d.restart_policy
        );
        ensure!(
            d.labels
                .keys()
                .all(|k| !k.starts_with("sandboxes.dev/e2b-")),
            "the provider's own metadata keys are not labels: {:?}",
            d.labels
        );
        let greeting = sh(fx, &d.id, "printf %s \"$GREETING\"").await?;
        ensure!(
            greeting == "hello world",
            "GREETING inside the sandbox is {greeting:?}"
        );
        Ok(())
    })
    .await;
}

/// `find` narrows by labels, states and owner (every E2B sandbox runs from create; a stopped
/// one is `Stopped`, none is `Creating`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_find_narrows_by_labels_states_and_owner() {
    run(async |fx| {
        let p = &fx.provider;
        let mut ra = fx.request();
        ra.labels.insert("role".into(), "web".into());
        let mut rb = fx.request();
        rb.labels.insert("role".into(), "db".into());
        rb.owner.namespace = ra.owner.namespace.clone();
        rb.owner.name = ra.owner.name.clone();
        let mut rc = fx.request();
        rc.labels.insert("role".into(), "web".into());
        let a = create(fx, &ra).await?.id;
        let b = create(fx, &rb).await?.id;
        let c = create(fx, &rc).await?.id;
        p.stop(&b).await.or_fail("stop")?;
        let find = |labels: BTreeMap<String, String>,
                    states: Option<Vec<SandboxState>>,
                    owner: Option<String>| async move {
            let query = SandboxQuery {
                labels,
                states,
                owner,
            };
            p.find(&query).await.or_fail("find").map(|f| ids(&f))
        };
        let all = find(fx.instance_labels(), None, None).await?;
        ensure!(
            all == sorted(vec![a.clone(), b.clone(), c.clone()]),
            "all: {all:?}"
        );
        let mut web = fx.instance_labels();
        web.insert("role".into(), "web".into());
        let got = find(web, None, None).await?;
        ensure!(
            got == sorted(vec![a.clone(), c.clone()]),
            "role=web: {got:?}"
        );
        let got = find(
            fx.instance_labels(),
            Some(vec![SandboxState::Running]),
            None,
        )
        .await?;
        ensure!(
            got == sorted(vec![a.clone(), c.clone()]),
            "running: {got:?}"
        );
        let got = find(
            fx.instance_labels(),
            Some(vec![SandboxState::Stopped]),
            None,
        )
        .await?;
        ensure!(got == vec![b.clone()], "stopped: {got:?}");
        for state in [SandboxState::Creating, SandboxState::Sleeping] {
            let got = find(fx.instance_labels(), Some(vec![state]), None).await?;
            ensure!(
                got.is_empty(),
                "looked for {state:?} ones and found {got:?}"
            );
        }
        let owner = format!("{}.{}", ra.owner.namespace, ra.owner.name);
        let got = find(fx.instance_labels(), None, Some(owner)).await?;
        ensure!(
            got == sorted(vec![a.clone(), b.clone()]),
            "by owner: {got:?}"
        );
        Ok(())
    })
    .await;
}

/// `find` sees a sandbox with our labels created behind the provider's back (a crashed
/// create, adopted), and keeps another instance's and unlabelled ones out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_find_sees_planted_sandboxes_and_keeps_foreign_ones_out() {
    run(async |fx| {
        let planter = fx.planter.as_ref().ok_or("no planter")?;
        let ours = fx.owner("Sandbox");
        let adopted = planter.plant(&ours.labels()).await?;
        let mut foreign = ours.clone();
        foreign.instance = format!("other-{}", unique_hex());
        let foreign_id = planter.plant(&foreign.labels()).await?;
        let bare = planter.plant(&BTreeMap::new()).await?;
        let found = fx.provider.find(&fx.query()).await.or_fail("find")?;
        ensure!(
            ids(&found) == vec![adopted.clone()],
            "find by our instance: {found:?}"
        );
        ensure!(
            found[0].started_at.has_run(),
            "E2B planted sandboxes run: {found:?}"
        );
        let d = describe(fx, &foreign_id).await?;
        ensure!(
            d.labels.get(MANAGED_BY) == Some(&foreign.instance),
            "foreign labels: {:?}",
            d.labels
        );
        for id in [foreign_id, bare] {
            fx.provider
                .destroy(&id)
                .await
                .or_fail("destroy a planted sandbox")?;
        }
        Ok(())
    })
    .await;
}

/// Requested TCP ports are reported where E2B serves them, `https://<port>-<id>.<domain>`,
/// while the sandbox runs, and not while it is paused. (The double does not proxy sandbox
/// ports, so reachability is not checked here; see tests/doubles/README.md.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_ports_are_reported_on_the_sandbox_host() {
    run(async |fx| {
        let mut request = fx.request();
        request.ports = vec![PortRequest {
            sandbox_port: 8080,
            protocol: "tcp".into(),
        }];
        let d = create(fx, &request).await?;
        let want = format!("8080-{}.e2b-double.local", d.id);
        ensure!(
            d.ports.len() == 1 && d.ports[0].host == want && d.ports[0].port == 443,
            "ports of a running sandbox: {:?}",
            d.ports
        );
        fx.provider.sleep(&d.id).await.or_fail("sleep")?;
        ensure!(
            describe(fx, &d.id).await?.ports.is_empty(),
            "a paused sandbox serves no port"
        );
        Ok(())
    })
    .await;
}

// ---- E2B only ----

/// The keep-alive: with a 3 s E2B timeout that the double really enforces, a sandbox the
/// provider manages outlives several timeouts without being paused or killed, while one the
/// provider does not manage (another instance, never seen) is killed at its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_outlives_several_timeouts_and_only_for_our_sandboxes() {
    let d = start_double(E2bDoubleOptions::default()).await;
    let settings = E2bSettings {
        on_timeout: OnTimeout::Kill,
        ..settings_for(&d, d.api_key(), 3, 1)
    };
    let provider = E2bProvider::new("e2b-keepalive", settings).expect("provider");
    let instance = format!("ka-{}", unique_hex());
    let owner = Owner {
        instance: instance.clone(),
        kind: "Sandbox".into(),
        namespace: "ns".into(),
        name: "kept".into(),
        uid: unique_hex(),
    };
    let request = sandbox_operator::provider::CreateRequest {
        name: format!("sbx-{}", owner.uid),
        owner,
        image: None,
        template: None,
        command: None,
        restart_policy: RestartPolicy::Never,
        env: BTreeMap::new(),
        labels: BTreeMap::new(),
        resources: Default::default(),
        ports: vec![],
        volumes: vec![],
        allowed_domains: None,
        idle_action: None,
        image_pull_policy: sandbox_operator::provider::ImagePullPolicy::IfNotPresent,
        registry_credentials: Vec::new(),
        secret_env_keys: Default::default(),
    };
    let kept = provider.create(&request).await.expect("create").id;
    // One the provider never learns of: the double ends it at its timeout.
    let unmanaged = {
        let body = serde_json::json!({ "templateID": "base", "timeout": 3,
            "metadata": { MANAGED_BY: "someone-else" } });
        let created: serde_json::Value = reqwest::Client::new()
            .post(format!("{}/sandboxes", d.api_url()))
            .header("X-API-Key", d.api_key())
            .json(&body)
            .send()
            .await
            .expect("plant")
            .json()
            .await
            .expect("planted");
        created["sandboxID"].as_str().expect("id").to_string()
    };
    let started = Instant::now();
    // Wait (polling the double) until the unmanaged sandbox is gone and three timeouts of
    // the kept one have passed.
    let deadline = started + Duration::from_secs(60);
    loop {
        let gone = d.sandbox(&unmanaged).await.is_none();
        if gone && started.elapsed() >= Duration::from_secs(3 * 3 + 1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the unmanaged sandbox was never ended"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let record = d
        .sandbox(&kept)
        .await
        .expect("the kept sandbox outlived its timeouts");
    assert_eq!(record.power, double::Power::Running);
    assert_eq!(record.pauses, 0, "kept alive, never paused");
    assert!(record.timeout_extensions >= 3, "refreshed: {record:?}");
    let expired: Vec<String> = d.expired().into_iter().map(|e| e.id).collect();
    assert_eq!(
        expired,
        vec![unmanaged],
        "only the unmanaged sandbox timed out"
    );
    let out = provider
        .exec(
            &kept,
            &ExecRequest::shell("echo alive", Duration::from_secs(10)),
        )
        .await
        .expect("exec");
    assert_eq!(out.stdout, b"alive\n");
    let refreshes = d.api_counters().get("POST /sandboxes/{sandboxID}/timeout");
    let lists = d.api_counters().get("GET /v2/sandboxes");
    assert!(
        refreshes >= 3 && lists >= 3,
        "one list per pass, refreshes: {:?}",
        d.api_counters().snapshot()
    );
    drop(provider);
    d.shutdown().await.expect("cleanup");
}

/// With `onTimeout: pause`, a sandbox whose keep-alive could not run is paused by E2B, not
/// killed: nothing is lost and it reads `Sleeping`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_keep_alive_pauses_instead_of_killing() {
    let d = start_double(E2bDoubleOptions::default()).await;
    let settings = settings_for(&d, d.api_key(), 3, 1);
    let provider = E2bProvider::new("e2b-autopause", settings).expect("provider");
    let mut request = base_request("paused");
    request.owner.instance = format!("ap-{}", unique_hex());
    let id = provider.create(&request).await.expect("create").id;
    // Every refresh fails: the keep-alive cannot run.
    d.faults().inject(
        Some("POST"),
        "/sandboxes/*/timeout",
        FaultAction::status(500),
        usize::MAX,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let record = d.sandbox(&id).await.expect("never killed");
        if record.power != double::Power::Running {
            assert_eq!(record.power, double::Power::Paused { memory: true });
            break;
        }
        assert!(Instant::now() < deadline, "the sandbox never timed out");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let described = provider
        .describe(&id)
        .await
        .expect("describe")
        .expect("kept");
    assert_eq!(described.state, SandboxState::Sleeping);
    d.faults().clear();
    drop(provider);
    d.shutdown().await.expect("cleanup");
}

fn base_request(name: &str) -> sandbox_operator::provider::CreateRequest {
    let uid = unique_hex();
    sandbox_operator::provider::CreateRequest {
        name: format!("sbx-{uid}"),
        owner: Owner {
            instance: format!("e2b-{}", unique_hex()),
            kind: "Sandbox".into(),
            namespace: "ns".into(),
            name: name.into(),
            uid,
        },
        image: None,
        template: None,
        command: None,
        restart_policy: RestartPolicy::Never,
        env: BTreeMap::new(),
        labels: BTreeMap::new(),
        resources: Default::default(),
        ports: vec![],
        volumes: vec![],
        allowed_domains: None,
        idle_action: None,
        image_pull_policy: sandbox_operator::provider::ImagePullPolicy::IfNotPresent,
        registry_credentials: Vec::new(),
        secret_env_keys: Default::default(),
    }
}

/// API error bodies map onto the seam: 429 with `Retry-After` is a rate-limited transient,
/// a capacity `error_code` is `InsufficientCapacity`, a revoked key is `Unauthorized`, a
/// dropped connection and a slow answer past the bound are transient — and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_map_onto_the_seam() {
    let d = start_double(E2bDoubleOptions::default()).await;
    let provider =
        E2bProvider::new("e2b-errors", settings_for(&d, d.api_key(), 60, 30)).expect("provider");
    let request = base_request("errors");
    let faults = d.faults();

    faults.inject(
        Some("POST"),
        "/sandboxes",
        FaultAction::Status {
            status: 429,
            retry_after: Some(7),
            error_code: None,
        },
        1,
    );
    let err = provider.create(&request).await.expect_err("429");
    assert!(
        err.is(ErrorKind::Transient) && err.reason() == "RateLimited",
        "{err}"
    );
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));

    faults.inject(
        Some("POST"),
        "/sandboxes",
        FaultAction::Status {
            status: 503,
            retry_after: None,
            error_code: Some("sandbox_capacity_unavailable".into()),
        },
        1,
    );
    let err = provider.create(&request).await.expect_err("capacity");
    assert_eq!(err.reason(), "InsufficientCapacity", "{err}");

    faults.inject(Some("GET"), "/v2/sandboxes", FaultAction::Drop, 1);
    let err = provider
        .find(&SandboxQuery::default())
        .await
        .expect_err("dropped");
    assert!(err.is(ErrorKind::Transient), "{err}");

    assert!(
        d.sandboxes().await.is_empty(),
        "no refused create left a sandbox"
    );
    let id = provider
        .create(&request)
        .await
        .expect("create once healed")
        .id;

    d.revoke_api_key(d.api_key());
    for result in [
        provider.describe(&id).await.map(drop),
        provider.find(&SandboxQuery::default()).await.map(drop),
        provider.destroy(&id).await,
    ] {
        let err = result.expect_err("revoked key");
        assert!(err.is(ErrorKind::Unauthorized), "{err}");
        assert!(
            !err.message().contains(d.api_key()),
            "the key never appears in an error"
        );
    }
    assert!(
        d.sandbox(&id).await.is_some(),
        "nothing was deleted with a revoked key"
    );
    d.add_api_key(d.api_key());
    drop(provider);
    d.shutdown().await.expect("cleanup");
}

/// `find` follows `X-Next-Token` to the last page, and a page that fails fails the whole
/// enumeration (rule 1) instead of returning the pages before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_follows_every_page_and_a_failed_page_fails_it_all() {
    let d = start_double(E2bDoubleOptions {
        page_cap: 2,
        ..Default::default()
    })
    .await;
    let provider =
        E2bProvider::new("e2b-pages", settings_for(&d, d.api_key(), 60, 30)).expect("provider");
    let first = base_request("paged");
    let instance = first.owner.instance.clone();
    let mut made = Vec::new();
    for _ in 0..5 {
        let mut r = base_request("paged");
        r.owner.instance = instance.clone();
        made.push(provider.create(&r).await.expect("create").id);
    }
    let query = SandboxQuery {
        labels: BTreeMap::from([(MANAGED_BY.to_string(), instance.clone())]),
        ..Default::default()
    };
    let before = d.api_counters().get("GET /v2/sandboxes");
    let found = provider.find(&query).await.expect("find");
    assert_eq!(ids(&found), sorted(made.clone()));
    assert_eq!(
        d.api_counters().get("GET /v2/sandboxes") - before,
        3,
        "5 sandboxes, pages of 2"
    );

    d.faults()
        .inject_after(Some("GET"), "/v2/sandboxes", FaultAction::status(502), 1, 1);
    let err = provider
        .find(&query)
        .await
        .expect_err("the second page failed");
    assert!(err.is(ErrorKind::Transient), "{err}");
    drop(provider);
    d.shutdown().await.expect("cleanup");
}

/// The allow-list goes to E2B's network policy at create, and a changed one replaces it in
/// place: same sandbox id, the double's record updated, the old rules gone. A paused sandbox
/// cannot take a new policy (`Conflict`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_allow_list_is_set_at_create_and_replaced_in_place() {
    let d = start_double(E2bDoubleOptions::default()).await;
    let provider =
        E2bProvider::new("e2b-egress", settings_for(&d, d.api_key(), 60, 30)).expect("provider");
    let mut request = base_request("egress");
    request.allowed_domains = Some(vec!["example.com".into(), "*.pypi.org".into()]);
    let id = provider.create(&request).await.expect("create").id;
    let record = d.sandbox(&id).await.expect("created");
    assert_eq!(
        record.network.allow_out,
        Some(vec!["example.com".into(), "*.pypi.org".into()])
    );
    assert_eq!(record.network.deny_out, Some(vec!["0.0.0.0/0".into()]));

    provider
        .set_allowed_domains(&id, Some(vec!["github.com".into()]))
        .await
        .expect("replace");
    assert_eq!(
        provider.allowed_domains(&id).await.expect("read back"),
        Some(vec!["github.com".to_string()])
    );
    provider.set_allowed_domains(&id, None).await.expect("open");
    assert_eq!(
        provider.allowed_domains(&id).await.expect("read back"),
        None
    );
    let record = d.sandbox(&id).await.expect("same sandbox");
    assert_eq!(record.network_updates, 2);
    assert_eq!(d.sandboxes().await.len(), 1, "no new sandbox");

    provider.sleep(&id).await.expect("sleep");
    let err = provider
        .set_allowed_domains(&id, Some(vec![]))
        .await
        .expect_err("paused");
    assert!(err.is(ErrorKind::Conflict), "{err}");
    drop(provider);
    d.shutdown().await.expect("cleanup");
}

/// The signals envd's enum lacks reach the process too (`INT` and `HUP` by a second process
/// running `kill`, `KILL` through `SendSignal`), each reported as 128 + N; and on a terminal,
/// the end of input is ^D, which ends `cat` cleanly (envd refuses `CloseStdin` for a PTY).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_stream_exec_delivers_every_signal_and_ends_terminal_input() {
    use bytes::Bytes;
    use futures::StreamExt;
    use sandbox_operator::provider::stream::{ExecInput, Signal, StreamExecRequest, TermSize};
    let d = start_double(E2bDoubleOptions::default()).await;
    let provider =
        E2bProvider::new("e2b-signals", settings_for(&d, d.api_key(), 60, 30)).expect("provider");
    let id = provider
        .create(&base_request("signals"))
        .await
        .expect("create")
        .id;
    let exec = provider.streaming_exec().expect("streaming exec");
    let request = |argv: &[&str], tty: Option<TermSize>| StreamExecRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::new(),
        cwd: None,
        stdin: tty.is_some(),
        tty,
    };
    for (signal, want) in [
        (Signal::Interrupt, 130),
        (Signal::Hangup, 129),
        (Signal::Kill, 137),
    ] {
        let session = exec
            .exec_stream(&id, &request(&["sleep", "600"], None))
            .await
            .expect("start");
        session
            .input
            .send(ExecInput::Signal(signal))
            .await
            .expect("queued");
        let status = tokio::time::timeout(Duration::from_secs(60), session.exit)
            .await
            .expect("ended within 60 s")
            .expect("an exit status");
        assert_eq!(status.code, want, "{signal:?}");
    }
    let tty = Some(TermSize { cols: 80, rows: 24 });
    let mut session = exec
        .exec_stream(&id, &request(&["cat"], tty))
        .await
        .expect("start");
    assert!(session.stderr.is_none(), "a terminal has one output");
    for input in [
        ExecInput::Stdin(Bytes::from_static(b"typed\n")),
        ExecInput::CloseStdin,
    ] {
        session.input.send(input).await.expect("queued");
    }
    let mut seen = Vec::new();
    let read_all = async {
        while let Some(chunk) = session.stdout.next().await {
            seen.extend_from_slice(&chunk.expect("output"));
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read_all)
        .await
        .expect("the terminal's output ended");
    let text = String::from_utf8_lossy(&seen);
    assert!(
        text.contains("typed\r\ntyped\r\n"),
        "echo and cat: {text:?}"
    );
    let status = session.exit.await.expect("an exit status");
    assert_eq!(status.code, 0, "cat ended at the terminal's end of input");
    drop(provider);
    d.shutdown().await.expect("cleanup");
}

/// A Process.Start stream that ends before its `end` event is a transient failure naming
/// what happened, never an exit code; and an exec keeps working afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_before_its_end_is_transient() {
    let d = start_double(E2bDoubleOptions::default()).await;
    let provider =
        E2bProvider::new("e2b-stream", settings_for(&d, d.api_key(), 60, 30)).expect("provider");
    let id = provider
        .create(&base_request("stream"))
        .await
        .expect("create")
        .id;
    d.faults().inject(
        None,
        "/process.Process/Start",
        FaultAction::TruncateStream,
        1,
    );
    let err = provider
        .exec(
            &id,
            &ExecRequest::shell("echo partial", Duration::from_secs(10)),
        )
        .await
        .expect_err("cut stream");
    assert!(err.is(ErrorKind::Transient), "{err}");
    assert!(err.message().contains("end"), "{err}");
    let out = provider
        .exec(
            &id,
            &ExecRequest::shell("echo whole", Duration::from_secs(10)),
        )
        .await
        .expect("exec after the fault");
    assert_eq!(
        (out.stdout.as_slice(), out.exit_code),
        (b"whole\n".as_slice(), 0)
    );
    drop(provider);
    d.shutdown().await.expect("cleanup");
}

/// Drift made behind the provider's back (a pause and a kill straight at E2B) reaches the
/// subscribers of the sandbox's instance through the watch's periodic list, mapped to its
/// owner; another instance's subscribers hear nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_behind_the_providers_back_is_reported_by_the_watch() {
    use futures::StreamExt;
    let d = start_double(E2bDoubleOptions::default()).await;
    let provider =
        E2bProvider::new("e2b-drift", settings_for(&d, d.api_key(), 60, 1)).expect("provider");
    let request = base_request("drifty");
    let events = provider.events().expect("events");
    let mut ours = events.subscribe(&request.owner.instance);
    let mut theirs = events.subscribe("someone-else");
    let id = provider.create(&request).await.expect("create").id;
    let next = async |stream: &mut futures::stream::BoxStream<'static, _>| {
        tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("an event within 30 s")
            .expect("the stream goes on")
    };
    let created: sandbox_operator::provider::ProviderResult<_> = next(&mut ours).await;
    assert_eq!(created.expect("event").action, "create");
    // The watch reports changes between two of its lists: let it look once first.
    let lists = d.api_counters().get("GET /v2/sandboxes");
    let deadline = Instant::now() + Duration::from_secs(30);
    while d.api_counters().get("GET /v2/sandboxes") < lists + 2 {
        assert!(Instant::now() < deadline, "the watch never listed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let client = reqwest::Client::new();
    let at = |path: String| {
        client
            .request(reqwest::Method::POST, format!("{}{path}", d.api_url()))
            .header("X-API-Key", d.api_key())
    };
    let paused = at(format!("/sandboxes/{id}/pause"))
        .send()
        .await
        .expect("pause");
    assert_eq!(paused.status(), reqwest::StatusCode::NO_CONTENT);
    // A start the watch saw late is drift too (a loaded machine lists it after the
    // create); the pause is the event after it.
    let mut event: sandbox_operator::provider::ProviderResult<_> = next(&mut ours).await;
    while event.as_ref().is_ok_and(|e| e.action == "running") {
        event = next(&mut ours).await;
    }
    let event = event.expect("event");
    assert_eq!(
        (event.owner.clone(), event.action.as_str()),
        (request.owner.clone(), "paused")
    );
    let killed = client
        .delete(format!("{}/sandboxes/{id}", d.api_url()))
        .header("X-API-Key", d.api_key())
        .send()
        .await
        .expect("kill");
    assert_eq!(killed.status(), reqwest::StatusCode::NO_CONTENT);
    let event: sandbox_operator::provider::ProviderResult<_> = next(&mut ours).await;
    assert_eq!(event.expect("event").action, "killed");
    let quiet = tokio::time::timeout(Duration::from_millis(1500), theirs.next()).await;
    assert!(quiet.is_err(), "another instance heard: {quiet:?}");
    drop(provider);
    d.shutdown().await.expect("cleanup");
}
