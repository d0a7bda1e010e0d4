//! Several operator replicas behind one Service serve envd: a process started through one
//! replica is listed, reattached, typed into and killed through another, which forwards to
//! the replica holding it (src/e2bapi/envd/process/peers.rs). Two operator processes of one
//! instance and namespace, each serving the E2B API on its own port (only one leads; both
//! serve), driven by the official Python SDK (tests/e2b/scenarios_commands.py).

mod harness;

use sandbox_doubles::ports::quiet_port;
use std::path::PathBuf;

use harness::e2b_sdk::{self, Sdk, api_config, api_up, created_and_ran, ensure_sleep_crd, key_for};
use harness::operator::{Operator, OperatorOptions};
use harness::tenant::tenant;
use harness::{repo, unique};
use serde_json::json;

#[tokio::test]
async fn a_process_started_through_one_replica_is_reached_through_another() {
    ensure_sleep_crd();
    let (port_a, port_b) = (quiet_port(), quiet_port());
    let key_file = shared_token_key();
    let mut a = tenant("e2b-rep", &replica(port_a, &key_file)).await;
    let key = key_for(&a.ns);
    // A has read the configuration file before B (same instance, same file) rewrites it.
    api_up(port_a).await;
    let b = Operator::start(&a.ns, &a.ns, &replica(port_b, &key_file));
    api_up(port_b).await;
    let (via_a, via_b) = (Sdk::python(port_a), Sdk::python(port_b));
    let sid = created_and_ran(&via_a, &key);

    reattach_elsewhere(&via_a, &via_b, &key, &sid);
    kill_elsewhere(&via_a, &via_b, &key, &sid);

    let orphan = background(&via_a, &key, &sid, "sleep 300");
    let stopped = a.op.terminate();
    assert!(stopped.is_some_and(|s| s.success()), "A stops: {stopped:?}");
    let r = via_b.run(
        &key,
        "connect_unknown",
        json!({"sandbox_id": sid, "pid": orphan}),
    );
    assert_eq!(r["error"], "NotFoundException", "{r}");
    let message = r["message"].as_str().unwrap_or_default();
    assert!(message.contains("stopped"), "{r}");

    assert_eq!(
        via_b.ok(&key, "kill", json!({"sandbox_id": sid}))["killed"],
        true
    );
    // The namespace goes while B still runs (and leads), so the finalizers are honoured.
    drop(a);
    drop(b);
}

/// Through B: the process A started is listed, reattached with the output produced in
/// between, typed into, and seen to end.
fn reattach_elsewhere(via_a: &Sdk, via_b: &Sdk, key: &str, sid: &str) {
    let cmd = "echo tick-1; echo tick-2; read line; echo got-$line";
    let pid = background(via_a, key, sid, cmd);
    let r = via_b.ok(
        key,
        "reattach",
        json!({"sandbox_id": sid, "pid": pid, "stdin": "hello\n"}),
    );
    e2b_sdk::assert_reattached(&r, pid, cmd);
}

/// Through B: `commands.kill` ends the process A started (SIGKILL, 137), and it leaves the
/// list.
fn kill_elsewhere(via_a: &Sdk, via_b: &Sdk, key: &str, sid: &str) {
    let pid = background(via_a, key, sid, "sleep 300");
    let r = via_b.ok(key, "kill_pid", json!({"sandbox_id": sid, "pid": pid}));
    assert_eq!(r["killed"], true, "{r}");
    assert_eq!(r["exit_code"], 137, "{r}");
    assert_eq!(r["listed_after"], false, "{r}");
}

/// `cmd` started in the background (with stdin) through `sdk`; its pid.
fn background(sdk: &Sdk, key: &str, sid: &str, cmd: &str) -> u64 {
    let started = sdk.ok(
        key,
        "start_background",
        json!({"sandbox_id": sid, "cmd": cmd}),
    );
    started["pid"].as_u64().expect("pid")
}

/// Operator options serving the API on `port`, the envd access tokens derived with the key
/// in `key_file` (every replica needs the same one).
fn replica(port: u16, key_file: &std::path::Path) -> OperatorOptions {
    let api = api_config(port);
    OperatorOptions {
        config_extra: format!(
            "providers:\n  - name: docker\n    type: docker\n{api}  accessTokenKeyFile: {:?}\n",
            key_file.display().to_string()
        ),
        ..OperatorOptions::default()
    }
}

/// A fresh token key file.
fn shared_token_key() -> PathBuf {
    let dir = repo().join("target/e2e");
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join(format!("{}.key", unique("envd-token")));
    let key: Vec<u8> = (0..48).map(|_| fastrand::u8(..)).collect();
    std::fs::write(&path, key).expect("key file");
    path
}
