//! What a sandbox whose spec is silent gets: CPU and memory ceilings and capped logs (the
//! `docker.defaults` block). Without them a container runs with `Memory 0`, `NanoCpus 0` and
//! an unbounded `json-file` log, so one tenant could take the host's memory, CPU and disk.
//! The pids ceiling is the hardening's (`hardening.defaultPidsLimit`), not repeated here.
//!
//! A ceiling the request sets always wins; a default of `0` is an explicit "no ceiling".
//! The log cap applies to every sandbox: the engine keeps at most `logMaxFiles` files of
//! `logMaxSize` each.

use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig};
use serde::{Deserialize, Serialize};

use crate::api::Quantity;
use crate::provider::Resources;
use crate::validation::Issues;

/// CPU ceiling of a silent spec unless configured: one core.
pub const DEFAULT_CPU: &str = "1";
/// Memory ceiling of a silent spec unless configured.
pub const DEFAULT_MEMORY: &str = "1Gi";
/// Size of one log file before the engine rotates it (Docker's `max-size` syntax).
pub const DEFAULT_LOG_MAX_SIZE: &str = "10m";
/// Log files the engine keeps per sandbox.
pub const DEFAULT_LOG_MAX_FILES: u32 = 3;

/// The `docker.defaults` block. Every field has a default, so the block may be omitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SandboxDefaults {
    /// CPU ceiling of a sandbox whose spec sets none (e.g. `500m`, `2`); `0` = no ceiling.
    pub cpu: Quantity,
    /// Memory ceiling (and swap ceiling) of a sandbox whose spec sets none; `0` = no ceiling.
    pub memory: Quantity,
    /// Largest log file before rotation, in Docker's syntax (`10m`, `512k`, `1g`).
    pub log_max_size: String,
    /// Log files kept per sandbox (at least 1).
    pub log_max_files: u32,
}

impl Default for SandboxDefaults {
    fn default() -> Self {
        SandboxDefaults {
            cpu: DEFAULT_CPU.into(),
            memory: DEFAULT_MEMORY.into(),
            log_max_size: DEFAULT_LOG_MAX_SIZE.into(),
            log_max_files: DEFAULT_LOG_MAX_FILES,
        }
    }
}

impl SandboxDefaults {
    /// The CPU and memory ceilings as a request would carry them (`None` = no ceiling). A
    /// value that does not parse is `None` here and refused by [`Self::validate`].
    pub fn resources(&self) -> Resources {
        Resources {
            cpu_millis: self.cpu.to_millis().ok().filter(|m| *m > 0),
            memory_bytes: self.memory.to_bytes().ok().filter(|b| *b > 0),
            ..Resources::default()
        }
    }

    /// Reports every setting that cannot work, under `at` (e.g. `providers[0].docker.defaults`).
    pub fn validate(&self, at: &str, issues: &mut Issues) {
        match self.cpu.to_millis() {
            Err(e) => issues.push(format!("{at}.cpu"), e),
            Ok(m) if m > 0 && m < super::resources::MIN_CPU_MILLIS => issues.push(
                format!("{at}.cpu"),
                "Docker needs at least 10m, or 0 for none",
            ),
            Ok(_) => {}
        }
        match self.memory.to_bytes() {
            Err(e) => issues.push(format!("{at}.memory"), e),
            Ok(b) if b > 0 && b < super::resources::MIN_MEMORY_BYTES => issues.push(
                format!("{at}.memory"),
                "Docker needs at least 6Mi, or 0 for none",
            ),
            Ok(_) => {}
        }
        if !valid_log_size(&self.log_max_size) {
            issues.push(
                format!("{at}.logMaxSize"),
                format!(
                    "`{}` is not a size Docker accepts; use a number with k, m or g, e.g. \
                     `{DEFAULT_LOG_MAX_SIZE}`",
                    self.log_max_size
                ),
            );
        }
        if self.log_max_files == 0 {
            issues.push(format!("{at}.logMaxFiles"), "must be at least 1");
        }
    }

    /// Fills the ceilings the request left unset and caps the logs.
    pub(crate) fn apply(&self, body: &mut ContainerCreateBody) {
        let host = body.host_config.get_or_insert_with(HostConfig::default);
        let defaults = self.resources();
        if host.memory.is_none()
            && let Some(bytes) = defaults.memory_bytes.and_then(|b| i64::try_from(b).ok())
        {
            host.memory = Some(bytes);
            // No swap beyond the ceiling, as for a requested one (see `resources`).
            host.memory_swap = Some(bytes);
        }
        if host.nano_cpus.is_none() {
            host.nano_cpus = defaults
                .cpu_millis
                .and_then(|m| m.checked_mul(1_000_000))
                .and_then(|n| i64::try_from(n).ok());
        }
        host.log_config = Some(HostConfigLogConfig {
            typ: Some("json-file".into()),
            config: Some(
                [
                    ("max-size".to_string(), self.log_max_size.clone()),
                    ("max-file".to_string(), self.log_max_files.to_string()),
                ]
                .into_iter()
                .collect(),
            ),
        });
    }
}

/// Docker's `max-size`: digits, then optionally `k`, `m` or `g`.
fn valid_log_size(size: &str) -> bool {
    let digits = size.trim_end_matches(['k', 'm', 'g']);
    size.len() - digits.len() <= 1
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && digits.parse::<u64>().is_ok_and(|n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_request_gets_the_ceilings_and_every_one_capped_logs() {
        let mut body = ContainerCreateBody::default();
        SandboxDefaults::default().apply(&mut body);
        let host = body.host_config.unwrap();
        assert_eq!(host.memory, Some(1 << 30));
        assert_eq!(host.memory_swap, Some(1 << 30));
        assert_eq!(host.nano_cpus, Some(1_000_000_000));
        let log = host.log_config.unwrap();
        assert_eq!(log.typ.as_deref(), Some("json-file"));
        let config = log.config.unwrap();
        assert_eq!(config.get("max-size").map(String::as_str), Some("10m"));
        assert_eq!(config.get("max-file").map(String::as_str), Some("3"));
    }

    #[test]
    fn the_request_wins_and_zero_means_no_ceiling() {
        let mut body = ContainerCreateBody {
            host_config: Some(HostConfig {
                memory: Some(64 << 20),
                memory_swap: Some(64 << 20),
                ..Default::default()
            }),
            ..Default::default()
        };
        let none = SandboxDefaults {
            cpu: "0".into(),
            ..SandboxDefaults::default()
        };
        none.apply(&mut body);
        let host = body.host_config.unwrap();
        assert_eq!(host.memory, Some(64 << 20));
        assert_eq!(host.nano_cpus, None);
        assert_eq!(none.resources().cpu_millis, None);
    }

    #[test]
    fn validation_names_each_bad_field() {
        let bad = SandboxDefaults {
            cpu: "1m".into(),
            memory: "lots".into(),
            log_max_size: "10mb".into(),
            log_max_files: 0,
        };
        let mut issues = Issues::default();
        bad.validate("d", &mut issues);
        let paths: Vec<&str> = issues.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            ["d.cpu", "d.memory", "d.logMaxSize", "d.logMaxFiles"]
        );
        let mut ok = Issues::default();
        SandboxDefaults::default().validate("d", &mut ok);
        assert!(ok.iter().next().is_none());
        assert!(valid_log_size("512k") && valid_log_size("1g") && !valid_log_size("m"));
    }
}
