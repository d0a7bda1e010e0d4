//! The frames of the Sprites exec WebSocket, both ways: the one place that knows the stream
//! ids and the control messages.
//!
//! Without a TTY every binary frame starts with a stream-id byte: 0 stdin, 1 stdout, 2 stderr,
//! 3 exit (the next byte is the exit code), 4 stdin EOF. With a TTY binary frames are the
//! terminal's raw bytes, both ways, with no prefix. Text frames are JSON: from the service
//! `{"type":"session_info","session_id":N,…}` and `{"type":"exit","exit_code":N}` (how a TTY
//! session reports its end); to it `{"type":"resize","cols":C,"rows":R}` and
//! `{"type":"signal","signal":"TERM"}` (the latter only when the service advertised
//! `signal` in `X-Sprite-Capabilities`).

use bytes::Bytes;
use serde::Deserialize;
use tokio_tungstenite::tungstenite::Message;

use crate::provider::stream::{Signal, TermSize};

pub const STDIN: u8 = 0;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const EXIT: u8 = 3;
pub const STDIN_EOF: u8 = 4;

/// The byte a terminal reads as the end of input (^D): a TTY session has no EOF frame, so
/// closing its stdin is typing this, as at a real terminal.
const END_OF_TRANSMISSION: u8 = 0x04;

/// A frame from the service, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// Output for stdout (with a TTY: everything the terminal shows).
    Stdout(Bytes),
    /// Output for stderr (never with a TTY).
    Stderr(Bytes),
    /// The process ended with this code.
    Exit(i64),
    /// The session's id (for the kill endpoint).
    Session(u64),
    /// Anything else (pings, port notifications, frames without a payload).
    Other,
}

/// A JSON text frame from the service; only the fields we act on.
#[derive(Deserialize)]
struct Text {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    exit_code: Option<i64>,
    #[serde(default)]
    session_id: Option<u64>,
}

/// Decodes one frame of a session with (`tty`) or without a terminal.
pub fn decode(message: Message, tty: bool) -> Incoming {
    match message {
        Message::Binary(data) if tty => Incoming::Stdout(data),
        Message::Binary(data) => decode_framed(data),
        Message::Text(text) => match serde_json::from_str::<Text>(text.as_str()) {
            Ok(Text {
                kind,
                exit_code: Some(code),
                ..
            }) if kind == "exit" => Incoming::Exit(code),
            Ok(Text {
                kind,
                session_id: Some(id),
                ..
            }) if kind == "session_info" => Incoming::Session(id),
            _ => Incoming::Other,
        },
        _ => Incoming::Other,
    }
}

/// A binary frame with a stream-id byte. An exit frame without its code byte is not an exit
/// code (the caller then reports the socket's end as a failure, never as a guessed 0).
fn decode_framed(data: Bytes) -> Incoming {
    match data.first() {
        Some(&STDOUT) => Incoming::Stdout(data.slice(1..)),
        Some(&STDERR) => Incoming::Stderr(data.slice(1..)),
        Some(&EXIT) => match data.get(1) {
            Some(&code) => Incoming::Exit(i64::from(code)),
            None => Incoming::Other,
        },
        _ => Incoming::Other,
    }
}

/// Bytes for the process's stdin.
pub fn stdin(data: &[u8], tty: bool) -> Message {
    if tty {
        Message::binary(data.to_vec())
    } else {
        Message::binary([&[STDIN][..], data].concat())
    }
}

/// The end of the process's stdin: the EOF frame, or ^D on a terminal.
pub fn stdin_eof(tty: bool) -> Message {
    if tty {
        Message::binary(vec![END_OF_TRANSMISSION])
    } else {
        Message::binary(vec![STDIN_EOF])
    }
}

/// A resize of the session's terminal.
pub fn resize(size: TermSize) -> Message {
    let json = serde_json::json!({"type": "resize", "cols": size.cols, "rows": size.rows});
    Message::text(json.to_string())
}

/// A signal over the socket (the bare name: `INT`, `TERM`, `KILL`, `HUP`).
pub fn signal(signal: Signal) -> Message {
    let json = serde_json::json!({"type": "signal", "signal": signal.name()});
    Message::text(json.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin(bytes: &[u8]) -> Message {
        Message::binary(bytes.to_vec())
    }

    #[test]
    fn framed_output_is_split_by_its_stream_id() {
        assert_eq!(
            decode(bin(b"\x01out"), false),
            Incoming::Stdout(Bytes::from_static(b"out"))
        );
        assert_eq!(
            decode(bin(b"\x02err"), false),
            Incoming::Stderr(Bytes::from_static(b"err"))
        );
        assert_eq!(decode(bin(&[EXIT, 143]), false), Incoming::Exit(143));
        assert_eq!(decode(bin(&[EXIT]), false), Incoming::Other, "no code byte");
        assert_eq!(decode(bin(&[]), false), Incoming::Other);
        assert_eq!(decode(bin(&[9, 1]), false), Incoming::Other);
    }

    #[test]
    fn a_terminal_s_bytes_are_raw_and_its_exit_is_text() {
        assert_eq!(
            decode(bin(b"\x01\x02raw"), true),
            Incoming::Stdout(Bytes::from_static(b"\x01\x02raw"))
        );
        let exit = Message::text(r#"{"type":"exit","exit_code":3}"#);
        assert_eq!(decode(exit, true), Incoming::Exit(3));
        let info = Message::text(r#"{"type":"session_info","session_id":1847,"tty":true}"#);
        assert_eq!(decode(info, false), Incoming::Session(1847));
        let port = Message::text(r#"{"type":"port_opened","port":8080}"#);
        assert_eq!(decode(port, true), Incoming::Other);
        assert_eq!(decode(Message::text("not json"), true), Incoming::Other);
    }

    #[test]
    fn input_is_framed_without_a_terminal_and_raw_with_one() {
        assert_eq!(stdin(b"ab", false), bin(b"\x00ab"));
        assert_eq!(stdin(b"ab", true), bin(b"ab"));
        assert_eq!(stdin_eof(false), bin(&[STDIN_EOF]));
        assert_eq!(stdin_eof(true), bin(&[0x04]));
    }

    #[test]
    fn control_messages_are_json_text() {
        let text = |m: Message| -> serde_json::Value {
            match m {
                Message::Text(t) => serde_json::from_str(t.as_str()).expect("json"),
                other => panic!("not text: {other:?}"),
            }
        };
        let r = text(resize(TermSize {
            cols: 132,
            rows: 50,
        }));
        assert_eq!(
            r,
            serde_json::json!({"type": "resize", "cols": 132, "rows": 50})
        );
        let s = text(signal(Signal::Interrupt));
        assert_eq!(s, serde_json::json!({"type": "signal", "signal": "INT"}));
    }
}
