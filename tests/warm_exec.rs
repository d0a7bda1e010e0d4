//! Warm processes (`registry::warm`), for real: the conformance suite's interactive checks
//! run with every process handed to a reader that was waiting in the sandbox — on Docker and
//! on the Kubernetes provider — and each check fails if its process was started any other
//! way. Then what the handle adds: a file written through a waiting process, a reader that
//! is dropped runs nothing, and a frozen sandbox's reader is abandoned without running its
//! command, then or later.

mod harness;
#[macro_use]
mod conformance;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sandbox_operator::metrics::Metrics;
use sandbox_operator::provider::stream::{
    ExecSession, Logs, PortForward, StreamExecRequest, StreamingExec,
};
use sandbox_operator::provider::{
    CreateRequest, ErrorKind, ExecOutput, ExecRequest, Files, Hibernation, Provider,
    ProviderResult, SandboxDescriptor, SandboxQuery,
};
use sandbox_operator::registry::{ProviderHandle, warm};

use conformance::fixture::{Fixture, Skipped};
use conformance::support::{running, sh, wait_until};

/// Counts the readers in a sandbox (the pattern does not match its own command line).
const READERS: &str = r#"grep -l "sbx-[w]arm-1" /proc/[0-9]*/cmdline 2>/dev/null | wc -l"#;

/// The series that counts processes handed to a waiting reader.
const WARM_OK: &str = "sandbox_operator_provider_calls_total{provider=\"PROVIDER\",operation=\"exec_warm\",outcome=\"ok\"}";

/// A provider whose interactive processes go through a handle's waiting processes: each
/// request primes the sandbox first (so a reader is waiting, or being started, when the
/// request takes it), and a process started without one is an error.
struct Warmed {
    inner: Arc<dyn Provider>,
    exec: WarmedExec,
}

struct WarmedExec {
    handle: ProviderHandle,
    metrics: Metrics,
}

impl WarmedExec {
    fn handed(&self) -> f64 {
        let series = WARM_OK.replace("PROVIDER", self.handle.name());
        harness::metrics::sum(&self.metrics.render(), &series)
    }
}

#[async_trait]
impl StreamingExec for WarmedExec {
    async fn exec_stream(
        &self,
        id: &str,
        request: &StreamExecRequest,
    ) -> ProviderResult<ExecSession> {
        let before = self.handed();
        self.handle.prime(id, None);
        let session = self.handle.exec_stream(id, request).await?;
        if request.tty.is_none() && self.handed() != before + 1.0 {
            return Err(sandbox_operator::provider::ProviderError::invalid(format!(
                "the process in {id} was not handed to a waiting reader"
            )));
        }
        Ok(session)
    }
}

impl WarmedExec {
    /// A handle of its own over `provider`.
    fn over(provider: Arc<dyn Provider>) -> WarmedExec {
        let metrics = Metrics::new();
        let handle = ProviderHandle::new(provider, 8, Duration::from_secs(60), metrics.clone());
        WarmedExec { handle, metrics }
    }
}

fn warmed(made: Result<Fixture, Skipped>) -> Result<Fixture, Skipped> {
    let mut fx = made?;
    fx.provider = Arc::new(Warmed {
        inner: fx.provider.clone(),
        exec: WarmedExec::over(fx.provider.clone()),
    });
    Ok(fx)
}

async fn docker() -> Result<Fixture, Skipped> {
    warmed(conformance::docker::fixture().await)
}

async fn kubernetes() -> Result<Fixture, Skipped> {
    warmed(conformance::kubernetes::fixture().await)
}

mod on_docker {
    conformance_suite!(@each super::docker;
        interactive::stream_exec_delivers_stdin_and_its_end,
        interactive::stream_exec_passes_the_exit_code_through,
        interactive::stream_exec_keeps_stdout_and_stderr_apart,
        interactive::stream_exec_tty_has_its_size_and_resizes,
        interactive::stream_exec_delivers_signals,
        interactive::stream_exec_carries_a_large_stream,
        interactive::stream_exec_holds_a_fast_producer_for_a_slow_reader,
    );
}

mod on_kubernetes {
    conformance_suite!(@each super::kubernetes;
        interactive::stream_exec_delivers_stdin_and_its_end,
        interactive::stream_exec_passes_the_exit_code_through,
        interactive::stream_exec_keeps_stdout_and_stderr_apart,
        interactive::stream_exec_delivers_signals,
        interactive::stream_exec_carries_a_large_stream,
        interactive::stream_exec_holds_a_fast_producer_for_a_slow_reader,
    );
}

