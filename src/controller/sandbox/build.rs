//! Build (pure): a Sandbox's spec plus its resolved references → the provider request.
//!
//! No I/O here, so every translation rule (quantities, env precedence, the spec hash that
//! decides recreation) is table-tested without a cluster or an engine.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::api::{
    DesiredState, IdleAction, ImagePullPolicy, Protocol, RestartPolicy, Sandbox, SandboxSpec,
    SandboxStatus,
};
use crate::provider::labels::{Owner, SPEC_HASH, TEMPLATE};
use crate::provider::{
    self, CreateRequest, PortRequest, RegistryCredential, Resources, VolumeMount,
};
use crate::templates::service::Boot;

/// External name of a Sandbox's provider resource: deterministic from its UID, so a
/// crashed create is found again instead of duplicated.
pub fn external_name(uid: &str) -> String {
    format!("sbx-{uid}")
}

/// Everything the spec resolved to outside the spec itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resolved {
    /// Template id (the SandboxTemplate's external id) to boot from.
    pub template_id: Option<String>,
    /// How the template boots on this provider (set with `template_id`).
    pub boot: Option<Boot>,
    /// Provider volume names for `spec.volumes`, in order.
    pub volume_names: Vec<String>,
    /// Env from `spec.envFrom` Secrets, already prefixed. Secret values: never logged.
    pub secret_env: BTreeMap<String, String>,
    /// Whether the provider replaces an allow-list in place: then `spec.egress` is left out of
    /// the spec hash and converges like resources do, instead of recreating the sandbox.
    pub egress_in_place: bool,
    /// What of `spec.egress` the provider fixes at create (its `EgressPolicy::placement`):
    /// hashed, so a change of placement recreates while a change within one applies in place.
    pub egress_placement: Option<&'static str>,
    /// Registry credentials from `spec.imagePullSecrets`, in order. Their `Debug` redacts
    /// the secrets.
    pub registry_credentials: Vec<RegistryCredential>,
    /// Whether the provider's files reach a sandbox only once it runs
    /// (`Provider::files_need_running`): env is delivered right after the start.
    pub files_need_running: bool,
}

/// What the provider should hold for this Sandbox.
#[derive(Clone, PartialEq)]
pub struct Desired {
    /// The create request (its `labels` carry the spec hash).
    pub request: CreateRequest,
    /// Desired power state.
    pub state: DesiredState,
    /// Hash of everything that cannot change in place.
    pub spec_hash: String,
    /// The template whose archive is restored into the sandbox after its first start (a
    /// provider without native templates), before it is ever reported Ready.
    pub restore: Option<String>,
}

// Hand-written so a stray `{:?}` can never print Secret-derived env values.
impl std::fmt::Debug for Desired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Desired")
            .field("name", &self.request.name)
            .field("state", &self.state)
            .field("spec_hash", &self.spec_hash)
            .finish_non_exhaustive()
    }
}

