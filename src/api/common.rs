//! Types and constants shared by the three kinds: conditions, object references, names.

use chrono::{DateTime, SecondsFormat, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of every kind.
pub const GROUP: &str = "sandboxes.dev";
/// API version of every kind.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of every kind (`<group>/<version>`).
pub const API_VERSION: &str = "sandboxes.dev/v1alpha1";
/// Category the three kinds share: `kubectl get sandboxes` lists them all.
pub const CATEGORY: &str = "sandboxes";
/// The finalizer the operator puts on every object it holds provider state for.
pub const FINALIZER: &str = "sandboxes.dev/cleanup";

/// Condition status values.
pub const STATUS_TRUE: &str = "True";
/// Condition status values.
pub const STATUS_FALSE: &str = "False";
/// Condition status values.
pub const STATUS_UNKNOWN: &str = "Unknown";

/// Condition types the operator writes (kstatus reads `Ready`, `Reconciling` and `Stalled`).
pub const CONDITION_READY: &str = "Ready";
/// The operator is working towards the desired state (kstatus "in progress").
pub const CONDITION_RECONCILING: &str = "Reconciling";
/// The operator cannot make progress without a change to the object (kstatus "failed").
pub const CONDITION_STALLED: &str = "Stalled";

/// DNS-1123 subdomain: the shape of a Kubernetes object name.
pub(crate) const DNS1123_SUBDOMAIN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// Schema transform that removes the `default` schemars derives from `#[serde(default)]`.
///
/// The CRDs carry no schema defaults: the API server would write them into stored objects
/// (GitOps drift) and the Rust side already defaults on deserialisation.
pub(crate) fn no_default(schema: &mut schemars::Schema) {
    schema.remove("default");
}

/// Schema transform for enum types: drops the type's own description so the field's doc
/// comment (which says what the field does and its default) is what `kubectl explain` shows.
pub(crate) fn no_description(schema: &mut schemars::Schema) {
    schema.remove("description");
}

/// One aspect of an object's current state, in the shape kstatus, Flux and Argo CD read.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Condition type in CamelCase: `Ready`, `Reconciling` or `Stalled` (plus kind-specific
    /// ones such as `InUse`). Unique within the list.
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 316))]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[schemars(extend("enum" = ["True", "False", "Unknown"]))]
    pub status: String,
    /// Machine-readable CamelCase reason for the last transition, e.g. `SandboxRunning`,
    /// `ProviderUnavailable`, `TemplateNotFound`.
    #[serde(default)]
    #[schemars(length(max = 1024), transform = no_default)]
    pub reason: String,
    /// Human-readable detail: what happened and, when something is wrong, what to change.
    #[serde(default)]
    #[schemars(length(max = 32768), transform = no_default)]
    pub message: String,
    /// When `status` last changed (RFC 3339). Unchanged while the status stays the same,
    /// even when the reason or message change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub last_transition_time: Option<String>,
    /// The `metadata.generation` this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
}

impl Condition {
    /// A condition without a transition time; [`set_condition`] fills it in.
    pub fn new(
        type_: impl Into<String>,
        status: impl Into<String>,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: None,
            observed_generation: None,
        }
    }

    /// Sets `observed_generation` (builder style).
    pub fn with_generation(mut self, generation: Option<i64>) -> Self {
        self.observed_generation = generation;
        self
    }

    /// Whether `status` is `True`.
    pub fn is_true(&self) -> bool {
        self.status == STATUS_TRUE
    }
}

/// The condition of the given type, if present.
pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Formats a time the way every timestamp in our status is written (RFC 3339, UTC, seconds).
pub fn rfc3339(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Inserts or replaces the condition of `new.type_`, keeping list order.
///
/// `last_transition_time` is preserved while the status is unchanged (only reason, message
/// and observed generation are updated); when the status changes, or the condition is new,
/// it becomes `new.last_transition_time` or, when that is unset, `now`.
///
/// Returns whether anything in the list changed, so a caller can skip a no-op status write.
pub fn set_condition(conditions: &mut Vec<Condition>, new: Condition, now: DateTime<Utc>) -> bool {
    let mut new = new;
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            if existing.status == new.status {
                new.last_transition_time = existing
                    .last_transition_time
                    .clone()
                    .or_else(|| Some(rfc3339(now)));
            } else if new.last_transition_time.is_none() {
                new.last_transition_time = Some(rfc3339(now));
            }
            if *existing == new {
                false
            } else {
                *existing = new;
                true
            }
        }
        None => {
            if new.last_transition_time.is_none() {
                new.last_transition_time = Some(rfc3339(now));
            }
            conditions.push(new);
            true
        }
    }
}

