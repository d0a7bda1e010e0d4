//! The provider conformance suite (`tests/conformance/`) against the Fly Sprites provider and
//! the Sprites double (`tests/doubles/src/sprites/`), where every sprite is a real local
//! container of the base image.
//!
//! Needs a running engine and the base image (`tests/setup/docker.sh`,
//! `tests/setup/base-image.sh`; `SANDBOX_BASE_IMAGE` overrides the tag).

mod harness;
#[macro_use]
mod conformance;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::{Expect, Faults, Fixture, Planter, Skipped};
use sandbox_doubles::sprites::{self, SpritesDouble, SpritesOptions, TAG_LABEL};
use sandbox_operator::provider::labels::Owner;
use sandbox_operator::provider::sprites::SpritesProvider;
use sandbox_operator::provider::{CreateRequest, Resources, RestartPolicy, whole_archive};

conformance_suite!(fixture);

/// What the Sprites provider offers against the double: exact files; bulk tar through exec;
/// an egress verdict read from the policy the service enforces; a memory ceiling
/// (whole MiB); a domain allow-list and "no egress" (stored as the sprite's network policy,
/// which the real service enforces; the double only stores it); no command (a sprite has no
/// main process), no fractional CPU (the suite asks for 500m; whole CPUs are accepted), no
/// pids; and the service parks sprites by itself, so stop and sleep are refused. Streaming
/// exec over the exec WebSocket (stdin, a TTY with resize, signals, separate streams, the exit
/// code); port-forward through the port proxy WebSocket; no logs (a sprite has no main
/// process).
fn expect() -> Expect {
    Expect {
        streaming_exec: true,
        port_forward: true,
        files: true,
        bulk_files: true,
        egress: true,
        memory: true,
        domain_egress: true,
        no_egress: true,
        parks_itself: true,
        egress_policy: true,
        ..Expect::default()
    }
}

fn base_image() -> String {
    std::env::var("SANDBOX_BASE_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "sandbox-operator/base:bookworm".to_string())
}

/// One double per test, with a provider at it and one at a closed port.
async fn fixture() -> Result<Fixture, Skipped> {
    let instance = format!("conf-{:016x}", fastrand::u64(..));
    let double = sprites::spawn(SpritesOptions::new(base_image())).await;
    let provider = SpritesProvider::new(
        "sprites-conformance",
        &double.base_url,
        double.token.clone(),
    )
    .expect("a provider at the double");
    let port = sandbox_doubles::ports::quiet_port();
    let unreachable = SpritesProvider::new(
        "sprites-unreachable",
        &format!("http://127.0.0.1:{port}"),
        "t".into(),
    )
    .expect("a provider at a closed port");
    let base = CreateRequest {
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
        resources: Resources::default(),
        ports: vec![],
        volumes: vec![],
        allowed_domains: None,
        idle_action: None,
        image_pull_policy: Default::default(),
        registry_credentials: Vec::new(),
        secret_env_keys: Default::default(),
    };
    let double = Arc::new(Guard(Some(double)));
    Ok(Fixture {
        provider: Arc::new(provider),
        unreachable: Arc::new(unreachable),
        planter: Some(double.clone()),
        faults: Some(double.clone()),
        history: Some(Arc::new({
            let guard = double.clone();
            move |mode| {
                if let Some(d) = &guard.0 {
                    d.faults().set_history(mode);
                }
            }
        })),
        guard: Some(Box::new(double)),
        instance,
        base,
        expect: expect(),
        patience: Duration::from_secs(30),
    })
}

/// Holds the double; on drop removes every container it made (a panicking check included).
struct Guard(Option<SpritesDouble>);

impl Guard {
    fn double(&self) -> &SpritesDouble {
        self.0.as_ref().expect("the double runs")
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Some(double) = self.0.take() else { return };
        let tag = double.tag().to_string();
        drop(double);
        let listed = std::process::Command::new("docker")
            .args(["ps", "-aq", "--filter", &format!("label={TAG_LABEL}={tag}")])
            .output();
        if let Ok(out) = listed {
            let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(String::from)
                .collect();
            if !ids.is_empty() {
                let _ = std::process::Command::new("docker")
                    .args(["rm", "-f", "-v"])
                    .args(&ids)
                    .output();
            }
        }
    }
}

/// Plants a sprite straight at the double (as a create whose status write was lost would
/// leave it), with `labels` as the API's `key=value` strings.
#[async_trait]
impl Planter for Guard {
    async fn plant(&self, labels: &BTreeMap<String, String>) -> Result<String, String> {
        let d = self.double();
        let name = format!("planted-{:012x}", fastrand::u64(..) >> 16);
        let body = serde_json::json!({
            "name": name,
            "labels": labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        });
        let response = reqwest::Client::new()
            .post(format!("{}/v1/sprites", d.base_url))
            .bearer_auth(&d.token)
            .json(&body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("planting {name}: HTTP {}", response.status()));
        }
        Ok(name)
    }
}

