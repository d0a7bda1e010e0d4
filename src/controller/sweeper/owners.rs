//! Where a pass learns about owners: the API server in the operator, or anything else that
//! can answer the same two questions (a check that runs a whole pass against a provider with
//! no API server behind it supplies its own).

use async_trait::async_trait;
use kube::Client;

use super::SweepError;
use super::decide::{Candidate, OwnerFacts, OwnerKey};
use super::observe;

/// An owner as a direct read finds it right before a deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRead {
    /// Its UID (compared with the `owner-uid` label).
    pub uid: String,
    /// For a Sandbox: the provider id its status names as its current sandbox
    /// (`status.sandboxId`). Wreckage it names is never reclaimed.
    pub current_sandbox: Option<String>,
}

/// The two questions a pass asks about owners.
#[async_trait]
pub trait OwnerSource: Send + Sync {
    /// Facts about every owner the candidates labelled for `instance` name. Fails as a
    /// whole: a pass never decides on a partial picture.
    async fn facts(
        &self,
        candidates: &[Candidate],
        instance: &str,
    ) -> Result<OwnerFacts, SweepError>;

    /// One owner read directly, right before a deletion that depends on it: `None` when it
    /// does not exist.
    async fn read(&self, key: &OwnerKey) -> Result<Option<OwnerRead>, String>;
}

/// The owners as the API server holds them, read without a cache.
#[derive(Clone)]
pub struct ApiServerOwners {
    client: Client,
}

impl ApiServerOwners {
    /// Reads through `client`.
    pub fn new(client: Client) -> Self {
        ApiServerOwners { client }
    }
}

#[async_trait]
impl OwnerSource for ApiServerOwners {
    async fn facts(
        &self,
        candidates: &[Candidate],
        instance: &str,
    ) -> Result<OwnerFacts, SweepError> {
        observe::owner_facts(&self.client, candidates, instance).await
    }

    async fn read(&self, key: &OwnerKey) -> Result<Option<OwnerRead>, String> {
        observe::read_owner(&self.client, key).await
    }
}
