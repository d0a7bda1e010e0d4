//! Dereference: resolve a Sandbox's references (template, volumes, Secrets) — always in the
//! Sandbox's own namespace, so a Sandbox can never name another namespace's objects.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;

use crate::api::{LocalObjectRef, Sandbox, SandboxTemplate, SandboxVolume, condition};
use crate::controller::outcome::Outcome;
use crate::controller::status::READY;
use crate::controller::template::owner_of;
use crate::controller::{Context, caches};
use crate::provider::RegistryCredential;
use crate::provider::labels::ensure_named;
use crate::registry::ProviderHandle;
use crate::templates::service::Boot;

use super::SandboxContext;
use super::apply::WAIT;
use super::build::Resolved;

/// The Secret type of registry credentials, as Pods use them.
pub const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// The key of such a Secret that holds the Docker config document.
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";

/// Where the self-delivered env file lands inside the sandbox.
pub const SELF_DELIVERED_ENV_PATH: &str = "/run/sandboxes.dev/env";

/// The self-delivered env content and the version it was rendered from.
pub struct SelfDeliveredEnv {
    /// File content: one `KEY='value'` line per key. Secret: never logged.
    pub content: String,
    /// The Secret's resourceVersion: what status records instead of anything derived from
    /// the values.
    pub version: String,
}

/// Waiting for something that will come by itself: a SandboxTemplate or SandboxVolume
/// wakes the Sandbox through its watch (the resync is the net, see [`watched`]); anything
/// else is looked at again shortly.
fn wait(reason: &'static str, message: String) -> Outcome {
    let recheck = (!watched(reason)).then_some(WAIT);
    Outcome::waiting(reason, message, recheck)
}

/// Whether a wait with `reason` ends with an object the Sandbox controller watches (a
/// SandboxTemplate or SandboxVolume), so its event — not a poll — wakes the Sandbox. A
/// missing Secret is not watched (see the chart README): it is polled.
pub fn watched(reason: &str) -> bool {
    matches!(
        reason,
        "VolumeNotFound" | "VolumeNotReady" | "TemplateNotReady"
    )
}

/// Resolves template, volumes, `envFrom` Secrets and, for an image boot, the pull Secrets.
pub async fn references(
    sandbox: &Sandbox,
    sctx: &SandboxContext,
    handle: &ProviderHandle,
) -> Result<Resolved, Outcome> {
    let ns = sandbox.namespace().unwrap_or_default();
    let spec = &sandbox.spec;
    let allowed = spec
        .egress
        .as_ref()
        .and_then(|e| e.allowed_domains.as_deref());
    let mut resolved = Resolved {
        egress_in_place: handle.provider.egress_policy().is_some(),
        files_need_running: handle.provider.files_need_running(),
        egress_placement: handle
            .provider
            .egress_policy()
            .and_then(|p| p.placement(allowed)),
        ..Resolved::default()
    };
    if let Some(tref) = &spec.template_ref {
        let (id, boot) = template(sandbox, sctx, handle, &tref.name).await?;
        resolved.template_id = Some(id);
        resolved.boot = Some(boot);
    }
    resolved.volume_names = volumes(sandbox, sctx, handle).await?;
    let secrets: Api<Secret> = Api::namespaced(sctx.ctx.client.clone(), &ns);
    resolved.secret_env = secret_env(sandbox, &secrets).await?;
    if spec.template_ref.is_none() {
        let pull_secrets = spec.image_pull_secrets.as_deref().unwrap_or_default();
        resolved.registry_credentials = pull_credentials(&secrets, pull_secrets).await?;
    }
    Ok(resolved)
}

/// The provider volume names of `spec.volumes`, in order: each a Ready SandboxVolume on the
/// Sandbox's own provider.
async fn volumes(
    sandbox: &Sandbox,
    sctx: &SandboxContext,
    handle: &ProviderHandle,
) -> Result<Vec<String>, Outcome> {
    let ns = sandbox.namespace().unwrap_or_default();
    let ctx = &sctx.ctx;
    let api: Api<SandboxVolume> = Api::namespaced(ctx.client.clone(), &ns);
    let cache = sctx.caches.get().map(|c| &c.volumes);
    let mut names = Vec::new();
    for (i, mount) in sandbox.spec.volumes.iter().flatten().enumerate() {
        let name = &mount.volume_ref.name;
        let Some(volume) = caches::lookup(cache, &api, &ns, name).await? else {
            return Err(wait(
                "VolumeNotFound",
                format!(
                    "spec.volumes[{i}].volumeRef: SandboxVolume {name:?} does not exist in namespace {ns:?} yet"
                ),
            ));
        };
        let vprovider = volume.spec.provider.clone().or_else(|| {
            let default = ctx.providers.resolve(None).ok();
            default.map(|h| h.name().to_string())
        });
        if vprovider.as_deref() != Some(handle.name()) {
            return Err(Outcome::stalled(
                "VolumeProviderMismatch",
                format!(
                    "spec.volumes[{i}]: SandboxVolume {name:?} lives on provider {vprovider:?}, this Sandbox on {:?}; use a volume of the same provider",
                    handle.name()
                ),
            ));
        }
        let status = volume.status.clone().unwrap_or_default();
        let ready = condition(&status.conditions, READY).is_some_and(|c| c.status == "True");
        let Some(vn) = status.volume_name.filter(|_| ready) else {
            let msg = format!("waiting for SandboxVolume {name:?} to become Ready");
            return Err(wait("VolumeNotReady", msg));
        };
        // Status is never authority: the volume's provider name derives from its UID, so
        // a status naming any other volume names one it does not own.
        let own = crate::controller::volume::external_name(&volume.uid().unwrap_or_default());
        let field = format!("SandboxVolume {name:?} status.volumeName");
        ensure_named(&field, &vn, &own).map_err(Outcome::failed)?;
        names.push(vn);
    }
    Ok(names)
}

