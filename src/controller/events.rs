//! Publishing events.k8s.io Events for provider actions and failures.

use kube::Resource;
use kube::runtime::events::{Event, EventType};

use super::Context;

/// Publishes one Event on `obj`. A failure to publish is logged, never fatal: an Event is a
/// notification, and failing a reconcile over it would trade real work for bookkeeping.
pub async fn publish<K>(
    ctx: &Context,
    obj: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) where
    K: Resource<DynamicType = ()>,
{
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(truncate(note, 1000)),
        action: action.to_string(),
        secondary: None,
    };
    if let Err(err) = ctx.recorder.publish(&event, &obj.object_ref(&())).await {
        tracing::warn!(%err, reason, "could not publish event");
    }
}

/// Normal event shorthand.
pub async fn normal<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    obj: &K,
    reason: &str,
    note: String,
) {
    publish(ctx, obj, EventType::Normal, reason, reason, note).await;
}

/// A Normal event published off the reconcile's path: the reconcile does not wait for the
/// API server to store it. For the events on the path of every create (`Created`,
/// `Started`) and env delivery (`EnvDelivered`), which a pass records with
/// [`super::outcome::Report::after_status`] and publishes this way once its status is
/// written. Best effort like [`publish`]: an Event still queued when the process stops is
/// lost, which a notification may be; Warnings, which tests and users count, stay awaited.
pub fn normal_detached<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    obj: &K,
    reason: &'static str,
    note: String,
) {
    let recorder = ctx.recorder.clone();
    let reference = obj.object_ref(&());
    let event = Event {
        type_: EventType::Normal,
        reason: reason.to_string(),
        note: Some(truncate(note, 1000)),
        action: reason.to_string(),
        secondary: None,
    };
    tokio::spawn(async move {
        if let Err(err) = recorder.publish(&event, &reference).await {
            tracing::warn!(%err, reason, "could not publish event");
        }
    });
}

/// Warning event shorthand.
pub async fn warning<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    obj: &K,
    reason: &str,
    note: String,
) {
    publish(ctx, obj, EventType::Warning, reason, reason, note).await;
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}
