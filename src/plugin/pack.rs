//! Packing a local file or tree as the tar that `cp` uploads, whole ([`pack`]) or as a
//! request body that is sent while it is still being packed ([`packed_body`]).
//!
//! Streaming is what keeps a large upload's time close to one pass over the bytes: the file is
//! read, sent through the API server and checked by the operator at the same time, instead of
//! one after the other.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::TryStreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::errors::PluginError;
use crate::kube_client::StreamingBody;

/// The size of the pieces a packed body is sent in.
const PIECE: usize = 1 << 20;

/// How many packed pieces may wait to be sent: packing stays at most this far ahead.
const AHEAD: usize = 4;

/// A tar of `local` (a file, or a tree with its modes; symlinks inside kept as symlinks) whose
/// one top-level member is `root`.
pub fn pack(local: &Path, root: &str) -> Result<Vec<u8>, PluginError> {
    let size = std::fs::metadata(local).map_or(0, |m| if m.is_dir() { 0 } else { m.len() });
    // A file's archive is its bytes plus a header, padding and the end blocks: sized once,
    // so a large file is not copied again at every doubling of the buffer.
    let capacity = usize::try_from(size).unwrap_or(0).saturating_add(4096);
    pack_into(local, root, Vec::with_capacity(capacity))
        .map_err(|e| PluginError::local(format!("packing {}", local.display()), e))
}

/// [`pack`] as a request body, packed on a blocking thread while it is sent. The handle
/// answers how packing ended: an error of kind `BrokenPipe` means the request stopped reading
/// (look at its answer); any other is local, and the body then ends in an error, so the
/// operator refuses the upload whole instead of writing a shorter tree.
pub fn packed_body(local: PathBuf, root: String) -> (StreamingBody, JoinHandle<io::Result<()>>) {
    let (tx, mut rx) = mpsc::channel::<io::Result<Bytes>>(AHEAD);
    let packing = tokio::task::spawn_blocking(move || {
        let broken = tx.clone();
        let packed = pack_into(&local, &root, Pieces::new(tx)).map(drop);
        if let Err(e) = &packed {
            // Ends the body in an error; when the request has gone already, nobody hears it.
            let _ = broken.blocking_send(Err(io::Error::new(e.kind(), e.to_string())));
        }
        packed
    });
    let pieces = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let body = StreamBody::new(pieces.map_ok(Frame::data));
    (BodyExt::boxed(body), packing)
}

/// Writes the tar of `local` named `root` into `out` and returns it, flushed.
fn pack_into<W: Write>(local: &Path, root: &str, out: W) -> io::Result<W> {
    let is_dir = std::fs::metadata(local)?.is_dir();
    let mut builder = tar::Builder::new(out);
    builder.follow_symlinks(false);
    if is_dir {
        builder.append_dir_all(root, local)?;
    } else {
        builder.append_path_with_name(local, root)?;
    }
    let mut out = builder.into_inner()?;
    out.flush()?;
    Ok(out)
}

/// A writer that sends what it is given in pieces of [`PIECE`] bytes, waiting while
/// [`AHEAD`] pieces are unsent.
struct Pieces {
    tx: mpsc::Sender<io::Result<Bytes>>,
    piece: Vec<u8>,
}

impl Pieces {
    fn new(tx: mpsc::Sender<io::Result<Bytes>>) -> Self {
        Pieces {
            tx,
            piece: Vec::with_capacity(PIECE),
        }
    }

    fn send(&mut self) -> io::Result<()> {
        let piece = std::mem::replace(&mut self.piece, Vec::with_capacity(PIECE));
        self.tx.blocking_send(Ok(Bytes::from(piece))).map_err(|_| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the upload stopped before the archive was sent",
            )
        })
    }
}

impl Write for Pieces {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = PIECE - self.piece.len();
        let taken = data.len().min(room);
        self.piece.extend_from_slice(&data[..taken]);
        if self.piece.len() == PIECE {
            self.send()?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.piece.is_empty() {
            return Ok(());
        }
        self.send()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_packed_body_carries_the_same_archive_as_a_whole_pack() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("blob");
        let data: Vec<u8> = (0..3 * PIECE + 17).map(|i| (i % 251) as u8).collect();
        std::fs::write(&file, &data).unwrap();
        let (body, packing) = packed_body(file.clone(), "copy".into());
        let sent = body.collect().await.unwrap().to_bytes();
        packing.await.unwrap().unwrap();
        assert_eq!(sent.as_ref(), pack(&file, "copy").unwrap().as_slice());
        assert!(sent.len() > data.len());
    }

    #[tokio::test]
    async fn a_packed_body_of_an_unreadable_path_ends_in_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (body, packing) = packed_body(dir.path().join("absent"), "x".into());
        assert!(body.collect().await.is_err());
        let ended = packing.await.unwrap().unwrap_err();
        assert_eq!(ended.kind(), io::ErrorKind::NotFound);
    }

    #[tokio::test]
    async fn packing_stops_when_the_request_stops_reading() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("blob");
        std::fs::write(&file, vec![1u8; (AHEAD + 4) * PIECE]).unwrap();
        let (body, packing) = packed_body(file, "copy".into());
        drop(body);
        let ended = packing.await.unwrap().unwrap_err();
        assert_eq!(ended.kind(), io::ErrorKind::BrokenPipe);
    }
}
