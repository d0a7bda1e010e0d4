//! The messages of envd's `process.Process` service, as JSON (pure: no I/O, table-tested).
//!
//! A process is started with `Start` {`process` {`cmd`, `args`, `envs`, `cwd`}, `stdin`,
//! `pty` {`size` {`cols`, `rows`}}} and addressed afterwards by the pid its `start` event
//! carried, in a `ProcessSelector` {`pid`}: `SendInput` {`input` {`stdin` | `pty`}} (bytes
//! are base64 in Connect's JSON), `CloseStdin`, `SendSignal` {`signal`} and `Update`
//! {`pty` {`size`}}. With a PTY, input goes to the terminal (`pty`), and stdout and stderr
//! arrive as one `pty` output.
//!
//! envd's `Signal` enum has only `SIGNAL_SIGTERM` and `SIGNAL_SIGKILL`. A process that a
//! signal ended reports `exitCode: -1`, `exited: false` and a `status` like
//! `signal: terminated` (the text of the platform's signal table); the seam reports 128 + N
//! for it, as a shell does, so [`end_code`] reads the signal back from that text.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::provider::stream::{Signal, TermSize};

/// The `ProcessConfig` of `argv` (split into `cmd` and `args`); `None` for an empty argv.
pub fn config(argv: &[String], env: &BTreeMap<String, String>, cwd: Option<&str>) -> Option<Value> {
    let (cmd, args) = argv.split_first()?;
    let mut process = json!({ "cmd": cmd, "args": args, "envs": env });
    if let Some(cwd) = cwd {
        process["cwd"] = json!(cwd);
    }
    Some(process)
}

/// A `StartRequest` for `process`: with a stdin pipe when `stdin`, with a terminal of
/// `tty`'s size when given (then input and output are the terminal's).
pub fn start_request(process: Value, stdin: bool, tty: Option<TermSize>) -> Value {
    let mut request = json!({ "process": process, "stdin": stdin });
    if let Some(size) = tty {
        request["pty"] = pty(size);
    }
    request
}

fn pty(size: TermSize) -> Value {
    json!({ "size": { "cols": size.cols, "rows": size.rows } })
}

fn selector(pid: u32) -> Value {
    json!({ "pid": pid })
}

/// A `SendInputRequest`: `bytes` for the process's stdin, or for its terminal with a TTY.
pub fn input_request(pid: u32, tty: bool, bytes: &[u8]) -> Value {
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    let input = match tty {
        true => json!({ "pty": encoded }),
        false => json!({ "stdin": encoded }),
    };
    json!({ "process": selector(pid), "input": input })
}

/// A `CloseStdinRequest` (envd refuses it for a PTY process: send [`EOT`] instead).
pub fn close_stdin_request(pid: u32) -> Value {
    json!({ "process": selector(pid) })
}

/// The end-of-transmission byte (^D): a terminal's end of input at the start of a line.
pub const EOT: u8 = 0x04;

/// An `UpdateRequest` resizing the process's terminal.
pub fn resize_request(pid: u32, size: TermSize) -> Value {
    json!({ "process": selector(pid), "pty": pty(size) })
}

/// A `SendSignalRequest`, for the two signals envd's enum has; `None` for the others.
pub fn signal_request(pid: u32, signal: Signal) -> Option<Value> {
    let name = match signal {
        Signal::Terminate => "SIGNAL_SIGTERM",
        Signal::Kill => "SIGNAL_SIGKILL",
        Signal::Interrupt | Signal::Hangup => return None,
    };
    Some(json!({ "process": selector(pid), "signal": name }))
}

/// The exit code of an `EndEvent`: its `exitCode` (proto3 JSON omits a zero), or 128 + N
/// when a signal N ended the process. A signal whose text is not known keeps envd's -1.
pub fn end_code(end: &Value) -> i64 {
    let code = end.get("exitCode").and_then(Value::as_i64).unwrap_or(0);
    let exited = end.get("exited").and_then(Value::as_bool).unwrap_or(false);
    if code != -1 || exited {
        return code;
    }
    end.get("status")
        .and_then(Value::as_str)
        .and_then(|s| s.strip_prefix("signal: "))
        .and_then(signal_number)
        .map_or(code, |n| 128 + n)
}

