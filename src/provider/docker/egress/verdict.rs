//! Egress observation for Docker sandboxes.
//!
//! Docker alone cannot filter egress by domain: it can give a container no network at all
//! (`NetworkMode: none`), and with an egress gateway configured it can put it behind that
//! gateway. The verdict is built from what is OBSERVED, never from the spec:
//!
//! - Behind the gateway: `Filtered` only when the engine reports the running container on
//!   the gateway's internal network and no other, AND a probe run inside the sandbox sees a
//!   name from the list the gateway holds for it connect while an unlisted name and a raw IP
//!   address fail. `Open` when an unlisted name or the raw address connects. `Inconclusive`
//!   when the probe cannot run (no `curl` in the image) or the listed name does not connect
//!   either (the gateway may be down: the sandbox is cut off, which is not the policy).
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

use bollard::models::ContainerInspectResponse;

use crate::provider::docker::{DockerProvider, is_not_found, map_err};
use crate::provider::{
    Egress, EgressState, EgressVerdict, ErrorKind, ExecRequest, ProviderError, ProviderResult,
};

/// Bound on the in-sandbox probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// What to do when a sandbox's egress is open.
pub(crate) const OPEN_REMEDIATION: &str = "set spec.egress.allowedDomains to the names the \
    sandbox needs (enforced by the provider's egress gateway, when configured), or [] to cut \
    it off the network";

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

/// What the engine reports about a container's networking.
struct Attachment {
    mode: String,
    running: bool,
    paused: bool,
    /// Attached networks other than `none`, sorted so the detail reads the same every time.
    networks: Vec<String>,
}

impl Attachment {
    fn of(inspected: &ContainerInspectResponse) -> Self {
        let mode = inspected
            .host_config
            .as_ref()
            .and_then(|h| h.network_mode.clone())
            .unwrap_or_default();
        let state = inspected.state.as_ref();
        let mut networks: Vec<String> = inspected
            .network_settings
            .as_ref()
            .and_then(|n| n.networks.as_ref())
            .map(|n| n.keys().filter(|k| k.as_str() != "none").cloned().collect())
            .unwrap_or_default();
        networks.sort();
        Attachment {
            mode,
            running: state.and_then(|s| s.running).unwrap_or(false),
            paused: state.and_then(|s| s.paused).unwrap_or(false),
            networks,
        }
    }

    /// `Open` from the engine's word alone: any attached network reaches something, and only
    /// a `none` sandbox needs the look from inside. `None` when the mode is `none` and no
    /// network is attached.
    fn open_verdict(&self) -> Option<EgressVerdict> {
        let mode = &self.mode;
        if mode == "none" && self.networks.is_empty() {
            return None;
        }
        let attached = if self.networks.is_empty() {
            format!("network mode {mode:?}")
        } else {
            format!(
                "network mode {mode:?}, attached to {}",
                self.networks.join(", ")
            )
        };
        Some(verdict(
            EgressState::Open,
            format!(
                "the engine reports the running container with {attached}; Docker applies no egress filter"
            ),
        ))
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
        let seen = Attachment::of(&inspected);
        if !seen.running || seen.paused {
            return Ok(verdict(
                EgressState::Inconclusive,
                format!(
                    "the container is {} (network mode {:?}); egress can only be observed in a \
                     running sandbox's network namespace",
                    if seen.paused { "paused" } else { "not running" },
                    seen.mode
                ),
            ));
        }
        if let Some(gateway) = &self.gateway
            && seen.mode == gateway.network()
            && seen.networks == [gateway.network()]
        {
            return self.gateway_verdict(id).await;
        }
        match seen.open_verdict() {
            Some(open) => Ok(open),
            None => self.namespace_verdict(id).await,
        }
    }
}

