//! Observe: the provider's picture (enumeration) and the API server's (owner facts).
//!
//! Both halves either complete or fail as a whole. The provider is enumerated first and the
//! owners read after, so every resource seen has had its owner created before it (the
//! controllers write the object first), and a resource whose owner is read as absent was
//! really ownerless at that moment — the last owner read is repeated right before each
//! deletion anyway.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt, stream};
use kube::api::{Api, ListParams};
use kube::core::{NamespaceResourceScope, PartialObjectMeta};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use super::SweepError;
use super::decide::{
    Candidate, Observation, OwnerFact, OwnerFacts, OwnerKey, OwnerKind, ResourceKind,
};
use super::owners::OwnerRead;
use crate::api::{Sandbox, SandboxTemplate, SandboxVolume, SandboxWarmPool};
use crate::kube_client::paging::each_page;
use crate::provider::labels::MANAGED_BY;
use crate::provider::{ProviderError, ProviderResult, SandboxDescriptor, Template, VolumeInfo};
use crate::registry::ProviderHandle;

/// Bound on one Kubernetes read, so an API server that stops answering fails the pass
/// instead of hanging it.
pub const KUBE_TIMEOUT: Duration = Duration::from_secs(30);

/// How many owner listings run at once.
const LIST_CONCURRENCY: usize = 8;

/// Every resource labelled with `instance` on one provider — sandboxes, volumes and
/// templates — from one `inventory` call (which lists as few times as the provider can).
///
/// Any failed enumeration fails the whole picture (rule 1: a failed listing is an `Err`,
/// never `[]`, and a sweeper that deleted from a partial picture would delete on a wrong
/// guess). An absent capability is not a failure: a provider without volumes has none.
pub async fn enumerate(
    handle: &ProviderHandle,
    instance: &str,
) -> Result<Vec<Candidate>, SweepError> {
    let ours = BTreeMap::from([(MANAGED_BY.to_string(), instance.to_string())]);
    let inventory = handle
        .upkeep("inventory", handle.provider.inventory(&ours))
        .await
        .map_err(|source| SweepError::Enumeration {
            what: "sandboxes, volumes and templates (inventory)",
            source,
        })?;
    let sandboxes = inventory.sandboxes.into_iter().map(sandbox_candidate);
    let volumes = inventory
        .volumes
        .into_iter()
        .flatten()
        .map(volume_candidate);
    // Checked again here: whatever a provider's inventory returned, only ours go on.
    let templates = inventory
        .templates
        .into_iter()
        .flatten()
        .filter(|t| t.labels.get(MANAGED_BY).map(String::as_str) == Some(instance))
        .map(template_candidate);
    Ok(sandboxes.chain(volumes).chain(templates).collect())
}

/// A sandbox as the sweeper judges it.
pub fn sandbox_candidate(d: SandboxDescriptor) -> Candidate {
    Candidate {
        id: d.id,
        labels: d.labels,
        created_at: d.created_at,
        observation: Observation::Sandbox {
            state: d.state,
            started: d.started_at,
        },
    }
}

/// A volume as the sweeper judges it.
pub fn volume_candidate(v: VolumeInfo) -> Candidate {
    Candidate {
        id: v.name,
        labels: v.labels,
        created_at: v.created_at,
        observation: Observation::Volume {
            attached: v.attached,
            attached_to: v.attached_to,
        },
    }
}

/// A template as the sweeper judges it.
pub fn template_candidate(t: Template) -> Candidate {
    Candidate {
        id: t.id,
        labels: t.labels,
        created_at: t.created_at,
        observation: Observation::Template { in_use: t.in_use },
    }
}

/// One candidate read again by itself right before it is deleted: for a sandbox, its
/// `describe` (`None` when the provider no longer holds it), because a listing may omit
/// what a description carries (history). A volume or a template is returned as listed:
/// `get_volume`/`get_template` may report attachment or use as unknown where the listing
/// knew it, and their removal checks attachment and use by itself and refuses (rule 5).
pub async fn reread(
    handle: &ProviderHandle,
    candidate: &Candidate,
) -> ProviderResult<Option<Candidate>> {
    match candidate.kind() {
        ResourceKind::Sandbox => Ok(handle
            .upkeep("describe", handle.provider.describe(&candidate.id))
            .await?
            .map(sandbox_candidate)),
        ResourceKind::Volume | ResourceKind::Template => Ok(Some(candidate.clone())),
    }
}

/// The error of a capability a provider does not have.
pub fn absent_capability(handle: &ProviderHandle, what: &str) -> ProviderError {
    ProviderError::unsupported(format!("provider {} has no {what}", handle.name()))
}