/// Translates a Sandbox into the provider request. `Err` is a user-facing message naming
/// the field to fix (it becomes a `Stalled` condition).
pub fn desired(sandbox: &Sandbox, instance: &str, resolved: &Resolved) -> Result<Desired, String> {
    let spec = &sandbox.spec;
    let meta = &sandbox.metadata;
    let uid = meta.uid.clone().ok_or("object has no UID yet")?;
    let owner = Owner {
        instance: instance.to_string(),
        kind: "Sandbox".into(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: uid.clone(),
    };
    let spec_hash = spec_hash(spec, resolved);
    let mut labels = spec.labels.clone().unwrap_or_default();
    labels.insert(SPEC_HASH.into(), spec_hash.clone());
    if let Some(t) = &resolved.template_id {
        labels.insert(TEMPLATE.into(), t.clone());
    }
    let (image, template, restore) = boot(spec, resolved, sandbox.status.as_ref());
    Ok(Desired {
        request: CreateRequest {
            name: external_name(&uid),
            owner,
            image,
            template,
            command: spec.command.clone(),
            restart_policy: restart_policy(spec.restart_policy),
            env: env(spec, resolved)?,
            labels,
            resources: resources(spec)?,
            ports: ports(spec)?,
            volumes: volumes(spec, resolved)?,
            allowed_domains: spec.egress.as_ref().and_then(|e| e.allowed_domains.clone()),
            idle_action: provider_idle_action(spec).map(|a| match a {
                IdleAction::Off => provider::IdleAction::Off,
                IdleAction::Stop => provider::IdleAction::Stop,
                IdleAction::Suspend => provider::IdleAction::Suspend,
            }),
            image_pull_policy: match spec.image_pull_policy.unwrap_or_default() {
                ImagePullPolicy::Always => provider::ImagePullPolicy::Always,
                ImagePullPolicy::IfNotPresent => provider::ImagePullPolicy::IfNotPresent,
                ImagePullPolicy::Never => provider::ImagePullPolicy::Never,
            },
            registry_credentials: resolved.registry_credentials.clone(),
            secret_env_keys: resolved.secret_env.keys().cloned().collect(),
        },
        state: spec.state.unwrap_or(DesiredState::Running),
        spec_hash,
        restore,
    })
}

/// `spec.env` plus the `envFrom` Secrets' env. Secret env may not shadow plain env
/// silently: a clash is an error.
fn env(spec: &SandboxSpec, resolved: &Resolved) -> Result<BTreeMap<String, String>, String> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for var in spec.env.iter().flatten() {
        env.insert(var.name.clone(), var.value.clone());
    }
    for (key, value) in &resolved.secret_env {
        if env.contains_key(key) {
            return Err(format!(
                "env var {key:?} is set both in spec.env and by spec.envFrom; remove one of them"
            ));
        }
        env.insert(key.clone(), value.clone());
    }
    Ok(env)
}

/// `spec.ports`, each in 1-65535.
fn ports(spec: &SandboxSpec) -> Result<Vec<PortRequest>, String> {
    spec.ports
        .iter()
        .flatten()
        .map(|p| {
            let port = u16::try_from(p.port)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("spec.ports: {} is not a port in 1-65535", p.port))?;
            Ok(PortRequest {
                sandbox_port: port,
                protocol: match p.protocol {
                    Some(Protocol::UDP) => "udp".into(),
                    _ => "tcp".into(),
                },
            })
        })
        .collect()
}

/// `spec.volumes` with the provider volume names they resolved to.
fn volumes(spec: &SandboxSpec, resolved: &Resolved) -> Result<Vec<VolumeMount>, String> {
    let mounts = spec.volumes.as_deref().unwrap_or_default();
    if mounts.len() != resolved.volume_names.len() {
        return Err("internal: volume references were not all resolved".into());
    }
    Ok(mounts
        .iter()
        .zip(&resolved.volume_names)
        .map(|(m, name)| VolumeMount {
            volume_name: name.clone(),
            mount_path: m.mount_path.clone(),
            read_only: m.read_only.unwrap_or(false),
        })
        .collect())
}

/// `spec.restartPolicy`: `Never` when omitted.
fn restart_policy(policy: Option<RestartPolicy>) -> provider::RestartPolicy {
    match policy {
        Some(RestartPolicy::OnFailure) => provider::RestartPolicy::OnFailure,
        Some(RestartPolicy::Always) => provider::RestartPolicy::Always,
        _ => provider::RestartPolicy::Never,
    }
}

/// The image a create boots: `spec.image`, except that under `IfNotPresent` and `Never` the
/// registry digest status recorded for this same `spec.image` is booted instead, so a
/// recreate boots the same bits after the tag has moved. `Always` resolves the tag again;
/// an image id (an image no registry knows) is not pinned, as there is nowhere to fetch it
/// from should it go.
pub fn image_to_boot(spec: &SandboxSpec, status: Option<&SandboxStatus>) -> Option<String> {
    let image = spec.image.clone()?;
    if spec.image_pull_policy == Some(ImagePullPolicy::Always) {
        return Some(image);
    }
    let pinned = status
        .filter(|s| s.image.as_deref() == Some(image.as_str()))
        .and_then(|s| s.image_digest.clone())
        .filter(|d| d.contains("@sha256:"));
    Some(pinned.unwrap_or(image))
}