impl DockerProvider {
    /// Network mode `none`: confirms from inside that only loopback exists, because the
    /// engine's word alone must not make a sandbox `Filtered`.
    async fn namespace_verdict(&self, id: &str) -> ProviderResult<EgressVerdict> {
        let probe = ExecRequest {
            argv: vec!["cat".into(), "/proc/net/dev".into()],
            cwd: None,
            env: Default::default(),
            timeout: PROBE_TIMEOUT,
        };
        match self.run_exec(id, &probe).await {
            Ok(out) if out.exit_code == 0 => Ok(interfaces_verdict(&interfaces(
                &String::from_utf8_lossy(&out.stdout),
            ))),
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

/// Reads the interfaces a `none` sandbox's namespace holds into a verdict: only loopback is
/// `Filtered`; none at all cannot be a real namespace, so it proves nothing. Pure.
fn interfaces_verdict(seen: &[String]) -> EgressVerdict {
    let others: Vec<&String> = seen.iter().filter(|i| i.as_str() != "lo").collect();
    if seen.is_empty() {
        verdict(
            EgressState::Inconclusive,
            "network mode \"none\", but /proc/net/dev inside the sandbox listed no interfaces"
                .into(),
        )
    } else if others.is_empty() {
        verdict(
            EgressState::Filtered,
            "network mode \"none\" with no network attached, and the sandbox's network \
             namespace has only the loopback interface (observed in /proc/net/dev)"
                .into(),
        )
    } else {
        verdict(
            EgressState::Open,
            format!(
                "network mode \"none\", but the sandbox's network namespace has interfaces {others:?} besides loopback"
            ),
        )
    }
}

/// The in-sandbox probe behind the gateway: prints the curl exit codes for a listed name
/// (`skip` when there is none to try), an unlisted name and a raw IP address.
const GATEWAY_PROBE: &str = r#"command -v curl >/dev/null 2>&1 || { echo nocurl; exit 0; }
a=skip
if [ -n "$1" ]; then curl -s -o /dev/null -m 5 "http://$1/"; a=$?; fi
curl -s -o /dev/null -m 5 "http://sandbox-egress-probe.invalid/"; u=$?
curl -s -o /dev/null -m 3 "http://198.51.100.1/"; r=$?
echo "$a $u $r""#;

/// Whether a curl exit code means a TCP connection was made (6: not resolved, 7: refused or
/// unreachable, 28: timed out; anything else got at least a connection).
fn connected(code: &str) -> bool {
    !matches!(code, "6" | "7" | "28")
}

impl DockerProvider {
    async fn gateway_verdict(&self, id: &str) -> ProviderResult<EgressVerdict> {
        let held = match self.held_policy(id).await {
            Ok(Some(list)) => list,
            Ok(None) => {
                return Ok(verdict(
                    EgressState::Inconclusive,
                    "the sandbox is on the gateway's network but the gateway holds no policy for it (nothing is allowed)".into(),
                ));
            }
            Err(e) => {
                return Ok(verdict(
                    EgressState::Inconclusive,
                    format!("could not read the gateway's policy: {}", e.message()),
                ));
            }
        };
        let listed = held.iter().find(|d| !d.starts_with("*.")).cloned();
        let probe = ExecRequest {
            argv: vec![
                "sh".into(),
                "-c".into(),
                GATEWAY_PROBE.into(),
                "probe".into(),
                listed.clone().unwrap_or_default(),
            ],
            cwd: None,
            env: Default::default(),
            timeout: PROBE_TIMEOUT,
        };
        let out = match self.run_exec(id, &probe).await {
            Ok(out) if out.exit_code == 0 => {
                String::from_utf8_lossy(&out.stdout).trim().to_string()
            }
            Ok(out) => format!("probe exited {}", out.exit_code),
            Err(e) if e.is(ErrorKind::NotFound) => return Err(e),
            Err(e) => e.message().to_string(),
        };
        Ok(gateway_outcome(&out, listed.as_deref()))
    }
}

/// Reads the probe's output into a verdict. Pure.
fn gateway_outcome(out: &str, listed: Option<&str>) -> EgressVerdict {
    let codes: Vec<&str> = out.split_whitespace().collect();
    let [a, u, r] = codes.as_slice() else {
        return verdict(
            EgressState::Inconclusive,
            format!(
                "behind the egress gateway, but the in-sandbox probe could not run (needs sh and curl): {out}"
            ),
        );
    };
    if connected(u) || connected(r) {
        return verdict(
            EgressState::Open,
            format!(
                "behind the egress gateway, yet an unlisted name (curl exit {u}) or a raw IP address (curl exit {r}) connected"
            ),
        );
    }
    match (listed, *a) {
        (Some(name), code) if !connected(code) => verdict(
            EgressState::Inconclusive,
            format!("the listed name {name} did not connect either (curl exit {code}); is the egress gateway running?"),
        ),
        (Some(name), _) => verdict(
            EgressState::Filtered,
            format!("observed inside the sandbox: the listed name {name} connects through the egress gateway; an unlisted name and a raw IP address do not"),
        ),
        (None, _) => verdict(
            EgressState::Filtered,
            "observed inside the sandbox: an unlisted name and a raw IP address do not connect (the list has only wildcards, so no listed name was tried)".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_probe_is_read_as_an_observation() {
        let v = gateway_outcome("0 6 28", Some("a.test"));
        assert_eq!(v.state, EgressState::Filtered);
        assert_eq!(
            gateway_outcome("52 6 7", Some("a.test")).state,
            EgressState::Filtered
        );
        assert_eq!(
            gateway_outcome("0 0 28", Some("a.test")).state,
            EgressState::Open
        );
        assert_eq!(
            gateway_outcome("0 6 0", Some("a.test")).state,
            EgressState::Open
        );
        assert_eq!(
            gateway_outcome("6 6 28", Some("a.test")).state,
            EgressState::Inconclusive
        );
        assert_eq!(
            gateway_outcome("nocurl", Some("a.test")).state,
            EgressState::Inconclusive
        );
        assert_eq!(
            gateway_outcome("skip 6 7", None).state,
            EgressState::Filtered
        );
    }

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
