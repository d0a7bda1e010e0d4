//! Conditions the way kstatus, Flux and Argo CD read them, and status writes by server-side
//! apply on `/status` — only when something changed.

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::Condition;

use super::FIELD_MANAGER;

/// `Ready`: the object is converged on its spec.
pub const READY: &str = "Ready";
/// `Reconciling`: work is in progress (kstatus reads True as InProgress).
pub const RECONCILING: &str = "Reconciling";
/// `Stalled`: no progress without a change from the user (kstatus reads True as Failed).
pub const STALLED: &str = "Stalled";

/// The three conditions for one outcome of a reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Converged.
    Ready { reason: String, message: String },
    /// Working on it (or waiting for something that will come by itself).
    Progressing { reason: String, message: String },
    /// Cannot proceed until the spec or the environment changes.
    Stalled { reason: String, message: String },
    /// Settled but not ready, and nothing to retry (an exited main process under a restart
    /// policy that keeps it down): Ready=False with neither Reconciling nor Stalled.
    NotReady { reason: String, message: String },
}

impl Health {
    /// Ready shorthand.
    pub fn ready(reason: &str, message: impl Into<String>) -> Self {
        Health::Ready {
            reason: reason.into(),
            message: message.into(),
        }
    }
    /// Progressing shorthand.
    pub fn progressing(reason: &str, message: impl Into<String>) -> Self {
        Health::Progressing {
            reason: reason.into(),
            message: message.into(),
        }
    }
    /// Stalled shorthand.
    pub fn stalled(reason: &str, message: impl Into<String>) -> Self {
        Health::Stalled {
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// NotReady shorthand.
    pub fn not_ready(reason: &str, message: impl Into<String>) -> Self {
        Health::NotReady {
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// The Ready condition's reason.
    pub fn reason(&self) -> &str {
        match self {
            Health::Ready { reason, .. }
            | Health::Progressing { reason, .. }
            | Health::Stalled { reason, .. }
            | Health::NotReady { reason, .. } => reason,
        }
    }

    /// The Ready condition's message.
    pub fn message(&self) -> &str {
        match self {
            Health::Ready { message, .. }
            | Health::Progressing { message, .. }
            | Health::Stalled { message, .. }
            | Health::NotReady { message, .. } => message,
        }
    }

    /// Writes Ready/Reconciling/Stalled into `conditions`, keeping transition times of
    /// conditions whose status did not change. Abnormal-true conditions (Reconciling,
    /// Stalled) are removed when false, as kstatus recommends.
    pub fn apply(&self, conditions: &mut Vec<Condition>, generation: Option<i64>, now: &str) {
        let (ready, reconciling, stalled, reason, message) = match self {
            Health::Ready { reason, message } => ("True", false, false, reason, message),
            Health::Progressing { reason, message } => ("False", true, false, reason, message),
            Health::Stalled { reason, message } => ("False", false, true, reason, message),
            Health::NotReady { reason, message } => ("False", false, false, reason, message),
        };
        upsert(conditions, READY, ready, reason, message, generation, now);
        if reconciling {
            upsert(
                conditions,
                RECONCILING,
                "True",
                reason,
                message,
                generation,
                now,
            );
        } else {
            conditions.retain(|c| c.type_ != RECONCILING);
        }
        if stalled {
            upsert(
                conditions, STALLED, "True", reason, message, generation, now,
            );
        } else {
            conditions.retain(|c| c.type_ != STALLED);
        }
    }
}

/// Sets one condition, keeping `lastTransitionTime` when its status is unchanged.
pub fn upsert(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &str,
) {
    let transition = conditions
        .iter()
        .find(|c| c.type_ == type_)
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.to_string());
    conditions.retain(|c| c.type_ != type_);
    conditions.push(Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        last_transition_time: Some(transition),
        observed_generation: generation,
    });
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
}

/// The current time as RFC 3339 (seconds precision, as Kubernetes writes it).
pub fn now() -> String {
    crate::api::rfc3339(chrono::Utc::now())
}

/// Server-side applies `status` on the object's `/status` subresource when it differs from
/// `current`. Returns whether a write happened.
///
/// Only `status` is sent, under our field manager, so the operator never owns a field of
/// `spec` (GitOps tools would read that as drift).
pub async fn write<K, S>(
    api: &Api<K>,
    name: &str,
    current: Option<&S>,
    desired: &S,
) -> kube::Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize + PartialEq,
{
    Ok(write_returning(api, name, current, desired)
        .await?
        .is_some())
}

/// [`write`], returning the object as written (`None` when nothing needed writing): its
/// resourceVersion tells when the watch cache has caught up (see
/// [`super::freshness`]).
pub async fn write_returning<K, S>(
    api: &Api<K>,
    name: &str,
    current: Option<&S>,
    desired: &S,
) -> kube::Result<Option<K>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize + PartialEq,
{
    if current == Some(desired) {
        return Ok(None);
    }
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": desired,
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_is_kept_while_status_is_unchanged() {
        let mut c = Vec::new();
        Health::progressing("Creating", "x").apply(&mut c, Some(1), "t1");
        Health::progressing("Starting", "y").apply(&mut c, Some(1), "t2");
        let ready = c.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!(ready.last_transition_time.as_deref(), Some("t1"));
        assert_eq!(ready.reason, "Starting");
        Health::ready("Running", "z").apply(&mut c, Some(2), "t3");
        let ready = c.iter().find(|c| c.type_ == READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.last_transition_time.as_deref()),
            ("True", Some("t3"))
        );
        assert!(
            c.iter()
                .all(|c| c.type_ != RECONCILING && c.type_ != STALLED)
        );
    }

    #[test]
    fn stalled_sets_stalled_and_clears_reconciling() {
        let mut c = Vec::new();
        Health::progressing("Creating", "x").apply(&mut c, Some(1), "t1");
        Health::stalled("TemplateNotFound", "gone").apply(&mut c, Some(1), "t2");
        let types: Vec<_> = c
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(types, vec![("Ready", "False"), ("Stalled", "True")]);
    }
}