/// What the sandbox is created from — `(image, provider template)` — and the template to
/// restore after start. A provider's own template wins over the image; a store template
/// boots the base image it was captured on (the spec's image when it names none) and is
/// restored into it; a plain image boot may be pinned to a digest (see [`image_to_boot`]).
fn boot(
    spec: &SandboxSpec,
    resolved: &Resolved,
    status: Option<&SandboxStatus>,
) -> (Option<String>, Option<String>, Option<String>) {
    let id = resolved.template_id.clone();
    match &resolved.boot {
        Some(Boot::Restore { image }) => (image.clone().or_else(|| spec.image.clone()), None, id),
        Some(Boot::Native) => (spec.image.clone(), id, None),
        None => (image_to_boot(spec, status), id, None),
    }
}

/// Parses `spec.resources` into provider units, naming the field on error.
pub fn resources(spec: &SandboxSpec) -> Result<Resources, String> {
    let Some(r) = &spec.resources else {
        return Ok(Resources::default());
    };
    Ok(Resources {
        cpu_millis: r
            .cpu
            .as_ref()
            .map(|q| {
                q.to_millis()
                    .map_err(|e| format!("spec.resources.cpu: {e}"))
            })
            .transpose()?,
        memory_bytes: r
            .memory
            .as_ref()
            .map(|q| {
                q.to_bytes()
                    .map_err(|e| format!("spec.resources.memory: {e}"))
            })
            .transpose()?,
        disk_bytes: r
            .disk
            .as_ref()
            .map(|q| {
                q.to_bytes()
                    .map_err(|e| format!("spec.resources.disk: {e}"))
            })
            .transpose()?,
        pids: r.pids,
    })
}

/// The idle action the provider itself applies: none when `idleTimeoutSeconds` hands
/// idleness to the operator (see [`crate::idle`]), which then parks the sandbox itself.
fn provider_idle_action(spec: &SandboxSpec) -> Option<IdleAction> {
    match spec.idle_timeout_seconds {
        Some(_) => None,
        None => spec.idle_action,
    }
}