/// A reference to another object of this API by name.
///
/// Resolved in the referring object's own namespace only: an object can never name another
/// namespace's Sandbox, SandboxVolume or SandboxTemplate.
#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub struct LocalObjectRef {
    /// Name of the object, in the same namespace as the object that refers to it.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS1123_SUBDOMAIN))]
    pub name: String,
}

impl LocalObjectRef {
    /// A reference to `name`.
    pub fn new(name: impl Into<String>) -> Self {
        LocalObjectRef { name: name.into() }
    }
}

/// A reference to a Secret by name.
///
/// Resolved in the referring object's own namespace only: a Sandbox can never read another
/// namespace's Secret.
#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub struct SecretRef {
    /// Name of the Secret, in the same namespace as the object that refers to it.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS1123_SUBDOMAIN))]
    pub name: String,
}

impl SecretRef {
    /// A reference to the Secret `name`.
    pub fn new(name: impl Into<String>) -> Self {
        SecretRef { name: name.into() }
    }
}

/// The CEL rule (on a spec) that makes an optional `provider` field immutable: changing,
/// adding and removing it are all rejected.
pub(crate) const PROVIDER_IMMUTABLE_RULE: &str = "has(self.provider) == has(oldSelf.provider) && (!has(self.provider) || self.provider == oldSelf.provider)";

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(secs, 0).single().unwrap()
    }

    #[test]
    fn set_condition_keeps_transition_time_while_status_is_unchanged() {
        let mut conds = Vec::new();
        assert!(set_condition(
            &mut conds,
            Condition::new("Ready", "False", "Creating", "creating"),
            t(0)
        ));
        assert_eq!(
            conds[0].last_transition_time.as_deref(),
            Some("1970-01-01T00:00:00Z")
        );

        // Same status, new reason: time kept, reason updated.
        assert!(set_condition(
            &mut conds,
            Condition::new("Ready", "False", "Starting", "starting"),
            t(60)
        ));
        assert_eq!(conds[0].reason, "Starting");
        assert_eq!(
            conds[0].last_transition_time.as_deref(),
            Some("1970-01-01T00:00:00Z")
        );

        // Identical: no change reported.
        assert!(!set_condition(
            &mut conds,
            Condition::new("Ready", "False", "Starting", "starting"),
            t(90)
        ));

        // Status flips: time moves.
        assert!(set_condition(
            &mut conds,
            Condition::new("Ready", "True", "Running", "running"),
            t(120)
        ));
        assert_eq!(
            conds[0].last_transition_time.as_deref(),
            Some("1970-01-01T00:02:00Z")
        );
        assert!(condition(&conds, "Ready").unwrap().is_true());
        assert!(condition(&conds, "Stalled").is_none());
    }

    #[test]
    fn set_condition_appends_new_types_in_order() {
        let mut conds = Vec::new();
        set_condition(&mut conds, Condition::new("Ready", "False", "A", ""), t(0));
        set_condition(&mut conds, Condition::new("Stalled", "True", "B", ""), t(0));
        set_condition(&mut conds, Condition::new("Ready", "True", "C", ""), t(5));
        let types: Vec<_> = conds.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Ready", "Stalled"]);
    }

    #[test]
    fn condition_serialises_type_and_camel_case() {
        let c = Condition::new("Ready", "True", "Running", "ok").with_generation(Some(3));
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["type"], "Ready");
        assert_eq!(v["observedGeneration"], 3);
        assert!(v.get("lastTransitionTime").is_none());
    }
}
