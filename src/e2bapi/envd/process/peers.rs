//! The replicas serving envd, each a *peer* of the others. A process lives in the replica
//! that started it (the provider's streaming exec is a connection that replica holds), so a
//! request for it that lands on another replica is forwarded there ([`super::forward`]).
//!
//! Each replica claims a short *tag* at start: a `coordination.k8s.io` Lease in the
//! operator's namespace, named for the tag (a create, so two replicas never claim the same
//! one), labelled for the instance, whose holder is the URL the other replicas reach this
//! one at. It renews the Lease while it serves and deletes it when it stops. The pids it
//! assigns carry its tag ([`pid_tag`]), so any replica knows a pid's replica from the pid
//! alone; a tag with no live Lease is a replica that stopped, and its processes with it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

use crate::e2bapi::envd::error::{Code, EnvdError};
use crate::leader::{LeaderConfig, LeaseView};

/// The label naming the instance a peer Lease belongs to.
pub const PEER_LABEL: &str = "sandboxes.dev/envd-peer-of";
/// How long a peer Lease stays valid after its last renewal.
pub const LEASE: Duration = Duration::from_secs(15);
/// How often a replica renews its Lease: three times a lease, so one late renewal is no
/// expiry.
const RENEW_EVERY: Duration = Duration::from_secs(5);
/// Bits of a pid below the tag: a replica assigns 2²¹ pids before its sequence wraps.
const SEQ_BITS: u32 = 21;
/// The largest tag: ten bits, so every pid stays below 2³¹ (a signed int in every SDK).
pub const MAX_TAG: u16 = (1 << 10) - 1;
/// How many tags a replica tries before giving up.
const CLAIM_TRIES: usize = 32;

/// The tag of the replica that assigned `pid` (0: none did).
pub fn pid_tag(pid: u32) -> u16 {
    u16::try_from(pid >> SEQ_BITS).unwrap_or(0)
}

/// The pid number `seq` of the replica tagged `tag` (the sequence wraps, skipping 0).
pub fn pid(tag: u16, seq: u32) -> u32 {
    let seq = seq & ((1 << SEQ_BITS) - 1);
    (u32::from(tag) << SEQ_BITS) | seq.max(1)
}

/// The peer registry could not be joined.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The API server refused or failed.
    #[error(
        "registering this replica as an envd peer (a Lease in namespace {namespace}): {source}; the operator's Role needs create, get, list, patch and delete on leases there"
    )]
    Api {
        /// The namespace of the Leases.
        namespace: String,
        /// What failed.
        source: kube::Error,
    },
    /// Every tag tried was taken.
    #[error("no free envd peer tag after {CLAIM_TRIES} tries")]
    NoTag,
}

/// This replica's registration among the peers of its instance.
pub struct Peers {
    api: Api<Lease>,
    instance: String,
    tag: u16,
    url: String,
}

impl Peers {
    /// Claims a free tag for this replica, reachable at `url`; forgets peers whose Lease
    /// expired (they stopped).
    pub async fn join(client: Client, instance: &str, url: &str) -> Result<Peers, PeerError> {
        let namespace = LeaderConfig::for_instance(instance, LEASE.as_secs()).namespace;
        let api: Api<Lease> = Api::namespaced(client, &namespace);
        let failed = |source| PeerError::Api {
            namespace: namespace.clone(),
            source,
        };
        let mut peers = Peers {
            api,
            instance: instance.to_string(),
            tag: 0,
            url: url.to_string(),
        };
        peers.forget_expired().await.map_err(failed)?;
        for _ in 0..CLAIM_TRIES {
            peers.tag = fastrand::u16(1..=MAX_TAG);
            match peers
                .api
                .create(&PostParams::default(), &peers.lease())
                .await
            {
                Ok(_) => return Ok(peers),
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(failed(e)),
            }
        }
        Err(PeerError::NoTag)
    }

    /// This replica's tag.
    pub fn tag(&self) -> u16 {
        self.tag
    }

    fn name(&self, tag: u16) -> String {
        format!("sandbox-operator-{}-envd-{tag}", self.instance)
    }

