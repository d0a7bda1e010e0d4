//! Egress observation for Docker sandboxes.
//!
//! Docker cannot filter egress by domain. What it can do is give a container no network at
//! all (`NetworkMode: none`). The verdict is built from what is OBSERVED, never from the spec:
//!
//! - `Filtered` only when the engine reports network mode `none` with no network attached AND
//!   the sandbox's own network namespace, read from `/proc/net/dev` inside it, holds nothing
//!   but the loopback interface. A lying `cat` inside a hostile sandbox can only make a
//!   `none` sandbox look open, never an attached one look filtered, because both conditions
//!   are required.
//! - `Open` when the running sandbox is attached to any network (bridge, host, a user network
//!   — even an `--internal` one still reaches its peers), or when its namespace shows an
//!   interface other than `lo`.
//! - `Inconclusive` when the check could not run: the sandbox is not running (there is no
//!   namespace to look at), or the probe could not execute. Never conflated with `Filtered`.

use std::time::Duration;

use super::{DockerProvider, is_not_found, map_err};
use crate::provider::{
    Egress, EgressState, EgressVerdict, ErrorKind, ExecRequest, ProviderError, ProviderResult,
};

/// Bound on the in-sandbox probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// What to do when a sandbox's egress is open.
pub(crate) const OPEN_REMEDIATION: &str = "Docker cannot filter egress by domain; set \
    spec.egress.allowedDomains: [] to cut the sandbox off the network, or use a provider that \
    filters egress";

/// Interface names listed in a `/proc/net/dev` text (the two header lines skipped).
pub(crate) fn interfaces(proc_net_dev: &str) -> Vec<String> {
    proc_net_dev
        .lines()
        .filter_map(|line| {
            let (name, _) = line.split_once(':')?;
            let name = name.trim();
            // Header lines contain '|' and no "name:" pair.
            (!name.is_empty() && !name.contains('|')).then(|| name.to_string())
        })
        .collect()
}

fn verdict(state: EgressState, detail: String) -> EgressVerdict {
    let remediation = match state {
        EgressState::Filtered => None,
        EgressState::Open => Some(OPEN_REMEDIATION.to_string()),
        EgressState::Inconclusive => Some(
            "run the sandbox (spec.state: Running) so its network namespace can be inspected"
                .to_string(),
        ),
    };
    EgressVerdict {
        state,
        detail,
        remediation,
    }
}

#[async_trait::async_trait]
impl Egress for DockerProvider {
    async fn egress_verdict(&self, id: &str) -> ProviderResult<EgressVerdict> {
        let docker = self.engine().await?;
        let inspected = match docker.inspect_container(id, None).await {
            Ok(c) => c,
            Err(e) if is_not_found(&e) => {
                return Err(ProviderError::not_found(format!(
                    "sandbox {id} does not exist"
                )));
            }
            Err(e) => {
                // Could not look: that is a verdict of its own, not an error to retry blindly
                // and certainly not "filtered".
                let err = map_err(&format!("inspecting sandbox {id}"), e);
                return Ok(verdict(
                    EgressState::Inconclusive,
                    format!("could not inspect the container: {}", err.message()),
                ));
            }
        };

        let mode = inspected
            .host_config
            .as_ref()
            .and_then(|h| h.network_mode.clone())
            .unwrap_or_default();
        let state = inspected.state.as_ref();
        let running = state.and_then(|s| s.running).unwrap_or(false);
        let paused = state.and_then(|s| s.paused).unwrap_or(false);
        let mut networks: Vec<String> = inspected
            .network_settings
            .as_ref()
            .and_then(|n| n.networks.as_ref())
            .map(|n| n.keys().filter(|k| k.as_str() != "none").cloned().collect())
            .unwrap_or_default();
        networks.sort();

        if !running || paused {
            return Ok(verdict(
                EgressState::Inconclusive,
                format!(
                    "the container is {} (network mode {mode:?}); egress can only be observed in a \
                     running sandbox's network namespace",
                    if paused { "paused" } else { "not running" }
                ),
            ));
        }

        if mode != "none" || !networks.is_empty() {
            let attached = if networks.is_empty() {
                format!("network mode {mode:?}")
            } else {
                format!("network mode {mode:?}, attached to {}", networks.join(", "))
            };
            return Ok(verdict(
                EgressState::Open,
                format!(
                    "the engine reports the running container with {attached}; Docker applies no egress filter"
                ),
            ));
        }

        // Network mode none: confirm from inside that only loopback exists.
        let probe = ExecRequest {
            argv: vec!["cat".into(), "/proc/net/dev".into()],
            cwd: None,
            env: Default::default(),
            timeout: PROBE_TIMEOUT,
        };
        match self.run_exec(id, &probe).await {
            Ok(out) if out.exit_code == 0 => {
                let seen = interfaces(&String::from_utf8_lossy(&out.stdout));
                let others: Vec<&String> = seen.iter().filter(|i| i.as_str() != "lo").collect();
                if seen.is_empty() {
                    Ok(verdict(
                        EgressState::Inconclusive,
                        "network mode \"none\", but /proc/net/dev inside the sandbox listed no interfaces".into(),
                    ))
                } else if others.is_empty() {
                    Ok(verdict(
                        EgressState::Filtered,
                        "network mode \"none\" with no network attached, and the sandbox's network \
                         namespace has only the loopback interface (observed in /proc/net/dev)"
                            .into(),
                    ))
                } else {
                    Ok(verdict(
                        EgressState::Open,
                        format!(
                            "network mode \"none\", but the sandbox's network namespace has interfaces {others:?} besides loopback"
                        ),
                    ))
                }
            }
            Ok(out) => Ok(verdict(
                EgressState::Inconclusive,
                format!(
                    "network mode \"none\", but reading /proc/net/dev inside the sandbox failed (exit {}): {}",
                    out.exit_code,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            )),
            Err(e) if e.is(ErrorKind::NotFound) => Err(e),
            Err(e) => Ok(verdict(
                EgressState::Inconclusive,
                format!(
                    "network mode \"none\", but the in-sandbox probe could not run: {}",
                    e.message()
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_dev_interfaces_are_parsed() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
                    face |bytes    packets errs drop fifo frame compressed multicast|bytes\n    \
                    lo:       0       0    0    0    0     0          0         0        0\n  \
                    eth0: 1234      10    0    0    0     0          0         0     5678\n";
        assert_eq!(interfaces(text), vec!["lo".to_string(), "eth0".to_string()]);
        assert!(interfaces("").is_empty());
    }
}
