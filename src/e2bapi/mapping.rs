//! The mapping (pure) between an E2B create request and a Sandbox object, and back to what
//! get and list answer. What has no faithful mapping is refused with a 400 that says why.
//!
//! - `templateID` claims from a SandboxWarmPool of that name in the key's namespace (the
//!   Sandbox gets `spec.warmPoolRef`), else boots a SandboxTemplate of that name, else the
//!   image the platform team aliased to it (`e2bApi.templates`); see [`super::boot`];
//! - `timeout` is `spec.lifetime.shutdownAt` (now + timeout), action `Delete`, or `Sleep`
//!   with `autoPause`;
//! - `metadata` is one JSON annotation ([`METADATA_ANNOTATION`]) plus, per entry, a label of
//!   hashes ([`metadata_label`]) that the list filter selects on;
//! - `envVars` is `spec.env`; `network.allowOut` (domains) under a deny-all is
//!   `spec.egress.allowedDomains`, `allow_internet_access: false` alone an empty allow-list;
//! - the port URLs answer only requests carrying the sandbox's traffic access token (see
//!   `ports`), unless the create asked for `network.allowPublicTraffic: true`
//!   ([`PUBLIC_TRAFFIC_ANNOTATION`] `"true"`). E2B leaves them public by default; here the
//!   tenant is the namespace, and a sandbox id alone must not open a route into it for
//!   anyone who can reach the listener.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use sha2::{Digest, Sha256};

use super::error::ApiError;
use super::keys::Tenant;
use super::wire::{NetworkConfig, NewSandbox};
use crate::api::{
    DesiredState, EgressSpec, EnvVar, Lifetime, LifetimeAction, LocalObjectRef, Sandbox,
    SandboxSpec,
};

/// Marks the Sandboxes this API made (the list selects on it).
pub const MANAGED_LABEL: &str = "e2b.sandboxes.dev/sandbox";
/// The user metadata, as a JSON object.
pub const METADATA_ANNOTATION: &str = "e2b.sandboxes.dev/metadata";
/// The template id as the client gave it.
pub const TEMPLATE_ANNOTATION: &str = "e2b.sandboxes.dev/template-id";
/// `"true"` when the sandbox pauses (rather than dies) at its timeout.
pub const AUTO_PAUSE_ANNOTATION: &str = "e2b.sandboxes.dev/auto-pause";
/// The API key Secret the sandbox was created with (its name, never the key).
pub const KEY_ANNOTATION: &str = "e2b.sandboxes.dev/api-key";
/// The identity the sandbox was created as.
pub const CREATOR_ANNOTATION: &str = "e2b.sandboxes.dev/created-by";
/// `"true"` when the sandbox's port URLs are public (`network.allowPublicTraffic: true`);
/// anything else needs its traffic access token.
pub const PUBLIC_TRAFFIC_ANNOTATION: &str = "e2b.sandboxes.dev/public-traffic";
/// Prefix of the metadata index labels.
const METADATA_LABEL_PREFIX: &str = "meta.e2b.sandboxes.dev/";
/// The v1 create's default timeout (the spec's); the v2 SDKs always send one.
pub const DEFAULT_TIMEOUT_SECS: i64 = 15;
/// A deny-all entry of `denyOut`.
const DENY_ALL: &[&str] = &["0.0.0.0/0", "::/0"];

/// What a template id boots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Boot {
    /// The SandboxTemplate of this name in the key's namespace.
    Template(String),
    /// An image the platform team aliased to the id.
    Image(String),
    /// The SandboxWarmPool of this name in the key's namespace: the create is a claim, so
    /// only what a running member takes without a restart may come with it.
    Pool(String),
}

/// The Sandbox object `request` asks for, named `name` in the tenant's namespace.
pub fn sandbox(
    request: &NewSandbox,
    boot: Boot,
    tenant: &Tenant,
    name: &str,
    now: DateTime<Utc>,
) -> Result<Sandbox, ApiError> {
    refuse_unmapped(request)?;
    let auto_pause = auto_pause(request)?;
    let timeout = request.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS);
    let (image, template_ref, warm_pool_ref) = match boot {
        Boot::Template(t) => (None, Some(LocalObjectRef { name: t }), None),
        Boot::Image(i) => (Some(i), None, None),
        Boot::Pool(p) => (None, None, Some(LocalObjectRef { name: p })),
    };
    let egress = egress(request.allow_internet_access, request.network.as_ref())?;
    if let (Some(pool), Some(_)) = (&warm_pool_ref, &egress) {
        return Err(ApiError::bad_request(format!(
            "network (and allow_internet_access: false) cannot be set when the template id \
             names SandboxWarmPool {:?}: a claimed member is already running, with the pool's \
             spec.template.egress; set egress on the pool, or create from a template that is \
             not a pool",
            pool.name
        )));
    }
    let spec = SandboxSpec {
        image,
        template_ref,
        warm_pool_ref,
        env: env(request.env_vars.as_ref())?,
        egress,
        lifetime: Some(lifetime(timeout, auto_pause, now)?),
        ..SandboxSpec::default()
    };
    let mut object = Sandbox::new(name, spec);
    object.metadata.namespace = Some(tenant.namespace.clone());
    object.metadata.labels = Some(labels(request.metadata.as_ref()));
    object.metadata.annotations = Some(annotations(request, tenant, auto_pause)?);
    Ok(object)
}

