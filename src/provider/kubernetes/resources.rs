//! CPU, memory and disk of a sandbox Pod: what the Sandbox's spec asks for, or the
//! provider's defaults where it is silent, so no sandbox Pod runs without limits (one tenant
//! could otherwise take a node's memory, CPU or disk from every other).
//!
//! A ceiling the spec names is both the request and the limit (the scheduler reserves what
//! the kubelet enforces). A default has a small request and a larger limit: a silent spec
//! should not reserve a whole core, and its ceiling still holds.
//!
//! Disk is the container's `ephemeral-storage` limit (its writable layer, logs and
//! `emptyDir`s): the kubelet evicts a Pod that writes past it (with its local-storage
//! isolation on, the default). It does not refuse the write, so the applied disk is reported
//! as not enforced.
//!
//! Processes: Kubernetes limits them per node (the kubelet's `podPidsLimit`, one value for
//! every Pod of the node), not per Pod, so this provider has no pids default and refuses
//! `spec.resources.pids`; set `podPidsLimit` on the nodes that run sandboxes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use serde::{Deserialize, Serialize};

use crate::api::quantity::Quantity;
use crate::provider::{AppliedResources, Resources};
use crate::validation::Issues;

/// The Pod resource name of disk.
const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

/// Requests and limits for a sandbox Pod whose Sandbox names none (`defaultResources`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PodResourceDefaults {
    /// CPU limit.
    pub cpu: Quantity,
    /// CPU request (at most `cpu`).
    pub cpu_request: Quantity,
    /// Memory limit.
    pub memory: Quantity,
    /// Memory request (at most `memory`).
    pub memory_request: Quantity,
    /// Ephemeral-storage limit (the sandbox's disk).
    pub ephemeral_storage: Quantity,
    /// Ephemeral-storage request (at most `ephemeralStorage`).
    pub ephemeral_storage_request: Quantity,
}

impl Default for PodResourceDefaults {
    fn default() -> Self {
        PodResourceDefaults {
            cpu: "1".into(),
            cpu_request: "100m".into(),
            memory: "1Gi".into(),
            memory_request: "128Mi".into(),
            ephemeral_storage: "2Gi".into(),
            ephemeral_storage_request: "128Mi".into(),
        }
    }
}

impl PodResourceDefaults {
    /// The limits as provider resources (a budget counts limits, the most a Pod may take).
    pub fn resources(&self) -> Resources {
        Resources {
            cpu_millis: self.cpu.to_millis().ok(),
            memory_bytes: self.memory.to_bytes().ok(),
            disk_bytes: self.ephemeral_storage.to_bytes().ok(),
            pids: None,
        }
    }

    /// Reports a quantity that does not parse, or a request above its limit, under `at`.
    pub fn validate(&self, at: &str, issues: &mut Issues) {
        let pairs = [
            ("cpu", &self.cpu, "cpuRequest", &self.cpu_request, true),
            (
                "memory",
                &self.memory,
                "memoryRequest",
                &self.memory_request,
                false,
            ),
            (
                "ephemeralStorage",
                &self.ephemeral_storage,
                "ephemeralStorageRequest",
                &self.ephemeral_storage_request,
                false,
            ),
        ];
        for (name, limit, request_name, request, millis) in pairs {
            let read = |q: &Quantity| if millis { q.to_millis() } else { q.to_bytes() };
            match (read(limit), read(request)) {
                (Err(e), _) => issues.push(format!("{at}.{name}"), format!("{e}; give a quantity")),
                (_, Err(e)) => issues.push(
                    format!("{at}.{request_name}"),
                    format!("{e}; give a quantity"),
                ),
                (Ok(l), Ok(r)) if r > l => issues.push(
                    format!("{at}.{request_name}"),
                    format!("is above {name} ({request} > {limit}); lower it"),
                ),
                _ => {}
            }
        }
    }
}

