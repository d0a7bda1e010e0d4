//! envd's filesystem service and `/files` (src/e2bapi/envd/filesystem, files.rs) driven by
//! an official E2B SDK's `files` module (tests/e2b/scenarios_files.py and .mjs): write and read (text, every byte value, a file in new
//! directories), write_files, list at depth 1 and 2, exists, get_info, make_dir, rename,
//! remove, watch_dir seeing a create, a write and a remove, and a missing file raising the
//! SDK's not-found exception.

use serde_json::{Value, json};

use crate::harness::e2b_sdk::Sdk;

const DIR: &str = "/tmp/e2b-files";

fn paths(entries: &Value) -> Vec<&str> {
    let mut paths: Vec<&str> = entries
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["path"].as_str().expect("path"))
        .collect();
    paths.sort();
    paths
}

/// Every files check against the sandbox `sid`, below [`DIR`].
pub fn all(sdk: &Sdk, key: &str, sid: &str) {
    let args = json!({"sandbox_id": sid, "dir": DIR});
    write_and_read(sdk, key, &args);
    write_many_and_list(sdk, key, &args);
    inspect_move_and_remove(sdk, key, &args);
    missing_file(sdk, key, sid);
    watch(sdk, key, &args);
    watch_stream(sdk, key, &args);
}

/// Text and every byte value cross unchanged; the answer names what was written.
fn write_and_read(sdk: &Sdk, key: &str, args: &Value) {
    let got = sdk.ok(key, "files_write_read", args.clone());
    assert_eq!(got["text"], "hello, files\n", "{got}");
    assert_eq!(got["bytes_equal"], true, "{got}");
    assert_eq!(got["bytes_len"], 1024, "{got}");
    let written = &got["written"];
    assert_eq!(written["path"], format!("{DIR}/new/sub/hello.txt"), "{got}");
    assert_eq!(written["name"], "hello.txt");
    assert_eq!(written["type"], "file");
}

/// Several files in one upload; a listing one level deep, then two.
fn write_many_and_list(sdk: &Sdk, key: &str, args: &Value) {
    let got = sdk.ok(key, "files_write_many", args.clone());
    let expected: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|n| format!("{DIR}/many/{n}.txt"))
        .collect();
    assert_eq!(got["paths"], json!(expected), "{got}");
    assert_eq!(
        got["contents"],
        json!(["file a", "file b", "file c"]),
        "{got}"
    );

    let listed = sdk.ok(key, "files_list", args.clone());
    let top = [
        format!("{DIR}/all.bin"),
        format!("{DIR}/many"),
        format!("{DIR}/new"),
    ];
    assert_eq!(
        paths(&listed["depth1"]),
        top.iter().map(String::as_str).collect::<Vec<_>>()
    );
    let deeper = paths(&listed["depth2"]);
    for p in [
        format!("{DIR}/many/a.txt"),
        format!("{DIR}/new/sub"),
        format!("{DIR}/all.bin"),
    ] {
        assert!(deeper.contains(&p.as_str()), "{p} not in {deeper:?}");
    }
    assert!(
        !deeper.iter().any(|p| p.ends_with("hello.txt")),
        "depth 2 went deeper: {deeper:?}"
    );
    let bin = listed["depth1"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "all.bin")
        .unwrap();
    assert_eq!(
        (bin["type"].as_str(), bin["size"].as_i64()),
        (Some("file"), Some(1024)),
        "{bin}"
    );
    let dir = listed["depth1"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "many")
        .unwrap();
    assert_eq!(dir["type"], "dir", "{dir}");
}

