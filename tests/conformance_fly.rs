//! The Fly Machines provider against the Fly double (`sandbox_doubles::fly`), where every
//! machine is a real Docker container.
//!
//! Two parts: the shared conformance suite (`tests/conformance/`, every contract rule and
//! capability, one test each, through [`fixture`]) — run live against the real Machines API
//! too when `SANDBOX_LIVE_FLY_TOKEN` and `SANDBOX_LIVE_FLY_APP` are set (module `live`) — and
//! Fly-specific checks in `specific`: paging, leases, the error mapping, fingerprinted
//! hibernation, per-sandbox URLs and drift from listings.
//!
//! Needs a running Docker engine and the base image (`tests/setup/docker.sh`,
//! `tests/setup/base-image.sh`; `SANDBOX_BASE_IMAGE` overrides the tag).

mod harness;
#[macro_use]
mod conformance;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::{Expect, Fixture, Skipped};
use sandbox_doubles::fly::{Fault, FlyDouble, FlyDoubleOptions, Matcher};
use sandbox_operator::provider::fly::{FlyProvider, FlySettings};
use sandbox_operator::provider::labels::Owner;
use sandbox_operator::provider::{CreateRequest, Resources, RestartPolicy};
use sandbox_operator::secret::SecretSource;

conformance_suite!(fixture);

/// Issue 25's reproduction: a machine of a live Sandbox that ran, was stopped, put to sleep
/// and woken (`started` → `stopped` → `started` → `suspended` → `started`), listed by a
/// Machines API whose listing carries no `events`, must survive a sweep. (The sweeper
/// once read "no start event in the listing" as "never started" and destroyed it as
/// wreckage.) Its first start is not recorded in metadata either: nothing here describes it
/// before the sweep, so only the listing's state can tell that it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_that_ran_listed_without_events_survives_a_sweep() {
    use conformance::support::{OrFail, describe, running_from};
    use sandbox_doubles::History;
    use sandbox_operator::provider::SandboxState;

    let Some(fx) = conformance::setup(fixture().await) else {
        return;
    };
    let result = async {
        let owner = fx.owner("Sandbox");
        let mut request = fx.request();
        request.name = format!("sbx-{}", owner.uid);
        request.owner = owner.clone();
        let id = running_from(&fx, &request).await?;
        fx.provider.stop(&id).await.or_fail("stop")?;
        fx.provider.start(&id).await.or_fail("start")?;
        fx.provider.sleep(&id).await.or_fail("sleep")?;
        fx.provider.wake(&id).await.or_fail("wake")?;
        if let Some(set) = &fx.history {
            set(History::OmittedFromListings);
        }
        let live = conformance::sweep::FixedOwners::live(&[&owner]);
        let report = conformance::sweep::sweep(&fx, live).await;
        let table = report.render_table();
        println!("sweep of a Fly app listed without events:\n{table}");
        let after = describe(&fx, &id).await?;
        ensure!(
            after.state == SandboxState::Running,
            "the live sandbox's machine must survive the sweep:\n{table}"
        );
        Ok(())
    }
    .await;
    conformance::finish(fx, result).await;
}

/// What the Fly provider offers: hibernation, volumes, set_resources, files, bulk files and
/// drift events; no templates, no streaming exec, logs or port-forward (the templates service does them over exec), no capacity, no
/// egress observation. `command` and whole-CPU/256 MB-step memory ceilings are enforced; a
/// CPU fraction, a process limit and every egress restriction are refused.
fn expect() -> Expect {
    Expect {
        hibernation: true,
        volumes: true,
        templates: false,
        set_resources: true,
        capacity: false,
        files: true,
        bulk_files: true,
        egress: false,
        egress_policy: false,
        events: true,
        command: true,
        cpu: false,
        memory: true,
        pids: false,
        domain_egress: false,
        no_egress: false,
        parks_itself: false,
        memory_step_mib: 256,
        unlabelled_volumes: true,
        // The Machines exec API runs a command to completion (no stdin, TTY or signal), and
        // the provider reads no log and forwards no port.
        streaming_exec: false,
        logs: false,
        port_forward: false,
    }
}

fn idle_request(instance: &str, image: String) -> CreateRequest {
    CreateRequest {
        name: String::new(),
        owner: Owner {
            instance: instance.to_string(),
            kind: "Sandbox".into(),
            namespace: String::new(),
            name: String::new(),
            uid: String::new(),
        },
        image: Some(image),
        template: None,
        command: Some(vec!["sleep".into(), "infinity".into()]),
        restart_policy: RestartPolicy::Never,
        env: BTreeMap::new(),
        labels: BTreeMap::new(),
        resources: Resources::default(),
        ports: vec![],
        volumes: vec![],
        allowed_domains: None,
        idle_action: None,
        image_pull_policy: sandbox_operator::provider::ImagePullPolicy::IfNotPresent,
        registry_credentials: Vec::new(),
        secret_env_keys: Default::default(),
    }
}

/// A Fly provider whose API URL is a port nobody listens on.
fn unreachable(token: SecretSource) -> FlyProvider {
    let port = sandbox_doubles::ports::quiet_port();
    let settings = FlySettings {
        api_url: format!("http://127.0.0.1:{port}"),
        token,
        ..FlySettings::for_app("unreachable")
    };
    FlyProvider::new("fly-unreachable", settings).expect("built without contacting the API")
}

