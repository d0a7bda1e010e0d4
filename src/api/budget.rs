//! `SandboxBudget`: a namespace's share of the machine across every provider, set by a
//! platform team (tenants may read it, not change it: see the chart's RBAC).

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::no_default;
use super::quantity::Quantity;

/// Desired state of a SandboxBudget: ceilings on what the namespace's running Sandboxes
/// may hold in total.
// Several `printcolumn(...)` entries repeat `type_`, which clippy misreads as a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "sandboxes.dev",
    version = "v1alpha1",
    kind = "SandboxBudget",
    plural = "sandboxbudgets",
    singular = "sandboxbudget",
    shortname = "sbxb",
    category = "sandboxes",
    namespaced,
    status = "SandboxBudgetStatus",
    derive = "PartialEq",
    doc = "A SandboxBudget caps the total CPU, memory and number of running Sandboxes in its namespace, across all providers. A Sandbox that does not fit waits (Ready=False, reason OverBudget) and is started when room frees up, in creation order. Every SandboxBudget of a namespace applies.",
    printcolumn(
        name = "Sandboxes",
        type_ = "string",
        json_path = ".status.used.sandboxes",
        description = "Running Sandboxes counted"
    ),
    printcolumn(
        name = "Max",
        type_ = "string",
        json_path = ".spec.hard.sandboxes",
        description = "Most running Sandboxes allowed"
    ),
    printcolumn(
        name = "Waiting",
        type_ = "integer",
        json_path = ".status.waiting",
        description = "Sandboxes waiting for room"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxBudgetSpec {
    /// The ceilings; a field left out is not limited.
    pub hard: BudgetAmounts,
}

/// Amounts of a budget: its ceilings (`spec.hard`) or what is in use (`status.used`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetAmounts {
    /// Total CPU of the running Sandboxes (their `spec.resources.cpu`, or their provider's
    /// default), e.g. `4` or `2500m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Total memory of the running Sandboxes (their `spec.resources.memory`, or their
    /// provider's default), e.g. `8Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// Number of running Sandboxes (every state but `Stopped`, on any provider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub sandboxes: Option<i64>,
}

/// Observed state of a SandboxBudget, written by the operator only.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxBudgetStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The ceilings this status was computed against (a copy of `spec.hard`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hard: Option<BudgetAmounts>,
    /// What the namespace's running Sandboxes hold (only the amounts `hard` limits).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used: Option<BudgetUsage>,
    /// How many Sandboxes wait for room.
    #[serde(default)]
    #[schemars(transform = no_default)]
    pub waiting: i64,
}

/// What the running Sandboxes of a namespace hold, in the units of `spec.hard`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetUsage {
    /// CPU held, in millicores (e.g. `1500m`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// Memory held, in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// Running Sandboxes counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandboxes: Option<i64>,
}