/// A file written through a waiting process has exactly its bytes and mode, and the write
/// took the waiting process (no runtime exec).
async fn a_file_is_written_through_a_waiting_process(fx: &Fixture) -> Result<(), String> {
    let id = running(fx).await?;
    let w = &WarmedExec::over(fx.provider.clone());
    w.handle.prime(&id, None);
    waiting(fx, w, &id, "a waiting process").await?;
    let before = w.handed();
    let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    w.handle
        .write_file(&id, "/run/sandboxes.dev/env", &data, 0o600)
        .await
        .map_err(|e| e.to_string())?;
    if w.handed() != before + 1.0 {
        return Err("the write did not use the waiting process".into());
    }
    let files = fx.provider.files().ok_or("files")?;
    let back = files
        .read_file(&id, "/run/sandboxes.dev/env")
        .await
        .map_err(|e| e.to_string())?;
    if back != data {
        return Err(format!(
            "{} bytes read back, not the {} written",
            back.len(),
            data.len()
        ));
    }
    let mode = sh(fx, &id, "stat -c %a /run/sandboxes.dev/env").await?;
    if mode.trim() != "600" {
        return Err(format!("mode {mode:?}, not 600"));
    }
    a_small_text_is_written_exactly(fx, w, &id).await?;
    a_refused_write_is_reported(fx, w, &id).await
}

/// Small text — an env file — goes to a waiting process in its header's environment
/// (`shellfs::reported_write_from_env`): it arrives byte for byte, shell syntax and a
/// missing final newline included.
async fn a_small_text_is_written_exactly(
    fx: &Fixture,
    w: &WarmedExec,
    id: &str,
) -> Result<(), String> {
    waiting(fx, w, id, "a waiting process for the text").await?;
    let before = w.handed();
    let text = "TASK='a b'\nQUOTE=\"$HOME\" `id` \\n %s\n-n\nLAST=1";
    w.handle
        .write_file(id, "/run/sandboxes.dev/task", text.as_bytes(), 0o600)
        .await
        .map_err(|e| e.to_string())?;
    if w.handed() != before + 1.0 {
        return Err("the text was not written through the waiting process".into());
    }
    let files = fx.provider.files().ok_or("files")?;
    let back = files
        .read_file(id, "/run/sandboxes.dev/task")
        .await
        .map_err(|e| e.to_string())?;
    if back != text.as_bytes() {
        return Err(format!(
            "read back {:?}, not {text:?}",
            String::from_utf8_lossy(&back)
        ));
    }
    Ok(())
}

/// Waits until sandbox `id` has a process waiting in `w`'s handle.
async fn waiting(fx: &Fixture, w: &WarmedExec, id: &str, what: &str) -> Result<(), String> {
    wait_until(what, fx.patience, || async {
        w.handle
            .is_primed(id)
            .then_some(())
            .ok_or_else(|| "none yet".to_string())
    })
    .await
}

/// A write the script refuses (over a directory) through a waiting process fails with the
/// script's reason, as the provider's own write would.
async fn a_refused_write_is_reported(fx: &Fixture, w: &WarmedExec, id: &str) -> Result<(), String> {
    waiting(fx, w, id, "a waiting process again").await?;
    let before = w.handed();
    match w.handle.write_file(id, "/run", b"x", 0o600).await {
        Err(e) if e.kind() == ErrorKind::Invalid => {}
        other => return Err(format!("a write over a directory gave {other:?}")),
    }
    if w.handed() != before + 1.0 {
        return Err("the refused write did not use the waiting process".into());
    }
    Ok(())
}

/// A write staged through a waiting process (`ProviderHandle::stage_write`, as a claim
/// stages its env file during its ledger write) is not there until committed, then is
/// exactly its bytes; one dropped uncommitted leaves the file as it was and nothing beside it.
async fn a_staged_write_shows_only_once_committed(fx: &Fixture) -> Result<(), String> {
    let id = &running(fx).await?;
    let w = &WarmedExec::over(fx.provider.clone());
    w.handle.prime(id, None);
    let path = "/run/sandboxes.dev/staged";
    let look = format!(
        "cat {path} 2>/dev/null || echo absent; ls -a /run/sandboxes.dev | grep -c sbx-write; true"
    );
    let stage = |text: &'static str| async move {
        waiting(fx, w, id, "a waiting process to stage in").await?;
        w.handle
            .stage_write(id, path, text.as_bytes(), 0o600)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "nothing staged with a process waiting".to_string())
    };
    let first = stage("A='1'\n").await?;
    wait_until("the staged file beside the target", fx.patience, || async {
        let seen = sh(fx, id, &look).await?;
        (seen == "absent\n1\n")
            .then_some(())
            .ok_or_else(|| format!("saw {seen:?}"))
    })
    .await?;
    first.commit().await.map_err(|e| e.to_string())?;
    let seen = sh(fx, id, &look).await?;
    if seen != "A='1'\n0\n" {
        return Err(format!("after the commit: {seen:?}"));
    }
    drop(stage("B='2'\n").await?);
    wait_until("the dropped write to be gone", fx.patience, || async {
        let seen = sh(fx, id, &look).await?;
        (seen == "A='1'\n0\n")
            .then_some(())
            .ok_or_else(|| format!("saw {seen:?}"))
    })
    .await
}