/// The number of a signal from its description in Linux's signal table (what envd's status
/// text carries), with or without a trailing ` (core dumped)`.
fn signal_number(text: &str) -> Option<i64> {
    const TABLE: [&str; 31] = [
        "hangup",
        "interrupt",
        "quit",
        "illegal instruction",
        "trace/breakpoint trap",
        "aborted",
        "bus error",
        "floating point exception",
        "killed",
        "user defined signal 1",
        "segmentation fault",
        "user defined signal 2",
        "broken pipe",
        "alarm clock",
        "terminated",
        "stack fault",
        "child exited",
        "continued",
        "stopped (signal)",
        "stopped",
        "stopped (tty input)",
        "stopped (tty output)",
        "urgent I/O condition",
        "CPU time limit exceeded",
        "file size limit exceeded",
        "virtual timer expired",
        "profiling timer expired",
        "window changed",
        "I/O possible",
        "power failure",
        "bad system call",
    ];
    let text = text.strip_suffix(" (core dumped)").unwrap_or(text);
    TABLE
        .iter()
        .position(|name| *name == text)
        .map(|i| i as i64 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_request_carries_argv_env_cwd_stdin_and_the_terminal() {
        let argv = vec!["sh".to_string(), "-c".into(), "a b".into()];
        let env = BTreeMap::from([("A".to_string(), "x y".to_string())]);
        let process = config(&argv, &env, Some("/tmp")).expect("argv");
        let tty = TermSize { cols: 80, rows: 24 };
        assert_eq!(
            start_request(process.clone(), true, Some(tty)),
            json!({
                "process": {"cmd": "sh", "args": ["-c", "a b"], "envs": {"A": "x y"}, "cwd": "/tmp"},
                "stdin": true,
                "pty": {"size": {"cols": 80, "rows": 24}}
            })
        );
        let plain = start_request(
            config(&argv[..1], &BTreeMap::new(), None).expect("argv"),
            false,
            None,
        );
        assert_eq!(
            plain,
            json!({"process": {"cmd": "sh", "args": [], "envs": {}}, "stdin": false})
        );
        assert_eq!(config(&[], &env, None), None);
    }

    #[test]
    fn inputs_are_base64_and_addressed_by_pid() {
        assert_eq!(
            input_request(7, false, b"hi\0"),
            json!({"process": {"pid": 7}, "input": {"stdin": "aGkA"}})
        );
        assert_eq!(
            input_request(7, true, &[EOT]),
            json!({"process": {"pid": 7}, "input": {"pty": "BA=="}})
        );
        assert_eq!(close_stdin_request(9), json!({"process": {"pid": 9}}));
        assert_eq!(
            resize_request(
                9,
                TermSize {
                    cols: 132,
                    rows: 50
                }
            ),
            json!({"process": {"pid": 9}, "pty": {"size": {"cols": 132, "rows": 50}}})
        );
    }

    #[test]
    fn only_term_and_kill_are_envd_signals() {
        assert_eq!(
            signal_request(3, Signal::Terminate),
            Some(json!({"process": {"pid": 3}, "signal": "SIGNAL_SIGTERM"}))
        );
        assert_eq!(
            signal_request(3, Signal::Kill),
            Some(json!({"process": {"pid": 3}, "signal": "SIGNAL_SIGKILL"}))
        );
        assert_eq!(signal_request(3, Signal::Interrupt), None);
        assert_eq!(signal_request(3, Signal::Hangup), None);
    }

    #[test]
    fn end_codes_are_the_process_s_own_or_128_plus_its_signal() {
        for (end, want) in [
            (json!({"exited": true}), 0),
            (
                json!({"exitCode": 7, "exited": true, "status": "exit status 7"}),
                7,
            ),
            (json!({"exitCode": -1, "status": "signal: terminated"}), 143),
            (json!({"exitCode": -1, "status": "signal: killed"}), 137),
            (json!({"exitCode": -1, "status": "signal: interrupt"}), 130),
            (json!({"exitCode": -1, "status": "signal: hangup"}), 129),
            (
                json!({"exitCode": -1, "status": "signal: segmentation fault (core dumped)"}),
                139,
            ),
            (
                json!({"exitCode": -1, "status": "signal: something new"}),
                -1,
            ),
            (
                json!({"exitCode": -1, "exited": true, "status": "exit status 255"}),
                -1,
            ),
        ] {
            assert_eq!(end_code(&end), want, "{end}");
        }
    }
}
