//! Hibernation on E2B: pause with the memory snapshot, resume by connect, and a report of
//! what really happened (rule 7).
//!
//! E2B restores a memory snapshot with every process where it was; a filesystem-only pause,
//! or a snapshot E2B could not restore, cold-boots the VM. The API does not say which
//! happened, so the sandbox is asked: before the pause, the provider records a *boot
//! fingerprint* inside it — the kernel's boot id and PID 1's start time — in
//! [`FINGERPRINT_PATH`] (a directory that survives reboots); after the resume it reads the
//! fingerprint again. The same kernel boot and the same PID 1 means the process tree survived;
//! anything else, or no recorded fingerprint, is reported as not preserved.

use std::time::Duration;

use async_trait::async_trait;

use super::{E2bProvider, Inner};
use crate::provider::{
    ErrorKind, ExecRequest, Hibernation, HibernationOutcome, ProviderError, ProviderResult,
};

/// Where the boot fingerprint is kept inside the sandbox.
pub const FINGERPRINT_PATH: &str = "/var/tmp/.sandbox-operator-boot";
/// Bound on the fingerprint commands.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);
/// Separates the recorded fingerprint from the current one in the probe's output.
const SEPARATOR: &str = "--sandbox-operator--";

const MECHANISM: &str = "e2b pause (memory snapshot)";

/// How often the survival probe runs after a resume before survival is reported unknown.
const PROBE_ATTEMPTS: u64 = 4;

/// The fingerprint in `boot_id` + `/proc/1/stat` text: (boot id, PID 1 start time).
pub fn fingerprint(text: &str) -> Option<(String, String)> {
    let mut lines = text.lines();
    let boot_id = lines.next()?.trim();
    let stat = lines.next()?;
    // Field 2 (the command) may hold spaces or parentheses: count from the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    // After ')' come fields 3, 4, …; the start time is field 22.
    let start_time = rest.split_whitespace().nth(19)?;
    (!boot_id.is_empty()).then(|| (boot_id.to_string(), start_time.to_string()))
}

/// Compares the recorded and the current fingerprint from the probe's output.
pub fn verdict(probe: &str) -> (bool, String) {
    let Some((recorded, current)) = probe.split_once(SEPARATOR) else {
        return (false, "the fingerprint probe printed nothing usable".into());
    };
    let current = current.trim_start_matches('\n');
    match (fingerprint(recorded), fingerprint(current)) {
        (None, _) => (
            false,
            "no boot fingerprint was recorded before the pause, so survival cannot be shown; \
             relaunch what you need"
                .into(),
        ),
        (_, None) => (
            false,
            "the current boot fingerprint could not be read".into(),
        ),
        (Some(before), Some(now)) if before == now => (
            true,
            "same kernel boot and same PID 1 as before the pause: the memory snapshot was \
             restored"
                .into(),
        ),
        (Some(before), Some(now)) if before.0 != now.0 => (
            false,
            "the sandbox booted again (new kernel boot id): its processes did not survive".into(),
        ),
        (Some(_), Some(_)) => (
            false,
            "PID 1 was restarted: the sandbox's processes did not survive".into(),
        ),
    }
}

