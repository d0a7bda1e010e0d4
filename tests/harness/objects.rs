//! Waiting on the objects a test applied, the one way every test does it: Ready at the
//! object's current generation, gone after a delete, and a spec changed the way
//! `kubectl patch --type merge` changes it. Each wait polls with a deadline and, when it gives
//! up, names the object, what it waited for, the object's last conditions and where the
//! operator's log is.

use std::fmt::Debug;
use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use sandbox_operator::api::{Condition, Sandbox, SandboxTemplate, SandboxVolume, SandboxWarmPool};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::operator::Operator;
use super::wait_for;

/// How long a Sandbox on a local engine or a double gets to become Ready (or to be gone
/// after a delete); slower worlds pass their own bound to the `_within` forms.
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// A kind of ours: reconciled by the operator, with conditions and an observed generation.
pub trait Reconciled:
    kube::Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Serialize
{
    /// Its status conditions (none before the first status write).
    fn conditions(&self) -> &[Condition];
    /// The generation its status describes.
    fn observed_generation(&self) -> Option<i64>;
}

macro_rules! reconciled {
    ($($kind:ty),*) => {$(
        impl Reconciled for $kind {
            fn conditions(&self) -> &[Condition] {
                self.status.as_ref().map_or(&[], |s| s.conditions.as_slice())
            }
            fn observed_generation(&self) -> Option<i64> {
                self.status.as_ref().and_then(|s| s.observed_generation)
            }
        }
    )*};
}
reconciled!(Sandbox, SandboxTemplate, SandboxVolume, SandboxWarmPool);

/// What reconciles a test's objects, named (with where it logs) when a wait gives up.
pub trait Logged {
    /// Where to read what it did, e.g. `operator log: /path`.
    fn where_logged(&self) -> String;
}

impl Logged for Operator {
    fn where_logged(&self) -> String {
        format!("operator log: {}", self.log.display())
    }
}

/// The provider's id of the Sandbox `s` from its status; panics when none is recorded.
pub fn sandbox_id(s: &Sandbox) -> String {
    s.status
        .as_ref()
        .and_then(|st| st.sandbox_id.clone())
        .unwrap_or_else(|| panic!("no status.sandboxId on Sandbox {:?}", s.metadata.name))
}

/// `[type=status reason: message, …]` of `object`'s conditions, for a message.
pub fn describe_conditions<K: Reconciled>(object: &K) -> String {
    let each: Vec<String> = object
        .conditions()
        .iter()
        .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
        .collect();
    format!("[{}]", each.join(", "))
}

/// `Ok` when `object` is Ready=True for its current generation; else why not.
pub fn is_ready<K: Reconciled>(object: &K) -> Result<(), String> {
    let current = object.observed_generation() == object.meta().generation;
    let ready = sandbox_operator::api::condition(object.conditions(), "Ready");
    match ready {
        Some(c) if c.status == "True" && current => Ok(()),
        _ => Err(format!(
            "observedGeneration {:?} of generation {:?}, conditions {}",
            object.observed_generation(),
            object.meta().generation,
            describe_conditions(object)
        )),
    }
}

/// Polls `name` until `check` accepts it and returns it; panics after `timeout` naming the
/// object, `what` was awaited, `check`'s last answer and where `by` logs.
pub async fn wait_object<K, F>(
    api: &Api<K>,
    name: &str,
    by: &impl Logged,
    what: &str,
    timeout: Duration,
    check: F,
) -> K
where
    K: Reconciled,
    F: Fn(&K) -> Result<(), String>,
{
    let desc = format!("{} {name}: {what} ({})", K::kind(&()), by.where_logged());
    wait_for(&desc, timeout, || async {
        let object = api.get(name).await.map_err(|e| e.to_string())?;
        check(&object).map(|()| object)
    })
    .await
}

/// Waits (up to [`READY_TIMEOUT`]) for `name` to be Ready=True at its current generation.
pub async fn wait_ready<K: Reconciled>(api: &Api<K>, name: &str, by: &impl Logged) -> K {
    wait_ready_within(api, name, by, READY_TIMEOUT).await
}

/// [`wait_ready`] with a bound of the caller's.
pub async fn wait_ready_within<K: Reconciled>(
    api: &Api<K>,
    name: &str,
    by: &impl Logged,
    timeout: Duration,
) -> K {
    wait_object(api, name, by, "Ready", timeout, is_ready).await
}

/// Waits until `name` no longer exists; the panic names its finalizers and conditions.
pub async fn wait_gone<K: Reconciled>(api: &Api<K>, name: &str, timeout: Duration) {
    let what = format!("{} {name} to be gone", K::kind(&()));
    wait_for(&what, timeout, || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(()),
            Ok(Some(object)) => Err(format!(
                "still there, finalizers {:?}, conditions {}",
                object.meta().finalizers,
                describe_conditions(&object)
            )),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
}

/// Deletes `name` and waits (up to [`READY_TIMEOUT`]) until it is gone: the operator's
/// cleanup ran and released the finalizer.
pub async fn delete_and_wait_gone<K: Reconciled>(api: &Api<K>, name: &str) {
    delete_and_wait_gone_within(api, name, READY_TIMEOUT).await;
}

/// [`delete_and_wait_gone`] with a bound of the caller's.
pub async fn delete_and_wait_gone_within<K: Reconciled>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
) {
    if let Err(e) = api.delete(name, &DeleteParams::default()).await {
        panic!("deleting {} {name}: {e}", K::kind(&()));
    }
    wait_gone(api, name, timeout).await;
}

/// Merges `spec` into `name`'s spec, as `kubectl patch --type merge` would.
pub async fn patch_spec<K: Reconciled>(api: &Api<K>, name: &str, spec: Value) {
    let patch = Patch::Merge(json!({ "spec": spec }));
    if let Err(e) = api.patch(name, &PatchParams::default(), &patch).await {
        panic!("patching the spec of {} {name}: {e}", K::kind(&()));
    }
}

/// Waits (up to `timeout`) until pool `name` is Ready with exactly `ready` unclaimed members,
/// all Ready: a fill, a refill or a scale has settled.
pub async fn wait_pool_within(
    api: &Api<SandboxWarmPool>,
    name: &str,
    ready: i32,
    by: &impl Logged,
    timeout: Duration,
) -> SandboxWarmPool {
    let what = format!("{ready} ready members");
    wait_object(api, name, by, &what, timeout, |p| {
        is_ready(p)?;
        let s = p.status.clone().unwrap_or_default();
        match s.ready_replicas == ready && s.replicas == ready {
            true => Ok(()),
            false => Err(format!(
                "replicas {} ready {}",
                s.replicas, s.ready_replicas
            )),
        }
    })
    .await
}
