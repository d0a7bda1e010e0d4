//! E2B as a world's far side ([`super::world`]): the E2B double (its sandboxes real
//! containers) and the key file the operator reads, for every test that runs the operator
//! binary against E2B.

use sandbox_doubles::e2b::{self as double, E2bDouble, E2bDoubleOptions};

use super::cluster::namespace;
use super::world::{Backend, World, token_file};

/// The E2B side of a test's world: a double, the key file the operator reads, and the E2B
/// timeout (seconds) the provider asks for.
pub struct E2b {
    pub double: E2bDouble,
    pub key_file: tempfile::NamedTempFile,
    pub timeout: u64,
}

impl Backend for E2b {
    const NAME: &'static str = "e2b";
    const TYPE: &'static str = "e2b";

    fn settings(&self) -> String {
        format!(
            "      apiUrl: {}\n      sandboxUrl: {}\n      apiKey: {{file: {}}}\n      \
             timeoutSecs: {}\n      watchIntervalSecs: 1\n",
            self.double.api_url(),
            self.double.envd_url(),
            self.key_file.path().display(),
            self.timeout
        )
    }
}

impl World<E2b> {
    /// A new namespace (named from `prefix`) around a double of its own, with the provider
    /// asking for an E2B timeout of `timeout` seconds.
    pub async fn e2b(prefix: &str, timeout: u64) -> World<E2b> {
        let ns = namespace(prefix).await;
        let double = double::spawn(E2bDoubleOptions::default())
            .await
            .expect("the E2B double starts (is Docker running?)");
        let e2b = E2b {
            key_file: token_file(double.api_key()),
            double,
            timeout,
        };
        World::around(ns, e2b).await
    }

    /// Ends the world: the double's containers go.
    pub async fn shutdown(self) {
        self.backend
            .double
            .shutdown()
            .await
            .expect("double cleanup");
    }
}
