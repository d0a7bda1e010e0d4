//! The configuration a template image stores: how a capture leaves out the values a Sandbox
//! got from Secrets.
//!
//! `docker commit` always merges the committed container's configuration into the image's,
//! `Config.Env` included — and a sandbox's env holds the values of its `envFrom` Secrets.
//! The engine has no way to drop a variable at commit time: a commit can only add or
//! override one (an empty value still leaves the name set). So a capture commits untagged,
//! then loads (`docker load`) a new image configuration that names the committed layers —
//! which the engine holds already, so it reads none of them — with the env a template may
//! store ([`stored_env`]), under the template's tag. The untagged commit is removed by the
//! caller. A load the engine refuses fails the capture: a template with a secret in it is
//! never tagged.
//!
//! Self-delivered files (`selfDeliveredEnv`) live in the container's own layer; the capture
//! removes them in a helper before the commit that is tagged (see the module docs of
//! `templates`).

use std::collections::BTreeMap;

use futures::StreamExt;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{DockerProvider, map_err};
use crate::provider::{ProviderError, ProviderResult};

/// The env a template stores: the source image's own env, overridden and extended by the
/// captured Sandbox's plain env (`CommitRequest::env`). Nothing else of the sandbox's env —
/// in particular nothing that came from a Secret — is ever kept: this is an allow-list, so
/// a Secret key the controller no longer knows of (its Secret changed since the sandbox was
/// made) is left out too.
pub(crate) fn stored_env(image_env: &[String], plain: &BTreeMap<String, String>) -> Vec<String> {
    let mut env: Vec<String> = image_env
        .iter()
        .filter(|entry| {
            let name = entry.split_once('=').map_or(entry.as_str(), |(k, _)| k);
            !plain.contains_key(name)
        })
        .cloned()
        .collect();
    env.extend(plain.iter().map(|(k, v)| format!("{k}={v}")));
    env
}