/// The suite against a fresh double: its server and token file live as the fixture's guard,
/// its fault injection is the suite's `faults`, and sandboxes are planted through its API.
async fn fixture() -> Result<Fixture, Skipped> {
    let double = sandbox_doubles::fly::spawn(FlyDoubleOptions {
        max_page_size: 3,
        ..Default::default()
    })
    .await
    .expect("Fly double");
    let token = token_file(double.token());
    let first = sandbox_doubles::ports::quiet_block(501);
    let settings = FlySettings {
        api_url: double.base_url().to_string(),
        token: SecretSource::file(token.path()),
        public_host: Some(double.publish_host().to_string()),
        first_public_port: first,
        last_public_port: first + 500,
        drift_interval_seconds: 1,
        ..FlySettings::for_app(double.app())
    };
    let provider = FlyProvider::connect("fly-conformance", settings)
        .await
        .expect("provider");
    let instance = format!("conf-{}", conformance::support::unique_hex());
    Ok(Fixture {
        provider: Arc::new(provider),
        unreachable: Arc::new(unreachable(SecretSource::file(token.path()))),
        base: idle_request(&instance, base_image()),
        planter: Some(Arc::new(Planter::of(&double))),
        faults: Some(Arc::new(DoubleFaults(double.faults().clone()))),
        history: Some(Arc::new({
            let faults = double.faults().clone();
            move |mode| faults.set_history(mode)
        })),
        guard: Some(Box::new((double, token))),
        instance,
        expect: expect(),
        patience: Duration::from_secs(30),
    })
}

/// The app the provider creates is in the provider's own private network — named after the
/// app unless `network` names one — never the organization's default network, which every
/// other app of the organization is on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_is_created_in_the_providers_own_network() {
    let double = sandbox_doubles::fly::spawn(FlyDoubleOptions::default())
        .await
        .expect("Fly double");
    let token = token_file(double.token());
    let hex = conformance::support::unique_hex();
    let cases = [
        (format!("sbx-own-{hex}"), None),
        (
            format!("sbx-named-{hex}"),
            Some("sandboxes-net".to_string()),
        ),
    ];
    for (app, network) in cases {
        assert_eq!(double.app_network(&app), None, "{app} is new");
        let settings = FlySettings {
            api_url: double.base_url().to_string(),
            token: SecretSource::file(token.path()),
            org: Some("personal".into()),
            network: network.clone(),
            ..FlySettings::for_app(app.clone())
        };
        FlyProvider::connect("fly-network", settings)
            .await
            .expect("connect creates the app");
        let expected = network.unwrap_or_else(|| app.clone());
        assert_eq!(double.app_network(&app), Some(expected), "{app}");
    }
    // The double's own app, made without a network, is on the organization's default one.
    assert_eq!(double.app_network(double.app()).as_deref(), Some("default"));
    double.shutdown().await;
}

fn token_file(token: &str) -> tempfile::NamedTempFile {
    use std::io::Write;
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    writeln!(file, "{token}").expect("write token");
    file
}

/// The double's fault injection as the suite's: every request answered 503 while failing.
struct DoubleFaults(sandbox_doubles::fly::Faults);

#[async_trait]
impl conformance::Faults for DoubleFaults {
    async fn fail_all(&self) {
        self.0.arm(
            Matcher::any(),
            Fault::Status {
                code: reqwest::StatusCode::SERVICE_UNAVAILABLE,
                message: "injected outage".into(),
                classification: None,
                retry_after: None,
            },
            None,
        );
    }

    async fn heal(&self) {
        self.0.clear();
    }
}

/// Plants machines straight through the Machines API (a person with flyctl, a crashed
/// operator), with exactly the given labels as metadata.
struct Planter {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Planter {
    fn of(double: &FlyDouble) -> Planter {
        Planter {
            http: reqwest::Client::new(),
            url: format!("{}/v1/apps/{}/machines", double.base_url(), double.app()),
            token: double.token().to_string(),
        }
    }
}

#[async_trait]
impl conformance::Planter for Planter {
    async fn plant(&self, labels: &BTreeMap<String, String>) -> Result<String, String> {
        let body = serde_json::json!({
            "name": format!("planted-{}", conformance::support::unique_hex()),
            "skip_launch": true,
            "config": {
                "image": base_image(),
                "init": {"exec": ["sleep", "infinity"]},
                "metadata": labels,
            },
        });
        let reply = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("planting a machine: {e}"))?;
        let status = reply.status();
        let machine: serde_json::Value = reply
            .json()
            .await
            .map_err(|e| format!("planting a machine: {e}"))?;
        match machine["id"].as_str() {
            Some(id) if status.is_success() => Ok(id.to_string()),
            _ => Err(format!("planting a machine: {status} {machine}")),
        }
    }
}

/// The same suite against the real Machines API, opt-in: `SANDBOX_LIVE_FLY_TOKEN` (a token
/// for the app), `SANDBOX_LIVE_FLY_APP` (an existing app with a dedicated IP), and optionally
/// `SANDBOX_LIVE_FLY_REGION` and `SANDBOX_LIVE_FLY_IMAGE` (default
/// `registry-1.docker.io/library/debian:bookworm-slim`). Run with `--test-threads=1`.
mod live {
    use super::*;