/// Hash of the create-time configuration: every field that cannot change in place.
///
/// The spec is destructured without `..`, so a new field does not compile until it is
/// decided here: hashed (a change recreates the sandbox) or bound to `_name` with the
/// reason it is not. Secret VALUES are never hashed (envFrom is resolved at create, and a
/// hash of a secret must not leave the operator) — only the references are. 32 hex
/// characters fit a label value.
pub fn spec_hash(spec: &SandboxSpec, resolved: &Resolved) -> String {
    let SandboxSpec {
        // Immutable (an admission rule): a live Sandbox never moves.
        provider: _provider,
        image,
        // When to pull applies at the next create; a running sandbox keeps its bits.
        image_pull_policy: _image_pull_policy,
        // Credentials for a pull only, never part of what runs.
        image_pull_secrets: _image_pull_secrets,
        // Hashed as the template id it resolved to (`resolved.template_id`).
        template_ref: _template_ref,
        command,
        restart_policy,
        env,
        env_from,
        // Delivered into the running sandbox, and again when it changes.
        self_delivered_env: _self_delivered_env,
        volumes,
        // Converge in place (`setResources`), or the provider refuses the change.
        resources: _resources,
        ports,
        egress,
        // The power state converges in place.
        state: _state,
        // Hashed as what the provider applies (`provider_idle_action`).
        idle_action: _idle_action,
        // Evaluated by every pass (`crate::idle`), never by the provider.
        idle_timeout_seconds: _idle_timeout_seconds,
        // Evaluated by every pass, never by the provider.
        lifetime: _lifetime,
        labels,
        // Resolved before build: a claiming Sandbox is built from its pool's template.
        warm_pool_ref: _warm_pool_ref,
    } = spec;
    let mut material = serde_json::json!({
        "image": image,
        "template": resolved.template_id,
        "command": command,
        "restartPolicy": restart_policy,
        "env": env,
        "envFrom": env_from,
        "ports": ports,
        "volumes": volumes,
        "volumeNames": resolved.volume_names,
        "egress": if resolved.egress_in_place { None } else { egress.as_ref() },
        "labels": labels,
        "idleAction": provider_idle_action(spec),
    });
    // Only when the provider has one, so no other provider's hashes change.
    if let (Some(placement), Some(map)) = (resolved.egress_placement, material.as_object_mut()) {
        map.insert("egressPlacement".into(), placement.into());
    }
    let digest = Sha256::digest(material.to_string().as_bytes());
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Quantity;
    use crate::api::{EgressSpec, EnvVar, PortSpec, ResourcesSpec, SandboxSpec};

    fn sandbox(spec: SandboxSpec) -> Sandbox {
        let mut s = Sandbox::new("web", spec);
        s.metadata.namespace = Some("team".into());
        s.metadata.uid = Some("u-1".into());
        s
    }

    fn base_spec() -> SandboxSpec {
        serde_json::from_value(serde_json::json!({"image": "img"})).unwrap()
    }

    #[test]
    fn name_labels_and_units_are_translated() {
        let mut spec = base_spec();
        spec.resources = Some(ResourcesSpec {
            cpu: Some(Quantity("500m".into())),
            memory: Some(Quantity("256Mi".into())),
            disk: None,
            pids: Some(64),
        });
        spec.ports = Some(vec![PortSpec {
            name: None,
            port: 8080,
            protocol: None,
        }]);
        let d = desired(&sandbox(spec), "ops", &Resolved::default()).unwrap();
        assert_eq!(d.request.name, "sbx-u-1");
        assert_eq!(d.request.resources.cpu_millis, Some(500));
        assert_eq!(d.request.resources.memory_bytes, Some(256 * 1024 * 1024));
        assert_eq!(d.request.ports[0].sandbox_port, 8080);
        assert_eq!(d.request.labels.get(SPEC_HASH), Some(&d.spec_hash));
        assert_eq!(
            d.request
                .owner
                .labels()
                .get("sandboxes.dev/owner")
                .map(String::as_str),
            Some("team.web")
        );
        assert_eq!(d.state, DesiredState::Running);
    }

    #[test]
    fn hash_ignores_resources_and_state_but_not_command() {
        let a = base_spec();
        let mut b = base_spec();
        b.state = Some(DesiredState::Sleeping);
        b.resources = Some(ResourcesSpec {
            cpu: Some(Quantity("2".into())),
            memory: None,
            disk: None,
            pids: None,
        });
        assert_eq!(
            spec_hash(&a, &Resolved::default()),
            spec_hash(&b, &Resolved::default())
        );
        let mut c = base_spec();
        c.command = Some(vec!["sleep".into(), "1".into()]);
        assert_ne!(
            spec_hash(&a, &Resolved::default()),
            spec_hash(&c, &Resolved::default())
        );
    }

    #[test]
    fn egress_recreates_only_where_the_provider_cannot_replace_it_in_place() {
        let a = base_spec();
        let mut b = base_spec();
        b.egress = Some(EgressSpec {
            allowed_domains: Some(vec!["example.com".into()]),
        });
        let recreating = Resolved::default();
        assert_ne!(spec_hash(&a, &recreating), spec_hash(&b, &recreating));
        let in_place = Resolved {
            egress_in_place: true,
            ..Resolved::default()
        };
        assert_eq!(spec_hash(&a, &in_place), spec_hash(&b, &in_place));

        // A provider with placements: a change of placement recreates, a change within one
        // does not, and a provider without placements keeps its hashes.
        let placed = |p: &'static str| Resolved {
            egress_in_place: true,
            egress_placement: Some(p),
            ..Resolved::default()
        };
        assert_ne!(
            spec_hash(&a, &placed("open")),
            spec_hash(&b, &placed("gateway"))
        );
        let mut c = base_spec();
        c.egress = Some(EgressSpec {
            allowed_domains: Some(vec!["other.example.com".into()]),
        });
        assert_eq!(
            spec_hash(&b, &placed("gateway")),
            spec_hash(&c, &placed("gateway"))
        );
        assert_ne!(spec_hash(&b, &placed("gateway")), spec_hash(&b, &in_place));
    }

    #[test]
    fn secret_values_do_not_change_the_hash_but_clashes_are_errors() {
        let mut spec = base_spec();
        spec.env = Some(vec![EnvVar {
            name: "A".into(),
            value: "1".into(),
        }]);
        let mut r1 = Resolved::default();
        r1.secret_env.insert("B".into(), "secret-1".into());
        let mut r2 = Resolved::default();
        r2.secret_env.insert("B".into(), "secret-2".into());
        assert_eq!(spec_hash(&spec, &r1), spec_hash(&spec, &r2));
        let d = desired(&sandbox(spec.clone()), "ops", &r1).unwrap();
        assert_eq!(d.request.env.get("B").map(String::as_str), Some("secret-1"));
        assert!(!format!("{d:?}").contains("secret-1"));
        let mut clash = Resolved::default();
        clash.secret_env.insert("A".into(), "x".into());
        assert!(
            desired(&sandbox(spec), "ops", &clash)
                .unwrap_err()
                .contains("both in spec.env")
        );
    }

    #[test]
    fn a_recorded_registry_digest_pins_the_image_unless_always() {
        let digest = format!("r:5000/app@sha256:{}", "a".repeat(64));
        let mut spec = base_spec();
        spec.image = Some("r:5000/app:1".into());
        let status = SandboxStatus {
            image: Some("r:5000/app:1".into()),
            image_digest: Some(digest.clone()),
            ..SandboxStatus::default()
        };
        assert_eq!(image_to_boot(&spec, Some(&status)), Some(digest.clone()));
        assert_eq!(image_to_boot(&spec, None).as_deref(), Some("r:5000/app:1"));
        spec.image_pull_policy = Some(ImagePullPolicy::Never);
        assert_eq!(image_to_boot(&spec, Some(&status)), Some(digest.clone()));
        spec.image_pull_policy = Some(ImagePullPolicy::Always);
        assert_eq!(
            image_to_boot(&spec, Some(&status)).as_deref(),
            Some("r:5000/app:1")
        );

        let mut moved = base_spec();
        moved.image = Some("r:5000/app:2".into());
        assert_eq!(
            image_to_boot(&moved, Some(&status)).as_deref(),
            Some("r:5000/app:2")
        );

        let local = SandboxStatus {
            image: Some("img".into()),
            image_digest: Some("sha256:0123".into()),
            ..SandboxStatus::default()
        };
        assert_eq!(
            image_to_boot(&base_spec(), Some(&local)).as_deref(),
            Some("img")
        );

        let mut s = sandbox(spec);
        s.status = Some(status);
        let d = desired(&s, "ops", &Resolved::default()).unwrap();
        assert_eq!(
            d.request.image_pull_policy,
            provider::ImagePullPolicy::Always
        );
        let mut pinned = s.clone();
        pinned.spec.image_pull_policy = None;
        let p = desired(&pinned, "ops", &Resolved::default()).unwrap();
        assert_eq!(p.request.image, Some(digest));
        assert_eq!(
            p.spec_hash, d.spec_hash,
            "the pin and the policy never force a recreate"
        );
    }

    #[test]
    fn bad_quantities_name_the_field() {
        let mut spec = base_spec();
        spec.resources = Some(ResourcesSpec {
            cpu: None,
            memory: Some(Quantity("lots".into())),
            disk: None,
            pids: None,
        });
        assert!(
            desired(&sandbox(spec), "ops", &Resolved::default())
                .unwrap_err()
                .contains("spec.resources.memory")
        );
    }

    #[test]
    fn a_store_template_boots_its_base_image_and_is_restored() {
        let mut spec = base_spec();
        spec.image = None;
        let mut resolved = Resolved {
            template_id: Some("tpl".into()),
            boot: Some(Boot::Restore {
                image: Some("base:1".into()),
            }),
            ..Resolved::default()
        };
        let d = desired(&sandbox(spec.clone()), "ops", &resolved).unwrap();
        assert_eq!(d.request.image.as_deref(), Some("base:1"));
        assert_eq!(
            d.request.template, None,
            "the provider cannot boot it itself"
        );
        assert_eq!(d.restore.as_deref(), Some("tpl"));
        assert_eq!(
            d.request.labels.get(TEMPLATE).map(String::as_str),
            Some("tpl")
        );
        // A native template is the provider's to boot; nothing is restored.
        resolved.boot = Some(Boot::Native);
        let d = desired(&sandbox(spec), "ops", &resolved).unwrap();
        assert_eq!(d.request.template.as_deref(), Some("tpl"));
        assert_eq!(d.restore, None);
    }
}
