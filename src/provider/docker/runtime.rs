//! The OCI runtime a Docker provider's sandboxes run under (`runtime` setting), and what
//! changes when it is gVisor.
//!
//! With `runsc` every sandbox gets its own user-space kernel: the workload's system calls are
//! served by gVisor's Sentry, not the host kernel. Measured on Debian's runsc (2022-12 build,
//! ptrace platform) under Docker 20.10, three things behave differently, and the provider
//! reports each honestly instead of degrading silently:
//!
//! - a file written into a running sandbox with the engine's archive API lands in the
//!   container's root filesystem on the host, which gVisor's own file cache does not see
//!   (and an archive read misses what the workload wrote): files move through `exec`
//!   instead (see `files`);
//! - `docker update` is unsupported: in-place resource changes are offered by no capability
//!   (`resources()` is `None`), creation-time ceilings still apply;
//! - networking needs the engine host's setup fix described in `tests/setup/gvisor.sh`
//!   (the 2022 runsc misdetects a container's network namespace as the host's on kernels
//!   that show `net.core.rmem_default` in every namespace).
//!
//! Which runtime is gVisor is decided by name: `runsc`, `runsc-…` or `gvisor…`, as the
//! runtime is registered with the engine.

use bollard::models::{ContainerCreateBody, ContainerStateStatusEnum};

use super::DockerProvider;
use crate::provider::ProviderResult;
use crate::validation::Issues;

/// Reports a runtime name the engine could never know.
pub(super) fn validate(runtime: Option<&str>, at: &str, issues: &mut Issues) {
    let Some(name) = runtime else {
        return;
    };
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        issues.push(
            at,
            format!(
                "`{name}` is not a runtime name; use the name registered in the engine's daemon.json \
                 `runtimes` (e.g. `runsc`), or remove it for the engine's default"
            ),
        );
    }
}

/// Whether a runtime name (as registered with the engine) is gVisor.
pub fn is_gvisor_name(name: &str) -> bool {
    name == "runsc" || name.starts_with("runsc-") || name.starts_with("gvisor")
}

impl DockerProvider {
    /// The runtime named in status: the configured one, or `default` (the engine's).
    pub(crate) fn runtime_name(&self) -> &str {
        self.settings.runtime.as_deref().unwrap_or("default")
    }

    /// Whether this provider's sandboxes run under gVisor.
    pub(crate) fn is_gvisor(&self) -> bool {
        self.settings.runtime.as_deref().is_some_and(is_gvisor_name)
    }

    /// Under gVisor a paused sandbox cannot be force-removed (the engine finds its frozen
    /// process a zombie it cannot kill), so it is thawed first; runc needs nothing.
    pub(crate) async fn thaw_before_removal(&self, id: &str) -> ProviderResult<()> {
        if !self.is_gvisor() {
            return Ok(());
        }
        match self.status(id).await? {
            Some(ContainerStateStatusEnum::PAUSED) => self.unpause(id).await,
            _ => Ok(()),
        }
    }

    /// Sets the configured runtime on a container body.
    pub(crate) fn apply_runtime(&self, body: &mut ContainerCreateBody) {
        if let Some(runtime) = &self.settings.runtime {
            body.host_config
                .get_or_insert_with(Default::default)
                .runtime = Some(runtime.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated_and_gvisor_recognised() {
        let mut issues = Issues::default();
        validate(Some("runsc"), "r", &mut issues);
        validate(None, "r", &mut issues);
        assert!(issues.is_empty());
        validate(Some("run sc"), "p.runtime", &mut issues);
        assert_eq!(issues.iter().next().unwrap().0, "p.runtime");
        assert!(is_gvisor_name("runsc") && is_gvisor_name("runsc-ptrace"));
        assert!(!is_gvisor_name("runc") && !is_gvisor_name("kata"));
    }
}
