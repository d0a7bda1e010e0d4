//! `kubectl sandbox exec` (the built `kubectl-sandbox` binary) end to end on E2B: through the
//! real kube-apiserver's aggregation layer to an operator serving `subresources.sandboxes.dev`
//! (`harness::aggregated`) whose one provider is `type: e2b`, pointed at the E2B double (its
//! sandboxes real containers, its envd serving the process service). Stdin and its end, the
//! exit code and stderr passed through, and a TTY (on a pseudo-terminal) that follows a
//! resize. E2B has no main-process log and no port-forward, so the plugin's `logs` and
//! `port-forward` are not run here.

mod harness;

use std::io::Write;
use std::process::Command;

use harness::aggregated::Aggregated;
use harness::cluster::namespace;
use harness::plugin::{collect, plugin, pty, resize, run, type_until, wait_exit};
use harness::world::{Backend, World, token_file};
use sandbox_doubles::e2b::{self as double, E2bDouble, E2bDoubleOptions};
use serde_json::json;

/// The E2B side: a double and the key file the operator reads.
struct E2b {
    double: E2bDouble,
    key_file: tempfile::NamedTempFile,
}

impl Backend for E2b {
    const NAME: &'static str = "e2b";
    const TYPE: &'static str = "e2b";

    fn settings(&self) -> String {
        format!(
            "      apiUrl: {}\n      sandboxUrl: {}\n      apiKey: {{file: {}}}\n      \
             timeoutSecs: 60\n      watchIntervalSecs: 1\n",
            self.double.api_url(),
            self.double.envd_url(),
            self.key_file.path().display(),
        )
    }
}

/// A namespace with a Ready E2B Sandbox `box` and an operator serving the aggregated API in
/// front of the double.
async fn world(prefix: &str) -> (World<E2b>, Aggregated) {
    let ns = namespace(prefix).await;
    let double = double::spawn(E2bDoubleOptions::default())
        .await
        .expect("the E2B double starts (is Docker running?)");
    let e2b = E2b {
        key_file: token_file(double.api_key()),
        double,
    };
    let w = World::around(ns, e2b).await;
    let api = Aggregated::start_with(&w.ns, &w.config("", "")).await;
    w.apply("box", json!({"provider": "e2b", "image": "base"}));
    w.wait_ready("box", &api.operator).await;
    (w, api)
}

/// Ends the test's world: the APIService first, then the double's containers.
async fn finish(w: World<E2b>, api: Aggregated) {
    drop(api);
    w.backend.double.shutdown().await.expect("double cleanup");
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_on_e2b_passes_stdin_its_end_and_the_exit_code_through() {
    let (w, api) = world("plugin-e2b-exec").await;
    let script = "cat; echo to-stderr >&2; exit 5";
    let (code, out, err) = run(
        &w.ns,
        &["exec", "-i", "box", "--", "sh", "-c", script],
        b"hello\n",
    );
    assert_eq!(
        code,
        5,
        "stdout {out:?} stderr {err:?}\n{}",
        api.operator.log_tail()
    );
    assert_eq!(out, "hello\n");
    assert_eq!(err, "to-stderr\n");
    let (code, _, err) = run(&w.ns, &["exec", "box", "--", "true"], b"");
    assert_eq!(code, 0, "{err}");
    finish(w, api).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_on_e2b_with_a_tty_follows_a_resize() {
    let (w, api) = world("plugin-e2b-tty").await;
    let (mut master, slave_path) = pty(24, 80);
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&slave_path)
        .expect("open the pty's slave");
    let mut child = plugin(&w.ns, &["exec", "-it", "box", "--", "sh"])
        .stdin(slave.try_clone().expect("slave"))
        .stdout(slave.try_clone().expect("slave"))
        .stderr(slave)
        .spawn()
        .expect("start kubectl-sandbox");
    let seen = collect(master.try_clone().expect("master"));
    type_until(&mut master, &seen, b"stty size\n", "24 80").await;
    resize(&master, 40, 120);
    // The pty is not the plugin's controlling terminal: deliver the SIGWINCH a shell would.
    let winch = Command::new("kill")
        .args(["-WINCH", &child.id().to_string()])
        .status()
        .expect("kill -WINCH");
    assert!(winch.success());
    type_until(&mut master, &seen, b"stty size\n", "40 120").await;
    master.write_all(b"exit 3\n").expect("type");
    let code = wait_exit(&mut child).await;
    assert_eq!(
        code,
        3,
        "{}\n{}",
        seen.lock().unwrap(),
        api.operator.log_tail()
    );
    finish(w, api).await;
}