/// exists, get_info, make_dir (new, then existing), rename, remove.
fn inspect_move_and_remove(sdk: &Sdk, key: &str, args: &Value) {
    let got = sdk.ok(key, "files_inspect", args.clone());
    assert_eq!(
        (got["exists"].as_bool(), got["exists_missing"].as_bool()),
        (Some(true), Some(false)),
        "{got}"
    );
    let info = &got["info"];
    assert_eq!(info["name"], "file.txt", "{info}");
    assert_eq!(info["path"], format!("{DIR}/inspect/file.txt"));
    assert_eq!(
        (info["type"].as_str(), info["size"].as_i64()),
        (Some("file"), Some(5)),
        "{info}"
    );
    assert_eq!(info["permissions"], "-rw-r--r--", "{info}");
    assert_eq!(info["mode"], 0o644, "{info}");
    assert!(!info["owner"].as_str().unwrap().is_empty(), "{info}");
    let now = chrono::Utc::now().timestamp() as f64;
    let modified = info["modified"].as_f64().unwrap();
    assert!(
        (now - modified).abs() < 600.0,
        "modified {modified}, now {now}"
    );
    assert_eq!(got["dir_info"]["type"], "dir", "{got}");
    assert_eq!(
        (got["make_dir"].as_bool(), got["make_dir_again"].as_bool()),
        (Some(true), Some(false)),
        "{got}"
    );
    assert_eq!(
        got["renamed"]["path"],
        format!("{DIR}/inspect/moved.txt"),
        "{got}"
    );
    assert_eq!(got["old_exists"], false, "{got}");
    assert_eq!(got["moved_text"], "12345", "{got}");
    assert_eq!(
        (got["removed"].as_bool(), got["removed_exists"].as_bool()),
        (Some(true), Some(false)),
        "{got}"
    );
}

/// A missing file is the SDK's FileNotFound error (a NotFound one), for a read
/// (`/files`, 404) and for get_info (Connect not_found); a directory is not a file; another
/// user or a relative path is a bad request.
fn missing_file(sdk: &Sdk, key: &str, sid: &str) {
    let read = sdk.run(
        key,
        "files_read",
        json!({"sandbox_id": sid, "path": format!("{DIR}/nothing.txt")}),
    );
    assert_eq!(read["error"], sdk.error_name("FileNotFound"), "{read}");
    let info = sdk.run(
        key,
        "files_info",
        json!({"sandbox_id": sid, "path": format!("{DIR}/nothing")}),
    );
    assert_eq!(info["error"], sdk.error_name("FileNotFound"), "{info}");
    let dir = sdk.run(key, "files_read", json!({"sandbox_id": sid, "path": DIR}));
    assert_eq!(dir["error"], sdk.error_name("InvalidArgument"), "{dir}");
    // Operations run as the sandbox's own user: asking for another one is refused, not
    // ignored; a relative path has no home directory to resolve against.
    let file = format!("{DIR}/all.bin");
    let as_root = sdk.run(
        key,
        "files_read",
        json!({"sandbox_id": sid, "path": file, "user": "root"}),
    );
    assert_eq!(
        as_root["error"],
        sdk.error_name("InvalidArgument"),
        "{as_root}"
    );
    let relative = sdk.run(
        key,
        "files_read",
        json!({"sandbox_id": sid, "path": "all.bin"}),
    );
    assert_eq!(
        relative["error"],
        sdk.error_name("InvalidArgument"),
        "{relative}"
    );
}

/// A watcher sees the create, the write and the remove the scenario makes, by name.
fn watch(sdk: &Sdk, key: &str, args: &Value) {
    let got = sdk.ok(key, "files_watch", args.clone());
    let has = |phase: &str, kind: &str| {
        got[phase]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "w.txt" && e["type"] == kind)
    };
    assert!(has("created", "create"), "{got}");
    assert!(has("written", "write"), "{got}");
    assert!(has("removed", "remove"), "{got}");
}

/// The async SDK's watch (envd's WatchDir stream) sees a create, a write, a rename (the old
/// name, then the new one created) and a remove, and ends without an error when stopped.
fn watch_stream(sdk: &Sdk, key: &str, args: &Value) {
    let got = sdk.ok(key, "files_watch_stream", args.clone());
    let events: Vec<(&str, &str)> = got["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["type"].as_str().unwrap()))
        .collect();
    for wanted in [
        ("s.txt", "create"),
        ("s.txt", "write"),
        ("s.txt", "rename"),
        ("t.txt", "create"),
        ("t.txt", "remove"),
    ] {
        assert!(events.contains(&wanted), "{wanted:?} not in {events:?}");
    }
    assert_eq!(got["exit_errors"], json!([]), "{got}");
}
