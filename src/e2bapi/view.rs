//! How a Sandbox this API made reads as an E2B `SandboxDetail` / `ListedSandbox` (pure).

use chrono::{DateTime, SecondsFormat, Utc};
use kube::ResourceExt;

use super::mapping::{self, MANAGED_LABEL, TEMPLATE_ANNOTATION};
use super::routes::{ENVD_VERSION, Site};
use super::wire::SandboxInfo;
use crate::api::Sandbox;

/// Whether this API made `s` (only those are E2B sandboxes).
pub fn made_here(s: &Sandbox) -> bool {
    s.labels().get(MANAGED_LABEL).is_some_and(|v| v == "true")
}

/// An E2B sandbox the SDKs can still see: made here and not being deleted. A killed
/// sandbox is gone at once, as on E2B, while the finalizer still removes its provider
/// resource (`kubectl get sbx` shows it until then).
pub fn live(s: &Sandbox) -> bool {
    made_here(s) && s.metadata.deletion_timestamp.is_none()
}

/// The template id the sandbox was created with.
pub fn template_of(s: &Sandbox) -> String {
    s.annotations()
        .get(TEMPLATE_ANNOTATION)
        .cloned()
        .unwrap_or_default()
}

/// When the object was created.
pub fn created_at(s: &Sandbox) -> Option<DateTime<Utc>> {
    let t = s.metadata.creation_timestamp.as_ref()?;
    DateTime::<Utc>::from_timestamp(t.0.as_second(), 0)
}

/// The listed form (no token, no domain); `None` for an object without an E2B id.
pub fn info(s: &Sandbox, site: &Site, now: DateTime<Utc>) -> SandboxInfo {
    let ns = s.namespace().unwrap_or_default();
    let sid = super::id::of(&ns, &s.name_any()).unwrap_or_default();
    let started = created_at(s).unwrap_or(now);
    // A paused sandbox has no end until it is connected again: it reads as ending now.
    let end = s
        .spec
        .lifetime
        .as_ref()
        .and_then(mapping::end_of)
        .unwrap_or(now);
    let resources = s.spec.resources.clone().unwrap_or_default();
    let mib = |q: Option<&crate::api::Quantity>| {
        q.and_then(|q| q.to_bytes().ok())
            .map_or(0, |b| (b >> 20) as i64)
    };
    let cores = resources
        .cpu
        .as_ref()
        .and_then(|q| q.to_millis().ok())
        .map_or(0, |m| m.div_ceil(1000) as i64);
    SandboxInfo {
        template_id: template_of(s),
        sandbox_id: sid,
        client_id: site.client_id.clone(),
        started_at: rfc3339(started),
        end_at: rfc3339(end),
        envd_version: ENVD_VERSION.into(),
        cpu_count: cores,
        memory_mb: mib(resources.memory.as_ref()),
        disk_size_mb: mib(resources.disk.as_ref()),
        state: mapping::state_of(s, now),
        metadata: mapping::metadata_of(s),
        envd_access_token: None,
        domain: None,
    }
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}
