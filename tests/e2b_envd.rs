//! envd (src/e2bapi/envd) driven by both official E2B SDKs — Python (tests/e2b/driver.py
//! and its scenarios_*.py) and JS (tests/e2b/driver.mjs and its scenarios_*.mjs, the same
//! scenarios with the same answers) — through the operator's E2B API listener
//! (`E2B_SANDBOX_URL`), on the Docker provider and on the Kubernetes provider (Pods on the
//! test nodes). Per provider one operator; per SDK one sandbox, made by `Sandbox.create()`
//! and used at once, against which every check runs: commands ([`commands`]), PTYs, files and
//! watches ([`files`]), then pause and connect, where the provider's README row says whether
//! a background process survives ([`pause_then_connect`]), and kill. The two SDKs run at
//! once, each on a thread of its own.

mod harness;

#[path = "e2b_envd/commands.rs"]
mod commands;
#[path = "e2b_envd/files.rs"]
mod files;

use sandbox_doubles::ports::quiet_port;
use std::time::Duration;

use harness::cluster::kubectl;
use harness::e2b_sdk::{
    Sdk, SdkKind, api_config, api_up, created_and_ran, ensure_sleep_crd, key_for, options,
};
use harness::kubernetes::Kubernetes;
use harness::tenant::tenant;
use harness::wait_for;
use harness::world::World;
use sandbox_operator::e2bapi::id;
use serde_json::json;

#[tokio::test]
async fn both_sdks_drive_envd_on_docker() {
    ensure_sleep_crd();
    let port = quiet_port();
    let a = tenant("e2b-envd", &options(port)).await;
    let key = key_for(&a.ns);
    api_up(port).await;
    both_sdks(port, &key, Hibernation::KeepsProcesses);
}

#[tokio::test]
async fn both_sdks_drive_envd_on_kubernetes() {
    ensure_sleep_crd();
    let port = quiet_port();
    let world = World::<Kubernetes>::kubernetes("e2b-envd-k").await;
    let op = world.operator(&api_config(port), vec![]);
    let key = key_for(&world.ns);
    api_up(port).await;
    both_sdks(port, &key, Hibernation::EndsProcesses);
    drop(op);
    let _ = kubectl(&["delete", "namespace", &world.ns, "--wait=false"], None);
}

/// What pause does to a sandbox's processes on a provider, as its README row says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hibernation {
    /// Docker: `docker pause`, processes frozen and kept.
    KeepsProcesses,
    /// Kubernetes: the Pod is stopped; connect starts a fresh one.
    EndsProcesses,
}

/// kill, then a command through the same SDK handle: envd is reached through E2B's proxy,
/// whose 502 "The sandbox was not found" each SDK turns into its sandbox-stopped error (a
/// plain 404 reads as "unimplemented" to the JS SDK's Connect client).
fn gone_after_kill(sdk: &Sdk, key: &str, on: &serde_json::Value) {
    let after = sdk.run(key, "run_after_kill", on.clone());
    let (stopped, says) = match sdk.kind() {
        SdkKind::Python => ("SandboxNotRunningException", "was not found"),
        SdkKind::Js => ("SandboxNotFoundError", "not running anymore"),
    };
    assert_eq!(after["error"], stopped, "{after}");
    let message = after["message"].as_str().unwrap_or_default();
    assert!(message.contains(says), "{after}");
}

/// The whole envd body with the Python and the JS SDK at once, each on a thread with a
/// runtime of its own (the SDK drivers are blocking child processes), each SDK's scenarios
/// answered by one driver process ([`Sdk::serving`]).
fn both_sdks(port: u16, key: &str, hibernation: Hibernation) {
    std::thread::scope(|scope| {
        let sdks: [fn(u16) -> Sdk; 2] = [Sdk::python, Sdk::js];
        for sdk in sdks {
            scope.spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(envd(&sdk(port).serving(), key, port, hibernation));
            });
        }
    });
}

/// One sandbox, every envd check, pause and connect, kill.
async fn envd(sdk: &Sdk, key: &str, port: u16, hibernation: Hibernation) {
    let sid = created_and_ran(sdk, key);
    commands::all(sdk, key, port, &sid).await;
    files::all(sdk, key, &sid);
    pause_then_connect(sdk, key, &sid, hibernation).await;
    let on = json!({"sandbox_id": sid});
    gone_after_kill(sdk, key, &on);
    // kill deletes the Sandbox; its finalizer runs before get_info stops finding it.
    let not_found = sdk.error_name("SandboxNotFound");
    wait_for(
        "get_info to find no sandbox",
        Duration::from_secs(90),
        || {
            let info = sdk.run(key, "info", on.clone());
            let gone = info["error"] == not_found.as_str();
            async move { gone.then_some(()).ok_or(format!("{info}")) }
        },
    )
    .await;
}

