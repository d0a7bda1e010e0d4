//! The Connect protocol's JSON codec, as envd speaks it (pure: no I/O, table-tested): the
//! E2B provider's client side and the E2B-compatible API's envd server side share it.
//!
//! A server-streaming call sends one *enveloped* request — a flag byte, a 4-byte big-endian
//! length, the JSON — and answers `application/connect+json` with a sequence of envelopes.
//! Flag bit `0x02` marks the last one, whose JSON is `{}` or `{"error": {code, message}}`.
//! Unary calls are plain JSON; their errors are an HTTP status with `{code, message}`.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::Deserialize;

use crate::provider::{ErrorKind, ProviderError};

/// Flag bit of a compressed message (never sent by us; refused when received).
const COMPRESSED: u8 = 0x01;
/// Flag bit of the end-of-stream message.
const END_STREAM: u8 = 0x02;
/// Largest single message accepted (envd splits output into small chunks).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// One enveloped message (a request, or a streamed response message).
pub fn envelope(message: &serde_json::Value) -> Bytes {
    framed(0, message)
}

/// The enveloped end of a response stream: `{}`, or `{"error": {code, message}}`.
pub fn end_of_stream(end: &serde_json::Value) -> Bytes {
    framed(END_STREAM, end)
}

fn framed(flags: u8, message: &serde_json::Value) -> Bytes {
    let payload = message.to_string();
    let mut out = BytesMut::with_capacity(5 + payload.len());
    out.put_u8(flags);
    out.put_u32(payload.len() as u32);
    out.put_slice(payload.as_bytes());
    out.freeze()
}

/// A decoded frame of a streaming response.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// A response message.
    Message(serde_json::Value),
    /// The end of the stream: `Ok` or the call's error.
    End(Result<(), ConnectError>),
}

/// A Connect error: its code (`not_found`, …) and message.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ConnectError {
    /// The Connect code.
    #[serde(default)]
    pub code: String,
    /// The server's message.
    #[serde(default)]
    pub message: String,
}

impl ConnectError {
    /// The seam's error for this code, with `context` (what was being done) in front.
    pub fn to_provider(&self, context: &str) -> ProviderError {
        let kind = match self.code.as_str() {
            "not_found" => ErrorKind::NotFound,
            "invalid_argument" | "failed_precondition" | "out_of_range" | "permission_denied" => {
                ErrorKind::Invalid
            }
            "unauthenticated" => ErrorKind::Unauthorized,
            "already_exists" => ErrorKind::Conflict,
            "unimplemented" => ErrorKind::Unsupported,
            _ => ErrorKind::Transient,
        };
        ProviderError::new(kind, format!("{context}: {} ({})", self.message, self.code))
    }
}

#[derive(Deserialize)]
struct EndStream {
    error: Option<ConnectError>,
}

/// Splits a byte stream into frames, whatever the chunking.
#[derive(Debug, Default)]
pub struct Decoder {
    buffer: BytesMut,
}

impl Decoder {
    /// Adds received bytes.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next complete frame, `Ok(None)` when more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, String> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        let flags = self.buffer[0];
        let len = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if len > MAX_MESSAGE {
            return Err(format!("a stream message of {len} bytes exceeds the limit"));
        }
        if flags & COMPRESSED != 0 {
            return Err("the server sent a compressed message we did not ask for".into());
        }
        if self.buffer.len() < 5 + len {
            return Ok(None);
        }
        self.buffer.advance(5);
        let payload = self.buffer.split_to(len);
        if flags & END_STREAM != 0 {
            let end: EndStream = serde_json::from_slice(&payload)
                .map_err(|e| format!("unreadable end of stream: {e}"))?;
            return Ok(Some(Frame::End(match end.error {
                Some(error) => Err(error),
                None => Ok(()),
            })));
        }
        let message =
            serde_json::from_slice(&payload).map_err(|e| format!("unreadable message: {e}"))?;
        Ok(Some(Frame::Message(message)))
    }

    /// Whether bytes of an incomplete frame are buffered.
    pub fn has_partial(&self) -> bool {
        !self.buffer.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn frame(flags: u8, json: &str) -> Vec<u8> {
        let mut out = vec![flags];
        out.extend_from_slice(&(json.len() as u32).to_be_bytes());
        out.extend_from_slice(json.as_bytes());
        out
    }

    #[test]
    fn frames_decode_across_any_chunking() {
        let mut wire = frame(0, r#"{"event":{"start":{"pid":7}}}"#);
        wire.extend(frame(2, "{}"));
        for split in 0..wire.len() {
            let mut decoder = Decoder::default();
            decoder.push(&wire[..split]);
            let mut frames = Vec::new();
            while let Some(f) = decoder.next_frame().unwrap() {
                frames.push(f);
            }
            decoder.push(&wire[split..]);
            while let Some(f) = decoder.next_frame().unwrap() {
                frames.push(f);
            }
            assert_eq!(
                frames,
                vec![
                    Frame::Message(json!({"event": {"start": {"pid": 7}}})),
                    Frame::End(Ok(()))
                ],
                "split at {split}"
            );
            assert!(!decoder.has_partial());
        }
    }

    #[test]
    fn what_is_encoded_decodes() {
        let mut decoder = Decoder::default();
        decoder.push(&envelope(&json!({"a": 1})));
        decoder.push(&end_of_stream(
            &json!({"error": {"code": "not_found", "message": "m"}}),
        ));
        assert_eq!(
            decoder.next_frame().unwrap(),
            Some(Frame::Message(json!({"a": 1})))
        );
        let Some(Frame::End(Err(e))) = decoder.next_frame().unwrap() else {
            panic!("no error end")
        };
        assert_eq!((e.code.as_str(), e.message.as_str()), ("not_found", "m"));
    }

    #[test]
    fn an_error_end_maps_to_the_seam() {
        let mut decoder = Decoder::default();
        decoder.push(&frame(
            2,
            r#"{"error":{"code":"not_found","message":"no such dir"}}"#,
        ));
        let Some(Frame::End(Err(e))) = decoder.next_frame().unwrap() else {
            panic!("expected an error end");
        };
        let err = e.to_provider("listing /x");
        assert!(err.is(ErrorKind::NotFound));
        assert_eq!(err.message(), "listing /x: no such dir (not_found)");
        for (code, kind) in [
            ("unauthenticated", ErrorKind::Unauthorized),
            ("invalid_argument", ErrorKind::Invalid),
            ("unavailable", ErrorKind::Transient),
            ("deadline_exceeded", ErrorKind::Transient),
            ("unimplemented", ErrorKind::Unsupported),
        ] {
            let e = ConnectError {
                code: code.into(),
                message: String::new(),
            };
            assert_eq!(e.to_provider("x").kind(), kind, "{code}");
        }
    }

    #[test]
    fn compressed_or_oversized_frames_are_refused() {
        let mut decoder = Decoder::default();
        decoder.push(&frame(1, "{}"));
        assert!(decoder.next_frame().is_err());
        let mut decoder = Decoder::default();
        decoder.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(decoder.next_frame().is_err());
    }

    #[test]
    fn requests_are_enveloped() {
        let bytes = envelope(&json!({"a": 1}));
        assert_eq!(&bytes[..5], &[0, 0, 0, 0, 7]);
    }
}
