//! The process service's messages in the Connect JSON codec (pure, table-tested): the
//! requests as the SDKs send them (proto3 JSON: camelCase names, bytes as base64, enums by
//! name or number) and the events and answers envd sends back.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::ring::Chunk;
use crate::e2bapi::envd::error::{Code, EnvdError};
use crate::provider::stream::{Signal, TermSize};

/// What to run: `cmd` with `args`, extra `envs`, in `cwd`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessConfig {
    /// The program.
    #[serde(default)]
    pub cmd: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment for this process only.
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    /// Working directory; the sandbox's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// A terminal's size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Size {
    /// Columns.
    #[serde(default)]
    pub cols: u32,
    /// Rows.
    #[serde(default)]
    pub rows: u32,
}

/// A PTY request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Pty {
    /// Its size.
    #[serde(default)]
    pub size: Option<Size>,
}

/// `Start`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StartRequest {
    /// What to run.
    #[serde(default)]
    pub process: Option<ProcessConfig>,
    /// A terminal, when asked for.
    #[serde(default)]
    pub pty: Option<Pty>,
    /// A name to select the process by.
    #[serde(default)]
    pub tag: Option<String>,
    /// Whether the process gets a stdin; envd's default is yes.
    #[serde(default)]
    pub stdin: Option<bool>,
}

/// Which process: by pid or by tag.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Selector {
    /// The pid envd assigned.
    Pid(u32),
    /// The tag given at start.
    Tag(String),
}

/// Requests that name a process (`Connect`, `CloseStdin`).
#[derive(Debug, Clone, Deserialize)]
pub struct Selected {
    /// The process.
    pub process: Option<Selector>,
}

/// Input bytes, for stdin or for the terminal.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Input {
    /// stdin bytes, base64.
    Stdin(String),
    /// Terminal input, base64.
    Pty(String),
}

/// `SendInput`.
#[derive(Debug, Clone, Deserialize)]
pub struct SendInputRequest {
    /// The process.
    pub process: Option<Selector>,
    /// The bytes.
    pub input: Option<Input>,
}

/// `SendSignal`.
#[derive(Debug, Clone, Deserialize)]
pub struct SendSignalRequest {
    /// The process.
    pub process: Option<Selector>,
    /// The signal, by name (`SIGNAL_SIGKILL`) or number.
    #[serde(default)]
    pub signal: Value,
}

/// `Update`.
#[derive(Debug, Clone, Deserialize)]
pub struct UpdateRequest {
    /// The process.
    pub process: Option<Selector>,
    /// Its terminal's new size.
    #[serde(default)]
    pub pty: Option<Pty>,
}

/// One message of `StreamInput`: the process first, then data (keepalives are ignored).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamInput {
    /// The process the input goes to.
    Start {
        /// The process.
        process: Option<Selector>,
    },
    /// Input bytes.
    Data {
        /// The bytes.
        input: Option<Input>,
    },
    /// Nothing.
    Keepalive {},
}

/// The selector a request must carry.
pub fn selector(process: Option<Selector>) -> Result<Selector, EnvdError> {
    process.ok_or_else(|| invalid("the request names no process (process.pid or process.tag)"))
}

/// The bytes of an input message.
pub fn input_bytes(input: Option<Input>) -> Result<Bytes, EnvdError> {
    match input {
        Some(Input::Stdin(b) | Input::Pty(b)) => decode_bytes(&b),
        None => Err(invalid(
            "the request carries no input (input.stdin or input.pty)",
        )),
    }
}

/// proto3 JSON bytes: standard or URL-safe base64, padded or not.
pub fn decode_bytes(text: &str) -> Result<Bytes, EnvdError> {
    let trimmed = text.trim_end_matches('=');
    let padded = format!("{trimmed}{}", "=".repeat((4 - trimmed.len() % 4) % 4));
    STANDARD
        .decode(&padded)
        .or_else(|_| URL_SAFE.decode(&padded))
        .map(Bytes::from)
        .map_err(|e| invalid(&format!("input bytes are not base64: {e}")))
}

/// The signal a `SendSignal` names: SIGTERM (15) or SIGKILL (9), as envd's enum has them.
pub fn signal(value: &Value) -> Result<Signal, EnvdError> {
    match value {
        Value::String(s) if s == "SIGNAL_SIGTERM" => Ok(Signal::Terminate),
        Value::String(s) if s == "SIGNAL_SIGKILL" => Ok(Signal::Kill),
        Value::Number(n) if n.as_u64() == Some(15) => Ok(Signal::Terminate),
        Value::Number(n) if n.as_u64() == Some(9) => Ok(Signal::Kill),
        other => Err(invalid(&format!(
            "signal {other}: envd sends SIGNAL_SIGTERM or SIGNAL_SIGKILL"
        ))),
    }
}

/// A terminal size the seam takes; both dimensions must be set.
pub fn term_size(pty: &Pty) -> Result<TermSize, EnvdError> {
    let size = pty.size.unwrap_or_default();
    let fit = |n: u32| u16::try_from(n).ok().filter(|n| *n > 0);
    match (fit(size.cols), fit(size.rows)) {
        (Some(cols), Some(rows)) => Ok(TermSize { cols, rows }),
        _ => Err(invalid(&format!(
            "pty.size {}x{}: give cols and rows between 1 and 65535",
            size.cols, size.rows
        ))),
    }
}

fn invalid(message: &str) -> EnvdError {
    EnvdError::new(Code::InvalidArgument, message)
}

/// How a process ended, as the end event says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct End {
    /// Its exit code; `None` when it could not be read.
    pub code: Option<i64>,
    /// Why the output or the exit code could not be read.
    pub error: Option<String>,
}