/// A background process that counts in /tmp/ticks, five times a second.
const TICKER: &str = "i=0; while :; do i=$((i+1)); echo $i > /tmp/ticks; sleep 0.2; done";

/// A background process started before pause: after connect it is still listed and still
/// counting where the provider keeps processes (Docker), and gone with the Pod's filesystem
/// where it does not (Kubernetes); `status.lastHibernation.processesPreserved` says which.
async fn pause_then_connect(sdk: &Sdk, key: &str, sid: &str, hibernation: Hibernation) {
    let on = json!({"sandbox_id": sid});
    let started = sdk.ok(
        key,
        "start_background",
        json!({"sandbox_id": sid, "cmd": TICKER}),
    );
    let pid = started["pid"].as_u64().expect("pid");
    let first = ticks_past(sdk, key, sid, 0).await;

    assert_eq!(sdk.ok(key, "pause", on.clone())["paused"], true);
    assert_eq!(sdk.ok(key, "info", on.clone())["state"], "paused");
    let connected = sdk.ok(key, "connect", json!({"sandbox_id": sid, "timeout": 300}));
    assert_eq!(connected["sandbox_id"], sid);
    assert_eq!(sdk.ok(key, "info", on.clone())["state"], "running");

    let preserved = processes_preserved(sid);
    match hibernation {
        Hibernation::KeepsProcesses => {
            let listed = sdk.ok(key, "processes", on.clone());
            assert!(
                listed_pid(&listed, pid),
                "pid {pid} not listed after connect: {listed}"
            );
            ticks_past(sdk, key, sid, first).await;
            assert_eq!(
                preserved, "true",
                "status.lastHibernation.processesPreserved"
            );
        }
        Hibernation::EndsProcesses => {
            // The process ends when its exec stream to the stopped Pod does, which the
            // operator may learn after connect has answered.
            wait_for(
                "the old Pod's process to leave the list",
                Duration::from_secs(90),
                || {
                    let listed = sdk.ok(key, "processes", on.clone());
                    let kept = listed_pid(&listed, pid);
                    async move { (!kept).then_some(()).ok_or(format!("{listed}")) }
                },
            )
            .await;
            let ticks = sdk.ok(
                key,
                "commands_run",
                json!({"sandbox_id": sid, "cmd": "cat /tmp/ticks"}),
            );
            assert_ne!(ticks["exit_code"], 0, "the old Pod's /tmp/ticks: {ticks}");
            assert_eq!(
                preserved, "false",
                "status.lastHibernation.processesPreserved"
            );
        }
    }
}

/// Whether a `processes` answer lists `pid`.
fn listed_pid(answer: &serde_json::Value, pid: u64) -> bool {
    let listed = answer["listed"].as_array().expect("listed");
    listed.iter().any(|p| p["pid"] == pid)
}

/// The ticker's count once it is above `above`, polled with a deadline: the process runs.
async fn ticks_past(sdk: &Sdk, key: &str, sid: &str, above: u64) -> u64 {
    let args = json!({"sandbox_id": sid, "cmd": "cat /tmp/ticks"});
    wait_for(
        &format!("the background ticker past {above}"),
        Duration::from_secs(60),
        || {
            let answer = sdk.ok(key, "commands_run", args.clone());
            let count = answer["stdout"]
                .as_str()
                .unwrap_or_default()
                .trim()
                .parse::<u64>();
            async move {
                match count {
                    Ok(n) if n > above => Ok(n),
                    _ => Err(format!("{answer}")),
                }
            }
        },
    )
    .await
}

/// The Sandbox's `status.lastHibernation.processesPreserved`, read with kubectl.
fn processes_preserved(sid: &str) -> String {
    let object = id::parse(sid).expect("an id of this API");
    let path = "jsonpath={.status.lastHibernation.processesPreserved}";
    let out = kubectl(
        &[
            "get",
            "sbx",
            &object.name,
            "-n",
            &object.namespace,
            "-o",
            path,
        ],
        None,
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
