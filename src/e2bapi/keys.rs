//! API keys are Kubernetes Secrets of type [`KEY_SECRET_TYPE`] in the namespace they grant:
//! `data.apiKey` is the key and `data.serviceAccount` the ServiceAccount (same namespace)
//! whose identity the API acts with, so the objects a key creates are RBAC-limited and
//! audited like any client's. Whoever may create Secrets in a namespace may mint keys for
//! it (as they may already run Pods under its ServiceAccounts); no key reaches another
//! namespace.
//!
//! Every replica keeps the key Secrets of all namespaces in a watch-fed store. A presented
//! key is hashed and compared in constant time with the hash of every stored key (no early
//! exit), and it is never logged: only the Secret that matched is.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;

/// The Secret type that marks an API key.
pub const KEY_SECRET_TYPE: &str = "sandboxes.dev/e2b-api-key";
/// The data key holding the API key.
pub const KEY_FIELD: &str = "apiKey";
/// The data key naming the ServiceAccount.
pub const SERVICE_ACCOUNT_FIELD: &str = "serviceAccount";
/// How long a request waits for the first complete read of the keys.
const READY_WAIT: Duration = Duration::from_secs(10);

/// Who a key speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// The namespace the key grants (its Secret's).
    pub namespace: String,
    /// The ServiceAccount the API acts as, in that namespace.
    pub service_account: String,
    /// The key's Secret, for logs and the objects' annotations (never the key).
    pub key_name: String,
}

/// The key Secrets, as the watch last saw them.
#[derive(Clone)]
pub struct Keys {
    store: Store<Secret>,
}

impl Keys {
    /// Starts watching the key Secrets of every namespace; the task ends with the process.
    pub fn watch(client: Client) -> Keys {
        let api: Api<Secret> = Api::all(client);
        let config = watcher::Config::default().fields(&format!("type={KEY_SECRET_TYPE}"));
        let (store, writer) = reflector::store();
        let stream = reflector::reflector(writer, watcher(api, config))
            .default_backoff()
            .touched_objects();
        tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(event) = futures::StreamExt::next(&mut stream).await {
                if let Err(e) = event {
                    tracing::warn!(error = %e, "E2B API: watching the API key Secrets");
                }
            }
        });
        Keys { store }
    }

    /// The tenant of the `X-API-KEY` header value; 401 when none matches.
    pub async fn authenticate(&self, presented: Option<&str>) -> Result<Tenant, ApiError> {
        let presented = presented.ok_or_else(ApiError::unauthorized)?;
        if tokio::time::timeout(READY_WAIT, self.store.wait_until_ready())
            .await
            .is_err()
        {
            return Err(ApiError::unavailable(
                "the API keys are not read yet; retry shortly",
            ));
        }
        let secrets = self.store.state();
        match_key(presented, secrets.iter().map(Arc::as_ref)).ok_or_else(ApiError::unauthorized)
    }
}

/// The tenant of the one Secret whose key is `presented`: every candidate is compared, in
/// constant time, whatever matched before.
pub fn match_key<'a>(presented: &str, secrets: impl Iterator<Item = &'a Secret>) -> Option<Tenant> {
    let wanted = Sha256::digest(presented.as_bytes());
    let mut found = None;
    for secret in secrets {
        let Some((key, tenant)) = entry(secret) else {
            continue;
        };
        let stored = Sha256::digest(key);
        if bool::from(stored.ct_eq(&wanted)) {
            found = Some(tenant);
        }
    }
    found
}

/// A usable key Secret's key and tenant; `None` for one of another type or incomplete.
fn entry(secret: &Secret) -> Option<(&[u8], Tenant)> {
    if secret.type_.as_deref() != Some(KEY_SECRET_TYPE) {
        return None;
    }
    let data = secret.data.as_ref()?;
    let key = data.get(KEY_FIELD).map(|b| b.0.as_slice())?;
    let account = data.get(SERVICE_ACCOUNT_FIELD)?;
    let account = std::str::from_utf8(&account.0).ok()?.trim();
    if key.len() < 16 || account.is_empty() {
        return None;
    }
    let tenant = Tenant {
        namespace: secret.namespace()?,
        service_account: account.to_string(),
        key_name: secret.name_any(),
    };
    Some((key, tenant))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn key_secret(ns: &str, name: &str, key: &str, account: &str) -> Secret {
        let mut s = Secret::default();
        s.metadata.namespace = Some(ns.into());
        s.metadata.name = Some(name.into());
        s.type_ = Some(KEY_SECRET_TYPE.into());
        s.data = Some(
            [
                (KEY_FIELD.to_string(), ByteString(key.as_bytes().to_vec())),
                (
                    SERVICE_ACCOUNT_FIELD.into(),
                    ByteString(account.as_bytes().to_vec()),
                ),
            ]
            .into(),
        );
        s
    }

    #[test]
    fn a_key_maps_to_its_secrets_namespace_and_service_account() {
        let a = key_secret("a", "k", "e2b_aaaaaaaaaaaaaaaaaaaa", "agent");
        let b = key_secret("b", "k", "e2b_bbbbbbbbbbbbbbbbbbbb", "robot");
        let all = [a, b];
        let t = match_key("e2b_bbbbbbbbbbbbbbbbbbbb", all.iter()).unwrap();
        assert_eq!(
            (t.namespace.as_str(), t.service_account.as_str()),
            ("b", "robot")
        );
        assert_eq!(match_key("e2b_aaaaaaaaaaaaaaaaaaab", all.iter()), None);
        assert_eq!(match_key("", all.iter()), None);
    }

    #[test]
    fn other_secret_types_and_short_or_unowned_keys_never_match() {
        let mut opaque = key_secret("a", "k", "e2b_aaaaaaaaaaaaaaaaaaaa", "agent");
        opaque.type_ = Some("Opaque".into());
        let short = key_secret("a", "s", "short", "agent");
        let nobody = key_secret("a", "n", "e2b_cccccccccccccccccccc", " ");
        let all = [opaque, short, nobody];
        for k in [
            "e2b_aaaaaaaaaaaaaaaaaaaa",
            "short",
            "e2b_cccccccccccccccccccc",
        ] {
            assert_eq!(match_key(k, all.iter()), None, "{k}");
        }
    }
}
