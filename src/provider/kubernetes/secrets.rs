//! The per-sandbox Secrets of the provider's namespace: the pull Secret (see `pull`) and the
//! env Secret, and the one way both are created or converged.
//!
//! The env Secret holds the values of the sandbox's env that came from Secrets
//! (`spec.envFrom`, listed in the request's `secret_env_keys`); the Pod names them through
//! `secretKeyRef`, so the Pod spec — readable by anyone who can `get pods` in this namespace
//! — never carries them. The Secret is made before the Pod, is owned by the Pod (the API
//! server's garbage collector removes it with the Pod, should the operator never get to),
//! carries the owner labels, and is deleted explicitly with the sandbox. A stop replaces the
//! Pod: the Secret is released from the old Pod before it is deleted and owned by its
//! successor, so the collector never takes it in between.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};

use super::KubernetesProvider;
use super::errors::{absent_ok, from_kube};
use crate::provider::{CreateRequest, ProviderError, ProviderResult};

/// The name of sandbox `id`'s env Secret.
pub fn env_secret_name(id: &str) -> String {
    format!("{id}-env")
}

/// The env Secret `request` needs: `None` when none of its env came from a Secret.
pub fn env_secret(request: &CreateRequest) -> Option<Secret> {
    let data: BTreeMap<String, ByteString> = request
        .env
        .iter()
        .filter(|(name, _)| request.secret_env_keys.contains(*name))
        .map(|(name, value)| (name.clone(), ByteString(value.clone().into_bytes())))
        .collect();
    (!data.is_empty()).then(|| Secret {
        metadata: ObjectMeta {
            name: Some(env_secret_name(&request.name)),
            labels: Some(request.owner.labels()),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Default::default()
    })
}

/// Whether `pod`'s container takes env from its sandbox's env Secret.
pub fn uses_env_secret(pod: &Pod) -> bool {
    let Some(name) = pod.metadata.name.as_deref() else {
        return false;
    };
    let secret = env_secret_name(name);
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.env.iter().flatten())
        .filter_map(|e| e.value_from.as_ref()?.secret_key_ref.as_ref())
        .any(|r| r.name == secret)
}

impl KubernetesProvider {
    /// Creates `secret`; one already there for the same owner (`owner_uid`) is replaced (a
    /// create retried after a crash converges; its owner references go, since they may name
    /// a Pod the collector is about to take it with), one of another owner is a `Conflict`.
    pub(super) async fn ensure_secret(
        &self,
        owner_uid: &str,
        secret: &Secret,
    ) -> ProviderResult<()> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let what = format!("creating Secret {name}");
        match self.secrets().create(&PostParams::default(), secret).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = self
                    .secrets()
                    .get(&name)
                    .await
                    .map_err(|e| from_kube(e, &what))?;
                if super::owner_uid(&existing.metadata) != Some(owner_uid) {
                    return Err(ProviderError::conflict(format!(
                        "Secret {name} in namespace {} belongs to someone else; remove it",
                        self.settings.namespace
                    )));
                }
                self.secrets()
                    .replace(&name, &PostParams::default(), secret)
                    .await
                    .map(|_| ())
                    .map_err(|e| from_kube(e, &what))
            }
            Err(e) => Err(from_kube(e, &what)),
        }
    }

    /// Makes `pod` the only owner of its env Secret (when it uses one).
    pub(super) async fn own_env_secret(&self, pod: &Pod) -> ProviderResult<()> {
        let (Some(name), Some(uid)) = (pod.metadata.name.as_deref(), pod.metadata.uid.as_deref())
        else {
            return Ok(());
        };
        let owner = serde_json::json!([{
            "apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid,
        }]);
        self.set_env_secret_owner(pod, owner).await
    }

    /// Releases `pod`'s env Secret from it before the Pod is deleted and replaced.
    pub(super) async fn disown_env_secret(&self, pod: &Pod) -> ProviderResult<()> {
        self.set_env_secret_owner(pod, serde_json::Value::Null)
            .await
    }

    async fn set_env_secret_owner(
        &self,
        pod: &Pod,
        owners: serde_json::Value,
    ) -> ProviderResult<()> {
        let Some(name) = pod
            .metadata
            .name
            .as_deref()
            .filter(|_| uses_env_secret(pod))
        else {
            return Ok(());
        };
        let secret = env_secret_name(name);
        let patch = serde_json::json!({"metadata": {"ownerReferences": owners}});
        let patched = self
            .secrets()
            .patch(&secret, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        absent_ok(patched, &format!("setting the owner of Secret {secret}")).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_secret_derived_env_goes_into_the_env_secret() {
        let request = CreateRequest {
            env: BTreeMap::from([("PLAIN".into(), "p".into()), ("TOKEN".into(), "t".into())]),
            secret_env_keys: ["TOKEN".to_string()].into(),
            ..super::super::pod::tests::request()
        };
        let secret = env_secret(&request).unwrap();
        assert_eq!(secret.metadata.name.as_deref(), Some("sbx-1-env"));
        let data = secret.data.unwrap();
        assert_eq!(data.keys().collect::<Vec<_>>(), ["TOKEN"]);
        assert_eq!(data["TOKEN"].0, b"t");
        let plain = CreateRequest {
            secret_env_keys: Default::default(),
            ..request
        };
        assert!(env_secret(&plain).is_none());
    }
}
