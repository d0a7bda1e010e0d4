//! `kubectl sandbox` (the built `kubectl-sandbox` binary) end to end on the Sprites provider:
//! through the real kube-apiserver's aggregation layer to an operator whose only provider is
//! Sprites, pointed at the Sprites double (every sprite a real local container). The plugin's
//! exec rides the provider's streaming exec (the exec WebSocket): stdin and its end, stdout
//! and stderr apart, and the exit code passed through.

mod harness;

use std::io::Write;
use std::process::{Command, Stdio};

use harness::aggregated::Aggregated;
use harness::cluster::{apply_yaml_ok, client, kubeconfig, namespace};
use harness::docker::Purge;
use harness::objects::wait_ready;
use harness::world::token_file;
use kube::Api;
use sandbox_doubles::sprites::{self, SpritesDouble, SpritesOptions};
use sandbox_operator::api::Sandbox;

/// The operator's `providers:` section: Sprites at the double, its token in a file.
fn providers(double: &SpritesDouble, token: &tempfile::NamedTempFile) -> String {
    format!(
        "providers:\n  - name: sprites\n    type: sprites\n    sprites:\n      apiUrl: {}\n      \
         org: e2e\n      token: {{file: {}}}\n",
        double.base_url,
        token.path().display()
    )
}

/// A Sandbox on the Sprites provider (a sprite has no image or command of ours).
const SANDBOX: &str = r#"apiVersion: sandboxes.dev/v1alpha1
kind: Sandbox
metadata: {name: box}
spec:
  provider: sprites
"#;

/// Runs the plugin in `ns` to its end with `stdin`; (exit code, stdout, stderr).
fn run(ns: &str, args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubectl-sandbox"))
        .env("KUBECONFIG", kubeconfig())
        .arg("-n")
        .arg(ns)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kubectl-sandbox");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    let out = child.wait_with_output().expect("kubectl-sandbox");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_on_a_sprite_passes_stdin_streams_and_the_exit_code_through() {
    let ns = namespace("plugin-sprites").await;
    let _purge = Purge(ns.clone());
    let double = sprites::spawn(SpritesOptions::new(harness::docker::base_image())).await;
    let token = token_file(&double.token);
    let api = Aggregated::start_with(&ns, &providers(&double, &token)).await;
    apply_yaml_ok(SANDBOX, &ns);
    let sandboxes: Api<Sandbox> = Api::namespaced(client().await, &ns);
    wait_ready(&sandboxes, "box", &api.operator).await;

    let script = "cat; echo to-stderr >&2; exit 5";
    let (code, out, err) = run(
        &ns,
        &["exec", "-i", "box", "--", "sh", "-c", script],
        b"hello sprite\n",
    );
    assert_eq!(code, 5, "the exit code passes through (stderr {err:?})");
    assert_eq!(out, "hello sprite\n", "stdin crossed and ended");
    assert!(err.contains("to-stderr"), "stderr apart: {err:?}");
    assert!(
        !out.contains("to-stderr"),
        "stderr kept out of stdout: {out:?}"
    );
    assert!(
        !double.requests_to("GET", "/exec").is_empty(),
        "the exec went over the double's exec WebSocket"
    );
    drop(api);
    double.shutdown().await;
}
