//! The test S3 server's settings: runs `tests/setup/s3.sh` (idempotent; it starts s3s-fs, a
//! SigV4-checking server, when none runs) once per test binary and reads the env file it
//! writes (atomically, so a concurrent run never exposes half a file).

use std::collections::HashMap;
use std::sync::OnceLock;

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
