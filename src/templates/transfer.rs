//! Provider-neutral template transfer: capture a running sandbox's paths into the store, and
//! restore them into a fresh sandbox. Needs only `exec` from the provider and a store the
//! sandbox can reach, so publishing and fetching a native template (Docker) and the templates
//! of a provider without image commit (Fly, E2B) share this one code path — including its
//! security boundary. Driven by the templates service ([`super::service`]).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;

use super::manifest::{self, Access, Keys, MANIFEST_SCHEMA, Manifest, ManifestOwner};
use super::store::TemplateStore;
use crate::provider::labels::{KIND, Owner};
use crate::provider::{
    CommitRequest, CreateRequest, ExecRequest, Provider, ProviderError, ProviderResult, Resources,
    RestartPolicy, Template, validate,
};

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
    let tail: String = text
        .chars()
        .rev()
        .take(600)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    tail.split_whitespace()
        .map(|w| {
            if w.contains("X-Amz-Signature") || w.contains("X-Amz-Credential") {
                "<presigned-url>"
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Reason of an error refusing a namespace a template another namespace owns.
pub const NOT_SHARED: &str = "TemplateNotShared";
/// Reason of an error refusing to overwrite another namespace's template.
pub const OWNED_ELSEWHERE: &str = "TemplateOwnedElsewhere";

/// A template's manifest when `namespace` may `access` it; `Ok(None)` when absent. The
/// refusal is `Invalid` (a spec change fixes it: `spec.sharedWith` of the owner, or another
/// `spec.templateId`).
pub async fn manifest_for(
    store: &TemplateStore,
    template_id: &str,
    namespace: &str,
    access: Access,
) -> ProviderResult<Option<Manifest>> {
    let Some(m) = manifest(store, template_id).await? else {
        return Ok(None);
    };
    m.check_access(namespace, access).map_err(|e| {
        let reason = match access {
            Access::Read => NOT_SHARED,
            Access::Write => OWNED_ELSEWHERE,
        };
        ProviderError::invalid(e).with_reason(reason)
    })?;
    Ok(Some(m))
}

/// Captures `request.capture_paths` of the running sandbox `request.sandbox_id` into the
/// store as `request.template_id`, replacing an earlier capture of the SAME namespace only
/// (checked before anything is uploaded); the manifest records the request's owner (labels,
/// namespace and UID), `shared_with` and `base_image`. The manifest is written last: until
/// it exists, the template does not.
pub async fn capture(
    provider: &dyn Provider,
    store: &TemplateStore,
    request: &CommitRequest,
    base_image: Option<String>,
    shared_with: &[String],
    limits: Limits,
) -> ProviderResult<Manifest> {
    let (sandbox_id, template_id) = (&request.sandbox_id, &request.template_id);
    let paths = &request.capture_paths;
    validate::resource_name("template id", template_id).map_err(ProviderError::invalid)?;
    if paths.is_empty() {
        return Err(ProviderError::invalid(
            "capturePaths is empty: name the directories to capture",
        ));
    }
    manifest_for(store, template_id, &request.owner.namespace, Access::Write).await?;
    let keys = Keys::new(&store.settings().prefix, template_id);
    let url = store.presign_put(&keys.archive(), limits.presign).await?;
    let excluded = &request.secret_files;
    let script = manifest::capture_script(paths, excluded, &url, limits.max_archive_bytes)
        .map_err(ProviderError::invalid)?;
    run_capture(provider, sandbox_id, script, paths, limits).await?;
    let archive = store.head(&keys.archive()).await?.ok_or_else(|| {
        ProviderError::transient(format!("capture uploaded nothing to {}", keys.archive()))
    })?;
    let m = Manifest {
        schema: MANIFEST_SCHEMA,
        id: template_id.to_string(),
        capture_paths: paths.to_vec(),
        created_at: crate::api::rfc3339(Utc::now()),
        size_bytes: archive.size,
        label: request.label.clone(),
        base_image,
        labels: request.owner.labels(),
        owner: Some(ManifestOwner {
            namespace: request.owner.namespace.clone(),
            uid: request.owner.uid.clone(),
        }),
        shared_with: shared_with.to_vec(),
    };
    write_manifest(store, &keys, &m).await?;
    Ok(m)
}

/// Writes a template's manifest (the object whose existence defines the template).
async fn write_manifest(store: &TemplateStore, keys: &Keys, m: &Manifest) -> ProviderResult<()> {
    let body = serde_json::to_string_pretty(m)
        .map_err(|e| ProviderError::invalid(format!("manifest: {e}")))?;
    store
        .put_text(&keys.manifest(), &body, "application/json")
        .await
}

/// Runs the capture script in the sandbox and maps its exit status.
async fn run_capture(
    provider: &dyn Provider,
    sandbox_id: &str,
    script: String,
    paths: &[String],
    limits: Limits,
) -> ProviderResult<()> {
    let out = provider
        .exec(sandbox_id, &ExecRequest::shell(script, limits.transfer))
        .await?;
    match out.exit_code {
        0 => Ok(()),
        manifest::EXIT_TOO_LARGE => Err(ProviderError::invalid(format!(
            "the capture of {paths:?} is larger than {} bytes; capture less",
            limits.max_archive_bytes
        ))),
        code => Err(ProviderError::transient(format!(
            "capture in sandbox {sandbox_id} failed (exit {code}): {}",
            redact(&String::from_utf8_lossy(&out.stderr))
        ))),
    }
}

/// Reads a template's manifest. `Ok(None)` only when the manifest genuinely does not exist;
/// a failed lookup is `Err` (rule 3), and so is a manifest that fails validation.
pub async fn manifest(
    store: &TemplateStore,
    template_id: &str,
) -> ProviderResult<Option<Manifest>> {
    let keys = Keys::new(&store.settings().prefix, template_id);
    let Some(text) = store.get_text(&keys.manifest()).await? else {
        return Ok(None);
    };
    let m: Manifest = serde_json::from_str(&text).map_err(|e| {
        ProviderError::invalid(format!(
            "template store: manifest of {template_id:?} is unreadable: {e}"
        ))
    })?;
    m.validate().map_err(|e| {
        ProviderError::invalid(format!("template store: manifest of {template_id:?}: {e}"))
    })?;
    if m.id != template_id {
        return Err(ProviderError::invalid(format!(
            "template store: manifest under {template_id:?} names {:?}",
            m.id
        )));
    }
    Ok(Some(m))
}

/// Rewrites a stored template's `shared_with` when `namespace` owns it (the manifest is the
/// only object that changes). `Ok(false)` when the store does not have it.
pub async fn share(
    store: &TemplateStore,
    template_id: &str,
    namespace: &str,
    shared_with: &[String],
) -> ProviderResult<bool> {
    let Some(mut m) = manifest_for(store, template_id, namespace, Access::Write).await? else {
        return Ok(false);
    };
    if m.shared_with != shared_with {
        m.shared_with = shared_with.to_vec();
        let keys = Keys::new(&store.settings().prefix, template_id);
        write_manifest(store, &keys, &m).await?;
    }
    Ok(true)
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
    let Some(m) = manifest(store, template_id).await? else {
        return Ok(None);
    };
    let keys = Keys::new(&store.settings().prefix, template_id);
    let lease_key = keys.lease(&format!(
        "{}-{}",
        Utc::now().timestamp_millis(),
        fastrand::u64(..)
    ));
    store
        .put_text(&lease_key, &Utc::now().to_rfc3339(), "text/plain")
        .await?;
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
    let script =
        manifest::restore_script(&m.capture_paths, &url).map_err(ProviderError::invalid)?;
    let out = provider
        .exec(sandbox_id, &ExecRequest::shell(script, limits.transfer))
        .await?;
    let stderr = redact(&String::from_utf8_lossy(&out.stderr));
    match out.exit_code {
        0 => Ok(()),
        manifest::EXIT_TRANSFER_FAILED => Err(ProviderError::transient(format!(
            "restore download failed: {stderr}"
        ))),
        manifest::EXIT_SETUID_SURVIVED => Err(ProviderError::invalid(format!(
            "restore refused: a setuid/setgid file survived: {stderr}"
        ))),
        manifest::EXIT_HARDLINK_ESCAPE => {
            Err(ProviderError::invalid(format!("restore refused: {stderr}")))
        }
        manifest::EXIT_DEVICE_NODE => {
            Err(ProviderError::invalid(format!("restore refused: {stderr}")))
        }
        manifest::EXIT_SYMLINK_ESCAPE => Err(ProviderError::invalid(format!(
            "restore refused: a symlink of the restoring sandbox leads out of the capture paths: {stderr}"
        ))),
        manifest::EXIT_TAR_FAILED => Err(ProviderError::invalid(format!(
            "restore refused by tar (a member outside the tree, '..', or a symlink escape): {stderr}"
        ))),
        code => Err(ProviderError::transient(format!(
            "restore failed (exit {code}): {stderr}"
        ))),
    }
}

/// Removes a template from the store, refusing while a live restore lease exists.
/// Removing an absent template is a success. The manifest goes first, so the template stops
/// existing before its archive does.
pub async fn remove(
    store: &TemplateStore,
    template_id: &str,
    limits: Limits,
) -> ProviderResult<()> {
    let keys = Keys::new(&store.settings().prefix, template_id);
    let leases = store.list(&keys.leases()).await?;
    let times: Vec<_> = leases.iter().map(|l| l.last_modified).collect();
    if manifest::has_live_lease(&times, limits.lease_ttl_secs(), Utc::now()) {
        return Err(ProviderError::conflict(format!(
            "template {template_id:?} is being restored right now (live lease in the store); retry later"
        )));
    }
    store.remove(&[keys.manifest()]).await?;
    let rest: Vec<String> = store
        .list(&keys.root())
        .await?
        .into_iter()
        .map(|o| o.key)
        .collect();
    store.remove(&rest).await
}

/// The main process of a transfer helper sandbox: idles, and exits promptly on SIGTERM.
const HELPER_COMMAND: &[&str] = &["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"];

/// Name prefix of the short-lived sandboxes a publish or a fetch runs in. They carry the
/// owning SandboxTemplate's owner labels (kind `SandboxTemplate`: nothing else such an object
/// owns is a sandbox), so whoever owns the template can find and destroy one that a crash
/// left behind ([`is_helper`]).
pub const HELPER_PREFIX: &str = "sbxt-transfer-";

/// A unique helper sandbox name for `op` on `template_id`.
fn helper_name(op: &str, template_id: &str) -> String {
    let id: String = template_id.chars().take(64).collect();
    format!("{HELPER_PREFIX}{op}-{id}-{:016x}", fastrand::u64(..))
}

/// Whether a provider sandbox (by its labels) is a transfer helper: one owned by a
/// SandboxTemplate.
pub fn is_helper(labels: &BTreeMap<String, String>) -> bool {
    labels.get(KIND).is_some_and(|k| k == "SandboxTemplate")
}

/// Keeps an error's category (what the caller does next) and puts `what` in front of it.
fn context(what: &str, e: ProviderError) -> ProviderError {
    e.context(what)
}

fn helper_request(
    name: &str,
    owner: &Owner,
    image: Option<&str>,
    template: Option<&str>,
) -> CreateRequest {
    CreateRequest {
        name: name.to_string(),
        owner: owner.clone(),
        image: image.map(str::to_string),
        template: template.map(str::to_string),
        command: Some(HELPER_COMMAND.iter().map(|s| s.to_string()).collect()),
        restart_policy: RestartPolicy::Never,
        env: BTreeMap::new(),
        labels: BTreeMap::new(),
        resources: Resources::default(),
        ports: Vec::new(),
        volumes: Vec::new(),
        // The helper talks to the store over presigned URLs.
        allowed_domains: None,
        idle_action: None,
        image_pull_policy: Default::default(),
        registry_credentials: Vec::new(),
        secret_env_keys: Default::default(),
    }
}

/// Destroys a helper, retrying once; a failure is logged (the helper carries its owner's
/// labels, so the owner's next reconcile finds and destroys it).
async fn destroy_helper(provider: &dyn Provider, name: &str) -> ProviderResult<()> {
    let first = provider.destroy(name).await;
    let result = match first {
        Ok(()) => Ok(()),
        Err(_) => provider.destroy(name).await,
    };
    if let Err(e) = &result {
        tracing::error!(helper = name, error = %e, "transfer helper sandbox could not be destroyed");
    }
    result
}

/// Publishes the native template `template` into the store: a helper sandbox is booted from
/// it, its capture paths are captured into the store (see [`capture`]) under its own owner's
/// labels, and the helper is destroyed whatever happened. For providers whose templates are
/// host-local images (Docker).
pub async fn publish_template(
    provider: &dyn Provider,
    store: &TemplateStore,
    template: &Template,
    shared_with: &[String],
    limits: Limits,
) -> ProviderResult<Manifest> {
    let template_id = &template.id;
    validate::resource_name("template id", template_id).map_err(ProviderError::invalid)?;
    if template.capture_paths.is_empty() {
        return Err(ProviderError::invalid(format!(
            "template {template_id:?} records no capture paths, so there is nothing to publish; \
             recapture it with spec.capturePaths"
        )));
    }
    let owner = Owner::from_labels(&template.labels).ok_or_else(|| {
        ProviderError::invalid(format!(
            "template {template_id} carries no owner labels, so no helper can be made for \
             publishing it; recapture it through its SandboxTemplate"
        ))
    })?;
    // Refused before a helper is made: another namespace's copy is never replaced.
    manifest_for(store, template_id, &owner.namespace, Access::Write).await?;
    let name = helper_name("publish", template_id);
    let created = provider
        .create(&helper_request(&name, &owner, None, Some(template_id)))
        .await
        .map_err(|e| {
            context(
                &format!("creating the publish sandbox for template {template_id}"),
                e,
            )
        })?;
    let request = CommitRequest {
        sandbox_id: created.id.clone(),
        template_id: template_id.clone(),
        capture_paths: template.capture_paths.clone(),
        label: template.label.clone(),
        owner,
        // A helper booted from the template: its own env is none of the template's, and a
        // native template holds no self-delivered file.
        env: BTreeMap::new(),
        secret_files: Vec::new(),
    };
    let result = async {
        provider.start(&created.id).await?;
        let image = template.base_image.clone();
        capture(provider, store, &request, image, shared_with, limits).await
    }
    .await;
    // A helper that could not be destroyed is logged and found again by its owner labels;
    // the published template itself is complete.
    let _ = destroy_helper(provider, &created.id).await;
    result
}

/// Fetches `template_id` from the store onto a provider with native templates, when `owner`'s
/// namespace may read it (see [`Manifest::check_access`]): a FRESH helper
/// sandbox is made from `image` (the provider's default image when `None`), the archive is
/// restored into it through the security boundary ([`restore`]), and the helper is committed
/// as the template with `owner`'s labels (so the sweeper knows who owns it) and the
/// manifest's capture paths. `Ok(None)` when the store does not have the template.
///
/// Rule 11: a restore that fails or is refused destroys the helper; nothing of it is ever
/// committed or handed out. The helper is destroyed after a successful commit, too.
pub async fn fetch_into(
    provider: &dyn Provider,
    store: &TemplateStore,
    template_id: &str,
    owner: &Owner,
    image: Option<&str>,
    limits: Limits,
) -> ProviderResult<Option<Template>> {
    validate::resource_name("template id", template_id).map_err(ProviderError::invalid)?;
    let templates = provider.templates().ok_or_else(|| {
        ProviderError::unsupported(format!(
            "provider {:?} cannot hold templates, so template {template_id} cannot be fetched onto it",
            provider.name()
        ))
    })?;
    // No sandbox is made for a template the store does not have, or not for this namespace.
    if manifest_for(store, template_id, &owner.namespace, Access::Read)
        .await?
        .is_none()
    {
        return Ok(None);
    }
    let name = helper_name("fetch", template_id);
    let created = provider
        .create(&helper_request(&name, owner, image, None))
        .await
        .map_err(|e| {
            context(
                &format!("creating the restore sandbox for template {template_id}"),
                e,
            )
        })?;
    let helper = created.id;
    let result = async {
        provider.start(&helper).await?;
        let Some(m) = restore(provider, &helper, store, template_id, limits).await? else {
            // Removed from the store between the lookup and the restore.
            return Ok(None);
        };
        let commit = CommitRequest {
            sandbox_id: helper.clone(),
            template_id: template_id.to_string(),
            capture_paths: m.capture_paths.clone(),
            label: m.label.clone(),
            owner: owner.clone(),
            env: BTreeMap::new(),
            secret_files: Vec::new(),
        };
        templates.commit(&commit).await.map(Some)
    }
    .await;
    let destroyed = destroy_helper(provider, &helper).await;
    match (result, destroyed) {
        (Err(e), Err(d)) => Err(ProviderError::transient(format!(
            "{e}; and the restore sandbox {helper} could not be destroyed yet ({d}): it is never \
             handed out, and is destroyed on the next attempt"
        ))),
        (Err(e), Ok(())) => Err(e),
        (Ok(t), _) => Ok(t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presigned_urls_are_redacted() {
        let r = redact(
            "curl: (22) error for http://h/b/k?X-Amz-Credential=AK%2F&X-Amz-Signature=abc failed",
        );
        assert!(!r.contains("abc") && r.contains("<presigned-url>"), "{r}");
    }
}
