//! `files`: a tar stream of a path, down (`GET …/files?path=P`, the tree rooted at P's last
//! segment) or up (`PUT …/files?path=P` with a tar body, extracted at P). The import never
//! restores ownership or setuid/setgid bits (the seam's rule for tenant-authored archives).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::http::{Method, Request, Response, StatusCode, header};
use futures::{StreamExt, TryStreamExt};

use super::lookup::Target;
use super::params;
use super::status::AccessError;
use crate::provider::{ArchiveStream, BulkFiles};

/// The tar content type.
pub const TAR: &str = "application/x-tar";

/// Serves a download or an upload.
pub async fn serve(
    target: Target,
    request: Request<Body>,
    max_upload: u64,
) -> Result<Response<Body>, AccessError> {
    let path = params::path(request.uri().query())?;
    let handle = &target.handle;
    let Some(files) = handle.provider.bulk_files() else {
        return Err(AccessError::NotImplemented(format!(
            "provider {} cannot move files as tar archives",
            handle.name()
        )));
    };
    match *request.method() {
        Method::GET => download(&target, files, &path).await,
        Method::PUT | Method::POST => {
            let (archive, over) = limited(request.into_body(), max_upload);
            let imported = handle
                .call("import", files.import(&target.id, &path, archive))
                .await;
            match imported {
                Ok(()) => Ok(success()),
                Err(_) if over.load(Ordering::Relaxed) => Err(AccessError::TooLarge(format!(
                    "the tar body is larger than access.maxUploadBytes ({max_upload} bytes); \
                     nothing was written"
                ))),
                Err(e) => Err(AccessError::from_provider(&format!("files {path}"), &e)),
            }
        }
        _ => Err(AccessError::BadRequest(
            "files takes GET (download a tar) or PUT (upload a tar)".into(),
        )),
    }
}

async fn download(
    target: &Target,
    files: &dyn BulkFiles,
    path: &str,
) -> Result<Response<Body>, AccessError> {
    let stream = target
        .handle
        .call("export", files.export(&target.id, path))
        .await
        .map_err(|e| AccessError::from_provider(&format!("files {path}"), &e))?;
    Response::builder()
        .header(header::CONTENT_TYPE, TAR)
        .body(Body::from_stream(stream.map_err(std::io::Error::other)))
        .map_err(|e| AccessError::Internal(e.to_string()))
}

/// The upload as it arrives, for the provider to check while it is still being received.
/// Past `max` bytes it ends in an error (the import then fails and writes nothing) and `over`
/// is set, so that the answer can say why.
fn limited(body: Body, max: u64) -> (ArchiveStream, Arc<AtomicBool>) {
    let over = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&over);
    let mut received: u64 = 0;
    let archive = body.into_data_stream().map(move |piece| {
        let piece = piece.map_err(std::io::Error::other)?;
        received = received.saturating_add(piece.len() as u64);
        if received > max {
            flag.store(true, Ordering::Relaxed);
            return Err(std::io::Error::other(format!(
                "the upload is larger than access.maxUploadBytes ({max} bytes)"
            )));
        }
        Ok(piece)
    });
    (archive.boxed(), over)
}

/// The `metav1.Status` of a finished upload.
fn success() -> Response<Body> {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200,
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(parts: &[&'static [u8]]) -> Body {
        let frames = parts
            .iter()
            .map(|p| Ok::<_, std::io::Error>(bytes::Bytes::from_static(p)));
        Body::from_stream(futures::stream::iter(frames.collect::<Vec<_>>()))
    }

    async fn read(archive: ArchiveStream) -> Result<Vec<u8>, std::io::Error> {
        archive
            .try_fold(Vec::new(), |mut all, piece| async move {
                all.extend_from_slice(&piece);
                Ok(all)
            })
            .await
    }

    #[tokio::test]
    async fn an_upload_up_to_the_limit_passes_through_whole() {
        let (archive, over) = limited(chunked(&[b"abc", b"def"]), 6);
        assert_eq!(read(archive).await.ok().as_deref(), Some(&b"abcdef"[..]));
        assert!(!over.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn an_upload_past_the_limit_ends_in_an_error_and_says_so() {
        let (archive, over) = limited(chunked(&[b"abc", b"defg"]), 6);
        let read = read(archive).await;
        let err = read.expect_err("past the limit");
        assert!(
            err.to_string().contains("maxUploadBytes (6 bytes)"),
            "{err}"
        );
        assert!(over.load(Ordering::Relaxed));
    }
}