/// The image configuration document (`docker save`'s `<id>.json`) of an image, from its
/// inspect answer, with `env` as `Config.Env`. History is left out: the engine accepts a
/// configuration without one, and a partial history would not match the layers.
pub(crate) fn config_document(inspect: &Value, env: &[String]) -> Result<Value, String> {
    let diff_ids = inspect
        .pointer("/RootFS/Layers")
        .filter(|l| l.as_array().is_some_and(|l| !l.is_empty()))
        .ok_or("the committed image lists no layers")?;
    let mut config = inspect.get("Config").cloned().unwrap_or_else(|| json!({}));
    let object = config
        .as_object_mut()
        .ok_or("the committed image has no configuration object")?;
    object.retain(|_, v| !v.is_null());
    object.insert("Env".into(), json!(env));
    let mut doc = json!({
        "architecture": inspect.get("Architecture").cloned().unwrap_or(Value::Null),
        "os": inspect.get("Os").cloned().unwrap_or(Value::Null),
        "created": inspect.get("Created").cloned().unwrap_or(Value::Null),
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    for (from, to) in [
        ("Variant", "variant"),
        ("Author", "author"),
        ("Comment", "comment"),
    ] {
        if let Some(v) = inspect.get(from).filter(|v| !v.is_null()) {
            doc[to] = v.clone();
        }
    }
    Ok(doc)
}

/// A `docker save` archive of one image whose layers the engine already holds: the
/// configuration (named by its digest, as `docker save` names it) and the manifest only.
pub(crate) fn load_archive(config: &Value, reference: &str) -> Result<Vec<u8>, String> {
    let config_bytes = serde_json::to_vec(config).map_err(|e| e.to_string())?;
    let digest: String = Sha256::digest(&config_bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let layers = config
        .pointer("/rootfs/diff_ids")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let config_name = format!("{digest}.json");
    // Never read: the engine has every layer (a load looks a layer up before reading it).
    let layer_names: Vec<String> = (0..layers).map(|i| format!("{i}/layer.tar")).collect();
    let manifest = json!([{
        "Config": config_name,
        "RepoTags": [reference],
        "Layers": layer_names,
    }]);
    let manifest = serde_json::to_vec(&manifest).map_err(|e| e.to_string())?;
    let mut builder = tar::Builder::new(Vec::new());
    for (name, bytes) in [
        (config_name.as_str(), &config_bytes),
        ("manifest.json", &manifest),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(&mut header, name, bytes.as_slice())
            .map_err(|e| e.to_string())?;
    }
    builder.into_inner().map_err(|e| e.to_string())
}

impl DockerProvider {
    /// Tags the committed image `image_id` as `reference` with `env` as its whole
    /// `Config.Env` (see the module docs). Returns the new image's id.
    pub(super) async fn tag_with_env(
        &self,
        image_id: &str,
        reference: &str,
        env: &[String],
    ) -> ProviderResult<String> {
        let docker = self.engine().await?;
        let inspect = docker
            .inspect_image(image_id)
            .await
            .map_err(|e| map_err("reading the committed template image", e))?;
        let inspect = serde_json::to_value(&inspect).map_err(|e| {
            ProviderError::transient(format!("reading the committed template image: {e}"))
        })?;
        let refused = |e: String| {
            ProviderError::transient(format!(
                "the template image {reference} could not be written without the sandbox's \
                 secret env ({e}); nothing was tagged"
            ))
        };
        let config = config_document(&inspect, env).map_err(refused)?;
        let archive = load_archive(&config, reference).map_err(refused)?;
        let options = bollard::query_parameters::ImportImageOptionsBuilder::default()
            .quiet(true)
            .build();
        let mut progress = docker.import_image(options, bollard::body_full(archive.into()), None);
        while let Some(step) = progress.next().await {
            step.map_err(|e| map_err(&format!("tagging template image {reference}"), e))?;
        }
        let loaded = docker
            .inspect_image(reference)
            .await
            .map_err(|e| map_err(&format!("reading template image {reference}"), e))?;
        loaded.id.ok_or_else(|| {
            ProviderError::transient(format!("template image {reference} has no id"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_image_env_and_the_plain_env_are_stored() {
        let image = vec!["PATH=/usr/bin".to_string(), "LANG=C".to_string()];
        let plain = BTreeMap::from([
            ("LANG".to_string(), "C.UTF-8".to_string()),
            ("PLAIN".to_string(), "p".to_string()),
        ]);
        // The sandbox's TOKEN (from a Secret) is in neither: it is not stored.
        assert_eq!(
            stored_env(&image, &plain),
            vec!["PATH=/usr/bin", "LANG=C.UTF-8", "PLAIN=p"]
        );
        assert_eq!(stored_env(&image, &BTreeMap::new()), image);
    }

    #[test]
    fn the_document_replaces_env_and_names_the_layers() {
        let inspect = json!({
            "Architecture": "amd64", "Os": "linux", "Created": "2026-01-01T00:00:00Z",
            "Config": {"Env": ["TOKEN=secret", "PATH=/bin"], "Cmd": ["sh"], "User": null},
            "RootFS": {"Type": "layers", "Layers": ["sha256:a", "sha256:b"]},
        });
        let doc = config_document(&inspect, &["PATH=/bin".to_string()]).expect("document");
        assert_eq!(doc["config"]["Env"], json!(["PATH=/bin"]));
        assert_eq!(doc["config"]["Cmd"], json!(["sh"]));
        assert!(doc["config"].get("User").is_none());
        assert_eq!(doc["rootfs"]["diff_ids"], json!(["sha256:a", "sha256:b"]));
        assert!(!doc.to_string().contains("secret"));
        let archive = load_archive(&doc, "repo:tag").expect("archive");
        let digest: String = Sha256::digest(serde_json::to_vec(&doc).expect("json"))
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut names = Vec::new();
        for entry in tar::Archive::new(archive.as_slice())
            .entries()
            .expect("tar")
        {
            let entry = entry.expect("entry");
            names.push(entry.path().expect("path").display().to_string());
        }
        assert_eq!(
            names,
            vec![format!("{digest}.json"), "manifest.json".into()]
        );
        let without_layers = json!({"Config": {}, "RootFS": {"Layers": []}});
        assert!(config_document(&without_layers, &[]).is_err());
    }
}
