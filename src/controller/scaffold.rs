//! The reconcile scaffold every kind shares: time the reconcile, put our finalizer on a new
//! object alongside its first pass (see [`FinalizerAdded`]) or hand off through kube-runtime's
//! `finalizer()` to the kind's apply or cleanup, reset the object's backoff on success, and
//! on failure count the error and pick the retry delay.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::oneshot;
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
/// live object (waiting on [`FinalizerAdded`] before it touches a provider), `cleanup`
/// releases a deleted one's provider resources before the finalizer goes.
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
    FA: FnOnce(Arc<K>, FinalizerAdded) -> A,
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
        if !needs_finalizer(object.as_ref()) {
            return super::finalizer_outcome(
                finalizer(&api, FINALIZER, object, |event| async {
                    match event {
                        Finalizer::Apply(o) => apply(o, FinalizerAdded::already()).await,
                        Finalizer::Cleanup(o) => cleanup(o).await,
                    }
                })
                .await,
            );
        }
        // A new object: its finalizer is added while the pass does its first API work; the
        // pass waits for it before any provider call (see `FinalizerAdded`).
        let (added_tx, added_rx) = oneshot::channel();
        let add = async {
            let added = add_finalizer(&api, object.as_ref()).await;
            let _ = added_tx.send(added.is_ok());
            added
        };
        let (added, applied) = tokio::join!(
            add,
            apply(Arc::clone(&object), FinalizerAdded(Some(added_rx)))
        );
        added?;
        applied
    }
    .instrument(span)
    .await;
    if result.is_ok() {
        ctx.backoff.reset(&key);
    }
    result
}

/// Resolves once our finalizer is on the object in the API server.
///
/// kube-runtime's `finalizer()` adds it and ends the pass, waiting for the watch to bring the
/// change back: a second reconcile, and a patch plus a watch round trip, on every create's
/// path to Ready. Here the pass goes on at once and adds it alongside its first API work; the
/// one rule is that nothing is created at a provider before the finalizer is on (else a
/// deletion could skip the cleanup), so `apply` waits on this before its first provider call.
pub struct FinalizerAdded(Option<oneshot::Receiver<bool>>);

impl FinalizerAdded {
    /// The object already carries it.
    pub fn already() -> Self {
        Self(None)
    }

    /// Waits until it is on. An error when adding it failed: the pass ends and is retried
    /// (the scaffold reports the API server's error).
    pub async fn wait(self) -> Result<()> {
        match self.0 {
            None => Ok(()),
            Some(added) => match added.await {
                Ok(true) => Ok(()),
                _ => Err(Error::Finalizer(format!(
                    "adding {FINALIZER} failed; retrying"
                ))),
            },
        }
    }
}

/// Whether a live object lacks our finalizer (a deleted one never gets it again).
fn needs_finalizer<K: Resource>(object: &K) -> bool {
    object.meta().deletion_timestamp.is_none()
        && !object.finalizers().iter().any(|f| f == FINALIZER)
}

/// Adds our finalizer by the same guarded JSON patch kube-runtime uses: it fails, and the
/// pass is retried, if someone else changed the finalizers meanwhile.
async fn add_finalizer<K>(api: &Api<K>, object: &K) -> Result<()>
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
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
    api.patch(&object.name_any(), &PatchParams::default(), &patch)
        .await?;
    Ok(())
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
    use crate::api::{Sandbox, SandboxSpec};
    use crate::provider::ProviderError;

    #[tokio::test]
    async fn apply_goes_on_only_once_the_finalizer_is_on() {
        assert!(FinalizerAdded::already().wait().await.is_ok());
        let (tx, rx) = oneshot::channel();
        tx.send(true).unwrap();
        assert!(FinalizerAdded(Some(rx)).wait().await.is_ok());
        let (tx, rx) = oneshot::channel();
        tx.send(false).unwrap();
        assert!(FinalizerAdded(Some(rx)).wait().await.is_err());
        let (tx, rx) = oneshot::channel::<bool>();
        drop(tx);
        assert!(FinalizerAdded(Some(rx)).wait().await.is_err());
    }

    #[test]
    fn only_a_live_object_without_ours_needs_the_finalizer() {
        let mut s = Sandbox::new("s", SandboxSpec::default());
        assert!(needs_finalizer(&s));
        s.metadata.finalizers = Some(vec!["someone.else/x".into()]);
        assert!(needs_finalizer(&s));
        s.metadata.finalizers = Some(vec!["someone.else/x".into(), FINALIZER.into()]);
        assert!(!needs_finalizer(&s));
        s.metadata.finalizers = None;
        s.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert!(!needs_finalizer(&s));
    }

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
