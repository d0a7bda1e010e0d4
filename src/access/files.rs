//! `files`: a tar stream of a path, down (`GET …/files?path=P`, the tree rooted at P's last
//! segment) or up (`PUT …/files?path=P` with a tar body, extracted at P). The import never
//! restores ownership or setuid/setgid bits (the seam's rule for tenant-authored archives).

use axum::body::Body;
use axum::http::{Method, Request, Response, StatusCode, header};
use futures::{StreamExt, TryStreamExt};

use super::lookup::Target;
use super::params;
use super::status::AccessError;
use crate::provider::BulkFiles;

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
            let declared = request
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok());
            let body = read_body(request.into_body(), max_upload, declared).await?;
            handle
                .call("import", files.import(&target.id, &path, body))
                .await
                .map_err(|e| AccessError::from_provider(&format!("files {path}"), &e))?;
            Ok(success())
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

/// The whole upload, refused once it passes `max`. Its buffer is sized from the declared
/// length (capped at `max`) so that the archive is copied once, as it arrives.
async fn read_body(body: Body, max: u64, declared: Option<u64>) -> Result<Vec<u8>, AccessError> {
    let limit = usize::try_from(max).unwrap_or(usize::MAX);
    let too_large = || {
        AccessError::TooLarge(format!(
            "the tar body is larger than access.maxUploadBytes ({max} bytes) or was cut off"
        ))
    };
    let hint = declared.unwrap_or(0).min(max);
    let mut out = Vec::with_capacity(usize::try_from(hint).unwrap_or(0));
    let mut frames = body.into_data_stream();
    while let Some(chunk) = frames.next().await {
        let chunk = chunk.map_err(|_| too_large())?;
        if out.len() + chunk.len() > limit {
            return Err(too_large());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
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

    #[tokio::test]
    async fn an_upload_is_read_whole_up_to_the_limit_and_refused_past_it() {
        let read = read_body(chunked(&[b"abc", b"def"]), 6, Some(6)).await;
        assert_eq!(read.ok().as_deref(), Some(&b"abcdef"[..]));
        let over = read_body(chunked(&[b"abc", b"defg"]), 6, None).await;
        assert!(matches!(over, Err(AccessError::TooLarge(_))), "{over:?}");
    }

    #[tokio::test]
    async fn a_declared_length_never_reserves_more_than_the_limit() {
        let read = read_body(chunked(&[b"ab"]), 8, Some(u64::MAX)).await;
        let read = read.expect("under the limit");
        assert_eq!(read, b"ab");
        assert!(read.capacity() <= 8, "reserved {}", read.capacity());
    }
}