/// The container's requests and limits: each of cpu, memory and disk from the spec when it
/// names one (request = limit), else from `defaults`.
pub fn requirements(asked: &Resources, defaults: &PodResourceDefaults) -> ResourceRequirements {
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    let mut put = |key: &str, asked: Option<String>, limit: &Quantity, request: &Quantity| {
        let (l, r) = match asked {
            Some(q) => (q.clone(), q),
            None => (limit.0.clone(), request.0.clone()),
        };
        limits.insert(key.to_string(), K8sQuantity(l));
        requests.insert(key.to_string(), K8sQuantity(r));
    };
    let d = defaults;
    put(
        "cpu",
        asked.cpu_millis.map(|m| format!("{m}m")),
        &d.cpu,
        &d.cpu_request,
    );
    put(
        "memory",
        asked.memory_bytes.map(|b| b.to_string()),
        &d.memory,
        &d.memory_request,
    );
    put(
        EPHEMERAL_STORAGE,
        asked.disk_bytes.map(|b| b.to_string()),
        &d.ephemeral_storage,
        &d.ephemeral_storage_request,
    );
    ResourceRequirements {
        requests: Some(requests),
        limits: Some(limits),
        ..Default::default()
    }
}

/// The ceilings a Pod's container really has, read from its stored limits; `disk_fallback`
/// is the advisory disk of a Pod made before disk became a limit.
pub fn applied(container: Option<&Container>, disk_fallback: Option<u64>) -> AppliedResources {
    let limits = container
        .and_then(|c| c.resources.as_ref())
        .and_then(|r| r.limits.as_ref());
    let limit = |key: &str, millis: bool| {
        let q = Quantity(limits?.get(key)?.0.clone());
        if millis { q.to_millis() } else { q.to_bytes() }.ok()
    };
    AppliedResources {
        cpu_millis: limit("cpu", true),
        memory_bytes: limit("memory", false),
        disk_bytes: limit(EPHEMERAL_STORAGE, false).or(disk_fallback),
        disk_enforced: false,
        pids: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quantities(m: Option<BTreeMap<String, K8sQuantity>>) -> BTreeMap<String, String> {
        m.unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect()
    }

    #[test]
    fn a_silent_spec_gets_the_defaults_and_a_named_ceiling_is_request_and_limit() {
        let silent = requirements(&Resources::default(), &PodResourceDefaults::default());
        assert_eq!(
            quantities(silent.limits.clone()),
            BTreeMap::from([
                ("cpu".into(), "1".into()),
                ("memory".into(), "1Gi".into()),
                ("ephemeral-storage".into(), "2Gi".into()),
            ])
        );
        assert_eq!(quantities(silent.requests.clone())["cpu"], "100m");
        let asked = Resources {
            cpu_millis: Some(500),
            disk_bytes: Some(1 << 30),
            ..Default::default()
        };
        let r = requirements(&asked, &PodResourceDefaults::default());
        assert_eq!(quantities(r.limits.clone())["cpu"], "500m");
        let counted = PodResourceDefaults::default().resources();
        assert_eq!(counted.cpu_millis, Some(1000));
        assert_eq!(counted.memory_bytes, Some(1 << 30));
        assert_eq!(quantities(r.requests.clone())["cpu"], "500m");
        assert_eq!(quantities(r.requests.clone())["memory"], "128Mi");
        let container = Container {
            resources: Some(r),
            ..Default::default()
        };
        let applied = applied(Some(&container), None);
        assert_eq!(applied.cpu_millis, Some(500));
        assert_eq!(applied.memory_bytes, Some(1 << 30));
        assert_eq!(applied.disk_bytes, Some(1 << 30));
        assert!(!applied.disk_enforced, "eviction is not a refused write");
    }

    #[test]
    fn bad_defaults_name_their_field() {
        let bad = PodResourceDefaults {
            cpu: "lots".into(),
            memory_request: "2Gi".into(),
            ..Default::default()
        };
        let mut issues = Issues::default();
        bad.validate("d", &mut issues);
        let fields: Vec<String> = issues.iter().map(|(p, _)| p.clone()).collect();
        assert_eq!(fields, ["d.cpu", "d.memoryRequest"]);
    }
}
