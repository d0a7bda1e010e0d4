//! Registry credentials for a sandbox's image: the one credential that matches the image's
//! registry is written into a per-sandbox `kubernetes.io/dockerconfigjson` Secret in the
//! provider's namespace, which the Pod names in `imagePullSecrets`; the kubelet pulls with it.
//!
//! The tenant's own Secret lives in the Sandbox's namespace, which a Pod in the provider's
//! namespace cannot name, hence the copy. It holds only the matching registry's entry, is
//! labelled with the owner, and is deleted with the sandbox. Nothing of it reaches the Pod
//! spec, a log or a status.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::KubernetesProvider;
use crate::provider::image;
use crate::provider::{
    CreateRequest, ImagePullPolicy, ProviderError, ProviderResult, RegistryCredential,
};

/// The Secret type the kubelet reads pull credentials from.
const DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";

/// The name of sandbox `id`'s pull Secret.
pub fn secret_name(id: &str) -> String {
    format!("{id}-pull")
}

/// The credential the kubelet needs for `request`'s image, if any applies.
pub fn credential(request: &CreateRequest) -> ProviderResult<Option<&RegistryCredential>> {
    let Some(image) = request.image.as_deref() else {
        return Ok(None);
    };
    if request.registry_credentials.is_empty()
        || request.image_pull_policy == ImagePullPolicy::Never
    {
        return Ok(None);
    }
    let reference = image::parse(image).map_err(ProviderError::invalid)?;
    Ok(image::credential_for(
        &reference,
        &request.registry_credentials,
    ))
}

/// The Docker config document holding just `credential`.
fn document(credential: &RegistryCredential) -> Vec<u8> {
    let mut entry = serde_json::json!({
        "username": credential.username,
        "password": credential.password,
        "auth": STANDARD.encode(format!("{}:{}", credential.username, credential.password)),
    });
    if let Some(token) = &credential.identity_token {
        entry["identitytoken"] = serde_json::Value::String(token.clone());
    }
    serde_json::to_vec(&serde_json::json!({"auths": {credential.registry.clone(): entry}}))
        .unwrap_or_default()
}

impl KubernetesProvider {
    /// Creates the sandbox's pull Secret (see [`KubernetesProvider::ensure_secret`]).
    pub(super) async fn ensure_pull_secret(
        &self,
        request: &CreateRequest,
        credential: &RegistryCredential,
    ) -> ProviderResult<()> {
        let name = secret_name(&request.name);
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(request.owner.labels()),
                ..Default::default()
            },
            type_: Some(DOCKER_CONFIG_JSON.into()),
            data: Some(BTreeMap::from([(
                ".dockerconfigjson".to_string(),
                ByteString(document(credential)),
            )])),
            ..Default::default()
        };
        self.ensure_secret(&request.owner.uid, &secret).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_holds_only_the_matching_registry() {
        let c = RegistryCredential {
            registry: "127.0.0.1:5000".into(),
            username: "u".into(),
            password: "p".into(),
            identity_token: None,
            source: "s".into(),
        };
        let doc: serde_json::Value = serde_json::from_slice(&document(&c)).unwrap();
        assert_eq!(
            doc["auths"]["127.0.0.1:5000"]["auth"],
            STANDARD.encode("u:p")
        );
        assert_eq!(doc["auths"].as_object().unwrap().len(), 1);
    }
}