    async fn live_fixture() -> Result<Fixture, Skipped> {
        conformance::live_env("SANDBOX_LIVE_FLY_TOKEN")?;
        let app = conformance::live_env("SANDBOX_LIVE_FLY_APP")?;
        let token = SecretSource::env("SANDBOX_LIVE_FLY_TOKEN");
        let settings = FlySettings {
            token: token.clone(),
            region: std::env::var("SANDBOX_LIVE_FLY_REGION").ok(),
            ..FlySettings::for_app(app)
        };
        let provider = FlyProvider::connect("fly-live", settings)
            .await
            .map_err(|e| conformance::skip(format!("the live Fly app is not usable: {e}")))?;
        let image = std::env::var("SANDBOX_LIVE_FLY_IMAGE")
            .unwrap_or_else(|_| "registry-1.docker.io/library/debian:bookworm-slim".into());
        let instance = format!("conf-{}", conformance::support::unique_hex());
        Ok(Fixture {
            provider: Arc::new(provider),
            unreachable: Arc::new(unreachable(token)),
            base: idle_request(&instance, image),
            planter: None,
            faults: None,
            guard: None,
            instance,
            expect: expect(),
            patience: Duration::from_secs(120),
            history: None,
        })
    }

    conformance_suite!(live_fixture);
}

/// Fly-specific checks beyond the suite.
mod specific {
    use std::collections::BTreeMap;
    use std::io::Write;
    use std::time::{Duration, Instant};

    use futures::StreamExt;
    use reqwest::StatusCode;
    use sandbox_doubles::fly::{FlyDouble, FlyDoubleOptions, Matcher, spawn};
    use sandbox_operator::provider::fly::{FlyProvider, FlySettings};
    use sandbox_operator::provider::labels::{MANAGED_BY, OWNER_UID, Owner};
    use sandbox_operator::provider::{
        CreateRequest, ErrorKind, ExecOutput, ExecRequest, IdleAction, PortRequest, Provider,
        ProviderResult, Resources, RestartPolicy, SandboxQuery, SandboxState, StartedAt,
        VolumeMount, VolumeQuery,
    };
    use sandbox_operator::secret::SecretSource;

    use super::base_image;

    fn hex() -> String {
        format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
    }

