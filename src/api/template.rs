//! `SandboxTemplate`: a filesystem captured from a Sandbox, which later Sandboxes boot from.

use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use super::common::{
    Condition, LocalObjectRef, PROVIDER_IMMUTABLE_RULE, no_default, no_description,
};

/// Characters a capture path may contain (it becomes a shell argument and a tar selector).
pub const CAPTURE_PATH_PATTERN: &str = r"^/[A-Za-z0-9._+@,=/-]*$";

/// Shape of `spec.templateId`: it becomes an image tag and an object-key segment.
pub const TEMPLATE_ID_PATTERN: &str = r"^[a-z0-9][a-z0-9._-]*$";

/// `spec.templateId` cannot change: the provider template (and the published copy) are
/// stored under it.
const TEMPLATE_ID_IMMUTABLE_RULE: &str = "has(self.templateId) == has(oldSelf.templateId) && (!has(self.templateId) || self.templateId == oldSelf.templateId)";
/// `spec.source` cannot change (an absent source is `Capture`).
const SOURCE_IMMUTABLE_RULE: &str = "(has(self.source) ? self.source : 'Capture') == (has(oldSelf.source) ? oldSelf.source : 'Capture')";
/// Whether the source is `Capture` (the default), in CEL.
const CAPTURE: &str = "(!has(self.source) || self.source == 'Capture')";

/// Desired state of a SandboxTemplate: which paths of which Sandbox to capture.
// Several `printcolumn(...)` entries repeat `type_`, which clippy misreads as a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "sandboxes.dev",
    version = "v1alpha1",
    kind = "SandboxTemplate",
    plural = "sandboxtemplates",
    singular = "sandboxtemplate",
    shortname = "sbxt",
    category = "sandboxes",
    namespaced,
    status = "SandboxTemplateStatus",
    derive = "PartialEq",
    doc = "A SandboxTemplate captures paths of a Sandbox's filesystem into a reusable template that new Sandboxes boot from (spec.templateRef), optionally published to a shared store.",
    printcolumn(
        name = "Provider",
        type_ = "string",
        json_path = ".status.provider",
        description = "Provider holding the template"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the template can be booted from"
    ),
    printcolumn(
        name = "InUse",
        type_ = "boolean",
        json_path = ".status.inUse",
        description = "Whether a sandbox is backed by it"
    ),
    printcolumn(
        name = "Published",
        type_ = "boolean",
        json_path = ".status.published",
        description = "Whether it is in the shared template store"
    ),
    printcolumn(
        name = "Size",
        type_ = "integer",
        json_path = ".status.sizeBytes",
        description = "Size in bytes"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new(PROVIDER_IMMUTABLE_RULE).message("spec.provider is immutable: delete and recreate the SandboxTemplate to move it to another provider").field_path(".provider"))]
#[x_kube(validation = Rule::new(TEMPLATE_ID_IMMUTABLE_RULE).message("spec.templateId is immutable: delete and recreate the SandboxTemplate to store it under another id").field_path(".templateId"))]
#[x_kube(validation = Rule::new(SOURCE_IMMUTABLE_RULE).message("spec.source is immutable: delete and recreate the SandboxTemplate to change where it comes from").field_path(".source"))]
#[x_kube(validation = Rule::new(format!("!{CAPTURE} || has(self.sandboxRef)")).message("spec.sandboxRef is required when spec.source is Capture (the default): name the Sandbox to capture").field_path(".sandboxRef").reason(Reason::FieldValueRequired))]
#[x_kube(validation = Rule::new(format!("!{CAPTURE} || has(self.capturePaths)")).message("spec.capturePaths is required when spec.source is Capture (the default): list the directories to capture").field_path(".capturePaths").reason(Reason::FieldValueRequired))]
#[x_kube(validation = Rule::new(format!("{CAPTURE} || has(self.templateId)")).message("spec.templateId is required when spec.source is Store: give the id the template was published under").field_path(".templateId").reason(Reason::FieldValueRequired))]
#[x_kube(validation = Rule::new(format!("{CAPTURE} || (!has(self.sandboxRef) && !has(self.capturePaths))")).message("spec.sandboxRef and spec.capturePaths apply to spec.source Capture only: remove them (a Store template is fetched as it was published)").field_path(".source").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new(format!("{CAPTURE} || !has(self.sharedWith)")).message("spec.sharedWith applies to spec.source Capture only: a Store template is shared by the SandboxTemplate that published it; remove it").field_path(".sharedWith").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new("!has(self.templateId) || !self.templateId.contains('..')").message("spec.templateId must not contain '..'").field_path(".templateId"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateSpec {
    /// Name of a provider configured in the operator. The provider of `sandboxRef` is used
    /// when omitted; it must match it when set. Immutable: delete and recreate the
    /// SandboxTemplate to move it to another provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub provider: Option<String>,

    /// Where the template comes from: `Capture` (the default) captures `capturePaths` of
    /// the Sandbox `sandboxRef`; `Store` fetches the template published under `templateId`
    /// from the provider's shared template store (e.g. by another cluster). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<TemplateSource>,

    /// The template's id at the provider and in the shared store: stable across clusters,
    /// so a template published here can be fetched elsewhere (`source: Store`) under the
    /// same id. `sbxt-<metadata.uid>` when omitted; required for `source: Store`.
    /// Lowercase letters, digits, `.`, `_` and `-` (no `..`), at most 128. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), regex(pattern = TEMPLATE_ID_PATTERN))]
    pub template_id: Option<String>,

    /// The Sandbox (in this namespace) whose filesystem is captured; required for `source:
    /// Capture`. It must exist and be Ready. Captured once; changing `sandboxRef`,
    /// `capturePaths` or `label` captures again and replaces the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_ref: Option<LocalObjectRef>,

    /// Absolute paths to capture, e.g. `/home/user` or `/opt/venv`: 1 to 32 of them;
    /// required for `source: Capture`. Only these paths are restored into sandboxes booted
    /// from a fetched template. Each must be a normalised absolute path (no `..`, `.` or
    /// empty segments, not `/` itself) of letters, digits and `/ . _ - + @ , =` only (no
    /// spaces or shell metacharacters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "capture_paths_schema")]
    pub capture_paths: Option<Vec<String>>,

    /// Free-form label recorded with the template (up to 256 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub label: Option<String>,

    /// Also publish the template to the provider's shared template store (an S3 bucket) so
    /// sandboxes on other hosts can boot from it. `false` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish: Option<bool>,

    /// Other namespaces that may use this template from the shared template store: their
    /// SandboxTemplates with `source: Store` may fetch it by `templateId`, and their Sandboxes
    /// boot from those. Without it only this namespace may (the tenant is the namespace).
    /// Sharing grants reading only: no other namespace can publish over or replace the
    /// template. Recorded in the store with the template when it is captured or published;
    /// `source: Capture` only. Up to 64 namespace names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "shared_with_schema")]
    pub shared_with: Option<Vec<String>>,
}

