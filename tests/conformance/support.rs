//! What every check uses: the `Check` result, `ensure!`, turning provider results into
//! check failures, exec helpers and polling with a deadline.

use std::fmt::Debug;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sandbox_operator::provider::{
    CreateRequest, ErrorKind, ExecRequest, ProviderResult, SandboxDescriptor,
};

use super::Fixture;

/// A check's verdict: `Err` says which rule broke and what was seen.
pub type Check = Result<(), String>;

/// Fails the check with a formatted message unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// Turns a provider result into a check result, naming what was attempted.
pub trait OrFail<T> {
    /// `Ok` passes through; `Err` becomes "`what`: <error>".
    fn or_fail(self, what: &str) -> Result<T, String>;
}

impl<T> OrFail<T> for ProviderResult<T> {
    fn or_fail(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: unexpected error {:?}: {e}", e.kind()))
    }
}

/// Passes when `result` is an error of one of `kinds`; the error otherwise names `what`.
pub fn expect_kind<T: Debug>(result: ProviderResult<T>, kinds: &[ErrorKind], what: &str) -> Check {
    match result {
        Err(e) if kinds.iter().any(|k| e.is(*k)) => Ok(()),
        Err(e) => Err(format!(
            "{what}: expected an error of kind {kinds:?}, got {:?}: {e}",
            e.kind()
        )),
        Ok(value) => Err(format!(
            "{what}: expected an error of kind {kinds:?}, got Ok({value:?})"
        )),
    }
}

/// Lowercase hex that no other test (or earlier run) uses: 16 characters.
pub fn unique_hex() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mixed = nanos
        ^ (u64::from(std::process::id()) << 40)
        ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(20)
        ^ fastrand::u64(..);
    format!("{mixed:016x}")
}

/// Polls `probe` until it yields `Ok`, or fails with `what` and the last observation once
/// `patience` has passed. The interval is short; the deadline is what bounds the check.
pub async fn wait_until<T, F, Fut>(
    what: &str,
    patience: Duration,
    mut probe: F,
) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + patience;
    loop {
        match probe().await {
            Ok(value) => return Ok(value),
            Err(last) if Instant::now() >= deadline => {
                return Err(format!(
                    "timed out after {patience:?} waiting for {what}; last: {last}"
                ));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Runs `script` with `sh -c` in sandbox `id` and returns its stdout; fails unless it
/// exits 0.
pub async fn sh(fx: &Fixture, id: &str, script: &str) -> Result<String, String> {
    let out = fx
        .provider
        .exec(id, &ExecRequest::shell(script, Duration::from_secs(30)))
        .await
        .or_fail(&format!("exec {script:?} in {id}"))?;
    ensure!(
        out.exit_code == 0,
        "{script:?} in {id} exited {}: {}",
        out.exit_code,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Creates `request` and returns the provider's descriptor (whose `id` is all the suite
/// uses from here on).
pub async fn create(fx: &Fixture, request: &CreateRequest) -> Result<SandboxDescriptor, String> {
    let d = fx
        .provider
        .create(request)
        .await
        .or_fail(&format!("create {:?}", request.name))?;
    ensure!(!d.id.is_empty(), "create returned an empty id: {d:?}");
    Ok(d)
}

/// Creates a fresh sandbox from the base request and starts it; returns its id.
pub async fn running(fx: &Fixture) -> Result<String, String> {
    running_from(fx, &fx.request()).await
}

/// Creates `request`, starts it and waits until exec works in it; returns its id.
pub async fn running_from(fx: &Fixture, request: &CreateRequest) -> Result<String, String> {
    let id = create(fx, request).await?.id;
    fx.provider
        .start(&id)
        .await
        .or_fail(&format!("start {id}"))?;
    wait_until("the sandbox to run commands", fx.patience, || {
        sh(fx, &id, "true")
    })
    .await?;
    Ok(id)
}

/// Describes `id`, failing when it is absent.
pub async fn describe(fx: &Fixture, id: &str) -> Result<SandboxDescriptor, String> {
    fx.provider
        .describe(id)
        .await
        .or_fail(&format!("describe {id}"))?
        .ok_or_else(|| format!("describe {id}: the sandbox is absent"))
}

/// Ids of `found`, sorted.
pub fn ids(found: &[SandboxDescriptor]) -> Vec<String> {
    let mut ids: Vec<String> = found.iter().map(|d| d.id.clone()).collect();
    ids.sort();
    ids
}

/// `items` sorted, for comparing sets of ids.
pub fn sorted(mut items: Vec<String>) -> Vec<String> {
    items.sort();
    items
}

/// Deterministic pseudo-random bytes (xorshift64*), so a failure is reproducible.
pub fn random_bytes(len: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        out.extend_from_slice(&seed.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// SHA-256 of `data` as lowercase hex (what `sha256sum` prints).
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(data))
}

/// Whether `message` mentions `word`, case-insensitively (errors must name the field).
pub fn mentions(message: &str, word: &str) -> bool {
    message.to_lowercase().contains(&word.to_lowercase())
}

/// Stops `id`; for a provider that parks its sandboxes itself ([`super::Expect::parks_itself`])
/// asserts instead that `stop` is refused as `Unsupported`. Returns whether `id` is stopped.
pub async fn stop_or_refused(fx: &Fixture, id: &str) -> Result<bool, String> {
    let result = fx.provider.stop(id).await;
    if fx.expect.parks_itself {
        expect_kind(
            result,
            &[ErrorKind::Unsupported],
            "stop on a provider that parks itself",
        )?;
        return Ok(false);
    }
    result.or_fail("stop")?;
    Ok(true)
}
