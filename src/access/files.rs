//! `files`: a tar stream of a path, down (`GET …/files?path=P`, the tree rooted at P's last
//! segment) or up (`PUT …/files?path=P` with a tar body, extracted at P). The import never
//! restores ownership or setuid/setgid bits (the seam's rule for tenant-authored archives).

use axum::body::Body;
use axum::http::{Method, Request, Response, StatusCode, header};
use futures::TryStreamExt;

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
            let body = read_body(request.into_body(), max_upload).await?;
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

async fn read_body(body: Body, max: u64) -> Result<Vec<u8>, AccessError> {
    let limit = usize::try_from(max).unwrap_or(usize::MAX);
    axum::body::to_bytes(body, limit)
        .await
        .map(|b| b.to_vec())
        .map_err(|_| {
            AccessError::TooLarge(format!(
                "the tar body is larger than access.maxUploadBytes ({max} bytes) or was cut off"
            ))
        })
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