/// A waiting reader that is dropped (here: its linger is over) ends without running
/// anything, and leaves no process behind.
async fn a_dropped_reader_runs_nothing(fx: &Fixture) -> Result<(), String> {
    let id = running(fx).await?;
    let w = &WarmedExec::over(fx.provider.clone());
    w.handle.prime(&id, Some(Duration::from_millis(300)));
    let readers = READERS;
    wait_until("the reader to start", fx.patience, || async {
        let n = sh(fx, &id, readers).await?;
        (n.trim() != "0")
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    })
    .await?;
    wait_until("the reader to end", fx.patience, || async {
        let n = sh(fx, &id, readers).await?;
        (n.trim() == "0" && !w.handle.is_primed(&id))
            .then_some(())
            .ok_or_else(|| format!("{} readers still there", n.trim()))
    })
    .await?;
    Ok(())
}

/// A reader in a sandbox frozen by hibernation never answers: the request gets its process
/// the ordinary way (which refuses a frozen sandbox), and after the resume the abandoned
/// reader ends without running the command it was handed.
async fn a_frozen_readers_command_never_runs(fx: &Fixture) -> Result<(), String> {
    let id = running(fx).await?;
    let w = &WarmedExec::over(fx.provider.clone());
    w.handle.prime(&id, None);
    let all = warm::DEPTH.to_string();
    wait_until("the readers to start", fx.patience, || async {
        let n = sh(fx, &id, READERS).await?;
        (n.trim() == all)
            .then_some(())
            .ok_or_else(|| format!("{} of {all}", n.trim()))
    })
    .await?;
    let hibernation = fx.provider.hibernation().ok_or("hibernation")?;
    hibernation
        .hibernate(&id)
        .await
        .map_err(|e| e.to_string())?;
    let request = StreamExecRequest {
        argv: vec!["sh".into(), "-c".into(), "echo ran > /tmp/frozen".into()],
        env: BTreeMap::new(),
        cwd: None,
        stdin: false,
        tty: None,
    };
    let refused = w.handle.exec_stream(&id, &request).await;
    if refused.is_ok() {
        return Err("a process started in a frozen sandbox".into());
    }
    hibernation.resume(&id).await.map_err(|e| e.to_string())?;
    // The reader that was handed the command ends; the one not asked keeps waiting.
    let left = (warm::DEPTH - 1).to_string();
    wait_until("the abandoned reader to end", fx.patience, || async {
        let n = sh(fx, &id, READERS).await?;
        (n.trim() == left)
            .then_some(())
            .ok_or_else(|| format!("{} readers", n.trim()))
    })
    .await?;
    let ran = sh(fx, &id, "cat /tmp/frozen 2>/dev/null || echo absent").await?;
    if ran.trim() != "absent" {
        return Err(format!("the abandoned command ran: {ran:?}"));
    }
    Ok(())
}

/// A pause that races the start of a waiting process (primed, then hibernated at once)
/// never leaves the engine wedged: every time, the sandbox can be described and resumed.
/// Without the provider's freeze gate, a start that reaches a paused container hangs in
/// the frozen cgroup and holds the container's locks; then this test thaws it by hand (so
/// the engine serves the rest of the suite) and fails.
async fn a_pause_racing_a_waiting_process_never_wedges_the_engine(
    fx: &Fixture,
) -> Result<(), String> {
    let id = running(fx).await?;
    let hibernation = fx.provider.hibernation().ok_or("hibernation")?;
    for round in 0..10 {
        let w = WarmedExec::over(fx.provider.clone());
        let raced = async {
            w.handle.prime(&id, None);
            hibernation
                .hibernate(&id)
                .await
                .map_err(|e| e.to_string())?;
            fx.provider.describe(&id).await.map_err(|e| e.to_string())?;
            hibernation.resume(&id).await.map_err(|e| e.to_string())
        };
        match tokio::time::timeout(Duration::from_secs(30), raced).await {
            Ok(done) => done.map(|_| ())?,
            Err(_) => {
                harness::docker::thaw(&id).await;
                return Err(format!(
                    "round {round}: the engine hung on a paused sandbox"
                ));
            }
        }
    }
    Ok(())
}

