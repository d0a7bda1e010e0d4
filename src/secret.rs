//! References to secrets: an environment variable or a file (a mounted Kubernetes Secret),
//! never the value itself. Settings files hold only these references, and every error names
//! the variable or the file, never the value.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::validation::Issues;

/// A secret reference that could not be resolved. Messages never contain the value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// A secret's environment variable is not set.
    #[error(
        "secret for {field}: environment variable {name} is not set; set it (for example from a \
         Kubernetes Secret with `env[].valueFrom.secretKeyRef`) or use `file:` instead"
    )]
    EnvMissing {
        /// Config field path that references the secret.
        field: String,
        /// The environment variable name.
        name: String,
    },
    /// A secret's environment variable is set but is not valid UTF-8.
    #[error("secret for {field}: environment variable {name} is not valid UTF-8")]
    EnvNotUnicode {
        /// Config field path that references the secret.
        field: String,
        /// The environment variable name.
        name: String,
    },
    /// A secret file could not be read.
    #[error("secret for {field}: cannot read file {}: {source}", path.display())]
    File {
        /// Config field path that references the secret.
        field: String,
        /// The file.
        path: PathBuf,
        /// The I/O error (never contains file content).
        source: std::io::Error,
    },
    /// A secret resolved to an empty string (after trimming the trailing newline).
    #[error("secret for {field}: {origin} is empty; put the secret value there")]
    Empty {
        /// Config field path that references the secret.
        field: String,
        /// `environment variable X` or `file Y`.
        origin: String,
    },
    /// A secret reference names neither or both of `env` and `file`.
    #[error("secret for {field}: set exactly one of `env` (variable name) or `file` (path)")]
    SourceAmbiguous {
        /// Config field path that references the secret.
        field: String,
    },
}

/// Where a secret comes from: exactly one of an environment variable or a file (typically a
/// mounted Kubernetes Secret). The value itself never appears in the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretSource {
    /// Name of an environment variable holding the secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// Path of a file holding the secret (one trailing newline is ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
}

impl SecretSource {
    /// A secret read from the environment variable `name`.
    pub fn env(name: impl Into<String>) -> Self {
        SecretSource {
            env: Some(name.into()),
            file: None,
        }
    }

    /// A secret read from the file at `path`.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        SecretSource {
            env: None,
            file: Some(path.into()),
        }
    }

    /// Read the secret now. Errors name the variable or file, never the value.
    pub fn resolve(&self) -> Result<String, SecretError> {
        self.resolve_for("secret")
    }

    /// Like [`resolve`](Self::resolve), with `field` (the config path, e.g.
    /// `providers[1].fly.token`) in any error so the operator log points at the setting.
    pub fn resolve_for(&self, field: &str) -> Result<String, SecretError> {
        self.resolve_with(field, |name| std::env::var_os(name))
    }

    pub(crate) fn resolve_with(
        &self,
        field: &str,
        lookup: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<String, SecretError> {
        match (&self.env, &self.file) {
            (Some(name), None) => {
                let raw = lookup(name).ok_or_else(|| SecretError::EnvMissing {
                    field: field.into(),
                    name: name.clone(),
                })?;
                let value = raw.into_string().map_err(|_| SecretError::EnvNotUnicode {
                    field: field.into(),
                    name: name.clone(),
                })?;
                non_empty(value, field, || format!("environment variable {name}"))
            }
            (None, Some(path)) => {
                let raw = std::fs::read_to_string(path).map_err(|source| SecretError::File {
                    field: field.into(),
                    path: path.clone(),
                    source,
                })?;
                // Secrets mounted from files often end with a newline; a token never does.
                let value = raw
                    .strip_suffix("\r\n")
                    .or_else(|| raw.strip_suffix('\n'))
                    .unwrap_or(&raw)
                    .to_owned();
                non_empty(value, field, || format!("file {}", path.display()))
            }
            _ => Err(SecretError::SourceAmbiguous {
                field: field.into(),
            }),
        }
    }
}

fn non_empty(
    value: String,
    field: &str,
    origin: impl FnOnce() -> String,
) -> Result<String, SecretError> {
    if value.trim().is_empty() {
        Err(SecretError::Empty {
            field: field.into(),
            origin: origin(),
        })
    } else {
        Ok(value)
    }
}

impl SecretSource {
    /// Reports a reference that can never resolve (names neither or both sources, a bad
    /// variable name), under `at`. Whether the secret is really there is checked at start-up
    /// by [`SecretSource::resolve_for`].
    pub fn validate(&self, at: &str, issues: &mut Issues) {
        let src = self;
        match (&src.env, &src.file) {
            (Some(name), None) => {
                let valid = !name.is_empty()
                    && !name.starts_with(|c: char| c.is_ascii_digit())
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !valid {
                    issues.push(
                        format!("{at}.env"),
                        format!(
                            "`{name}` is not an environment variable name; use letters, digits and \
                             '_' (e.g. `FLY_API_TOKEN`) — the secret value itself never goes in \
                             this file"
                        ),
                    );
                }
            }
            (None, Some(path)) => {
                if path.as_os_str().is_empty() {
                    issues.push(
                        format!("{at}.file"),
                        "is empty; give the path of a mounted secret file",
                    );
                }
            }
            (Some(_), Some(_)) => issues.push(
                at.to_string(),
                "sets both `env` and `file`; keep exactly one",
            ),
            (None, None) => issues.push(
                at.to_string(),
                "names no source; set `env: VAR_NAME` or `file: /path/to/secret`",
            ),
        }
    }
}