/// The fields of the spec this API has no mapping for, refused by name.
fn refuse_unmapped(r: &NewSandbox) -> Result<(), ApiError> {
    if let Some(field) = r.rest.keys().next() {
        return Err(ApiError::bad_request(format!(
            "field {field:?} is not supported by this E2B-compatible API"
        )));
    }
    let set = |v: &Option<serde_json::Value>| v.as_ref().is_some_and(|v| !v.is_null());
    let unsupported = [
        ("mcp", set(&r.mcp)),
        ("iam", set(&r.iam)),
        (
            "volumeMounts",
            r.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()),
        ),
    ];
    match unsupported.iter().find(|(_, on)| *on) {
        Some((field, _)) => Err(ApiError::bad_request(format!(
            "{field} is not supported by this E2B-compatible API; remove it"
        ))),
        None => Ok(()),
    }
}

/// `autoPause` (with memory, and no auto-resume): the lifetime action `Sleep`.
fn auto_pause(r: &NewSandbox) -> Result<bool, ApiError> {
    let resume_on = r
        .auto_resume
        .as_ref()
        .and_then(|v| v.get("enabled"))
        .is_some_and(|e| e != &serde_json::Value::Bool(false));
    if resume_on {
        return Err(ApiError::bad_request(
            "autoResume is not supported: resume a paused sandbox with Sandbox.connect",
        ));
    }
    let on = r.auto_pause.unwrap_or(false);
    if on && r.auto_pause_memory == Some(false) {
        return Err(ApiError::bad_request(
            "autoPauseMemory: false (a filesystem-only pause) is not supported; a pause keeps \
             processes where the provider can",
        ));
    }
    Ok(on)
}

