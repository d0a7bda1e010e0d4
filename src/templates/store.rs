//! The S3-compatible object store that holds published templates (aws-sdk-s3).
//!
//! Only the control plane's half lives here — presigning, metadata, enumeration, deletion.
//! Archive bytes move directly between a sandbox and the store over presigned URLs (see
//! [`super::transfer`]); the operator never proxies them.
//!
//! Operations used are the six every S3-compatible store supports: PutObject, GetObject,
//! HeadObject, ListObjectsV2, DeleteObject(s) — plus presigned PUT/GET.

use std::time::Duration;

use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{Delete, ObjectIdentifier};
use chrono::{DateTime, Utc};

use super::manifest::clamp_presign;
use crate::config::TemplateStoreConfig;
use crate::provider::ProviderError;

/// Key prefix when none is configured.
pub const DEFAULT_PREFIX: &str = "sandbox-templates";
/// Region when none is configured: SigV4 needs some region, and most S3-compatible stores
/// accept `auto`.
pub const DEFAULT_REGION: &str = "auto";

/// Why a store cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Settings are missing. Reported as configuration, never as a network failure, so an
    /// operator looks at the settings and not at the network.
    #[error(
        "template store {store:?} is not configured: missing {missing}; set them in the operator configuration (templateStores) or the environment"
    )]
    Unconfigured {
        /// Store name.
        store: String,
        /// The missing settings, comma-separated.
        missing: String,
    },
    /// A secret reference could not be resolved.
    #[error("template store {store:?}: {message}")]
    Secret {
        /// Store name.
        store: String,
        /// What failed (names the reference, never the value).
        message: String,
    },
}

/// Connection settings after config + environment fallbacks.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreSettings {
    /// Store name (for messages).
    pub name: String,
    /// Bucket.
    pub bucket: String,
    /// Endpoint URL; `None` = AWS.
    pub endpoint: Option<String>,
    /// Region.
    pub region: String,
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key (never printed: see the Debug impl).
    pub secret_access_key: String,
    /// Session token.
    pub session_token: Option<String>,
    /// Path-style addressing.
    pub path_style: bool,
    /// Key prefix, no trailing slash.
    pub prefix: String,
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings")
            .field("name", &self.name)
            .field("bucket", &self.bucket)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl StoreSettings {
    /// Resolves settings from the configuration, with the environment as fallback for each
    /// (`BUCKET_NAME`, `AWS_ENDPOINT_URL_S3`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`). A partial configuration is an error that
    /// names every missing setting.
    pub fn resolve(
        config: &TemplateStoreConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<StoreSettings, StoreError> {
        let store = config.name.clone();
        let secret = |src: &Option<crate::config::SecretSource>,
                      field: &str,
                      var: &str|
         -> Result<Option<String>, StoreError> {
            match src {
                Some(s) => s
                    .resolve_for(&format!("templateStores[{store}].{field}"))
                    .map(Some)
                    .map_err(|e| StoreError::Secret {
                        store: store.clone(),
                        message: e.to_string(),
                    }),
                None => Ok(env(var).filter(|v| !v.is_empty())),
            }
        };
        let bucket = Some(config.bucket.clone())
            .filter(|b| !b.is_empty())
            .or_else(|| env("BUCKET_NAME"));
        let access = secret(&config.access_key_id, "accessKeyId", "AWS_ACCESS_KEY_ID")?;
        let secret_key = secret(
            &config.secret_access_key,
            "secretAccessKey",
            "AWS_SECRET_ACCESS_KEY",
        )?;
        let token = secret(&config.session_token, "sessionToken", "AWS_SESSION_TOKEN")?;
        let mut missing = Vec::new();
        if bucket.is_none() {
            missing.push("bucket (or BUCKET_NAME)");
        }
        if access.is_none() {
            missing.push("accessKeyId (or AWS_ACCESS_KEY_ID)");
        }
        if secret_key.is_none() {
            missing.push("secretAccessKey (or AWS_SECRET_ACCESS_KEY)");
        }
        match (bucket, access, secret_key) {
            (Some(bucket), Some(access_key_id), Some(secret_access_key)) => Ok(StoreSettings {
                name: store,
                bucket,
                endpoint: endpoint_of(config, &env),
                region: config
                    .region
                    .clone()
                    .or_else(|| env("AWS_REGION"))
                    .unwrap_or_else(|| DEFAULT_REGION.into()),
                access_key_id,
                secret_access_key,
                session_token: token,
                path_style: config.path_style.unwrap_or(false),
                prefix: config
                    .prefix
                    .clone()
                    .unwrap_or_else(|| DEFAULT_PREFIX.into())
                    .trim_matches('/')
                    .to_string(),
            }),
            _ => Err(StoreError::Unconfigured {
                store,
                missing: missing.join(", "),
            }),
        }
    }
}

/// The endpoint URL of a store: its setting, else `AWS_ENDPOINT_URL_S3` from `env`; `None`
/// means AWS itself.
pub fn endpoint_of(
    config: &TemplateStoreConfig,
    env: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    config
        .endpoint
        .clone()
        .or_else(|| env("AWS_ENDPOINT_URL_S3"))
}

/// One stored object's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    /// Full key.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// Last modified, when the store reported it.
    pub last_modified: Option<DateTime<Utc>>,
}