/// The start event, carrying the pid.
pub fn start_event(pid: u32) -> Value {
    json!({"event": {"start": {"pid": pid}}})
}

/// A data event: the chunk's bytes, base64, under its stream's name.
pub fn data_event(chunk: &Chunk) -> Value {
    let (stream, bytes) = match chunk {
        Chunk::Stdout(b) => ("stdout", b),
        Chunk::Stderr(b) => ("stderr", b),
        Chunk::Pty(b) => ("pty", b),
    };
    json!({"event": {"data": {stream: STANDARD.encode(bytes)}}})
}

/// The end event. An exit code that could not be read is -1 with the reason in `error`.
pub fn end_event(end: &End) -> Value {
    let mut event = match end.code {
        Some(code) => {
            json!({"exitCode": code, "exited": true, "status": format!("exit status {code}")})
        }
        None => json!({"exitCode": -1, "exited": false, "status": "unknown"}),
    };
    if let Some(error) = &end.error {
        event["error"] = json!(error);
    }
    json!({"event": {"end": event}})
}

/// The keepalive event, sent on an idle stream as often as the client asks.
pub fn keepalive_event() -> Value {
    json!({"event": {"keepalive": {}}})
}

/// One process in a `List` answer.
pub fn process_info(pid: u32, config: &ProcessConfig, tag: Option<&str>) -> Value {
    let mut info = json!({"config": config, "pid": pid});
    if let Some(tag) = tag {
        info["tag"] = json!(tag);
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_request_reads_as_the_sdk_sends_it() {
        let raw = r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","x"],"envs":{"A":"b"},
            "cwd":"/tmp"},"pty":{"size":{"cols":80,"rows":24}},"stdin":false,"tag":"t"}"#;
        let r: StartRequest = serde_json::from_str(raw).unwrap();
        let p = r.process.unwrap();
        assert_eq!(
            (p.cmd.as_str(), p.args.len(), p.cwd.as_deref()),
            ("/bin/bash", 3, Some("/tmp"))
        );
        assert_eq!(p.envs["A"], "b");
        let size = term_size(&r.pty.unwrap()).unwrap();
        assert_eq!((size.cols, size.rows), (80, 24));
        assert_eq!((r.stdin, r.tag.as_deref()), (Some(false), Some("t")));
        let bare: StartRequest = serde_json::from_str(r#"{"process":{"cmd":"ls"}}"#).unwrap();
        assert_eq!((bare.stdin, bare.pty), (None, None));
    }

    #[test]
    fn selectors_inputs_and_signals_read_both_ways_the_codec_allows() {
        let r: SendInputRequest =
            serde_json::from_str(r#"{"process":{"pid":5},"input":{"pty":"bHMK"}}"#).unwrap();
        assert_eq!(selector(r.process).unwrap(), Selector::Pid(5));
        assert_eq!(input_bytes(r.input).unwrap(), Bytes::from_static(b"ls\n"));
        assert_eq!(decode_bytes("bHMK").unwrap(), decode_bytes("bHMK").unwrap());
        assert_eq!(
            decode_bytes("_-8").unwrap(),
            Bytes::from_static(&[0xff, 0xef])
        );
        assert!(decode_bytes("!!").is_err());
        let r: Selected = serde_json::from_str(r#"{"process":{"tag":"t"}}"#).unwrap();
        assert_eq!(selector(r.process).unwrap(), Selector::Tag("t".into()));
        assert!(selector(None).is_err());
        assert_eq!(signal(&json!("SIGNAL_SIGKILL")).unwrap(), Signal::Kill);
        assert_eq!(signal(&json!(15)).unwrap(), Signal::Terminate);
        let unspecified = signal(&json!("SIGNAL_UNSPECIFIED")).unwrap_err();
        assert_eq!(unspecified.code, Code::InvalidArgument);
        let s: StreamInput =
            serde_json::from_str(r#"{"data":{"input":{"stdin":"eA=="}}}"#).unwrap();
        assert_eq!(
            s,
            StreamInput::Data {
                input: Some(Input::Stdin("eA==".into()))
            }
        );
        let s: StreamInput = serde_json::from_str(r#"{"start":{"process":{"pid":5}}}"#).unwrap();
        assert_eq!(
            s,
            StreamInput::Start {
                process: Some(Selector::Pid(5))
            }
        );
    }

    #[test]
    fn a_size_must_fit_a_terminal() {
        let pty = |cols, rows| Pty {
            size: Some(Size { cols, rows }),
        };
        assert!(term_size(&pty(0, 24)).is_err());
        assert!(term_size(&pty(80, 70_000)).is_err());
        assert!(term_size(&Pty::default()).is_err());
    }

    #[test]
    fn events_are_the_proto3_json_envd_sends() {
        assert_eq!(start_event(7), json!({"event": {"start": {"pid": 7}}}));
        let data = data_event(&Chunk::Stderr(Bytes::from_static(b"hi")));
        assert_eq!(data, json!({"event": {"data": {"stderr": "aGk="}}}));
        let end = end_event(&End {
            code: Some(3),
            error: None,
        });
        assert_eq!(
            end,
            json!({"event": {"end": {"exitCode": 3, "exited": true, "status": "exit status 3"}}})
        );
        let lost = end_event(&End {
            code: None,
            error: Some("engine gone".into()),
        });
        assert_eq!(lost["event"]["end"]["error"], "engine gone");
        assert_eq!(lost["event"]["end"]["exited"], false);
        let config = ProcessConfig {
            cmd: "a".into(),
            ..Default::default()
        };
        let info = process_info(7, &config, Some("t"));
        assert_eq!(
            info,
            json!({"config": {"cmd": "a", "args": [], "envs": {}}, "pid": 7, "tag": "t"})
        );
    }
}
