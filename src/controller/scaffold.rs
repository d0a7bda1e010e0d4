//! The reconcile scaffold every kind shares: time the reconcile, hand off through
//! kube-runtime's `finalizer()` to the kind's apply or cleanup, reset the object's backoff on
//! success, and on failure count the error and pick the retry delay.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::{Context, Error, Result};
use crate::api::FINALIZER;

/// The backoff key of an object: `Kind/namespace/name`.
pub fn key<K: ResourceExt>(kind: &str, object: &K) -> String {
    format!(
        "{kind}/{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// One reconcile of a namespaced `object` of `kind`, in a span naming it: `apply` converges a
/// live object, `cleanup` releases a deleted one's provider resources before the finalizer
/// goes.
pub async fn reconcile<K, FA, FC, A, C>(
    kind: &'static str,
    object: Arc<K>,
    ctx: &Context,
    apply: FA,
    cleanup: FC,
) -> Result<Action>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
    FA: FnOnce(Arc<K>) -> A,
    FC: FnOnce(Arc<K>) -> C,
    A: Future<Output = Result<Action>>,
    C: Future<Output = Result<Action>>,
{
    let _timer = ctx.metrics.reconcile_timer(kind);
    let ns = object.namespace().unwrap_or_default();
    let key = key(kind, object.as_ref());
    let span = tracing::info_span!("reconcile", kind, namespace = %ns, name = %object.name_any());
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &ns);
    let result = async {
        let object = with_finalizer(&api, object).await?;
        super::finalizer_outcome(
            finalizer(&api, FINALIZER, object, |event| async {
                match event {
                    Finalizer::Apply(o) => apply(o).await,
                    Finalizer::Cleanup(o) => cleanup(o).await,
                }
            })
            .await,
        )
    }
    .instrument(span)
    .await;
    if result.is_ok() {
        ctx.backoff.reset(&key);
    }
    result
}

/// The object with our finalizer on it: a live object without one gets it added here, and the
/// object the API server returns goes on to `apply` in this same pass. kube-runtime's
/// `finalizer()` would add it and end the pass, waiting for the watch to bring the change
/// back: a second reconcile and a watch round trip on every create's path to Ready. The patch
/// is the same guarded JSON patch (it fails, and the pass is retried, if someone else changed
/// the finalizers meanwhile). Being deleted, or already carrying it: returned unchanged.
async fn with_finalizer<K>(api: &Api<K>, object: Arc<K>) -> Result<Arc<K>>
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
    let ours = object.finalizers().iter().any(|f| f == FINALIZER);
    if ours || object.meta().deletion_timestamp.is_some() {
        return Ok(object);
    }
    let ops = if object.finalizers().is_empty() {
        serde_json::json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
        ])
    } else {
        serde_json::json!([
            {"op": "test", "path": "/metadata/finalizers", "value": object.finalizers()},
            {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER},
        ])
    };
    let patch = Patch::<()>::Json(
        serde_json::from_value(ops).map_err(|e| Error::Finalizer(format!("patch: {e}")))?,
    );
    let patched = api
        .patch(&object.name_any(), &PatchParams::default(), &patch)
        .await?;
    Ok(Arc::new(patched))
}

/// Counts the failure and retries with per-object exponential backoff, never sooner than the
/// provider asked (`Retry-After`).
pub fn error_policy<K: ResourceExt>(
    kind: &'static str,
    object: &K,
    err: &Error,
    ctx: &Context,
) -> Action {
    ctx.metrics.reconcile_error(kind, err.category());
    let key = key(kind, object);
    let delay = retry_delay(ctx.backoff.next_delay(&key), err);
    tracing::warn!(object = %key, error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// The backoff delay, raised to what the provider asked for when it said how long to wait.
pub fn retry_delay(backoff: Duration, err: &Error) -> Duration {
    match err {
        Error::Provider(p) => p.retry_after().map_or(backoff, |after| backoff.max(after)),
        _ => backoff,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::ProviderError;

    #[test]
    fn retry_after_raises_the_backoff_but_never_lowers_it() {
        let throttled = Error::Provider(
            ProviderError::transient("429").with_retry_after(Some(Duration::from_secs(30))),
        );
        assert_eq!(
            retry_delay(Duration::from_secs(1), &throttled),
            Duration::from_secs(30)
        );
        assert_eq!(
            retry_delay(Duration::from_secs(60), &throttled),
            Duration::from_secs(60)
        );
        let plain = Error::Provider(ProviderError::transient("500"));
        assert_eq!(
            retry_delay(Duration::from_secs(2), &plain),
            Duration::from_secs(2)
        );
        let kube = Error::Dependency("x".into());
        assert_eq!(
            retry_delay(Duration::from_secs(2), &kube),
            Duration::from_secs(2)
        );
    }
}
