//! The test S3 server's settings: runs `tests/setup/s3.sh` (idempotent; it starts s3s-fs, a
//! SigV4-checking server, when none runs) once per test binary and reads the env file it
//! writes (atomically, so a concurrent run never exposes half a file). Also the operator
//! configuration of a template store on it, and the cleanup of a test's prefix.

use std::collections::HashMap;
use std::sync::OnceLock;

use sandbox_operator::config::TemplateStoreConfig;
use sandbox_operator::provider::docker::DockerSettings;
use sandbox_operator::templates::manifest::{Keys, MANIFEST_SCHEMA, Manifest, ManifestOwner};
use sandbox_operator::templates::store::{StoreError, StoreSettings, TemplateStore};

/// `SANDBOX_S3_ENDPOINT`, `SANDBOX_S3_ACCESS_KEY`, `SANDBOX_S3_SECRET_KEY`, `SANDBOX_S3_BUCKET`.
pub fn s3_env() -> HashMap<String, String> {
    static ENV: OnceLock<HashMap<String, String>> = OnceLock::new();
    ENV.get_or_init(|| {
        let out = std::process::Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/setup/s3.sh"))
            .output()
            .expect("run tests/setup/s3.sh");
        assert!(
            out.status.success(),
            "s3.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let env: HashMap<String, String> = std::fs::read_to_string(&path)
            .expect("s3 env file")
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for key in [
            "SANDBOX_S3_ENDPOINT",
            "SANDBOX_S3_ACCESS_KEY",
            "SANDBOX_S3_SECRET_KEY",
            "SANDBOX_S3_BUCKET",
        ] {
            assert!(env.contains_key(key), "{path} lacks {key}: {env:?}");
        }
        env
    })
    .clone()
}

/// Docker settings whose sandboxes reach the test store on the host through the host
/// firewall, as the operator makes them for a provider whose `templateStore` it is.
pub fn reaching_store(mut settings: DockerSettings) -> DockerSettings {
    settings
        .hardening
        .open_template_store(&s3_env()["SANDBOX_S3_ENDPOINT"]);
    settings
}

/// The S3 test store under `prefix` (`templateStores`), with the keys by environment
/// reference; and the environment that holds them.
pub fn store_config(prefix: &str) -> (String, Vec<(String, String)>) {
    let env = s3_env();
    let config = format!(
        "templateStores:\n  - name: s3\n    bucket: {}\n    endpoint: {}\n    \
         pathStyle: true\n    prefix: {prefix}\n    accessKeyId: {{env: E2E_S3_ACCESS_KEY}}\n    \
         secretAccessKey: {{env: E2E_S3_SECRET_KEY}}\n",
        env["SANDBOX_S3_BUCKET"], env["SANDBOX_S3_ENDPOINT"],
    );
    let keys = vec![
        (
            "E2E_S3_ACCESS_KEY".into(),
            env["SANDBOX_S3_ACCESS_KEY"].clone(),
        ),
        (
            "E2E_S3_SECRET_KEY".into(),
            env["SANDBOX_S3_SECRET_KEY"].clone(),
        ),
    ];
    (config, keys)
}

/// Settings of the test store under `prefix`; `secret` overrides the secret key (a wrong one
/// makes every request fail its signature check).
pub fn store_settings(prefix: &str, secret: Option<&str>) -> Result<StoreSettings, StoreError> {
    let env = s3_env();
    let cfg: TemplateStoreConfig = serde_json::from_value(serde_json::json!({
        "name": "test",
        "bucket": env["SANDBOX_S3_BUCKET"],
        "endpoint": env["SANDBOX_S3_ENDPOINT"],
        "pathStyle": true,
        "prefix": prefix,
    }))
    .expect("store config");
    let access = env["SANDBOX_S3_ACCESS_KEY"].clone();
    let secret = secret
        .map(str::to_string)
        .unwrap_or_else(|| env["SANDBOX_S3_SECRET_KEY"].clone());
    StoreSettings::resolve(&cfg, |k| match k {
        "AWS_ACCESS_KEY_ID" => Some(access.clone()),
        "AWS_SECRET_ACCESS_KEY" => Some(secret.clone()),
        _ => None,
    })
}

/// The test store under `prefix` (see [`store_settings`]).
pub fn store(prefix: &str, secret: Option<&str>) -> TemplateStore {
    TemplateStore::new(store_settings(prefix, secret).expect("test store settings"))
}

/// Puts a template of `/workspace/app` owned by `owner` (with its owner `labels`, shared with
/// nobody) into `store` as the control plane writes one: `archive` (any bytes), then the
/// manifest.
pub async fn put_owned_template(
    store: &TemplateStore,
    id: &str,
    owner: ManifestOwner,
    labels: std::collections::BTreeMap<String, String>,
    archive: &str,
) {
    let keys = Keys::new(&store.settings().prefix, id);
    store
        .put_text(&keys.archive(), archive, "application/gzip")
        .await
        .expect("archive");
    put_owned_manifest(store, id, owner, labels, archive.len() as u64).await;
}

/// Writes the manifest of a template of `/workspace/app` owned by `owner` (shared with
/// nobody) whose archive is `size_bytes` long.
pub async fn put_owned_manifest(
    store: &TemplateStore,
    id: &str,
    owner: ManifestOwner,
    labels: std::collections::BTreeMap<String, String>,
    size_bytes: u64,
) {
    let m = Manifest {
        schema: MANIFEST_SCHEMA,
        id: id.into(),
        capture_paths: vec!["/workspace/app".into()],
        created_at: "2026-01-01T00:00:00Z".into(),
        size_bytes,
        label: None,
        base_image: Some(super::docker::base_image()),
        labels,
        owner: Some(owner),
        shared_with: Vec::new(),
    };
    let body = serde_json::to_string(&m).expect("json");
    let keys = Keys::new(&store.settings().prefix, id);
    store
        .put_text(&keys.manifest(), &body, "application/json")
        .await
        .expect("manifest");
}

/// Removes every object of the test store under a prefix when dropped, so a failed test
/// leaves none behind (a passing one has removed them through the operator already).
pub struct PurgePrefix(pub String);

impl Drop for PurgePrefix {
    fn drop(&mut self) {
        let Ok(settings) = store_settings(&self.0, None) else {
            return;
        };
        let prefix = format!("{}/", self.0);
        // Drop runs inside the test's runtime, which cannot be blocked on: a runtime of its
        // own on a thread of its own.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                let store = TemplateStore::new(settings);
                if let Ok(objects) = store.list(&prefix).await {
                    let keys: Vec<String> = objects.into_iter().map(|o| o.key).collect();
                    let _ = store.remove(&keys).await;
                }
            });
        })
        .join();
    }
}
