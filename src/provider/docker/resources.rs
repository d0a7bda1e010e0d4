//! Changing a sandbox's ceilings in place with `docker update`.
//!
//! Memory always moves together with the swap ceiling (set to the same value), exactly as
//! at creation: changing only the memory limit fails on the engine when the new value is
//! above the current swap limit, and a creation path and an update path that disagree about
//! swap drift apart silently. Disk cannot be changed in place (nor enforced on overlay2 at
//! all), so asking for it is `Unsupported` before anything else changes.

use async_trait::async_trait;
use bollard::models::ContainerUpdateBody;

use super::core::applied_resources;
use super::{DockerProvider, map_err, status_of};
use crate::provider::{ProviderError, ProviderResult, ResourceChange, Resources, SetResources};

/// The update body for the fields present; `None` when nothing is to change.
/// The engine's floor for a memory ceiling.
pub(super) const MIN_MEMORY_BYTES: u64 = 6 * 1024 * 1024;
/// The engine's floor for a CPU ceiling, in millicores (0.01 core).
pub(super) const MIN_CPU_MILLIS: u64 = 10;

/// Memory and CPU ceilings in the engine's units (bytes, nano-CPUs), refusing what the engine
/// would refuse with a message that names the field. One conversion for create and update.
pub(super) fn engine_limits(resources: &Resources) -> ProviderResult<(Option<i64>, Option<i64>)> {
    let memory = resources
        .memory_bytes
        .map(|m| {
            if m < MIN_MEMORY_BYTES {
                return Err(ProviderError::invalid(format!(
                    "spec.resources.memory is {m} bytes; Docker needs at least 6Mi"
                )));
            }
            i64::try_from(m).map_err(|_| {
                ProviderError::invalid(format!(
                    "memory {m} bytes is too large; fix spec.resources.memory"
                ))
            })
        })
        .transpose()?;
    let nano_cpus = resources
        .cpu_millis
        .map(|m| {
            if m < MIN_CPU_MILLIS {
                return Err(ProviderError::invalid(format!(
                    "spec.resources.cpu is {m}m; Docker needs at least 10m (0.01 core)"
                )));
            }
            m.checked_mul(1_000_000)
                .and_then(|n| i64::try_from(n).ok())
                .ok_or_else(|| {
                    ProviderError::invalid(format!("cpu {m}m is too large; fix spec.resources.cpu"))
                })
        })
        .transpose()?;
    Ok((memory, nano_cpus))
}

fn update_body(resources: &Resources) -> ProviderResult<Option<ContainerUpdateBody>> {
    if resources.disk_bytes.is_some() {
        return Err(ProviderError::unsupported(
            "Docker cannot change a disk ceiling in place, and does not enforce one on overlay2: disk is \
             advisory; leave spec.resources.disk unchanged, or recreate the sandbox",
        ));
    }
    let (memory, nano_cpus) = engine_limits(resources)?;
    if memory.is_none() && nano_cpus.is_none() && resources.pids.is_none() {
        return Ok(None);
    }
    Ok(Some(ContainerUpdateBody {
        memory,
        memory_swap: memory,
        nano_cpus,
        pids_limit: resources.pids,
        ..Default::default()
    }))
}

#[async_trait]
impl SetResources for DockerProvider {
    /// Applies the fields present and returns the ceilings read back from the engine (not
    /// the request). `docker update` changes the cgroup limits of the running container in
    /// place: it is never restarted.
    async fn set_resources(
        &self,
        id: &str,
        resources: &Resources,
    ) -> ProviderResult<ResourceChange> {
        if let Some(body) = update_body(resources)? {
            let docker = self.engine().await?;
            if let Err(e) = docker.update_container(id, body).await {
                let message = e.to_string();
                return Err(match status_of(&e) {
                    Some(404) => {
                        ProviderError::not_found(format!("sandbox {id} does not exist: {message}"))
                    }
                    _ if resources.pids.is_some() && message.to_lowercase().contains("pids") => {
                        ProviderError::unsupported(format!(
                            "this Docker engine cannot change the process limit in place ({message}); \
                             leave spec.resources.pids unchanged or recreate the sandbox"
                        ))
                    }
                    _ => map_err(&format!("updating the resources of sandbox {id}"), e),
                });
            }
        }
        let container = self
            .inspect(id)
            .await?
            .ok_or_else(|| ProviderError::not_found(format!("sandbox {id} does not exist")))?;
        let labels = container
            .config
            .and_then(|c| c.labels)
            .unwrap_or_default()
            .into_iter()
            .collect();
        Ok(ResourceChange {
            applied: applied_resources(&container.host_config.unwrap_or_default(), &labels),
            restarted: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::ErrorKind;

    #[test]
    fn ceilings_below_the_engine_floor_are_refused_naming_the_field() {
        let low_memory = Resources {
            memory_bytes: Some(MIN_MEMORY_BYTES - 1),
            ..Resources::default()
        };
        let err = engine_limits(&low_memory).unwrap_err();
        assert!(err.is(ErrorKind::Invalid) && err.message().contains("spec.resources.memory"));
        let low_cpu = Resources {
            cpu_millis: Some(MIN_CPU_MILLIS - 1),
            ..Resources::default()
        };
        let err = engine_limits(&low_cpu).unwrap_err();
        assert!(err.is(ErrorKind::Invalid) && err.message().contains("spec.resources.cpu"));
        let floor = Resources {
            memory_bytes: Some(MIN_MEMORY_BYTES),
            cpu_millis: Some(MIN_CPU_MILLIS),
            ..Resources::default()
        };
        assert_eq!(
            engine_limits(&floor).unwrap(),
            (Some(6 * 1024 * 1024), Some(10_000_000))
        );
    }

    #[test]
    fn memory_moves_with_swap_and_disk_is_refused() {
        let body = update_body(&Resources {
            memory_bytes: Some(256 << 20),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(body.memory, Some(256 << 20));
        assert_eq!(body.memory_swap, Some(256 << 20));
        assert_eq!(body.nano_cpus, None);

        assert!(update_body(&Resources::default()).unwrap().is_none());
        assert!(matches!(
            update_body(&Resources {
                disk_bytes: Some(1),
                memory_bytes: Some(1 << 30),
                ..Default::default()
            }),
            Err(e) if e.is(ErrorKind::Unsupported)
        ));
        let body = update_body(&Resources {
            cpu_millis: Some(250),
            pids: Some(64),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(body.nano_cpus, Some(250_000_000));
        assert_eq!(body.pids_limit, Some(64));
    }
}