/// A configured S3-compatible template store.
#[derive(Clone)]
pub struct TemplateStore {
    client: aws_sdk_s3::Client,
    settings: StoreSettings,
}

impl std::fmt::Debug for TemplateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TemplateStore")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

fn store_err<E, R>(what: &str, key: &str, err: SdkError<E, R>) -> ProviderError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let detail = match &err {
        SdkError::ServiceError(e) => format!(
            "{} ({})",
            e.err().message().unwrap_or("no message"),
            e.err().code().unwrap_or("no code")
        ),
        other => format!("{other}"),
    };
    ProviderError::transient(format!("template store: {what} {key:?} failed: {detail}"))
}

fn is_not_found<E: ProvideErrorMetadata, R>(
    err: &SdkError<E, R>,
    raw_status: impl Fn(&R) -> u16,
) -> bool {
    match err {
        SdkError::ServiceError(e) => {
            matches!(e.err().code(), Some("NoSuchKey" | "NotFound")) || raw_status(e.raw()) == 404
        }
        _ => false,
    }
}

fn to_chrono(t: Option<&aws_sdk_s3::primitives::DateTime>) -> Option<DateTime<Utc>> {
    t.and_then(|t| DateTime::<Utc>::from_timestamp(t.secs(), t.subsec_nanos()))
}

impl TemplateStore {
    /// A store client for resolved settings. Makes no request.
    pub fn new(settings: StoreSettings) -> Self {
        let creds = Credentials::new(
            settings.access_key_id.clone(),
            settings.secret_access_key.clone(),
            settings.session_token.clone(),
            None,
            "sandbox-operator",
        );
        let mut builder = aws_sdk_s3::config::Builder::new()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(settings.region.clone()))
            .credentials_provider(creds)
            .force_path_style(settings.path_style)
            // Only when required: on a presigned PUT a checksum header joins the signed
            // headers and the sandbox's plain `curl -T` could not reproduce it.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        if let Some(ep) = &settings.endpoint {
            builder = builder.endpoint_url(ep);
        }
        TemplateStore {
            client: aws_sdk_s3::Client::from_conf(builder.build()),
            settings,
        }
    }

    /// The settings in use.
    pub fn settings(&self) -> &StoreSettings {
        &self.settings
    }

    /// `s3://bucket/key`: the opaque reference shown to users.
    pub fn reference(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.settings.bucket)
    }

    /// Every object under `prefix`, following continuation tokens to the end. A truncated
    /// page without a token ends the listing with an error rather than looping on the same
    /// page or pretending the listing is complete. `Err` whenever it could not look.
    pub async fn list(&self, prefix: &str) -> Result<Vec<StoredObject>, ProviderError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.settings.bucket)
                .prefix(prefix)
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| store_err("list", prefix, e))?;
            for o in page.contents() {
                let Some(key) = o.key() else { continue };
                out.push(StoredObject {
                    key: key.to_string(),
                    size: o.size().and_then(|s| u64::try_from(s).ok()).unwrap_or(0),
                    last_modified: to_chrono(o.last_modified()),
                });
            }
            match (
                page.is_truncated().unwrap_or(false),
                page.next_continuation_token(),
            ) {
                (false, _) => return Ok(out),
                (true, Some(t)) => token = Some(t.to_string()),
                (true, None) => {
                    return Err(ProviderError::transient(format!(
                        "template store: listing {prefix:?} returned a truncated page without a continuation token; refusing to treat a partial listing as complete"
                    )));
                }
            }
        }
    }

    /// One object's metadata; `Ok(None)` only when it does not exist.
    pub async fn head(&self, key: &str) -> Result<Option<StoredObject>, ProviderError> {
        match self
            .client
            .head_object()
            .bucket(&self.settings.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(o) => Ok(Some(StoredObject {
                key: key.to_string(),
                size: o
                    .content_length()
                    .and_then(|s| u64::try_from(s).ok())
                    .unwrap_or(0),
                last_modified: to_chrono(o.last_modified()),
            })),
            Err(e) if is_not_found(&e, |r| r.status().as_u16()) => Ok(None),
            Err(e) => Err(store_err("head", key, e)),
        }
    }

    /// A small object's body as text; `Ok(None)` only when it does not exist.
    pub async fn get_text(&self, key: &str) -> Result<Option<String>, ProviderError> {
        match self
            .client
            .get_object()
            .bucket(&self.settings.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(o) => {
                let bytes = o
                    .body
                    .collect()
                    .await
                    .map_err(|e| {
                        ProviderError::transient(format!(
                            "template store: reading {key:?} failed: {e}"
                        ))
                    })?
                    .into_bytes();
                String::from_utf8(bytes.to_vec()).map(Some).map_err(|_| {
                    ProviderError::invalid(format!("template store: {key:?} is not UTF-8 text"))
                })
            }
            Err(e) if is_not_found(&e, |r| r.status().as_u16()) => Ok(None),
            Err(e) => Err(store_err("get", key, e)),
        }
    }

    /// Writes a small text object.
    pub async fn put_text(
        &self,
        key: &str,
        body: &str,
        content_type: &str,
    ) -> Result<(), ProviderError> {
        self.client
            .put_object()
            .bucket(&self.settings.bucket)
            .key(key)
            .content_type(content_type)
            .body(ByteStream::from(body.as_bytes().to_vec()))
            .send()
            .await
            .map_err(|e| store_err("put", key, e))?;
        Ok(())
    }

    /// Deletes objects, 1,000 per request (the DeleteObjects ceiling). Absent keys are a
    /// success; a per-key error in the response fails the call.
    pub async fn remove(&self, keys: &[String]) -> Result<(), ProviderError> {
        for batch in keys.chunks(1000) {
            let objects = batch
                .iter()
                .map(|k| ObjectIdentifier::builder().key(k).build())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ProviderError::invalid(format!("template store: bad key: {e}")))?;
            let delete = Delete::builder()
                .set_objects(Some(objects))
                .quiet(true)
                .build()
                .map_err(|e| {
                    ProviderError::invalid(format!("template store: bad delete request: {e}"))
                })?;
            let out = self
                .client
                .delete_objects()
                .bucket(&self.settings.bucket)
                .delete(delete)
                .send()
                .await
                .map_err(|e| store_err("delete", &batch[0], e))?;
            if let Some(err) = out.errors().first() {
                return Err(ProviderError::transient(format!(
                    "template store: deleting {:?} failed: {}",
                    err.key().unwrap_or("?"),
                    err.message().unwrap_or("no message")
                )));
            }
        }
        Ok(())
    }

    /// A presigned PUT URL. Nothing but `host` is signed (no content type, no checksum), so a
    /// plain `curl -T file URL` satisfies the signature.
    pub async fn presign_put(&self, key: &str, expires: Duration) -> Result<String, ProviderError> {
        let cfg = presign_config(expires)?;
        let req = self
            .client
            .put_object()
            .bucket(&self.settings.bucket)
            .key(key)
            .presigned(cfg)
            .await
            .map_err(|e| {
                ProviderError::invalid(format!("template store: cannot presign PUT {key:?}: {e}"))
            })?;
        Ok(req.uri().to_string())
    }

    /// A presigned GET URL.
    pub async fn presign_get(&self, key: &str, expires: Duration) -> Result<String, ProviderError> {
        let cfg = presign_config(expires)?;
        let req = self
            .client
            .get_object()
            .bucket(&self.settings.bucket)
            .key(key)
            .presigned(cfg)
            .await
            .map_err(|e| {
                ProviderError::invalid(format!("template store: cannot presign GET {key:?}: {e}"))
            })?;
        Ok(req.uri().to_string())
    }
}