/// The env of `spec.envFrom` Secrets, prefixed; a key that is no variable name stalls.
pub async fn secret_env(
    sandbox: &Sandbox,
    secrets: &Api<Secret>,
) -> Result<BTreeMap<String, String>, Outcome> {
    let mut env = BTreeMap::new();
    for (i, from) in sandbox.spec.env_from.iter().flatten().enumerate() {
        let field = format!("spec.envFrom[{i}].secretRef");
        let data = secret_data(secrets, &from.secret_ref.name, &field).await?;
        let prefix = from.prefix.clone().unwrap_or_default();
        for (key, value) in data {
            let name = format!("{prefix}{key}");
            if !valid_env_name(&name) {
                return Err(Outcome::stalled(
                    "InvalidSecretKey",
                    format!(
                        "spec.envFrom[{i}]: Secret {:?} key {key:?} is not a valid environment variable name",
                        from.secret_ref.name
                    ),
                ));
            }
            env.insert(name, value);
        }
    }
    Ok(env)
}

/// Reads the registry credentials of `spec.imagePullSecrets`, in order. A Secret of another
/// type, or one whose document cannot be read, stalls with a message naming it — and never
/// quoting it.
async fn pull_credentials(
    api: &Api<Secret>,
    refs: &[LocalObjectRef],
) -> Result<Vec<RegistryCredential>, Outcome> {
    let mut credentials = Vec::new();
    for (i, secret_ref) in refs.iter().enumerate() {
        let name = &secret_ref.name;
        let field = format!("spec.imagePullSecrets[{i}]");
        let Some(secret) = api.get_opt(name).await? else {
            return Err(wait(
                "SecretNotFound",
                format!("{field}: Secret {name:?} does not exist yet"),
            ));
        };
        let invalid = |why: String| {
            Outcome::stalled(
                "InvalidPullSecret",
                format!(
                    "{field}: Secret {name:?} {why}; create it with kubectl create secret docker-registry {name} --docker-server=... --docker-username=... --docker-password=..."
                ),
            )
        };
        if secret.type_.as_deref() != Some(DOCKER_CONFIG_JSON_TYPE) {
            return Err(invalid(format!(
                "is of type {:?}, not {DOCKER_CONFIG_JSON_TYPE}",
                secret.type_.as_deref().unwrap_or("Opaque")
            )));
        }
        let Some(document) = secret
            .data
            .as_ref()
            .and_then(|d| d.get(DOCKER_CONFIG_JSON_KEY))
        else {
            return Err(invalid(format!("has no {DOCKER_CONFIG_JSON_KEY} key")));
        };
        credentials.extend(
            crate::provider::image::credentials_from_docker_config(&document.0, name)
                .map_err(invalid)?,
        );
    }
    Ok(credentials)
}

