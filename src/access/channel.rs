//! The channel protocol Pod exec, attach and port-forward speak over a WebSocket, so that a
//! client written for Pods (kubectl's code paths, client libraries) works for a Sandbox, and
//! one codec serves both the aggregated API server and the `kubectl sandbox` plugin.
//!
//! Each binary message is one frame: its first byte names a channel, the rest is that
//! channel's data. Exec channels: 0 stdin, 1 stdout, 2 stderr, 3 error (a `metav1.Status`
//! JSON, which also carries the exit code), 4 resize (`{"Width":…,"Height":…}`). `v5` adds a
//! close signal: channel 255 with one byte, the channel closed (how a client ends stdin
//! without ending the connection). Port-forward: for the i-th port of the request, channel
//! 2i carries data and 2i+1 errors, and the first frame on each starts with the port number
//! (two bytes, little-endian).

use serde::{Deserialize, Serialize};

use crate::provider::stream::TermSize;

/// stdin.
pub const STDIN: u8 = 0;
/// stdout.
pub const STDOUT: u8 = 1;
/// stderr.
pub const STDERR: u8 = 2;
/// The final status (and any error before it).
pub const ERROR: u8 = 3;
/// Terminal resize.
pub const RESIZE: u8 = 4;
/// `v5`: "the channel in this frame's one byte is closed".
pub const CLOSE: u8 = 255;

/// The exec/attach subprotocols we speak, most preferred first.
pub const EXEC_PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];
/// The WebSocket port-forward subprotocol.
pub const PORT_FORWARD_PROTOCOL: &str = "v4.channel.k8s.io";

/// Which exec protocol version a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// `v4.channel.k8s.io`: JSON status on the error channel; no stdin close.
    V4,
    /// `v5.channel.k8s.io`: v4 plus the close frame.
    V5,
}

impl Version {
    /// The subprotocol name.
    pub fn protocol(self) -> &'static str {
        match self {
            Version::V4 => EXEC_PROTOCOLS[1],
            Version::V5 => EXEC_PROTOCOLS[0],
        }
    }

    /// The best version among the client's `Sec-WebSocket-Protocol` offers (comma-separated,
    /// in one or several headers); `None` when we speak none of them.
    pub fn negotiate<'a>(offers: impl IntoIterator<Item = &'a str>) -> Option<Version> {
        let offered: Vec<&str> = offers
            .into_iter()
            .flat_map(|h| h.split(','))
            .map(str::trim)
            .collect();
        [Version::V5, Version::V4]
            .into_iter()
            .find(|v| offered.contains(&v.protocol()))
    }
}

/// One frame: `channel` followed by `data`.
pub fn frame(channel: u8, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 1);
    out.push(channel);
    out.extend_from_slice(data);
    out
}

/// Splits a received frame into its channel and data; `None` for an empty message.
pub fn split(message: &[u8]) -> Option<(u8, &[u8])> {
    message.split_first().map(|(c, rest)| (*c, rest))
}

/// The resize channel's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resize {
    /// Columns.
    #[serde(rename = "Width")]
    pub width: u16,
    /// Rows.
    #[serde(rename = "Height")]
    pub height: u16,
}

impl From<Resize> for TermSize {
    fn from(r: Resize) -> TermSize {
        TermSize {
            cols: r.width,
            rows: r.height,
        }
    }
}

impl From<TermSize> for Resize {
    fn from(s: TermSize) -> Resize {
        Resize {
            width: s.cols,
            height: s.rows,
        }
    }
}

/// The error channel's final message for a process that exited with `code`: `Success` for 0,
/// else `Failure` with reason `NonZeroExitCode` and the code as an `ExitCode` cause, as the
/// kubelet writes it.
pub fn exit_status(code: i64) -> String {
    if code == 0 {
        return serde_json::json!({"metadata": {}, "status": "Success"}).to_string();
    }
    serde_json::json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("command terminated with non-zero exit code: {code}"),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
    .to_string()
}

/// The error channel's message for a failure that is not an exit code (the process could not
/// start, the provider failed mid-stream).
pub fn failure_status(message: &str) -> String {
    serde_json::json!({
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "InternalError",
    })
    .to_string()
}

/// What an error-channel message says: the exit code, or a failure message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The process exited with this code.
    Exited(i64),
    /// Something failed before or instead of an exit.
    Failed(String),
}

/// Reads an error-channel message (a `metav1.Status`).
pub fn parse_status(message: &[u8]) -> Outcome {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(message) else {
        return Outcome::Failed(String::from_utf8_lossy(message).into_owned());
    };
    if v["status"] == "Success" {
        return Outcome::Exited(0);
    }
    let code = v["details"]["causes"].as_array().and_then(|causes| {
        causes
            .iter()
            .find(|c| c["reason"] == "ExitCode")
            .and_then(|c| c["message"].as_str()?.parse().ok())
    });
    match code {
        Some(code) if v["reason"] == "NonZeroExitCode" => Outcome::Exited(code),
        _ => Outcome::Failed(
            v["message"]
                .as_str()
                .unwrap_or("unknown failure")
                .to_string(),
        ),
    }
}

/// The port-forward data channel of the `index`-th requested port.
pub fn port_data_channel(index: usize) -> Option<u8> {
    u8::try_from(index * 2).ok()
}

/// The first frame's payload on a port-forward channel: the port, little-endian.
pub fn port_prefix(port: u16) -> [u8; 2] {
    port.to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_offered_version_wins() {
        assert_eq!(
            Version::negotiate(["v4.channel.k8s.io, v5.channel.k8s.io"]),
            Some(Version::V5)
        );
        assert_eq!(
            Version::negotiate(["channel.k8s.io", "v4.channel.k8s.io"]),
            Some(Version::V4)
        );
        assert_eq!(Version::negotiate(["base64.channel.k8s.io"]), None);
    }

    #[test]
    fn exit_codes_round_trip_through_the_status() {
        assert_eq!(parse_status(exit_status(0).as_bytes()), Outcome::Exited(0));
        assert_eq!(parse_status(exit_status(7).as_bytes()), Outcome::Exited(7));
        assert_eq!(
            parse_status(failure_status("no such file").as_bytes()),
            Outcome::Failed("no such file".into())
        );
    }

    #[test]
    fn frames_carry_their_channel() {
        let f = frame(STDOUT, b"hi");
        assert_eq!(split(&f), Some((STDOUT, &b"hi"[..])));
        assert_eq!(split(&[]), None);
        let r: Resize = serde_json::from_str(r#"{"Width":120,"Height":40}"#).unwrap();
        assert_eq!(
            TermSize::from(r),
            TermSize {
                cols: 120,
                rows: 40
            }
        );
    }
}
