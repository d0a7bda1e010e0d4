//! envd's process service (src/e2bapi/envd/process) driven by an official E2B SDK's
//! `commands` and `pty` modules (tests/e2b/scenarios_commands.py and .mjs). Each scenario
//! connects to the sandbox afresh (`Sandbox.connect`), so a reattach comes from another
//! client than the one that started the process.

use serde_json::{Value, json};

use crate::harness::e2b_sdk::{self, Sdk};

/// Every commands and PTY check against the sandbox `sid` (its API on `port`).
pub async fn all(sdk: &Sdk, key: &str, port: u16, sid: &str) {
    let on = json!({"sandbox_id": sid});
    foreground(sdk, key, &on);
    background_then_reattach(sdk, key, sid);
    kill(sdk, key, &on);
    close_stdin(sdk, key, &on);
    pty(sdk, key, &on);
    wrong_token(sdk, key, port, sid).await;
}

/// `commands.run` in the foreground: separate streams, envs, cwd, exit code; a non-zero
/// exit raises CommandExitException carrying the output.
fn foreground(sdk: &Sdk, key: &str, on: &Value) {
    let r = sdk.ok(key, "run_foreground", on.clone());
    assert_eq!(r["stdout"], "out\nhello\n/tmp\n", "{r}");
    assert_eq!(r["stderr"], "err\n", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    let failed = &r["failed"];
    assert_eq!(failed["raised"], true, "{r}");
    assert_eq!(failed["exit_code"], 3, "{r}");
    assert_eq!(failed["stdout"], "partial\n", "{r}");
    assert_eq!(failed["stderr"], "oops\n", "{r}");
}

/// A background command whose client went away keeps running; another client lists it,
/// reattaches by pid, gets the output produced in between, sends stdin and sees the end. A
/// pid this replica never assigned is the SDK's not-found error naming where processes live.
fn background_then_reattach(sdk: &Sdk, key: &str, sid: &str) {
    let cmd = "echo tick-1; echo tick-2; read line; echo got-$line";
    let started = sdk.ok(
        key,
        "start_background",
        json!({"sandbox_id": sid, "cmd": cmd}),
    );
    let pid = started["pid"].as_u64().expect("pid");
    let r = sdk.ok(
        key,
        "reattach",
        json!({"sandbox_id": sid, "pid": pid, "stdin": "hello\n"}),
    );
    e2b_sdk::assert_reattached(&r, pid, cmd);

    let unknown = sdk.run(key, "connect_unknown", json!({"sandbox_id": sid, "pid": 7}));
    assert_eq!(unknown["error"], sdk.error_name("NotFound"), "{unknown}");
    let message = unknown["message"].as_str().unwrap_or_default();
    assert!(message.contains("replica that started it"), "{unknown}");
}

/// `commands.close_stdin` (the announced envd 0.5.2 allows it): `cat` ends at the end of
/// its input, having echoed it.
fn close_stdin(sdk: &Sdk, key: &str, on: &Value) {
    let r = sdk.ok(key, "close_stdin", on.clone());
    assert_eq!(r["stdout"], "to cat\n", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
}

/// `commands.kill` is SIGKILL: the process ends with 137, leaves the list, and a second
/// kill finds nothing (False).
fn kill(sdk: &Sdk, key: &str, on: &Value) {
    let r = sdk.ok(key, "commands_kill", on.clone());
    assert_eq!(r["listed_before"], true, "{r}");
    assert_eq!(r["killed"], true, "{r}");
    assert_eq!(r["exit_code"], 137, "{r}");
    assert_eq!(r["listed_after"], false, "{r}");
    assert_eq!(r["killed_again"], false, "{r}");
}

/// A PTY of the size asked for, resized (`stty size` shows both), typed into, and killed.
fn pty(sdk: &Sdk, key: &str, on: &Value) {
    let r = sdk.ok(key, "pty", on.clone());
    let before = r["before"].as_str().unwrap_or_default();
    let after = r["after"].as_str().unwrap_or_default();
    assert!(before.contains("24 80\r\n"), "{r}");
    assert!(after.contains("30 100\r\n"), "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["killed"], true, "{r}");
    assert_eq!(r["killed_code"], 137, "{r}");
}

/// envd checks the sandbox's access token: the SDK's token lists processes, another is
/// refused with the Connect code unauthenticated.
async fn wrong_token(sdk: &Sdk, key: &str, port: u16, sid: &str) {
    let token = sdk.ok(key, "token", json!({"sandbox_id": sid}))["token"]
        .as_str()
        .expect("token")
        .to_string();
    let list = |token: String| {
        reqwest::Client::new()
            .post(format!("http://127.0.0.1:{port}/process.Process/List"))
            .header("E2b-Sandbox-Id", sid)
            .header("X-Access-Token", token)
            .header("Content-Type", "application/json")
            .body("{}")
            .send()
    };
    let right = list(token.clone()).await.expect("List");
    assert_eq!(right.status(), 200);
    let body: Value = right.json().await.expect("json");
    assert!(body["processes"].is_array(), "{body}");
    let wrong = list(format!("{token}x")).await.expect("List");
    assert_eq!(wrong.status(), 401);
    let body: Value = wrong.json().await.expect("json");
    assert_eq!(body["code"], "unauthenticated", "{body}");
}