/// Resolves `spec.templateRef` (named `name`) to a template id and how it boots on the
/// Sandbox's provider, through the templates service: a native template absent from the
/// provider is fetched from its shared store first, owned by its SandboxTemplate (so the
/// sweeper claims it once that is gone). A template that is nowhere stalls: the sandbox is
/// never booted from the plain image instead.
async fn template(
    sandbox: &Sandbox,
    sctx: &SandboxContext,
    handle: &ProviderHandle,
    name: &str,
) -> Result<(String, Boot), Outcome> {
    let ctx = &sctx.ctx;
    let ns = sandbox.namespace().unwrap_or_default();
    let api: Api<SandboxTemplate> = Api::namespaced(ctx.client.clone(), &ns);
    let cache = sctx.caches.get().map(|c| &c.templates);
    let Some(template) = caches::lookup(cache, &api, &ns, name).await? else {
        return Err(Outcome::stalled(
            "TemplateNotFound",
            format!(
                "spec.templateRef: SandboxTemplate {name:?} does not exist in namespace {ns:?}; create it or \
                 remove templateRef (the sandbox is never booted from the plain image instead)"
            ),
        ));
    };
    let status = template.status.clone().unwrap_or_default();
    let ready = condition(&status.conditions, READY).is_some_and(|c| c.status == "True");
    let Some(id) = status.template_id.filter(|_| ready) else {
        let msg = format!("waiting for SandboxTemplate {name:?} to become Ready");
        return Err(wait("TemplateNotReady", msg));
    };
    let provider = handle.provider.as_ref();
    if let Err(e) = ctx.templates.home(provider) {
        let msg = format!(
            "spec.templateRef: {}; remove templateRef or use another provider",
            e.message()
        );
        return Err(Outcome::stalled("TemplatesUnsupported", msg));
    }
    let owner = owner_of(&template, &ctx.instance);
    match handle
        .call("boot_template", ctx.templates.boot(provider, &id, &owner))
        .await
    {
        Ok(Some(boot)) => Ok((id, boot)),
        Ok(None) => Err(Outcome::stalled(
            "TemplateNotFound",
            format!(
                "spec.templateRef: SandboxTemplate {name:?} is not present at provider {:?} nor in its \
                 shared template store; recapture it (the sandbox is never booted from the plain image \
                 instead)",
                handle.name()
            ),
        )),
        Err(e) => Err(Outcome::failed(e)),
    }
}

/// Reads and renders the `selfDeliveredEnv` Secret, when the Sandbox has one.
pub async fn self_delivered_env(
    sandbox: &Sandbox,
    ctx: &Context,
) -> Result<Option<SelfDeliveredEnv>, Outcome> {
    let Some(sref) = &sandbox.spec.self_delivered_env else {
        return Ok(None);
    };
    let ns = sandbox.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(secret) = secrets.get_opt(&sref.name).await? else {
        return Err(wait(
            "SecretNotFound",
            format!(
                "spec.selfDeliveredEnv: Secret {:?} does not exist in namespace {ns:?} yet",
                sref.name
            ),
        ));
    };
    let data = decode(&secret, "spec.selfDeliveredEnv")?;
    for key in data.keys() {
        if !valid_env_name(key) {
            return Err(Outcome::stalled(
                "InvalidSecretKey",
                format!(
                    "spec.selfDeliveredEnv: Secret {:?} key {key:?} is not a valid environment variable name",
                    sref.name
                ),
            ));
        }
    }
    Ok(Some(SelfDeliveredEnv {
        content: render_env_file(&data),
        version: secret.resource_version().unwrap_or_default(),
    }))
}

async fn secret_data(
    api: &Api<Secret>,
    name: &str,
    field: &str,
) -> Result<BTreeMap<String, String>, Outcome> {
    let Some(secret) = api.get_opt(name).await? else {
        return Err(wait(
            "SecretNotFound",
            format!("{field}: Secret {name:?} does not exist yet"),
        ));
    };
    decode(&secret, field)
}

fn decode(secret: &Secret, field: &str) -> Result<BTreeMap<String, String>, Outcome> {
    let mut out = BTreeMap::new();
    for (key, value) in secret.data.iter().flatten() {
        let text = String::from_utf8(value.0.clone()).map_err(|_| {
            Outcome::stalled(
                "InvalidSecretValue",
                format!("{field}: Secret key {key:?} is not UTF-8 text"),
            )
        })?;
        out.insert(key.clone(), text);
    }
    for (key, value) in secret.string_data.iter().flatten() {
        out.insert(key.clone(), value.clone());
    }
    Ok(out)
}

/// `[A-Za-z_][A-Za-z0-9_]*`.
pub fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// One `KEY='value'` line per key, POSIX single-quoted (`'` → `'\''`), so
/// `set -a; . /run/sandboxes.dev/env` exports exactly the Secret's values.
pub fn render_env_file(data: &BTreeMap<String, String>) -> String {
    data.iter()
        .map(|(k, v)| format!("{k}='{}'\n", v.replace('\'', "'\\''")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_file_quotes_for_posix_sh() {
        let data = BTreeMap::from([
            ("A".to_string(), "it's $HOME".to_string()),
            ("B".to_string(), "line1\nline2".to_string()),
        ]);
        assert_eq!(
            render_env_file(&data),
            "A='it'\\''s $HOME'\nB='line1\nline2'\n"
        );
    }

    #[test]
    fn env_names() {
        assert!(valid_env_name("_A1"));
        assert!(!valid_env_name("1A"));
        assert!(!valid_env_name("A-B"));
        assert!(!valid_env_name(""));
    }
}
