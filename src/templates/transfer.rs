//! Provider-neutral template transfer: capture a running sandbox's paths into the store, and
//! restore them into a fresh sandbox. Needs only `exec` from the provider and a store the
//! sandbox can reach, so the Docker provider's publish/fetch and a provider without image
//! commit (Fly) share this one code path — including its security boundary.

use std::time::Duration;

use chrono::Utc;

use super::manifest::{self, Keys, MANIFEST_SCHEMA, Manifest};
use super::store::TemplateStore;
use crate::provider::{ExecRequest, Provider, ProviderError, ProviderResult, validate};

/// Transfer limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Lifetime of presigned URLs.
    pub presign: Duration,
    /// Wall-clock budget of one capture or restore exec.
    pub transfer: Duration,
    /// Largest archive accepted.
    pub max_archive_bytes: u64,
    /// How long past the transfer budget a lease still counts as live.
    pub lease_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            presign: Duration::from_secs(3600),
            transfer: Duration::from_secs(manifest::DEFAULT_TRANSFER_SECS),
            max_archive_bytes: manifest::MAX_ARCHIVE_BYTES,
            lease_grace: Duration::from_secs(manifest::LEASE_GRACE_SECS),
        }
    }
}

impl Limits {
    /// How long a lease can belong to a live restore.
    pub fn lease_ttl_secs(&self) -> u64 {
        self.transfer.as_secs() + self.lease_grace.as_secs()
    }
}