/// Where a SandboxTemplate's filesystem comes from.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
#[schemars(transform = no_description)]
pub enum TemplateSource {
    /// Captured from a running Sandbox (`sandboxRef`, `capturePaths`).
    #[default]
    Capture,
    /// Fetched from the provider's shared template store by `templateId`.
    Store,
}

impl SandboxTemplateSpec {
    /// The source in force (`Capture` when omitted).
    pub fn source(&self) -> TemplateSource {
        self.source.unwrap_or_default()
    }

    /// The namespaces the template is shared with (none when omitted).
    pub fn shared_with(&self) -> &[String] {
        self.shared_with.as_deref().unwrap_or_default()
    }
}

/// Schema of `spec.sharedWith`: distinct namespace names.
fn shared_with_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 64,
        "x-kubernetes-list-type": "set",
        "items": {
            "type": "string",
            "minLength": 1,
            "maxLength": 63,
            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
        }
    })
}

/// Schema of `spec.capturePaths`: the list bounds, the character pattern and CEL rules
/// whose messages name the field and the fix.
fn capture_paths_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "minItems": 1,
        "maxItems": 32,
        "items": {
            "type": "string",
            "minLength": 1,
            "maxLength": 4096,
            "pattern": CAPTURE_PATH_PATTERN,
            "x-kubernetes-validations": [
                {
                    "rule": "self.startsWith('/')",
                    "message": "spec.capturePaths entries must be absolute paths: start them with /, e.g. /home/user"
                },
                {
                    "rule": "self.matches('^[A-Za-z0-9._+@,=/-]*$')",
                    "message": "spec.capturePaths entries may contain only letters, digits and / . _ - + @ , =: remove spaces and shell metacharacters"
                },
                {
                    "rule": "!self.contains('/../') && !self.endsWith('/..') && self != '/'",
                    "message": "spec.capturePaths entries must not contain '..' segments or be / itself: name the directory to capture, e.g. /home/user"
                },
                {
                    "rule": "!self.contains('//') && !self.contains('/./') && !self.endsWith('/.')",
                    "message": "spec.capturePaths entries must be normalised: remove empty (//) and '.' segments"
                }
            ]
        }
    })
}

/// Observed state of a SandboxTemplate, written by the operator only.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (the template can be booted from), `Reconciling`, `Stalled`, and why a
    /// deletion is being refused while a sandbox still uses the template.
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    #[serde(default)]
    #[schemars(transform = no_default)]
    pub conditions: Vec<Condition>,
    /// The operator's id for the template at the provider (derived from this object's UID).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_id: Option<String>,
    /// The provider's reference to the captured filesystem (an image id, an `s3://` URL).
    /// Opaque: for display only.
    #[serde(rename = "ref", skip_serializing_if = "Option::is_none")]
    pub ref_: Option<String>,
    /// When the capture was taken (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// Size of the template on the provider's storage, when reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// Whether a Sandbox in this namespace names the template (`spec.templateRef`). Deletion
    /// checks with the provider itself and is refused while any sandbox is backed by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_use: Option<bool>,
    /// Whether the template is in the shared template store.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub published: Option<bool>,
    /// The provider holding the template.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Hash of the capture inputs (`sandboxRef`, `capturePaths`, `label`) the template at the
    /// provider was captured from; a spec with other inputs is captured again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_hash: Option<String>,
}