/// A request that takes the sandbox's last waiting process starts the next at once: while
/// the requests' processes still run, one waits again (not only after one of them ends).
async fn taking_the_last_reader_starts_the_next(fx: &Fixture) -> Result<(), String> {
    let id = running(fx).await?;
    let w = &WarmedExec::over(fx.provider.clone());
    w.handle.prime(&id, None);
    wait_until("the readers to start", fx.patience, || async {
        w.handle
            .is_settled(&id)
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    })
    .await?;
    let before = w.handed();
    let hold = StreamExecRequest {
        argv: vec!["sh".into(), "-c".into(), "read x".into()],
        env: BTreeMap::new(),
        cwd: None,
        stdin: true,
        tty: None,
    };
    let mut running_now = Vec::new();
    for _ in 0..warm::DEPTH {
        let session = w.handle.exec_stream(&id, &hold).await;
        running_now.push(session.map_err(|e| e.to_string())?);
    }
    if w.handed() != before + warm::DEPTH as f64 {
        return Err("the requests did not take the waiting processes".into());
    }
    if !w.handle.is_primed(&id) {
        return Err("no process waits while the requests run".into());
    }
    drop(running_now);
    Ok(())
}

/// A test named `$name` that runs check `$check` against the fixture `$fixture`.
macro_rules! on_fixture {
    ($name:ident, $fixture:path, $check:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let Some(fx) = conformance::setup($fixture().await) else {
                return;
            };
            let result = $check(&fx).await;
            conformance::finish(fx, result).await;
        }
    };
}

on_fixture!(
    docker_a_pause_racing_a_waiting_process_never_wedges_the_engine,
    conformance::docker::fixture,
    a_pause_racing_a_waiting_process_never_wedges_the_engine
);
on_fixture!(
    docker_a_file_is_written_through_a_waiting_process,
    conformance::docker::fixture,
    a_file_is_written_through_a_waiting_process
);
on_fixture!(
    kubernetes_a_file_is_written_through_a_waiting_process,
    conformance::kubernetes::fixture,
    a_file_is_written_through_a_waiting_process
);
on_fixture!(
    docker_a_staged_write_shows_only_once_committed,
    conformance::docker::fixture,
    a_staged_write_shows_only_once_committed
);
on_fixture!(
    kubernetes_a_staged_write_shows_only_once_committed,
    conformance::kubernetes::fixture,
    a_staged_write_shows_only_once_committed
);
on_fixture!(
    docker_a_dropped_reader_runs_nothing,
    conformance::docker::fixture,
    a_dropped_reader_runs_nothing
);
on_fixture!(
    docker_taking_the_last_reader_starts_the_next,
    conformance::docker::fixture,
    taking_the_last_reader_starts_the_next
);
on_fixture!(
    docker_a_frozen_readers_command_never_runs,
    conformance::docker::fixture,
    a_frozen_readers_command_never_runs
);

#[async_trait]
impl Provider for Warmed {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn files_need_running(&self) -> bool {
        self.inner.files_need_running()
    }
    async fn create(&self, request: &CreateRequest) -> ProviderResult<SandboxDescriptor> {
        self.inner.create(request).await
    }
    async fn describe(&self, id: &str) -> ProviderResult<Option<SandboxDescriptor>> {
        self.inner.describe(id).await
    }
    async fn find(&self, query: &SandboxQuery) -> ProviderResult<Vec<SandboxDescriptor>> {
        self.inner.find(query).await
    }
    async fn start(&self, id: &str) -> ProviderResult<()> {
        self.inner.start(id).await
    }
    async fn stop(&self, id: &str) -> ProviderResult<()> {
        self.inner.stop(id).await
    }
    async fn sleep(&self, id: &str) -> ProviderResult<()> {
        self.inner.sleep(id).await
    }
    async fn wake(&self, id: &str) -> ProviderResult<()> {
        self.inner.wake(id).await
    }
    async fn destroy(&self, id: &str) -> ProviderResult<()> {
        self.inner.destroy(id).await
    }
    async fn exec(&self, id: &str, request: &ExecRequest) -> ProviderResult<ExecOutput> {
        self.inner.exec(id, request).await
    }
    fn hibernation(&self) -> Option<&dyn Hibernation> {
        self.inner.hibernation()
    }
    fn files(&self) -> Option<&dyn Files> {
        self.inner.files()
    }
    fn streaming_exec(&self) -> Option<&dyn StreamingExec> {
        Some(&self.exec)
    }
    fn logs(&self) -> Option<&dyn Logs> {
        self.inner.logs()
    }
    fn port_forward(&self) -> Option<&dyn PortForward> {
        self.inner.port_forward()
    }
}