/// Keeps presigned signatures out of messages that reach events and logs.
fn redact(text: &str) -> String {
    let tail: String = text.chars().rev().take(600).collect::<Vec<_>>().into_iter().rev().collect();
    tail.split_whitespace()
        .map(|w| if w.contains("X-Amz-Signature") || w.contains("X-Amz-Credential") { "<presigned-url>" } else { w })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Captures `paths` of the running sandbox `sandbox_id` into the store as `template_id`,
/// replacing an earlier capture. The manifest is written last: until it exists, the
/// template does not.
pub async fn capture(
    provider: &dyn Provider,
    sandbox_id: &str,
    store: &TemplateStore,
    template_id: &str,
    paths: &[String],
    label: Option<String>,
    limits: Limits,
) -> ProviderResult<Manifest> {
    validate::resource_name("template id", template_id).map_err(ProviderError::Invalid)?;
    if paths.is_empty() {
        return Err(ProviderError::Invalid("capturePaths is empty: name the directories to capture".into()));
    }
    let keys = Keys::new(&store.settings().prefix, template_id);
    let url = store.presign_put(&keys.archive(), limits.presign).await?;
    let script = manifest::capture_script(paths, &url, limits.max_archive_bytes).map_err(ProviderError::Invalid)?;
    let out = provider.exec(sandbox_id, &ExecRequest::shell(script, limits.transfer)).await?;
    match out.exit_code {
        0 => {}
        manifest::EXIT_TOO_LARGE => {
            return Err(ProviderError::Invalid(format!(
                "the capture of {paths:?} is larger than {} bytes; capture less",
                limits.max_archive_bytes
            )));
        }
        code => {
            return Err(ProviderError::Transient(format!(
                "capture in sandbox {sandbox_id} failed (exit {code}): {}",
                redact(&String::from_utf8_lossy(&out.stderr))
            )));
        }
    }
    let archive = store
        .head(&keys.archive())
        .await?
        .ok_or_else(|| ProviderError::Transient(format!("capture uploaded nothing to {}", keys.archive())))?;
    let m = Manifest {
        schema: MANIFEST_SCHEMA,
        id: template_id.to_string(),
        capture_paths: paths.to_vec(),
        created_at: Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        size_bytes: archive.size,
        label,
    };
    let body = serde_json::to_string_pretty(&m).map_err(|e| ProviderError::Invalid(format!("manifest: {e}")))?;
    store.put_text(&keys.manifest(), &body, "application/json").await?;
    Ok(m)
}

/// Reads a template's manifest. `Ok(None)` only when the manifest genuinely does not exist;
/// a failed lookup is `Err` (rule 3), and so is a manifest that fails validation.
pub async fn manifest(store: &TemplateStore, template_id: &str) -> ProviderResult<Option<Manifest>> {
    let keys = Keys::new(&store.settings().prefix, template_id);
    let Some(text) = store.get_text(&keys.manifest()).await? else { return Ok(None) };
    let m: Manifest = serde_json::from_str(&text)
        .map_err(|e| ProviderError::Invalid(format!("template store: manifest of {template_id:?} is unreadable: {e}")))?;
    m.validate().map_err(|e| ProviderError::Invalid(format!("template store: manifest of {template_id:?}: {e}")))?;
    if m.id != template_id {
        return Err(ProviderError::Invalid(format!("template store: manifest under {template_id:?} names {:?}", m.id)));
    }
    Ok(Some(m))
}

/// Lists template ids in the store (those with a manifest).
pub async fn list(store: &TemplateStore, id_prefix: Option<&str>) -> ProviderResult<Vec<String>> {
    let root = format!("{}/{}", store.settings().prefix, id_prefix.unwrap_or(""));
    let objects = store.list(&root).await?;
    let mut ids: Vec<String> = objects
        .iter()
        .filter_map(|o| o.key.strip_suffix("/manifest.json"))
        .filter_map(|k| k.rsplit('/').next())
        .map(str::to_string)
        .collect();
    ids.sort();
    ids.dedup();
    Ok(ids)
}

/// Restores `template_id` into the running sandbox `sandbox_id` under a lease.
///
/// `Ok(None)` when the store has no such template. On `Err` the sandbox holds a partial or
/// refused restore: the CALLER must destroy it instead of handing it out.
pub async fn restore(
    provider: &dyn Provider,
    sandbox_id: &str,
    store: &TemplateStore,
    template_id: &str,
    limits: Limits,
) -> ProviderResult<Option<Manifest>> {
    let Some(m) = manifest(store, template_id).await? else { return Ok(None) };
    let keys = Keys::new(&store.settings().prefix, template_id);
    let lease_key = keys.lease(&format!("{}-{}", Utc::now().timestamp_millis(), fastrand::u64(..)));
    store.put_text(&lease_key, &Utc::now().to_rfc3339(), "text/plain").await?;
    let result = run_restore(provider, sandbox_id, store, &keys, &m, limits).await;
    // Best effort: a stale lease only delays an eviction until it ages out.
    if let Err(e) = store.remove(std::slice::from_ref(&lease_key)).await {
        tracing::warn!(error = %e, lease = %lease_key, "could not release restore lease");
    }
    result.map(|()| Some(m))
}

async fn run_restore(
    provider: &dyn Provider,
    sandbox_id: &str,
    store: &TemplateStore,
    keys: &Keys,
    m: &Manifest,
    limits: Limits,
) -> ProviderResult<()> {
    let url = store.presign_get(&keys.archive(), limits.presign).await?;
    let script = manifest::restore_script(&m.capture_paths, &url).map_err(ProviderError::Invalid)?;
    let out = provider.exec(sandbox_id, &ExecRequest::shell(script, limits.transfer)).await?;
    let stderr = redact(&String::from_utf8_lossy(&out.stderr));
    match out.exit_code {
        0 => Ok(()),
        manifest::EXIT_TRANSFER_FAILED => Err(ProviderError::Transient(format!("restore download failed: {stderr}"))),
        manifest::EXIT_SETUID_SURVIVED => Err(ProviderError::Invalid(format!("restore refused: a setuid/setgid file survived: {stderr}"))),
        manifest::EXIT_HARDLINK_ESCAPE => Err(ProviderError::Invalid(format!("restore refused: {stderr}"))),
        manifest::EXIT_DEVICE_NODE => Err(ProviderError::Invalid(format!("restore refused: {stderr}"))),
        manifest::EXIT_TAR_FAILED => Err(ProviderError::Invalid(format!("restore refused by tar (a member outside the tree, '..', or a symlink escape): {stderr}"))),
        code => Err(ProviderError::Transient(format!("restore failed (exit {code}): {stderr}"))),
    }
}

/// Removes a template from the store, refusing while a live restore lease exists.
/// Removing an absent template is a success. The manifest goes first, so the template stops
/// existing before its archive does.
pub async fn remove(store: &TemplateStore, template_id: &str, limits: Limits) -> ProviderResult<()> {
    let keys = Keys::new(&store.settings().prefix, template_id);
    let leases = store.list(&keys.leases()).await?;
    let times: Vec<_> = leases.iter().map(|l| l.last_modified).collect();
    if manifest::has_live_lease(&times, limits.lease_ttl_secs(), Utc::now()) {
        return Err(ProviderError::Conflict(format!(
            "template {template_id:?} is being restored right now (live lease in the store); retry later"
        )));
    }
    store.remove(&[keys.manifest()]).await?;
    let rest: Vec<String> = store.list(&keys.root()).await?.into_iter().map(|o| o.key).collect();
    store.remove(&rest).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presigned_urls_are_redacted() {
        let r = redact("curl: (22) error for http://h/b/k?X-Amz-Credential=AK%2F&X-Amz-Signature=abc failed");
        assert!(!r.contains("abc") && r.contains("<presigned-url>"), "{r}");
    }
}