    /// A UUID-shaped id, as Kubernetes UIDs are.
    fn uid() -> String {
        let h = hex();
        format!(
            "{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }

    /// One test's world: a double, a provider pointed at it, and this test's instance name.
    struct World {
        double: FlyDouble,
        provider: FlyProvider,
        instance: String,
        _token: tempfile::NamedTempFile,
    }

    async fn world_with(options: FlyDoubleOptions, tune: impl FnOnce(&mut FlySettings)) -> World {
        let double = spawn(options).await.expect("Fly double");
        let mut token = tempfile::NamedTempFile::new().unwrap();
        writeln!(token, "{}", double.token()).unwrap();
        let first = sandbox_doubles::ports::quiet_block(501);
        let mut settings = FlySettings {
            api_url: double.base_url().to_string(),
            token: SecretSource::file(token.path()),
            public_host: Some(double.publish_host().to_string()),
            first_public_port: first,
            last_public_port: first + 500,
            drift_interval_seconds: 1,
            ..FlySettings::for_app(double.app())
        };
        tune(&mut settings);
        let provider = FlyProvider::connect("fly-test", settings)
            .await
            .expect("provider");
        World {
            double,
            provider,
            instance: format!("conf-{}", &hex()[..10]),
            _token: token,
        }
    }

    async fn world() -> World {
        world_with(
            FlyDoubleOptions {
                max_page_size: 2,
                ..Default::default()
            },
            |_| {},
        )
        .await
    }

    impl World {
        fn owner(&self, kind: &str) -> Owner {
            let uid = uid();
            Owner {
                instance: self.instance.clone(),
                kind: kind.into(),
                namespace: "conformance".into(),
                name: format!("obj-{}", &uid[..8]),
                uid,
            }
        }

        fn request(&self) -> CreateRequest {
            let owner = self.owner("Sandbox");
            CreateRequest {
                name: format!("sbx-{}", owner.uid),
                owner,
                image: Some(base_image()),
                template: None,
                command: Some(vec!["sleep".into(), "infinity".into()]),
                restart_policy: RestartPolicy::Never,
                env: BTreeMap::from([("GREETING".into(), "hi".into())]),
                labels: BTreeMap::from([("team".into(), "a".into())]),
                resources: Resources::default(),
                ports: vec![],
                volumes: vec![],
                allowed_domains: None,
                idle_action: None,
                image_pull_policy: sandbox_operator::provider::ImagePullPolicy::IfNotPresent,
                registry_credentials: Vec::new(),
                secret_env_keys: Default::default(),
            }
        }

        async fn running_from(&self, request: &CreateRequest) -> String {
            let d = self.provider.create(request).await.expect("create");
            self.provider.start(&d.id).await.expect("start");
            d.id
        }

        async fn running(&self) -> String {
            self.running_from(&self.request()).await
        }

        async fn sh(&self, id: &str, script: &str) -> ExecOutput {
            self.provider
                .exec(id, &ExecRequest::shell(script, Duration::from_secs(30)))
                .await
                .expect("exec")
        }

        fn query(&self) -> SandboxQuery {
            SandboxQuery {
                labels: BTreeMap::from([(MANAGED_BY.to_string(), self.instance.clone())]),
                ..Default::default()
            }
        }
    }

    fn kind<T: std::fmt::Debug>(result: ProviderResult<T>) -> ErrorKind {
        result.expect_err("an error").kind()
    }

    #[tokio::test]
    async fn capabilities_are_exactly_what_fly_can_do() {
        let w = world().await;
        let p: &dyn Provider = &w.provider;
        assert_eq!(p.kind(), "fly");
        assert!(p.hibernation().is_some());
        assert!(p.volumes().is_some());
        assert!(p.resources().is_some());
        assert!(p.files().is_some());
        assert!(p.bulk_files().is_some());
        assert!(p.events().is_some());
        assert!(p.templates().is_none(), "no native templates");
        assert!(p.capacity().is_none(), "no headroom API");
        assert!(
            p.egress().is_none(),
            "nothing to observe: Fly cannot filter"
        );
        w.double.shutdown().await;
    }

    /// Identity and rule 6: the id is the machine id; a created sandbox has never started.
    #[tokio::test]
    async fn identity_is_the_machine_id_and_started_at_is_none_until_it_runs() {
        let w = world().await;
        let request = w.request();
        let created = w.provider.create(&request).await.unwrap();
        assert_ne!(created.id, request.name, "the id is Fly's, not our name");
        assert_eq!(created.state, SandboxState::Creating);
        assert_eq!(
            created.started_at,
            StartedAt::Never,
            "never started (rule 6)"
        );
        assert_eq!(created.labels.get(OWNER_UID), Some(&request.owner.uid));
        assert_eq!(created.labels.get("team").map(String::as_str), Some("a"));
        assert_eq!(created.env.get("GREETING").map(String::as_str), Some("hi"));
        assert_eq!(
            created.command.as_deref(),
            Some(&["sleep".to_string(), "infinity".into()][..])
        );

        let mut by_owner = w.query();
        by_owner
            .labels
            .insert(OWNER_UID.into(), request.owner.uid.clone());
        let found = w.provider.find(&by_owner).await.unwrap();
        assert_eq!(
            found.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(),
            [created.id.as_str()]
        );
        assert_eq!(
            kind(w.provider.create(&request).await),
            ErrorKind::Conflict,
            "a taken name is a conflict, never a second machine"
        );

        w.provider.start(&created.id).await.unwrap();
        let running = w.provider.describe(&created.id).await.unwrap().unwrap();
        assert_eq!(running.state, SandboxState::Running);
        let started = running.started_at.time().expect("started");
        w.provider.stop(&created.id).await.unwrap();
        let stopped = w.provider.describe(&created.id).await.unwrap().unwrap();
        assert_eq!(stopped.state, SandboxState::Stopped);
        assert_eq!(
            stopped.started_at,
            StartedAt::At(started),
            "first start is kept"
        );
        w.provider.stop(&created.id).await.unwrap();
        w.double.shutdown().await;
    }

    /// Rule 1: find follows every page; a failure on any page, a dropped connection or a cut-off
    /// body is an error, never a shorter list.
    #[tokio::test]
    async fn find_follows_every_page_and_fails_when_it_cannot_look() {
        let w = world().await;
        let mut ids = Vec::new();
        for _ in 0..5 {
            ids.push(w.provider.create(&w.request()).await.unwrap().id);
        }
        let mut found: Vec<String> = w
            .provider
            .find(&w.query())
            .await
            .unwrap()
            .into_iter()
            .map(|d| d.id)
            .collect();
        found.sort();
        ids.sort();
        assert_eq!(found, ids, "5 machines over pages of 2");
        let mut stopped_only = w.query();
        stopped_only.states = Some(vec![SandboxState::Running]);
        assert!(w.provider.find(&stopped_only).await.unwrap().is_empty());

        let faults = w.double.faults();
        let list = || Matcher::path("/machines");
        faults.fail(
            list().with_query("cursor="),
            1,
            StatusCode::INTERNAL_SERVER_ERROR,
        );
        assert_eq!(
            kind(w.provider.find(&w.query()).await),
            ErrorKind::Transient
        );
        faults.drop_connection(list(), 1);
        assert_eq!(
            kind(w.provider.find(&w.query()).await),
            ErrorKind::Transient
        );
        faults.truncate(list(), 1);
        assert_eq!(
            kind(w.provider.find(&w.query()).await),
            ErrorKind::Transient
        );
        let volumes = w.provider.volumes().unwrap();
        faults.fail(Matcher::path("/volumes"), 1, StatusCode::BAD_GATEWAY);
        assert!(volumes.list_volumes(&VolumeQuery::default()).await.is_err());
        w.double.revoke_tokens();
        assert_eq!(
            kind(w.provider.find(&w.query()).await),
            ErrorKind::Unauthorized
        );
        w.double.shutdown().await;
    }

    /// Rule 5: destroy is idempotent, by id.
    #[tokio::test]
    async fn destroy_is_idempotent_and_takes_a_running_machine_down() {
        let w = world().await;
        let id = w.running().await;
        w.provider.destroy(&id).await.unwrap();
        assert!(w.provider.describe(&id).await.unwrap().is_none());
        assert!(w.double.live_machines(w.double.app()).is_empty());
        w.provider.destroy(&id).await.unwrap();
        w.provider.destroy("0123456789abcd").await.unwrap();
        w.double.shutdown().await;
    }

    #[tokio::test]
    async fn exec_returns_exit_code_and_output_as_data() {
        let w = world().await;
        let id = w.running().await;
        let out = w.sh(&id, "echo $GREETING; echo oops >&2; exit 3").await;
        assert_eq!(out.stdout, b"hi\n");
        assert_eq!(out.stderr, b"oops\n");
        assert_eq!(out.exit_code, 3);
        let mut request = ExecRequest::shell("pwd; echo $X", Duration::from_secs(10));
        request.cwd = Some("/tmp".into());
        request.env = BTreeMap::from([("X".into(), "a b".into())]);
        let out = w.provider.exec(&id, &request).await.unwrap();
        assert_eq!(out.stdout, b"/tmp\na b\n");
        let slow = ExecRequest::shell("sleep 5", Duration::from_secs(1));
        assert_eq!(
            kind(w.provider.exec(&id, &slow).await),
            ErrorKind::Transient
        );
        w.provider.stop(&id).await.unwrap();
        assert_eq!(
            kind(
                w.provider
                    .exec(&id, &ExecRequest::shell("true", Duration::from_secs(5)))
                    .await
            ),
            ErrorKind::Conflict,
            "not running"
        );
        w.double.shutdown().await;
    }

    /// Rule 2: absent files are errors; every byte value crosses unchanged.
    #[tokio::test]
    async fn files_carry_every_byte_and_absent_is_not_found() {
        let w = world().await;
        let id = w.running().await;
        let files = w.provider.files().unwrap();
        let all: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
        files
            .write_file(&id, "/work/dir/bytes.bin", &all, 0o4755)
            .await
            .unwrap();
        assert_eq!(
            files.read_file(&id, "/work/dir/bytes.bin").await.unwrap(),
            all
        );
        let mode = w.sh(&id, "stat -c %a /work/dir/bytes.bin").await;
        assert_eq!(mode.stdout, b"755\n", "setuid never written");
        files
            .write_file(&id, "/work/dir/bytes.bin", b"short", 0o644)
            .await
            .unwrap();
        assert_eq!(
            files.read_file(&id, "/work/dir/bytes.bin").await.unwrap(),
            b"short",
            "replaced, not appended"
        );
        files
            .write_file(&id, "/work/dir/empty", b"", 0o600)
            .await
            .unwrap();
        assert_eq!(files.read_file(&id, "/work/dir/empty").await.unwrap(), b"");
        assert_eq!(
            kind(files.read_file(&id, "/work/nope").await),
            ErrorKind::NotFound
        );
        assert_eq!(
            kind(files.list_dir(&id, "/work/nope").await),
            ErrorKind::NotFound
        );
        w.sh(&id, "ln -s /etc /work/dir/link; mkdir /work/dir/sub")
            .await;
        let mut listed = files.list_dir(&id, "/work/dir").await.unwrap();
        listed.sort_by(|a, b| a.name.cmp(&b.name));
        let summary: Vec<(String, Option<u64>, Option<String>)> = listed
            .into_iter()
            .map(|e| (e.name, e.size, e.symlink_target))
            .collect();
        assert_eq!(
            summary,
            [
                ("bytes.bin".to_string(), Some(5), None),
                ("empty".into(), Some(0), None),
                ("link".into(), None, Some("/etc".into())),
                ("sub".into(), None, None),
            ]
        );
        w.sh(&id, "mkdir -p /work/empty-dir").await;
        assert!(
            files
                .list_dir(&id, "/work/empty-dir")
                .await
                .unwrap()
                .is_empty()
        );
        files.delete_path(&id, "/work/dir").await.unwrap();
        files.delete_path(&id, "/work/dir").await.unwrap();
        assert_eq!(
            kind(files.read_file(&id, "/work/dir/empty").await),
            ErrorKind::NotFound
        );
        w.double.shutdown().await;
    }

    #[tokio::test]
    async fn bulk_tar_round_trips_and_hostile_archives_are_refused() {
        let w = world().await;
        let id = w.running().await;
        w.sh(
        &id,
        "mkdir -p /src/app/lib && printf 'a\\000b' > /src/app/lib/f && chmod 4755 /src/app/lib/f",
    )
    .await;
        let bulk = w.provider.bulk_files().unwrap();
        let mut stream = bulk.export(&id, "/src/app").await.unwrap();
        let mut archive = Vec::new();
        while let Some(chunk) = stream.next().await {
            archive.extend_from_slice(&chunk.unwrap());
        }
        bulk.import(
            &id,
            "/dst",
            sandbox_operator::provider::whole_archive(archive),
        )
        .await
        .unwrap();
        let copied = w.provider.files().unwrap();
        assert_eq!(
            copied.read_file(&id, "/dst/app/lib/f").await.unwrap(),
            b"a\0b"
        );
        let mode = w.sh(&id, "stat -c %a /dst/app/lib/f").await;
        assert_eq!(mode.stdout, b"755\n", "setuid does not survive an import");
        let missing = bulk.export(&id, "/src/missing").await.map(|_| ());
        assert_eq!(kind(missing), ErrorKind::NotFound);

        let bytes = raw_archive_with_name(b"../escape");
        assert_eq!(
            kind(
                bulk.import(
                    &id,
                    "/dst",
                    sandbox_operator::provider::whole_archive(bytes)
                )
                .await
            ),
            ErrorKind::Invalid
        );
        let escaped = w.sh(&id, "test -e /escape && echo yes || echo no").await;
        assert_eq!(escaped.stdout, b"no\n");
        w.double.shutdown().await;
    }

    /// A one-member tar archive whose member name is `name`, byte for byte.
    fn raw_archive_with_name(name: &[u8]) -> Vec<u8> {
        let mut header = [0u8; 512];
        header[..name.len()].copy_from_slice(name);
        header[100..107].copy_from_slice(b"0000644");
        header[124..135].copy_from_slice(b"00000000001");
        header[136..147].copy_from_slice(b"00000000000");
        header[156] = b'0';
        header[257..263].copy_from_slice(b"ustar\0");
        header[263..265].copy_from_slice(b"00");
        header[148..156].copy_from_slice(b"        ");
        let sum: u32 = header.iter().map(|b| u32::from(*b)).sum();
        header[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        let mut out = header.to_vec();
        let mut data = [0u8; 512];
        data[0] = b'x';
        out.extend_from_slice(&data);
        out.extend_from_slice(&[0u8; 1024]);
        out
    }

    /// Rule 7: hibernate and resume report what happened — a resume from the snapshot keeps the
    /// processes, a lost snapshot is a cold boot, and a machine Fly cannot snapshot is stopped
    /// and says so.
    #[tokio::test]
    async fn hibernation_reports_what_really_happened() {
        let w = world().await;
        let hibernation = w.provider.hibernation().unwrap();
        let id = w.running().await;
        // The process is its pid AND its start time: a cold boot starts the pid count over,
        // so a later process (the check's own shell, even) can hold the same pid.
        let started =
            "sleep 1000 >/dev/null 2>&1 & p=$!; echo \"$p $(cut -d' ' -f22 /proc/$p/stat)\"";
        let ident = String::from_utf8(w.sh(&id, started).await.stdout).unwrap();
        let (pid, since) = ident.trim().split_once(' ').unwrap();
        let alive = format!("[ \"$(cut -d' ' -f22 /proc/{pid}/stat 2>/dev/null)\" = {since} ]");

        let slept = hibernation.hibernate(&id).await.unwrap();
        assert!(slept.processes_preserved, "{slept:?}");
        assert_eq!(slept.mechanism, "suspend");
        let d = w.provider.describe(&id).await.unwrap().unwrap();
        assert_eq!(d.state, SandboxState::Sleeping);
        let woke = hibernation.resume(&id).await.unwrap();
        assert!(woke.processes_preserved, "{woke:?}");
        assert_eq!(w.sh(&id, &alive).await.exit_code, 0);

        hibernation.hibernate(&id).await.unwrap();
        assert!(w.double.lose_snapshot(&id));
        let cold = hibernation.resume(&id).await.unwrap();
        assert!(
            !cold.processes_preserved,
            "a cold boot is reported: {cold:?}"
        );
        assert_ne!(w.sh(&id, &alive).await.exit_code, 0);

        let mut big = w.request();
        big.resources.memory_bytes = Some(4 << 30);
        let big = w.running_from(&big).await;
        let fallback = hibernation.hibernate(&big).await.unwrap();
        assert!(!fallback.processes_preserved, "{fallback:?}");
        assert_eq!(fallback.mechanism, "stop");
        let d = w.provider.describe(&big).await.unwrap().unwrap();
        assert_eq!(d.state, SandboxState::Stopped);
        w.double.shutdown().await;
    }

    /// Rule 4 and 5 for volumes: attachment is read from the machines too, removal is refused
    /// while attached and idempotent when absent; data outlives the sandbox.
    #[tokio::test]
    async fn volumes_know_their_machine_and_outlive_it() {
        let w = world_with(FlyDoubleOptions::default(), |_| {}).await;
        let volumes = w.provider.volumes().unwrap();
        let name = format!("sbxv-{}", uid());
        let owner = w.owner("SandboxVolume");
        let made = volumes.create_volume(&name, &owner.labels()).await.unwrap();
        assert_eq!(made.name, name, "the seam name reads back");
        assert!(!made.attached);
        let again = volumes.create_volume(&name, &owner.labels()).await.unwrap();
        assert_eq!(again.name, name, "creating it again is a success");

        let mut request = w.request();
        request.volumes = vec![VolumeMount {
            volume_name: name.clone(),
            mount_path: "/data".into(),
            read_only: false,
        }];
        let writer = w.running_from(&request).await;
        w.sh(&writer, "echo kept > /data/f").await;
        let d = w.provider.describe(&writer).await.unwrap().unwrap();
        assert_eq!(d.volumes, std::slice::from_ref(&name));
        let info = volumes.get_volume(&name).await.unwrap().unwrap();
        assert!(info.attached);
        assert_eq!(info.attached_to, std::slice::from_ref(&writer));
        let attached_only = VolumeQuery {
            attached: Some(true),
            ..Default::default()
        };
        assert_eq!(volumes.list_volumes(&attached_only).await.unwrap().len(), 1);
        let refused = volumes.remove_volume(&name).await.unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::Conflict);
        assert!(refused.message().contains(&writer), "{refused}");

        w.provider.destroy(&writer).await.unwrap();
        let mut request = w.request();
        request.volumes = vec![VolumeMount {
            volume_name: name.clone(),
            mount_path: "/data".into(),
            read_only: false,
        }];
        let reader = w.running_from(&request).await;
        assert_eq!(w.sh(&reader, "cat /data/f").await.stdout, b"kept\n");
        w.provider.destroy(&reader).await.unwrap();
        volumes.remove_volume(&name).await.unwrap();
        volumes.remove_volume(&name).await.unwrap();
        assert!(volumes.get_volume(&name).await.unwrap().is_none());

        let mut missing = w.request();
        missing.volumes = vec![VolumeMount {
            volume_name: "sbxv-absent".into(),
            mount_path: "/data".into(),
            read_only: false,
        }];
        assert_eq!(kind(w.provider.create(&missing).await), ErrorKind::NotFound);
        w.double.shutdown().await;
    }

    /// Rule 10: what Fly cannot enforce is refused before anything is created.
    #[tokio::test]
    async fn unenforceable_fields_are_refused_and_leave_nothing_behind() {
        let w = world().await;
        let mut egress = w.request();
        egress.allowed_domains = Some(vec!["example.com".into()]);
        let err = w.provider.create(&egress).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        assert!(
            err.message().contains("spec.egress.allowedDomains"),
            "{err}"
        );
        let mut pids = w.request();
        pids.resources.pids = Some(100);
        assert_eq!(kind(w.provider.create(&pids).await), ErrorKind::Unsupported);
        let mut cpu = w.request();
        cpu.resources.cpu_millis = Some(1500);
        assert_eq!(kind(w.provider.create(&cpu).await), ErrorKind::Invalid);
        assert!(w.double.live_machines(w.double.app()).is_empty());
        w.double.shutdown().await;
    }

    #[tokio::test]
    async fn set_resources_updates_the_machine_and_refuses_what_fly_lacks() {
        let w = world().await;
        let id = w.running().await;
        let resources = w.provider.resources().unwrap();
        let wanted = Resources {
            cpu_millis: Some(2000),
            memory_bytes: Some(512 << 20),
            ..Default::default()
        };
        let change = resources.set_resources(&id, &wanted).await.unwrap();
        assert!(
            change.restarted,
            "Fly reboots a running machine to resize it"
        );
        let applied = change.applied;
        assert_eq!(applied.cpu_millis, Some(2000));
        assert_eq!(applied.memory_bytes, Some(512 << 20));
        let limit = w
        .sh(
            &id,
            "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes",
        )
        .await;
        assert_eq!(limit.stdout, format!("{}\n", 512u64 << 20).into_bytes());
        let d = w.provider.describe(&id).await.unwrap().unwrap();
        assert_eq!(d.state, SandboxState::Running, "rebooted and running again");
        assert!(d.started_at.time().is_some());
        let pids = Resources {
            pids: Some(10),
            ..Default::default()
        };
        assert_eq!(
            kind(resources.set_resources(&id, &pids).await),
            ErrorKind::Unsupported
        );
        // A stopped machine is updated without a launch, and not reported as restarted.
        w.provider.stop(&id).await.unwrap();
        let smaller = Resources {
            memory_bytes: Some(256 << 20),
            ..Default::default()
        };
        let change = resources.set_resources(&id, &smaller).await.unwrap();
        assert!(
            !change.restarted,
            "a stopped machine stays stopped: {change:?}"
        );
        let d = w.provider.describe(&id).await.unwrap().unwrap();
        assert_eq!(d.state, SandboxState::Stopped);
        assert_eq!(d.resources.memory_bytes, Some(256 << 20));
        w.double.shutdown().await;
    }

    /// Leases: while another client (a second replica, a person with flyctl) holds a machine's
    /// lease, the provider's mutations are refused as `Conflict`/`LeaseHeld` and change nothing.
    #[tokio::test]
    async fn a_lease_held_elsewhere_blocks_mutations() {
        let w = world().await;
        let id = w.running().await;
        let http = reqwest::Client::new();
        let lease_url = format!(
            "{}/v1/apps/{}/machines/{id}/lease",
            w.double.base_url(),
            w.double.app()
        );
        let lease: serde_json::Value = http
            .post(&lease_url)
            .bearer_auth(w.double.token())
            .json(&serde_json::json!({"ttl": 60, "description": "flyctl"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let nonce = lease["data"]["nonce"].as_str().unwrap().to_string();
        let err = w.provider.stop(&id).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict);
        assert_eq!(err.reason(), "LeaseHeld");
        assert_eq!(
            w.provider.describe(&id).await.unwrap().unwrap().state,
            SandboxState::Running
        );
        http.delete(&lease_url)
            .bearer_auth(w.double.token())
            .header("fly-machine-lease-nonce", nonce)
            .send()
            .await
            .unwrap();
        w.provider.stop(&id).await.unwrap();
        w.double.shutdown().await;
    }

    #[tokio::test]
    async fn api_errors_map_to_what_the_caller_should_do() {
        let w = world().await;
        let faults = w.double.faults();
        faults.insufficient_capacity(1);
        let full = w.provider.create(&w.request()).await.unwrap_err();
        assert_eq!(full.kind(), ErrorKind::Transient);
        assert_eq!(full.reason(), "InsufficientCapacity");
        let mut bad_image = w.request();
        bad_image.image = Some("sandbox-operator/absent:none".into());
        assert_eq!(
            kind(w.provider.create(&bad_image).await),
            ErrorKind::Invalid
        );
        assert_eq!(
            w.provider.describe("0123456789abcd").await.unwrap(),
            None,
            "absent is None, not an error"
        );

        // A 429 pauses the whole client for Retry-After: the next call (of any kind) reaches
        // the API only once that has passed.
        faults.rate_limit(Matcher::path("/machines"), 1, 1);
        let limited = w.provider.find(&w.query()).await.unwrap_err();
        assert_eq!(limited.kind(), ErrorKind::Transient);
        assert_eq!(limited.retry_after(), Some(Duration::from_secs(1)));
        w.provider.describe("0123456789abcd").await.unwrap();
        let log = w.double.requests().all();
        let [.., limited_at, next_at] = &log[..] else {
            panic!("two requests expected: {log:?}");
        };
        let gap = next_at.at.duration_since(limited_at.at);
        assert!(
            gap >= Duration::from_millis(950),
            "sent {gap:?} after the 429"
        );

        let fresh = world().await;
        fresh.double.revoke_tokens();
        let refused = fresh.provider.describe("0123456789abcd").await.unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::Unauthorized);
        assert!(!refused.to_string().contains(fresh.double.token()));
        w.double.shutdown().await;
        fresh.double.shutdown().await;
    }

    async fn get_until_ok(url: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match reqwest::get(url).await {
                Ok(r) => return r.text().await.unwrap(),
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("{url} never answered: {e}"),
            }
        }
    }

    const SERVER: &str = "perl -MIO::Socket::INET -e '$s=IO::Socket::INET->new(LocalPort=>8080,Listen=>5,ReuseAddr=>1) or die; \
    while($c=$s->accept){<$c>; print $c \"HTTP/1.0 200 OK\\r\\n\\r\\n$ENV{FLY_MACHINE_ID}\"; close $c}'";

    /// Two sandboxes serving the same port in one app each get a URL that reaches them alone.
    #[tokio::test]
    async fn each_sandbox_url_reaches_that_sandbox_alone() {
        let w = world().await;
        let mut ids = Vec::new();
        let mut urls = Vec::new();
        for _ in 0..2 {
            let mut request = w.request();
            request.command = Some(vec!["sh".into(), "-c".into(), SERVER.into()]);
            request.ports = vec![PortRequest {
                sandbox_port: 8080,
                protocol: "tcp".into(),
            }];
            request.idle_action = Some(IdleAction::Stop);
            let id = w.running_from(&request).await;
            let d = w.provider.describe(&id).await.unwrap().unwrap();
            assert_eq!(d.ports.len(), 1);
            urls.push(format!("http://{}:{}/", d.ports[0].host, d.ports[0].port));
            ids.push(id);
        }
        assert_ne!(urls[0], urls[1]);
        for (id, url) in ids.iter().zip(&urls) {
            assert_eq!(&get_until_ok(url).await, id, "{url}");
        }
        w.double.shutdown().await;
    }

    /// Drift: a change made behind the provider's back (flyctl stopping a machine) arrives as an
    /// event for its owner, from listings of the app — no per-machine reads.
    #[tokio::test]
    async fn drift_arrives_as_events_from_listings_alone() {
        let w = world().await;
        let request = w.request();
        let owner_uid = request.owner.uid.clone();
        let id = w.running_from(&request).await;
        let mut events = w.provider.events().unwrap().subscribe(&w.instance);
        // Let the first scan record the baseline.
        let first = Matcher::on(reqwest::Method::GET, "/machines");
        let deadline = Instant::now() + Duration::from_secs(10);
        while w.double.requests().count(&first) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        w.double.requests().clear();
        let stop = format!(
            "{}/v1/apps/{}/machines/{id}/stop",
            w.double.base_url(),
            w.double.app()
        );
        let answer = reqwest::Client::new()
            .post(&stop)
            .bearer_auth(w.double.token())
            .send()
            .await
            .unwrap();
        assert!(answer.status().is_success());
        let event = tokio::time::timeout(Duration::from_secs(15), async {
            loop {
                let e = events.next().await.expect("stream open").expect("event");
                if e.action == "stopped" || e.action == "stopping" {
                    return e;
                }
            }
        })
        .await
        .expect("a drift event");
        assert_eq!(event.owner.uid, owner_uid);
        let per_machine = w.double.requests().matching(&Matcher::on(
            reqwest::Method::GET,
            &format!("/machines/{id}"),
        ));
        assert!(
            per_machine.is_empty(),
            "no per-object reads: {per_machine:?}"
        );
        w.double.shutdown().await;
    }
}

fn base_image() -> String {
    std::env::var("SANDBOX_BASE_IMAGE").unwrap_or_else(|_| "sandbox-operator/base:bookworm".into())
}