/// `envVars` as `spec.env`, names checked as the CRD checks them.
fn env(vars: Option<&BTreeMap<String, String>>) -> Result<Option<Vec<EnvVar>>, ApiError> {
    let Some(vars) = vars.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let valid = |n: &str| {
        n.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let mut env = Vec::with_capacity(vars.len());
    for (name, value) in vars {
        if !valid(name) {
            return Err(ApiError::bad_request(format!(
                "envVars: {name:?} is not a variable name (letters, digits and _, not starting \
                 with a digit)"
            )));
        }
        env.push(EnvVar {
            name: name.clone(),
            value: value.clone(),
        });
    }
    Ok(Some(env))
}

/// `allow_internet_access` and `network` as `spec.egress` (domains only).
pub fn egress(
    internet: Option<bool>,
    network: Option<&NetworkConfig>,
) -> Result<Option<EgressSpec>, ApiError> {
    let default = NetworkConfig::default();
    let n = network.unwrap_or(&default);
    if let Some(field) = n.rest.keys().next() {
        return Err(ApiError::bad_request(format!(
            "network.{field} is not supported by this E2B-compatible API"
        )));
    }
    let deny = n.deny_out.as_deref().unwrap_or_default();
    if let Some(other) = deny.iter().find(|d| !DENY_ALL.contains(&d.as_str())) {
        return Err(ApiError::bad_request(format!(
            "network.denyOut {other:?}: only a deny-all (0.0.0.0/0) can be enforced; allow \
             what the sandbox may reach with allowOut domains instead"
        )));
    }
    let allow = n.allow_out.clone().unwrap_or_default();
    allow.iter().try_for_each(|d| check_domain(d))?;
    let closed = !deny.is_empty() || internet == Some(false);
    match (closed, allow.is_empty()) {
        (true, _) => Ok(Some(EgressSpec {
            allowed_domains: Some(allow),
        })),
        (false, true) => Ok(None),
        (false, false) => Err(ApiError::bad_request(
            "network.allowOut without denyOut [\"0.0.0.0/0\"] (or allow_internet_access: \
             false) restricts nothing; add the deny-all to limit egress to allowOut",
        )),
    }
}

/// An `allowOut` entry must be a domain (optionally `*.`): addresses cannot be enforced.
fn check_domain(d: &str) -> Result<(), ApiError> {
    let host = d.strip_prefix("*.").unwrap_or(d);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let numeric = host.chars().all(|c| c.is_ascii_digit() || c == '.');
    if numeric || host.contains('/') || host.contains(':') || !host.split('.').all(label_ok) {
        return Err(ApiError::bad_request(format!(
            "network.allowOut {d:?}: only lowercase domain names (optionally *.domain) can be \
             enforced, not IP addresses or CIDR blocks"
        )));
    }
    Ok(())
}

/// `shutdownAt` = now + `timeout`, then delete (or sleep).
pub fn lifetime(timeout: i64, sleep: bool, now: DateTime<Utc>) -> Result<Lifetime, ApiError> {
    if !(0..=i64::from(u32::MAX)).contains(&timeout) {
        return Err(ApiError::bad_request(format!(
            "timeout {timeout}: seconds from now, at least 0"
        )));
    }
    let at = now + chrono::Duration::seconds(timeout);
    Ok(Lifetime {
        shutdown_at: Some(at.to_rfc3339_opts(SecondsFormat::Secs, true)),
        ttl_seconds: None,
        action: Some(if sleep {
            LifetimeAction::Sleep
        } else {
            LifetimeAction::Delete
        }),
    })
}

/// The managed label and one index label per metadata entry.
fn labels(metadata: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([(MANAGED_LABEL.to_string(), "true".to_string())]);
    labels.extend(
        metadata
            .into_iter()
            .flatten()
            .map(|(k, v)| metadata_label(k, v)),
    );
    labels
}

/// The index label of one metadata entry: hashes, since keys and values are free text.
pub fn metadata_label(key: &str, value: &str) -> (String, String) {
    let short = |s: &str| hex(&Sha256::digest(s.as_bytes())[..10]);
    (
        format!("{METADATA_LABEL_PREFIX}k{}", short(key)),
        short(value),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn annotations(
    r: &NewSandbox,
    tenant: &Tenant,
    auto_pause: bool,
) -> Result<BTreeMap<String, String>, ApiError> {
    let metadata = serde_json::to_string(&r.metadata.clone().unwrap_or_default())
        .map_err(|e| ApiError::bad_request(format!("metadata: {e}")))?;
    let creator = format!(
        "system:serviceaccount:{}:{}",
        tenant.namespace, tenant.service_account
    );
    Ok(BTreeMap::from([
        (METADATA_ANNOTATION.into(), metadata),
        (TEMPLATE_ANNOTATION.into(), r.template_id.clone()),
        (AUTO_PAUSE_ANNOTATION.into(), auto_pause.to_string()),
        (KEY_ANNOTATION.into(), tenant.key_name.clone()),
        (CREATOR_ANNOTATION.into(), creator),
        (
            PUBLIC_TRAFFIC_ANNOTATION.into(),
            public_traffic(r).to_string(),
        ),
    ]))
}

/// Whether the request opens the port URLs to anyone (only an explicit
/// `allowPublicTraffic: true` does: a tenant's own choice, never a default).
fn public_traffic(r: &NewSandbox) -> bool {
    r.network.as_ref().and_then(|n| n.allow_public_traffic) == Some(true)
}

/// Whether the sandbox's port URLs need its traffic access token: always, unless the
/// Sandbox says `"true"` — fail closed, so one without the annotation (or with a value
/// someone typed by hand) is restricted.
pub fn restricts_traffic(s: &Sandbox) -> bool {
    annotation(s, PUBLIC_TRAFFIC_ANNOTATION) != Some("true")
}

/// The metadata of a Sandbox this API made (empty when absent or unreadable).
pub fn metadata_of(s: &Sandbox) -> BTreeMap<String, String> {
    s.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(METADATA_ANNOTATION))
        .and_then(|m| serde_json::from_str(m).ok())
        .unwrap_or_default()
}

/// Whether the sandbox pauses at its timeout.
pub fn auto_pauses(s: &Sandbox) -> bool {
    annotation(s, AUTO_PAUSE_ANNOTATION) == Some("true")
}

/// The value of one annotation of the object.
fn annotation<'a>(s: &'a Sandbox, key: &str) -> Option<&'a str> {
    s.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// `paused` when the spec or a passed sleeping lifetime suspends it, else `running`.
pub fn state_of(s: &Sandbox, now: DateTime<Utc>) -> &'static str {
    let asleep = matches!(
        s.spec.state,
        Some(DesiredState::Sleeping | DesiredState::Stopped)
    );
    let slept = s.spec.lifetime.as_ref().is_some_and(|l| {
        l.action == Some(LifetimeAction::Sleep) && end_of(l).is_some_and(|at| at <= now)
    });
    if asleep || slept { "paused" } else { "running" }
}

/// When the lifetime ends; `None` without a `shutdownAt`.
pub fn end_of(l: &Lifetime) -> Option<DateTime<Utc>> {
    let at = DateTime::parse_from_rfc3339(l.shutdown_at.as_deref()?).ok()?;
    Some(at.with_timezone(&Utc))
}

#[cfg(test)]
#[path = "mapping_tests.rs"]
mod tests;