#[async_trait]
impl Faults for Guard {
    async fn fail_all(&self) {
        self.double().faults().set_fail_all(true);
    }
    async fn heal(&self) {
        self.double().faults().set_fail_all(false);
    }
}

/// Checks of the Sprites provider beyond the shared suite: the API's faults, paging, the
/// network policy replaced in place, and states read from what the service did.
mod sprites_specific {
    use super::*;
    use bytes::Bytes;
    use futures::StreamExt;
    use sandbox_doubles::sprites::Park;
    use sandbox_operator::provider::stream::{
        ExecInput, ExecSession, Signal, StreamExecRequest, TermSize,
    };
    use sandbox_operator::provider::{ErrorKind, ExecRequest, Provider, SandboxState};

    async fn setup() -> (Fixture, Arc<SpritesProvider>) {
        let fx = fixture().await.expect("a fixture");
        let guard = fx.guard.as_ref().expect("guard");
        let guard = guard
            .downcast_ref::<Arc<Guard>>()
            .expect("the guard is ours");
        let d = guard.double();
        let provider = Arc::new(
            SpritesProvider::new("sprites-specific", &d.base_url, d.token.clone())
                .expect("provider"),
        );
        (fx, provider)
    }

    fn double(fx: &Fixture) -> &SpritesDouble {
        let guard = fx.guard.as_ref().expect("guard");
        guard.downcast_ref::<Arc<Guard>>().expect("ours").double()
    }

