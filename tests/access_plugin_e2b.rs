//! `kubectl sandbox exec` (the built `kubectl-sandbox` binary) end to end on E2B: through the
//! real kube-apiserver's aggregation layer to an operator serving `subresources.sandboxes.dev`
//! (`harness::aggregated`) whose one provider is `type: e2b`, pointed at the E2B double (its
//! sandboxes real containers, its envd serving the process service). Stdin and its end, the
//! exit code and stderr passed through, and a TTY (on a pseudo-terminal) that follows a
//! resize. E2B has no main-process log and no port-forward, so the plugin's `logs` and
//! `port-forward` are not run here.

mod harness;

use harness::aggregated::Aggregated;
use harness::e2b::E2b;
use harness::plugin;
use harness::world::World;
use serde_json::json;

/// A namespace with a Ready E2B Sandbox `box` and an operator serving the aggregated API in
/// front of the double.
async fn world(prefix: &str) -> (World<E2b>, Aggregated) {
    let w = World::e2b(prefix, 60).await;
    let api = Aggregated::start_with(&w.ns, &w.config("", "")).await;
    w.apply("box", json!({"provider": "e2b", "image": "base"}));
    w.wait_ready("box", &api.operator).await;
    (w, api)
}

/// Ends the test's world: the APIService first, then the double's containers.
async fn finish(w: World<E2b>, api: Aggregated) {
    drop(api);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_on_e2b_passes_stdin_its_end_and_the_exit_code_through() {
    let (w, api) = world("plugin-e2b-exec").await;
    plugin::exec_passes_stdin_and_its_end_and_the_exit_code_through(&w.ns, &api.operator);
    finish(w, api).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_on_e2b_with_a_tty_follows_a_resize() {
    let (w, api) = world("plugin-e2b-tty").await;
    plugin::exec_with_a_tty_follows_a_resize(&w.ns, &api.operator).await;
    finish(w, api).await;
}
