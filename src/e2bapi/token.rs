//! envd access tokens: HMAC-SHA256 of the sandbox id under a key every replica shares
//! (`e2bApi.accessTokenKeyFile`), so any replica can hand out and check a sandbox's token
//! without storing it where readers of the Sandbox object would see it. Traffic access
//! tokens (port URLs of a sandbox created with `allowPublicTraffic: false`) come from the
//! same key under another input, so neither token opens what the other does.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Shortest accepted key.
pub const MIN_KEY_LEN: usize = 32;

/// Derives the envd access tokens.
#[derive(Clone)]
pub struct TokenKey(Vec<u8>);

impl TokenKey {
    /// The key from `file`, or a random one for this process when there is none.
    pub fn load(file: Option<&std::path::Path>) -> Result<TokenKey, String> {
        let Some(file) = file else {
            tracing::warn!(
                "E2B API: no e2bApi.accessTokenKeyFile; envd access tokens change on restart and differ between replicas"
            );
            return Ok(TokenKey(
                (0..MIN_KEY_LEN).map(|_| fastrand::u8(..)).collect(),
            ));
        };
        let key = std::fs::read(file)
            .map_err(|e| format!("e2bApi.accessTokenKeyFile {}: {e}", file.display()))?;
        if key.len() < MIN_KEY_LEN {
            return Err(format!(
                "e2bApi.accessTokenKeyFile {}: at least {MIN_KEY_LEN} bytes",
                file.display()
            ));
        }
        Ok(TokenKey(key))
    }

    /// The traffic access token of sandbox `id` (`e2b-traffic-access-token`). The input
    /// cannot be a sandbox id (ids have no `/`), so it never equals an envd token.
    pub fn traffic_token(&self, id: &str) -> String {
        self.token(&format!("traffic/{id}"))
    }

    /// The token of sandbox `id`.
    pub fn token(&self, id: &str) -> String {
        // HMAC takes keys of any length: `new_from_slice` cannot fail for it.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) else {
            return String::new();
        };
        mac.update(id.as_bytes());
        mac.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_depends_on_the_id_and_the_key() {
        let k = TokenKey(vec![1; 32]);
        assert_eq!(k.token("a"), k.token("a"));
        assert_ne!(k.token("a"), k.token("b"));
        assert_ne!(k.token("a"), TokenKey(vec![2; 32]).token("a"));
        assert_eq!(k.token("a").len(), 64);
        assert!(TokenKey::load(Some(std::path::Path::new("/nonexistent"))).is_err());
        assert_ne!(k.traffic_token("a"), k.token("a"));
        assert_ne!(k.traffic_token("a"), k.traffic_token("b"));
    }
}