impl Inner {
    async fn probe(&self, id: &str, script: String) -> ProviderResult<Vec<u8>> {
        let request = ExecRequest::shell(script, PROBE_TIMEOUT);
        let out = self.exec_request(id, &request).await?;
        if out.exit_code != 0 {
            return Err(ProviderError::transient(format!(
                "the boot fingerprint probe in E2B sandbox {id} exited {}: {}",
                out.exit_code,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(out.stdout)
    }

    pub(crate) async fn hibernate(&self, id: &str) -> ProviderResult<HibernationOutcome> {
        let record = format!(
            "mkdir -p /var/tmp && cat /proc/sys/kernel/random/boot_id /proc/1/stat > {FINGERPRINT_PATH}"
        );
        let recorded = self.probe(id, record).await;
        if let Err(e) = &recorded
            && e.is(ErrorKind::NotFound)
        {
            return Err(e.clone());
        }
        match self.api.pause(id, true).await {
            Ok(()) => {}
            Err(e) if e.is(ErrorKind::Conflict) && self.e2b_state(id).await? == "paused" => {
                let preserved = !self.is_stopped(id);
                return Ok(HibernationOutcome {
                    processes_preserved: preserved,
                    mechanism: MECHANISM.into(),
                    detail: Some(if preserved {
                        "it was already paused".into()
                    } else {
                        "it was already stopped (paused without memory): its processes had ended"
                            .into()
                    }),
                });
            }
            Err(e) => return Err(e),
        }
        self.notify(id, "pause");
        let detail = match recorded {
            Ok(_) => "paused with its memory; the resume will check that the processes survived",
            Err(_) => {
                "paused with its memory, but no boot fingerprint could be recorded, so the resume \
                 cannot show that processes survived"
            }
        };
        Ok(HibernationOutcome {
            processes_preserved: true,
            mechanism: MECHANISM.into(),
            detail: Some(detail.into()),
        })
    }

    pub(crate) async fn resume(&self, id: &str) -> ProviderResult<HibernationOutcome> {
        let resumed = self.connect(id).await?;
        if !resumed {
            return Ok(HibernationOutcome {
                processes_preserved: true,
                mechanism: "none".into(),
                detail: Some("it was running: nothing to resume".into()),
            });
        }
        let probe = format!(
            "cat {FINGERPRINT_PATH} 2>/dev/null; echo {SEPARATOR}; \
             cat /proc/sys/kernel/random/boot_id /proc/1/stat"
        );
        // A just-resumed sandbox may refuse a process for a moment: a transient failure is
        // tried again a few times before survival is reported as unknown.
        let mut attempt = 0;
        let probed = loop {
            attempt += 1;
            match self.probe(id, probe.clone()).await {
                Err(e) if e.is(ErrorKind::Transient) && attempt < PROBE_ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(300 * attempt)).await;
                }
                other => break other,
            }
        };
        let (preserved, detail) = match probed {
            Ok(out) => verdict(&String::from_utf8_lossy(&out)),
            Err(e) => (
                false,
                format!("resumed, but whether processes survived could not be checked: {e}"),
            ),
        };
        Ok(HibernationOutcome {
            processes_preserved: preserved,
            mechanism: "e2b connect (resume)".into(),
            detail: Some(detail),
        })
    }
}

#[async_trait]
impl Hibernation for E2bProvider {
    async fn hibernate(&self, id: &str) -> ProviderResult<HibernationOutcome> {
        self.inner.hibernate(id).await
    }

    async fn resume(&self, id: &str) -> ProviderResult<HibernationOutcome> {
        self.inner.resume(id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "1 (my (odd) cmd) S 0 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 4242 2 3\n";

    #[test]
    fn fingerprints_read_the_boot_id_and_pid1_start_time() {
        let text = format!("b00t-id\n{STAT}");
        assert_eq!(
            fingerprint(&text),
            Some(("b00t-id".to_string(), "4242".to_string()))
        );
        assert_eq!(fingerprint(""), None);
        assert_eq!(fingerprint("id\nno parenthesis"), None);
    }

    #[test]
    fn only_an_identical_fingerprint_means_preserved() {
        let fp = |id: &str, start: &str| format!("{id}\n{}", STAT.replace("4242", start));
        let probe = |before: &str, now: &str| format!("{before}{SEPARATOR}\n{now}");
        assert!(verdict(&probe(&fp("a", "1"), &fp("a", "1"))).0);
        let (kept, why) = verdict(&probe(&fp("a", "1"), &fp("b", "1")));
        assert!(!kept && why.contains("booted again"), "{why}");
        let (kept, why) = verdict(&probe(&fp("a", "1"), &fp("a", "2")));
        assert!(!kept && why.contains("PID 1"), "{why}");
        let (kept, why) = verdict(&probe("", &fp("a", "1")));
        assert!(!kept && why.contains("no boot fingerprint"), "{why}");
        assert!(!verdict("garbage").0);
    }
}
