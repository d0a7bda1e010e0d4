//! Hibernation on Docker: `docker pause` freezes every process of the container in the
//! cgroup freezer, so a paused sandbox resumes with its process tree intact. When pausing is
//! impossible the fallback is `stop`, which ends the processes — and is reported as such.
//!
//! Rule 7: each outcome is decided by inspecting the container before and after the call
//! (its state, and the pid and start time of the main process), never from what was
//! attempted.

use async_trait::async_trait;
use bollard::models::{ContainerInspectResponse, ContainerStateStatusEnum as S};

use super::{DockerProvider, is_not_found};
use crate::provider::{Hibernation, HibernationOutcome, Provider, ProviderError, ProviderResult};

/// The facts compared before and after: state word, main pid, last start time.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snapshot {
    status: S,
    pid: Option<i64>,
    started_at: Option<String>,
}

impl Snapshot {
    fn of(c: &ContainerInspectResponse) -> Snapshot {
        let state = c.state.clone().unwrap_or_default();
        Snapshot {
            status: state.status.unwrap_or(S::EMPTY),
            pid: state.pid.filter(|p| *p > 0),
            started_at: state.started_at,
        }
    }

    /// Whether `after` is the same process tree as `self`, alive (running or frozen).
    fn same_processes(&self, after: &Snapshot) -> bool {
        matches!(after.status, S::RUNNING | S::PAUSED)
            && after.pid.is_some()
            && after.pid == self.pid
            && after.started_at == self.started_at
    }
}

fn outcome(preserved: bool, mechanism: &str, detail: impl Into<String>) -> HibernationOutcome {
    HibernationOutcome {
        processes_preserved: preserved,
        mechanism: mechanism.to_string(),
        detail: Some(detail.into()),
    }
}

impl DockerProvider {
    async fn snapshot(&self, id: &str) -> ProviderResult<Snapshot> {
        self.inspect(id)
            .await?
            .map(|c| Snapshot::of(&c))
            .ok_or_else(|| ProviderError::not_found(format!("sandbox {id} does not exist")))
    }
}

#[async_trait]
impl Hibernation for DockerProvider {
    /// Pauses a running sandbox (processes preserved). A paused one stays paused. One that
    /// is not running has no processes to keep: it is stopped (if it was crash-looping) and
    /// reported with `processes_preserved = false`. If pausing fails, it is stopped instead,
    /// and the outcome says so.
    async fn hibernate(&self, id: &str) -> ProviderResult<HibernationOutcome> {
        let before = self.snapshot(id).await?;
        match before.status {
            S::PAUSED => Ok(outcome(
                true,
                "pause",
                "already paused: its processes are frozen in place",
            )),
            S::RUNNING => {
                let docker = self.engine().await?;
                let paused = {
                    let _gate = self.freeze.pause(id).await;
                    docker.pause_container(id).await
                };
                match paused {
                    Ok(()) => {
                        let after = self.snapshot(id).await?;
                        if after.status == S::PAUSED && before.same_processes(&after) {
                            Ok(outcome(
                                true,
                                "pause",
                                "paused with the cgroup freezer: every process is kept, frozen",
                            ))
                        } else {
                            Ok(outcome(
                                false,
                                "pause",
                                format!(
                                    "the main process did not survive the pause (now {}); relaunch what you need",
                                    after.status
                                ),
                            ))
                        }
                    }
                    Err(e) if is_not_found(&e) => Err(ProviderError::not_found(format!(
                        "sandbox {id} does not exist: {e}"
                    ))),
                    Err(pause_err) => {
                        self.stop(id).await?;
                        let after = self.snapshot(id).await?;
                        Ok(outcome(
                            false,
                            "stop",
                            format!(
                                "pause failed ({pause_err}); stopped instead (now {}): its processes ended",
                                after.status
                            ),
                        ))
                    }
                }
            }
            S::RESTARTING => {
                self.stop(id).await?;
                Ok(outcome(
                    false,
                    "stop",
                    "the sandbox was crash-looping (restarting), not running: stopped it; no processes to preserve",
                ))
            }
            other => Ok(outcome(
                false,
                "stop",
                format!(
                    "the sandbox was {other}, not running: there were no processes to preserve"
                ),
            )),
        }
    }

    /// Unpauses a paused sandbox (processes preserved when the same main process is
    /// running afterwards); starts a stopped one (`processes_preserved = false`: it runs,
    /// but anything launched by exec is gone).
    async fn resume(&self, id: &str) -> ProviderResult<HibernationOutcome> {
        let before = self.snapshot(id).await?;
        match before.status {
            S::PAUSED => {
                self.unpause(id).await?;
                let after = self.snapshot(id).await?;
                if after.status == S::RUNNING && before.same_processes(&after) {
                    Ok(outcome(
                        true,
                        "unpause",
                        "unpaused: the process tree from before the pause is running",
                    ))
                } else {
                    Ok(outcome(
                        false,
                        "unpause",
                        format!(
                            "unpaused, but the main process from before did not come back (now {}); relaunch what you need",
                            after.status
                        ),
                    ))
                }
            }
            S::RUNNING => Ok(outcome(
                true,
                "none",
                "already running: nothing to resume, its processes are untouched",
            )),
            other => {
                self.start(id).await?;
                let after = self.snapshot(id).await?;
                Ok(outcome(
                    false,
                    "start",
                    format!(
                        "the sandbox was {other} (its processes had ended); started it fresh (now {}): \
                         relaunch anything started by exec",
                        after.status
                    ),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(status: S, pid: i64, started: &str) -> Snapshot {
        Snapshot {
            status,
            pid: Some(pid).filter(|p| *p > 0),
            started_at: Some(started.to_string()),
        }
    }

    #[test]
    fn same_processes_needs_the_same_live_main_process() {
        let before = snap(S::RUNNING, 42, "t1");
        assert!(before.same_processes(&snap(S::PAUSED, 42, "t1")));
        assert!(before.same_processes(&snap(S::RUNNING, 42, "t1")));
        assert!(
            !before.same_processes(&snap(S::RUNNING, 43, "t2")),
            "restarted"
        );
        assert!(
            !before.same_processes(&snap(S::RUNNING, 42, "t2")),
            "pid reused"
        );
        assert!(!before.same_processes(&snap(S::EXITED, 0, "t1")), "exited");
    }
}