fn presign_config(expires: Duration) -> Result<PresigningConfig, ProviderError> {
    PresigningConfig::expires_in(Duration::from_secs(clamp_presign(expires.as_secs())))
        .map_err(|e| ProviderError::invalid(format!("template store: bad presign lifetime: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> TemplateStoreConfig {
        serde_json::from_value(serde_json::json!({"name": "shared", "bucket": ""})).expect("config")
    }

    #[test]
    fn partial_configuration_names_every_missing_setting() {
        let err = StoreSettings::resolve(&cfg(), |k| {
            (k == "AWS_ACCESS_KEY_ID").then(|| "AK".to_string())
        })
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("not configured"), "{msg}");
        assert!(
            msg.contains("bucket")
                && msg.contains("secretAccessKey")
                && !msg.contains("accessKeyId (or"),
            "{msg}"
        );
    }

    #[test]
    fn environment_fills_in_and_secrets_stay_out_of_debug() {
        let env = |k: &str| match k {
            "BUCKET_NAME" => Some("b".to_string()),
            "AWS_ACCESS_KEY_ID" => Some("AK".to_string()),
            "AWS_SECRET_ACCESS_KEY" => Some("very-secret".to_string()),
            "AWS_ENDPOINT_URL_S3" => Some("http://127.0.0.1:9000".to_string()),
            _ => None,
        };
        let s = StoreSettings::resolve(&cfg(), env).unwrap();
        assert_eq!(
            (s.bucket.as_str(), s.region.as_str(), s.prefix.as_str()),
            ("b", DEFAULT_REGION, DEFAULT_PREFIX)
        );
        assert_eq!(s.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert!(!format!("{s:?}").contains("very-secret"));
    }
}
