//! Hibernation = Fly's suspend (a snapshot of the machine's memory), reporting what happened.
//!
//! The API says a start after a suspend *attempts* to resume from the snapshot and falls back
//! to a cold boot when no snapshot is usable — and its answer does not say which happened. So
//! the provider observes it (rule 7): before suspending it reads a fingerprint of the running
//! system through exec — the kernel's boot id and pid 1's start time — and stores it in the
//! machine's metadata (`sandboxes.dev.fly.fingerprint`, `POST .../metadata/{key}`); after the
//! start it reads the fingerprint again. Equal means the same processes run on (a resume);
//! different means a cold boot; a fingerprint that cannot be read is reported as not
//! preserved, with the reason.
//!
//! A machine Fly refuses to snapshot (412: over 2 GB of memory, swap, a schedule) is stopped
//! instead, and the outcome says so (`mechanism: stop`, processes not preserved).

use std::time::Duration;

use async_trait::async_trait;

use super::FINGERPRINT_KEY;
use super::FlyProvider;
use super::power::Suspended;
use crate::provider::{
    ExecRequest, Hibernation, HibernationOutcome, ProviderError, ProviderResult,
};

/// Boot id and pid 1's start time (field 22 of `/proc/1/stat`).
const FINGERPRINT: &str = "cat /proc/sys/kernel/random/boot_id && cut -d' ' -f22 /proc/1/stat";
/// Bound on reading the fingerprint.
const FINGERPRINT_TIMEOUT: Duration = Duration::from_secs(20);

impl FlyProvider {
    /// The fingerprint of the running system, or why it could not be read.
    async fn fingerprint(&self, id: &str) -> Result<String, String> {
        let request = ExecRequest::shell(FINGERPRINT, FINGERPRINT_TIMEOUT);
        match self.run_exec(id, &request).await {
            Ok(out) if out.exit_code == 0 => {
                let text = String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .replace('\n', "/");
                if text.is_empty() {
                    Err("the fingerprint read back empty".into())
                } else {
                    Ok(text)
                }
            }
            Ok(out) => Err(format!(
                "reading /proc in the sandbox exited with {}",
                out.exit_code
            )),
            Err(e) => Err(e.to_string()),
        }
    }
}

#[async_trait]
impl Hibernation for FlyProvider {
    /// Under one lease: fingerprint → metadata, `POST .../suspend`, wait `suspended`
    /// (or, when refused, stop and wait `stopped`).
    async fn hibernate(&self, id: &str) -> ProviderResult<HibernationOutcome> {
        let fingerprint = self.fingerprint(id).await;
        self.leased(id, |nonce| async move {
            if let Ok(fp) = &fingerprint {
                self.set_metadata(id, FINGERPRINT_KEY, fp, Some(&nonce))
                    .await?;
            }
            match self.power_suspend(id, &nonce).await? {
                Suspended::Snapshot => Ok(HibernationOutcome {
                    processes_preserved: true,
                    mechanism: "suspend".into(),
                    detail: Some(match &fingerprint {
                        Ok(_) => "memory snapshot taken; a resume reports whether Fly could use it"
                            .into(),
                        Err(why) => format!(
                            "memory snapshot taken, but the running system could not be \
                             fingerprinted ({why}), so a resume cannot verify it"
                        ),
                    }),
                }),
                Suspended::Stopped(why) => Ok(HibernationOutcome {
                    processes_preserved: false,
                    mechanism: "stop".into(),
                    detail: Some(format!(
                        "Fly refused to snapshot the machine ({why}); it was stopped instead and \
                         its processes ended"
                    )),
                }),
            }
        })
        .await
    }

    /// `POST .../start`, wait `started`, then compare fingerprints (see the module docs).
    async fn resume(&self, id: &str) -> ProviderResult<HibernationOutcome> {
        let before = self
            .get_machine(id)
            .await?
            .ok_or_else(|| ProviderError::not_found(format!("machine {id} does not exist")))?;
        let was = before.state.clone();
        let stored = before.read().metadata.get(FINGERPRINT_KEY).cloned();
        self.power_start(id).await?;
        let now = self.fingerprint(id).await;
        let (preserved, detail) = match (&stored, &now) {
            (Some(a), Ok(b)) if a == b => (
                true,
                format!("resumed from the memory snapshot (machine was {was})"),
            ),
            (Some(_), Ok(_)) => (
                false,
                format!(
                    "Fly cold-booted the machine (it was {was}): no usable snapshot; its processes \
                     ended and must be relaunched"
                ),
            ),
            (None, _) => (
                false,
                format!(
                    "the machine (it was {was}) was not suspended by this operator, so a resume \
                     cannot be verified; treat its processes as ended"
                ),
            ),
            (Some(_), Err(why)) => (
                false,
                format!("the resumed system could not be fingerprinted ({why})"),
            ),
        };
        Ok(HibernationOutcome {
            processes_preserved: preserved,
            mechanism: if preserved { "resume" } else { "cold boot" }.into(),
            detail: Some(detail),
        })
    }
}