    /// This replica's Lease, renewed now.
    fn lease(&self) -> Lease {
        let labels = [(PEER_LABEL.to_string(), self.instance.clone())];
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name(self.tag)),
                labels: Some(labels.into_iter().collect()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.url.clone()),
                lease_duration_seconds: i32::try_from(LEASE.as_secs()).ok(),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..LeaseSpec::default()
            }),
        }
    }

    async fn forget_expired(&self) -> Result<(), kube::Error> {
        let all = self.api.list(&self.selector()).await?;
        for lease in all.items.iter().filter(|l| live_url(l).is_none()) {
            let name = lease.metadata.name.clone().unwrap_or_default();
            match self.api.delete(&name, &DeleteParams::default()).await {
                Ok(_) | Err(kube::Error::Api(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn selector(&self) -> ListParams {
        ListParams::default().labels(&format!("{PEER_LABEL}={}", self.instance))
    }

    /// Renews the Lease until `stop`, then deletes it: from then on the other replicas
    /// answer for this one's processes that it stopped.
    pub async fn hold(&self, stop: impl Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                () = tokio::time::sleep(RENEW_EVERY) => self.renew().await,
            }
        }
        let name = self.name(self.tag);
        if let Err(e) = self.api.delete(&name, &DeleteParams::default()).await {
            tracing::warn!(error = %e, lease = %name, "could not delete this replica's envd peer Lease; it expires");
        }
    }

    async fn renew(&self) {
        let name = self.name(self.tag);
        let patch = serde_json::json!({"spec": {"renewTime": MicroTime(Timestamp::now())}});
        let renewed = match self
            .api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 404 => {
                self.api.create(&PostParams::default(), &self.lease()).await
            }
            other => other,
        };
        if let Err(e) = renewed {
            tracing::warn!(error = %e, lease = %name, "could not renew this replica's envd peer Lease");
        }
    }

    /// The URL of the live replica tagged `tag`; `None` when it stopped (no Lease, or one
    /// that expired).
    pub async fn url_of(&self, tag: u16) -> Result<Option<String>, EnvdError> {
        let lease = self
            .api
            .get_opt(&self.name(tag))
            .await
            .map_err(unavailable)?;
        Ok(lease.as_ref().and_then(live_url))
    }

    /// The URLs of the other live replicas.
    pub async fn others(&self) -> Result<Vec<String>, EnvdError> {
        let all = self.api.list(&self.selector()).await.map_err(unavailable)?;
        let mine = self.name(self.tag);
        Ok(all
            .items
            .iter()
            .filter(|l| l.metadata.name.as_deref() != Some(mine.as_str()))
            .filter_map(live_url)
            .collect())
    }
}

/// The holder of a Lease that has not expired.
fn live_url(lease: &Lease) -> Option<String> {
    let view = LeaseView::from(lease);
    if view.expired(Timestamp::now(), LEASE) {
        return None;
    }
    view.holder().map(str::to_string)
}

fn unavailable(e: kube::Error) -> EnvdError {
    EnvdError::new(
        Code::Unavailable,
        format!("looking up the operator replicas (their envd peer Leases): {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_names_the_replica_that_assigned_it() {
        assert_eq!(pid_tag(pid(5, 1)), 5);
        assert_eq!(pid_tag(pid(MAX_TAG, u32::MAX)), MAX_TAG);
        assert!(pid(MAX_TAG, u32::MAX) < 1 << 31, "a signed int everywhere");
        assert_eq!(
            pid(3, 1 << SEQ_BITS),
            pid(3, 1),
            "the sequence wraps and skips 0"
        );
        assert_eq!(pid_tag(7), 0, "a small pid is no replica's");
    }

    fn lease(holder: &str, renewed_ago: Duration) -> Lease {
        let renewed = Timestamp::now() - renewed_ago;
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(renewed)),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn only_a_lease_renewed_within_its_duration_is_a_live_peer() {
        let url = "http://10.0.0.1:3000";
        assert_eq!(
            live_url(&lease(url, Duration::from_secs(2))).as_deref(),
            Some(url)
        );
        assert_eq!(live_url(&lease(url, Duration::from_secs(20))), None);
        assert_eq!(live_url(&lease("", Duration::ZERO)), None);
    }
}