    async fn policy(fx: &Fixture, id: &str) -> serde_json::Value {
        let d = double(fx);
        reqwest::Client::new()
            .get(format!("{}/v1/sprites/{id}/policy/network", d.base_url))
            .bearer_auth(&d.token)
            .send()
            .await
            .expect("policy answered")
            .json()
            .await
            .expect("policy JSON")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rate_limit_carries_the_wait_the_api_asked_for() {
        let (fx, p) = setup().await;
        double(&fx).faults().rate_limit(1, 7);
        let err = p.find(&fx.query()).await.expect_err("rate limited");
        assert!(err.is(ErrorKind::Transient), "{err}");
        assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
        assert!(p.find(&fx.query()).await.is_ok(), "one 429 only");
        fx.cleanup().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_revoked_token_is_unauthorized_everywhere_and_deletes_nothing() {
        let (fx, p) = setup().await;
        let id = p.create(&fx.request()).await.expect("create").id;
        double(&fx).rotate_token("a-new-token");
        let err = p.find(&fx.query()).await.expect_err("revoked");
        assert!(err.is(ErrorKind::Unauthorized), "{err}");
        assert!(!err.to_string().contains(&double(&fx).token), "{err}");
        let err = p.destroy(&id).await.expect_err("revoked");
        assert!(err.is(ErrorKind::Unauthorized), "{err}");
        let exec = p
            .exec(&id, &ExecRequest::shell("true", Duration::from_secs(10)))
            .await
            .expect_err("revoked");
        assert!(exec.is(ErrorKind::Unauthorized), "{exec}");
        assert_eq!(double(&fx).deletes(), 0);
        double(&fx).rotate_token(&double(&fx).token.clone());
        fx.cleanup().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_exec_socket_closed_before_the_exit_frame_is_transient() {
        let (fx, p) = setup().await;
        let id = p.create(&fx.request()).await.expect("create").id;
        p.start(&id).await.expect("start");
        double(&fx).faults().drop_exec(&id, 1);
        let err = p
            .exec(&id, &ExecRequest::shell("echo hi", Duration::from_secs(10)))
            .await
            .expect_err("no exit frame");
        assert!(err.is(ErrorKind::Transient), "{err}");
        assert!(err.message().contains("before the exit code"), "{err}");
        let out = p
            .exec(&id, &ExecRequest::shell("exit 3", Duration::from_secs(10)))
            .await
            .expect("the next exec");
        assert_eq!(out.exit_code, 3);
        fx.cleanup().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn find_follows_every_page() {
        let (fx, p) = setup().await;
        let mut made = Vec::new();
        for _ in 0..5 {
            made.push(p.create(&fx.request()).await.expect("create").id);
        }
        let before = double(&fx).requests();
        let mut found: Vec<String> = p
            .find(&fx.query())
            .await
            .expect("find")
            .into_iter()
            .map(|d| d.id)
            .collect();
        found.sort();
        made.sort();
        assert_eq!(found, made);
        assert_eq!(double(&fx).requests() - before, 3, "5 sprites, 2 per page");
        fx.cleanup().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn egress_is_replaced_in_place() {
        let (fx, p) = setup().await;
        let mut request = fx.request();
        request.allowed_domains = Some(vec!["example.com".into()]);
        let created = p.create(&request).await.expect("create");
        let rules = policy(&fx, &created.id).await;
        assert_eq!(rules["rules"][0]["domain"], "example.com");
        assert_eq!(rules["rules"][1]["domain"], "*");
        assert_eq!(rules["rules"][1]["action"], "deny");
        p.replace_egress(&created.id, Some(&["api.example.org".to_string()]))
            .await
            .expect("replace");
        let rules = policy(&fx, &created.id).await;
        assert_eq!(rules["rules"][0]["domain"], "api.example.org");
        assert_eq!(rules["rules"].as_array().map(Vec::len), Some(2));
        let after = p
            .describe(&created.id)
            .await
            .expect("describe")
            .expect("kept");
        assert_eq!(after.created_at, created.created_at, "the same sprite");
        assert_eq!(double(&fx).creates(), 1);
        p.replace_egress(&created.id, None).await.expect("open");
        assert_eq!(
            policy(&fx, &created.id).await["rules"],
            serde_json::json!([])
        );
        fx.cleanup().await;
    }

    /// The verdict follows the policy the service reports, whatever was asked: filtered with
    /// an allow-list, open without, and inconclusive when the policy cannot be read.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_egress_verdict_is_the_enforced_policy_or_inconclusive() {
        use sandbox_operator::provider::EgressState;
        let (fx, p) = setup().await;
        let mut request = fx.request();
        request.allowed_domains = Some(vec!["example.com".into()]);
        let id = p.create(&request).await.expect("create").id;
        let egress = p.egress().expect("egress observation");
        let never_ran = egress.egress_verdict(&id).await.expect("verdict");
        assert_eq!(never_ran.state, EgressState::Inconclusive, "{never_ran:?}");
        p.start(&id).await.expect("start");
        let v = egress.egress_verdict(&id).await.expect("verdict");
        assert_eq!(v.state, EgressState::Filtered, "{v:?}");
        assert!(v.detail.contains("example.com"), "{v:?}");
        // Changed behind the provider's back: the verdict follows the service, not a record.
        let d = double(&fx);
        reqwest::Client::new()
            .post(format!("{}/v1/sprites/{id}/policy/network", d.base_url))
            .bearer_auth(&d.token)
            .json(&serde_json::json!({"rules": []}))
            .send()
            .await
            .expect("policy replaced")
            .error_for_status()
            .expect("policy accepted");
        let v = egress.egress_verdict(&id).await.expect("verdict");
        assert_eq!(v.state, EgressState::Open, "{v:?}");
        assert!(v.remediation.is_some());
        d.faults().fail_policy_reads(true);
        let v = egress.egress_verdict(&id).await.expect("verdict");
        assert_eq!(v.state, EgressState::Inconclusive, "{v:?}");
        assert!(v.detail.contains("could not read"), "{v:?}");
        d.faults().fail_policy_reads(false);
        fx.cleanup().await;
    }

    /// A tree with every byte value, a nested directory and an empty file crosses both ways
    /// through tar over the exec WebSocket unchanged; absent and symlinked paths are refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bulk_tar_crosses_the_exec_socket_unchanged() {
        let (fx, p) = setup().await;
        let id = p.create(&fx.request()).await.expect("create").id;
        p.start(&id).await.expect("start");
        let files = p.files().expect("files");
        let every_byte: Vec<u8> = (0..=255u8).cycle().take(256 * 300).collect();
        files
            .write_file(&id, "/tmp/tree/a/bytes.bin", &every_byte, 0o640)
            .await
            .expect("write");
        files
            .write_file(&id, "/tmp/tree/empty", b"", 0o600)
            .await
            .expect("write");
        let bulk = p.bulk_files().expect("bulk");
        let mut stream = bulk.export(&id, "/tmp/tree").await.expect("export");
        let mut archive = Vec::new();
        while let Some(chunk) = stream.next().await {
            archive.extend_from_slice(&chunk.expect("chunk"));
        }
        bulk.import(&id, "/tmp/copy", whole_archive(archive))
            .await
            .expect("import");
        let back = files
            .read_file(&id, "/tmp/copy/tree/a/bytes.bin")
            .await
            .expect("read back");
        assert_eq!(back, every_byte);
        assert_eq!(
            files
                .read_file(&id, "/tmp/copy/tree/empty")
                .await
                .expect("empty"),
            b""
        );
        let absent = bulk
            .export(&id, "/tmp/nothing-here")
            .await
            .err()
            .expect("absent");
        assert!(absent.is(ErrorKind::NotFound), "{absent}");
        p.exec(
            &id,
            &ExecRequest::shell("ln -s /etc /tmp/link", Duration::from_secs(10)),
        )
        .await
        .expect("symlink");
        let link = bulk.export(&id, "/tmp/link").await.err().expect("symlink");
        assert!(link.is(ErrorKind::Invalid), "{link}");
        fx.cleanup().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn states_follow_what_the_service_did_and_a_warm_wake_keeps_processes() {
        let (fx, p) = setup().await;
        let id = p.create(&fx.request()).await.expect("create").id;
        p.start(&id).await.expect("start");
        let pid = p
            .exec(
                &id,
                &ExecRequest::shell(
                    "nohup sleep 600 >/dev/null 2>&1 & echo $!",
                    Duration::from_secs(10),
                ),
            )
            .await
            .expect("background process");
        let pid = String::from_utf8_lossy(&pid.stdout).trim().to_string();
        let alive = format!("test -d /proc/{pid} && echo alive || echo gone");
        double(&fx).park(&id, Park::Warm).await.expect("warm");
        let d = p.describe(&id).await.expect("describe").expect("there");
        assert_eq!(d.state, SandboxState::Sleeping);
        p.wake(&id).await.expect("wake");
        let out = p
            .exec(&id, &ExecRequest::shell(&alive, Duration::from_secs(10)))
            .await;
        assert_eq!(
            out.expect("exec").stdout,
            b"alive\n",
            "a warm wake keeps processes"
        );
        double(&fx).park(&id, Park::Cold).await.expect("cold");
        let d = p.describe(&id).await.expect("describe").expect("there");
        assert_eq!(d.state, SandboxState::Stopped);
        assert!(
            d.started_at.time().is_some(),
            "a cold sprite has run before"
        );
        p.wake(&id).await.expect("wake");
        let out = p
            .exec(&id, &ExecRequest::shell(&alive, Duration::from_secs(10)))
            .await;
        assert_eq!(
            out.expect("exec").stdout,
            b"gone\n",
            "a cold wake starts fresh"
        );
        fx.cleanup().await;
    }

    fn stream_request(argv: &[&str]) -> StreamExecRequest {
        StreamExecRequest {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: Default::default(),
            cwd: None,
            stdin: false,
            tty: None,
        }
    }

    /// A service that does not take signals over the exec socket (no `signal` in
    /// `X-Sprite-Capabilities`): the signal goes through the kill endpoint with the id from
    /// `session_info`, and still ends the process.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_socket_signals_the_kill_endpoint_carries_them() {
        let (fx, p) = setup().await;
        let id = p.create(&fx.request()).await.expect("create").id;
        p.start(&id).await.expect("start");
        double(&fx).faults().set_no_ws_signals(true);
        let exec = p.streaming_exec().expect("streaming exec");
        let session = exec
            .exec_stream(&id, &stream_request(&["sleep", "600"]))
            .await
            .expect("started");
        let ExecSession { input, exit, .. } = session;
        input
            .send(ExecInput::Signal(Signal::Interrupt))
            .await
            .expect("queued");
        let status = tokio::time::timeout(Duration::from_secs(60), exit)
            .await
            .expect("ended within the bound")
            .expect("an exit status");
        assert_eq!(status.code, 130, "sleep ended by SIGINT");
        assert_eq!(double(&fx).requests_to("POST", "/kill").len(), 1);
        drop(input);
        fx.cleanup().await;
    }

    /// A terminal has no EOF frame: closing its stdin types ^D, which ends `cat`'s input.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_terminal_s_stdin_ends_with_its_end_of_input_character() {
        let (fx, p) = setup().await;
        let id = p.create(&fx.request()).await.expect("create").id;
        p.start(&id).await.expect("start");
        let exec = p.streaming_exec().expect("streaming exec");
        let mut request = stream_request(&["cat"]);
        request.stdin = true;
        request.tty = Some(TermSize { cols: 80, rows: 24 });
        let session = exec.exec_stream(&id, &request).await.expect("started");
        let ExecSession {
            input,
            stdout,
            exit,
            ..
        } = session;
        input
            .send(ExecInput::Stdin(Bytes::from_static(b"hi\n")))
            .await
            .expect("queued");
        input.send(ExecInput::CloseStdin).await.expect("queued");
        let run = async {
            let out: Vec<u8> = stdout.map(|c| c.expect("output").to_vec()).concat().await;
            (out, exit.await)
        };
        let (out, status) = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("ended within the bound");
        assert_eq!(status.expect("an exit status").code, 0);
        assert!(String::from_utf8_lossy(&out).contains("hi"), "{out:?}");
        fx.cleanup().await;
    }
}