/// Reads every owner the candidates name: one paginated metadata listing per kind and
/// namespace (not one read per resource, so a thousand healthy sandboxes cost one list).
/// A listing that fails fails the whole picture.
pub async fn owner_facts(
    client: &Client,
    candidates: &[Candidate],
    instance: &str,
) -> Result<OwnerFacts, SweepError> {
    let keys: BTreeSet<OwnerKey> = candidates
        .iter()
        .filter(|c| c.labels.get(MANAGED_BY).map(String::as_str) == Some(instance))
        .filter_map(|c| c.owner())
        .filter_map(|o| OwnerKey::of(&o))
        .collect();
    let scopes: BTreeSet<(OwnerKind, String)> =
        keys.iter().map(|k| (k.kind, k.namespace.clone())).collect();
    let listed: Vec<((OwnerKind, String), BTreeMap<String, String>)> = stream::iter(scopes)
        .map(|(kind, namespace)| async move {
            let uids = list_uids(client, kind, &namespace).await?;
            Ok::<_, SweepError>(((kind, namespace), uids))
        })
        .buffer_unordered(LIST_CONCURRENCY)
        .try_collect()
        .await?;
    let listed: BTreeMap<(OwnerKind, String), BTreeMap<String, String>> =
        listed.into_iter().collect();
    Ok(keys
        .into_iter()
        .map(|key| {
            let fact = match listed
                .get(&(key.kind, key.namespace.clone()))
                .and_then(|names| names.get(&key.name))
            {
                Some(uid) => OwnerFact::Live { uid: uid.clone() },
                None => OwnerFact::Absent,
            };
            (key, fact)
        })
        .collect())
}

/// Name → UID of every object of `kind` in `namespace`. A namespace that does not exist
/// lists as empty (the API server's answer), which is right: its objects are gone.
async fn list_uids(
    client: &Client,
    kind: OwnerKind,
    namespace: &str,
) -> Result<BTreeMap<String, String>, SweepError> {
    let result = match kind {
        OwnerKind::Sandbox => list_uids_of::<Sandbox>(client, namespace).await,
        OwnerKind::SandboxVolume => list_uids_of::<SandboxVolume>(client, namespace).await,
        OwnerKind::SandboxTemplate => list_uids_of::<SandboxTemplate>(client, namespace).await,
        OwnerKind::SandboxWarmPool => list_uids_of::<SandboxWarmPool>(client, namespace).await,
    };
    result.map_err(|message| SweepError::OwnerLookup {
        kind,
        namespace: namespace.to_string(),
        message,
    })
}

async fn list_uids_of<K>(
    client: &Client,
    namespace: &str,
) -> Result<BTreeMap<String, String>, String>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let mut out = BTreeMap::new();
    let fetch = |params: ListParams| {
        let api = &api;
        async move {
            within_kube_timeout(async {
                api.list_metadata(&params).await.map_err(|e| e.to_string())
            })
            .await
        }
    };
    let visit = |items: Vec<PartialObjectMeta<K>>| {
        for item in items {
            if let (Some(name), Some(uid)) = (item.metadata.name, item.metadata.uid) {
                out.insert(name, uid);
            }
        }
    };
    each_page(&ListParams::default(), fetch, visit).await?;
    Ok(out)
}

/// A direct read of one owner by namespace/name, right before a deletion: what it is now
/// when it exists, `None` when it does not.
pub async fn read_owner(client: &Client, key: &OwnerKey) -> Result<Option<OwnerRead>, String> {
    let read = async {
        match key.kind {
            OwnerKind::Sandbox => read_sandbox(client, key).await,
            OwnerKind::SandboxVolume => read_uid::<SandboxVolume>(client, key).await,
            OwnerKind::SandboxTemplate => read_uid::<SandboxTemplate>(client, key).await,
            OwnerKind::SandboxWarmPool => read_uid::<SandboxWarmPool>(client, key).await,
        }
    };
    within_kube_timeout(read).await
}

/// Runs one Kubernetes read within [`KUBE_TIMEOUT`], a silent API server becoming an error
/// that names the bound.
async fn within_kube_timeout<T>(
    read: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    tokio::time::timeout(KUBE_TIMEOUT, read)
        .await
        .map_err(|_| {
            format!(
                "the API server did not answer within {}s",
                KUBE_TIMEOUT.as_secs()
            )
        })?
}

/// A Sandbox is read whole: its status says which sandbox it currently runs.
async fn read_sandbox(client: &Client, key: &OwnerKey) -> Result<Option<OwnerRead>, String> {
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &key.namespace);
    match api.get_opt(&key.name).await {
        Ok(Some(sandbox)) => Ok(Some(OwnerRead {
            uid: sandbox.metadata.uid.unwrap_or_default(),
            current_sandbox: sandbox.status.and_then(|s| s.sandbox_id),
        })),
        Ok(None) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

async fn read_uid<K>(client: &Client, key: &OwnerKey) -> Result<Option<OwnerRead>, String>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), &key.namespace);
    match api.get_metadata_opt(&key.name).await {
        // The API server always sets a UID; an empty one would match no label, so it could
        // never protect a resource it does not own.
        Ok(Some(meta)) => Ok(Some(OwnerRead {
            uid: meta.metadata.uid.unwrap_or_default(),
            current_sandbox: None,
        })),
        Ok(None) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}
