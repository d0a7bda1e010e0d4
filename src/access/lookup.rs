//! Which sandbox a request reaches: the Sandbox named by the URL's namespace and name (never
//! an id the client sends), its provider through the registry, and the provider's id from
//! its status — acted on only once the provider confirms that the resource under that id
//! belongs to this very object (its owner-uid label), because status is never authority.
//! A request that needs the sandbox running counts as traffic for idleness, and wakes a
//! sandbox that idleness parked ([`activity`]).

use std::sync::Arc;

use async_trait::async_trait;
use kube::{Api, Client};

use super::activity::{self, Heartbeat};
use super::status::AccessError;
use crate::api::common::{CONDITION_READY, condition};
use crate::api::sandbox::Sandbox;
use crate::provider::SandboxState;
use crate::provider::labels::{Claim, ensure_owned_or_claimed};
use crate::registry::{ProviderHandle, ProviderRegistry};

/// What a subresource needs of the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Ready and running: exec, attach, port-forward, files. A Sandbox being deleted still
    /// serves them until its provider resource goes, as a terminating Pod's exec does.
    Running,
    /// Running and not being deleted: the E2B API's envd and port URLs, where a killed
    /// sandbox is gone at once (404 while its finalizer still removes it).
    Live,
    /// Only that it exists at the provider: its log is readable whatever its state (a
    /// crashed sandbox's log is what its owner wants to read).
    Existing,
}

impl Need {
    /// Whether the sandbox must be Ready and running.
    fn running(self) -> bool {
        matches!(self, Need::Running | Need::Live)
    }
}

/// The sandbox a request reaches.
#[derive(Clone)]
pub struct Target {
    /// Its provider.
    pub handle: ProviderHandle,
    /// The provider's id.
    pub id: String,
    /// Records traffic for idleness while whoever holds it (a session) lasts; `None` when
    /// the sandbox has no idle policy or the request does not use it.
    pub heartbeat: Option<Arc<Heartbeat>>,
}

/// Finds sandboxes by namespace and name.
#[async_trait]
pub trait Directory: Send + Sync {
    /// The sandbox `namespace/name`: 404 when there is none, 409 when it is not in the state
    /// `need` asks for.
    async fn find(&self, namespace: &str, name: &str, need: Need) -> Result<Target, AccessError>;
}

/// Sandboxes read from the API server, providers from the registry.
pub struct Sandboxes {
    client: Client,
    providers: ProviderRegistry,
}

impl Sandboxes {
    /// A directory over `client` and `providers`.
    pub fn new(client: Client, providers: ProviderRegistry) -> Self {
        Sandboxes { client, providers }
    }

    async fn get(&self, namespace: &str, name: &str) -> Result<Sandbox, AccessError> {
        let api: Api<Sandbox> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name)
            .await
            .map_err(|e| AccessError::Unavailable(format!("cannot read the Sandbox: {e}")))?
            .ok_or_else(|| {
                AccessError::NotFound(format!(
                    "sandboxes.sandboxes.dev {name:?} not found in namespace {namespace:?}"
                ))
            })
    }
}

/// 409 unless the Sandbox's `Ready` condition is true.
fn check_ready(sandbox: &Sandbox, what: &str) -> Result<(), AccessError> {
    let conditions = sandbox
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    match condition(conditions, CONDITION_READY) {
        Some(c) if c.is_true() => Ok(()),
        Some(c) => Err(AccessError::Conflict(format!(
            "sandbox {what} is not Ready ({}: {}); wait for it with `kubectl wait --for=condition=Ready sandbox/{}`",
            c.reason,
            c.message,
            sandbox.metadata.name.as_deref().unwrap_or_default()
        ))),
        None => Err(AccessError::Conflict(format!(
            "sandbox {what} is not Ready yet (the operator has not reported on it)"
        ))),
    }
}

#[async_trait]
impl Directory for Sandboxes {
    async fn find(&self, namespace: &str, name: &str, need: Need) -> Result<Target, AccessError> {
        let what = format!("{namespace}/{name}");
        let mut sandbox = self.get(namespace, name).await?;
        if need == Need::Live && sandbox.metadata.deletion_timestamp.is_some() {
            return Err(AccessError::NotFound(format!(
                "sandbox {what} was killed: its Sandbox is being deleted"
            )));
        }
        if need.running() {
            sandbox = activity::before_use(&self.client, sandbox).await?;
            check_ready(&sandbox, &what)?;
        }
        let status = sandbox.status.as_ref();
        let provider = status
            .and_then(|s| s.provider.as_deref())
            .or(sandbox.spec.provider.as_deref());
        let handle = self
            .providers
            .resolve(provider)
            .map_err(AccessError::Conflict)?
            .clone();
        let id = status.and_then(|s| s.sandbox_id.clone()).ok_or_else(|| {
            AccessError::Conflict(format!("sandbox {what} has no provider id yet"))
        })?;
        let uid = sandbox.metadata.uid.clone().unwrap_or_default();
        // A claimed warm pool member is the Sandbox's through its pool's ledger.
        let claim = crate::claims::proof(&self.client, &sandbox)
            .await
            .map_err(|e| AccessError::Unavailable(format!("cannot read the warm pool: {e}")))?;
        let heartbeat = need
            .running()
            .then(|| activity::heartbeat(&self.client, &sandbox))
            .flatten();
        let target = Target {
            handle,
            id,
            heartbeat,
        };
        confirm(&target, &uid, claim.as_ref(), &what, need).await?;
        Ok(target)
    }
}

/// Asks the provider what is under the id, and accepts it only when it is this object's
/// (and running, when `need` says so).
async fn confirm(
    target: &Target,
    uid: &str,
    claim: Option<&Claim>,
    what: &str,
    need: Need,
) -> Result<(), AccessError> {
    let described = target
        .handle
        .call("describe", target.handle.provider.describe(&target.id))
        .await
        .map_err(|e| AccessError::from_provider(&format!("sandbox {what}"), &e))?;
    let gone = || AccessError::NotFound(format!("sandbox {what} is gone at its provider"));
    let d = described.ok_or_else(gone)?;
    if uid.is_empty() || ensure_owned_or_claimed("", &target.id, &d.labels, uid, claim).is_err() {
        return Err(gone());
    }
    if need.running() && d.state != SandboxState::Running {
        return Err(AccessError::Conflict(format!(
            "sandbox {what} is not running (it is {:?}); set spec.state: Running",
            d.state
        )));
    }
    Ok(())
}
