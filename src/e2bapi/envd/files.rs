//! envd's `/files`: `GET ?path=P` answers the exact bytes of one file, `POST` writes one
//! or several (a `multipart/form-data` body whose parts name their paths, or a raw
//! `application/octet-stream` body for `?path=P`) and answers what it wrote. Both go through
//! the seam's file capability, which keeps the contract: an absent file is a 404, never empty
//! bytes; a directory is a 400; a write replaces the whole file, its parents created. Errors
//! are envd's REST errors, `{code, message}` with the HTTP status as the code.

use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;

use super::error::{Code, EnvdError};
use super::files_multipart as multipart;
use super::filesystem::shell;
use super::rpc;
use super::target::EnvdTarget;
use crate::access::status::AccessError;
use crate::provider::Files;

/// The largest upload accepted (the operator holds an upload in memory while writing it).
pub const MAX_UPLOAD: usize = 100 * 1024 * 1024;
/// The body limit of `/files` ([`MAX_UPLOAD`] instead of axum's 2 MiB).
pub fn limit() -> axum::extract::DefaultBodyLimit {
    axum::extract::DefaultBodyLimit::max(MAX_UPLOAD)
}

/// The mode of a written file.
const FILE_MODE: u32 = 0o644;

/// An envd REST error.
pub struct RestError(EnvdError);

impl From<EnvdError> for RestError {
    fn from(e: EnvdError) -> Self {
        RestError(e)
    }
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        let status = self.0.code.status();
        let body = json!({"code": status.as_u16(), "message": self.0.message});
        crate::e2bapi::error::json(status, &body)
    }
}

/// The query's `path` and `username`.
fn query(uri: &Uri) -> (Option<String>, Option<String>) {
    let (mut path, mut user) = (None, None);
    for (k, v) in url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "path" => path = Some(v.into_owned()),
            "username" => user = Some(v.into_owned()),
            _ => {}
        }
    }
    (path, user)
}

fn capability(t: &EnvdTarget) -> Result<&dyn Files, EnvdError> {
    t.target.handle.provider.files().ok_or_else(|| {
        let name = t.target.handle.name();
        EnvdError::new(
            Code::Unimplemented,
            format!("provider {name} cannot read or write files"),
        )
    })
}

fn provider_error(path: &str, e: &crate::provider::ProviderError) -> EnvdError {
    EnvdError::from(AccessError::from_provider(path, e))
}

/// `GET /files?path=P`: the file's bytes.
pub async fn download(t: EnvdTarget, h: HeaderMap, uri: Uri) -> Result<Response, RestError> {
    let (path, user) = query(&uri);
    rpc::refuse_other_user(&h, user.as_deref())?;
    let path = shell::path("path to read", path.as_deref().unwrap_or_default())?;
    let files = capability(&t)?;
    let handle = &t.target.handle;
    let data = handle
        .call("read_file", files.read_file(&t.target.id, &path))
        .await
        .map_err(|e| provider_error(&path, &e))?;
    let octets = [(header::CONTENT_TYPE, "application/octet-stream")];
    Ok((StatusCode::OK, octets, data).into_response())
}

/// `POST /files`: writes every file of the body; answers `[{name, type, path}]`.
pub async fn upload(
    t: EnvdTarget,
    h: HeaderMap,
    uri: Uri,
    body: Bytes,
) -> Result<Response, RestError> {
    let (path, user) = query(&uri);
    rpc::refuse_other_user(&h, user.as_deref())?;
    let content_type = h
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let uploads = destinations(content_type, path.as_deref(), body)?;
    let files = capability(&t)?;
    let mut written = Vec::with_capacity(uploads.len());
    for (path, data) in uploads {
        t.target
            .handle
            .call(
                "write_file",
                files.write_file(&t.target.id, &path, &data, FILE_MODE),
            )
            .await
            .map_err(|e| provider_error(&path, &e))?;
        let name = path.rsplit('/').next().unwrap_or_default().to_string();
        written.push(json!({"name": name, "type": "file", "path": path}));
    }
    Ok(crate::e2bapi::error::json(StatusCode::OK, &written))
}

/// Each file of an upload and where it goes: a multipart part's filename, or the query's
/// `path` when the body holds one file; every path absolute and normalised.
pub fn destinations(
    content_type: &str,
    path: Option<&str>,
    body: Bytes,
) -> Result<Vec<(String, Bytes)>, EnvdError> {
    let bad = |m: String| EnvdError::new(Code::InvalidArgument, m);
    let named: Vec<(Option<String>, Bytes)> = match multipart::boundary(content_type) {
        Some(b) => multipart::parse(&body, &b)
            .map_err(|e| bad(format!("multipart body: {e}")))?
            .into_iter()
            .filter(|p| p.name == "file")
            .map(|p| (p.filename, p.data))
            .collect(),
        None if content_type.starts_with("application/octet-stream") => vec![(None, body)],
        None => {
            return Err(bad(format!(
                "upload as multipart/form-data, not {content_type:?}"
            )));
        }
    };
    if named.is_empty() {
        return Err(bad("the upload holds no part named \"file\"".into()));
    }
    let single = named.len() == 1;
    named
        .into_iter()
        .map(|(filename, data)| {
            let target = match (path, filename) {
                (Some(p), _) if single => p.to_string(),
                (Some(_), _) => {
                    return Err(bad("?path= names one file; this upload has several".into()));
                }
                (None, Some(f)) => f,
                (None, None) => {
                    return Err(bad("a file has no path: give ?path= or a filename".into()));
                }
            };
            Ok((shell::below_root("path to write", &target)?, data))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MULTI: &str = "multipart/form-data; boundary=B";

    fn form(files: &[(&str, &str)]) -> Bytes {
        let mut out = String::new();
        for (name, data) in files {
            out += &format!(
                "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n\r\n{data}\r\n"
            );
        }
        Bytes::from(out + "--B--\r\n")
    }

    #[test]
    fn parts_go_to_their_filenames_and_one_part_to_the_query_path() {
        let many = destinations(MULTI, None, form(&[("/a/x", "1"), ("/b//y", "2")])).unwrap();
        assert_eq!(many[0], ("/a/x".to_string(), Bytes::from("1")));
        assert_eq!(many[1].0, "/b/y");
        let one = destinations(MULTI, Some("/q/z"), form(&[("ignored", "3")])).unwrap();
        assert_eq!(one, vec![("/q/z".to_string(), Bytes::from("3"))]);
        let raw = destinations("application/octet-stream", Some("/r"), Bytes::from("4")).unwrap();
        assert_eq!(raw, vec![("/r".to_string(), Bytes::from("4"))]);
    }

    #[test]
    fn unusable_uploads_are_bad_requests() {
        let cases = [
            destinations(MULTI, Some("/q"), form(&[("/a", "1"), ("/b", "2")])),
            destinations(MULTI, None, form(&[("relative.txt", "1")])),
            destinations(MULTI, None, form(&[("/a/../etc/passwd", "1")])),
            destinations(MULTI, None, form(&[("/", "1")])),
            destinations(MULTI, None, Bytes::from("--B--\r\n")),
            destinations("application/octet-stream", None, Bytes::from("1")),
            destinations("text/plain", Some("/a"), Bytes::from("1")),
        ];
        for case in cases {
            let e = case.unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{e}");
            assert_eq!(e.code.status(), StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn rest_errors_carry_the_status_as_their_code() {
        let r = RestError(EnvdError::new(Code::NotFound, "gone")).into_response();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }
}
