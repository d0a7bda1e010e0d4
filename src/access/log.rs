//! `log`: the main process's output as a plain streamed HTTP response, as a Pod's log is
//! served; with `follow` it stays open and delivers new output as it is written.

use axum::body::Body;
use axum::http::{Request, Response, header};
use futures::TryStreamExt;

use super::lookup::Target;
use super::params;
use super::status::AccessError;

/// Streams the log.
pub async fn serve(target: Target, request: Request<Body>) -> Result<Response<Body>, AccessError> {
    let wanted = params::log_request(request.uri().query())?;
    let handle = &target.handle;
    let Some(logs) = handle.provider.logs() else {
        return Err(AccessError::NotImplemented(format!(
            "provider {} cannot read a sandbox's log",
            handle.name()
        )));
    };
    let stream = handle
        .call("logs", logs.logs(&target.id, &wanted))
        .await
        .map_err(|e| AccessError::from_provider("log", &e))?;
    let body = Body::from_stream(stream.map_err(std::io::Error::other));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/plain")
        .body(body)
        .map_err(|e| AccessError::Internal(e.to_string()))
}
