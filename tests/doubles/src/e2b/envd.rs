//! envd, the daemon inside every E2B sandbox, reached the way the SDKs reach it: one shared
//! host with `E2b-Sandbox-Id` / `E2b-Sandbox-Port: 49983` headers (or a
//! `49983-<sandboxID>.<domain>` Host header), and `X-Access-Token` when the sandbox was
//! created with `secure: true`.
//!
//! Served: `GET /health`; `GET /files?path=` (exact bytes; 404 absent, 400 directory) and
//! `POST /files` (multipart `file` parts, or a raw `application/octet-stream` body, creating
//! parent directories); the Connect services `process.Process/{Start, SendInput,
//! CloseStdin, SendSignal, Update}` (see [`super::process`]) and
//! `filesystem.Filesystem/{ListDir, Stat, MakeDir, Remove}`. Commands run through
//! `docker exec` as the user named in the `Authorization: Basic <user:>` header (files: the
//! `username` parameter); the double's default user is `root` (E2B's templates default to
//! `user`, which the base image here does not have).

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Response, StatusCode};
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};

use super::connect::ConnectError;
use super::faults::{self, error_response};
use super::process;
use super::state::{Power, Shared};

/// The port envd listens on inside a sandbox.
pub const ENVD_PORT: u16 = 49983;
/// The double's default user (see the module docs).
const DEFAULT_USER: &str = "root";

/// The sandbox a request addresses, resolved by the routing middleware.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) id: String,
    pub(crate) container: String,
}

/// The envd router.
pub(crate) fn router(shared: Shared) -> Router {
    let counters = shared.envd_counters.clone();
    Router::new()
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .route("/files", get(read_file).post(write_file))
        .route("/process.Process/Start", post(process::start))
        .route("/filesystem.Filesystem/{method}", post(filesystem))
        .route("/process.Process/{method}", post(process::unary))
        .route_layer(middleware::from_fn_with_state(
            shared.clone(),
            route_to_sandbox,
        ))
        .route_layer(middleware::from_fn(move |r: Request, n: Next| {
            faults::count(counters.clone(), r, n)
        }))
        .with_state(shared)
}

/// The addressed sandbox id, or why none is: (status, message).
fn sandbox_id_from(headers: &HeaderMap) -> Result<String, (u16, String)> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(id) = header("e2b-sandbox-id") {
        if let Some(port) = header("e2b-sandbox-port")
            && port != ENVD_PORT.to_string()
        {
            return Err((
                502,
                format!("the double only forwards to envd's port {ENVD_PORT}, not {port}"),
            ));
        }
        return Ok(id.to_string());
    }
    // `49983-<id>.<domain>`
    let host = header("host").unwrap_or_default();
    let label = host.split('.').next().unwrap_or_default();
    match label.split_once('-') {
        Some((port, id)) if port == ENVD_PORT.to_string() && !id.is_empty() => Ok(id.to_string()),
        _ => Err((
            400,
            "no sandbox addressed: send E2b-Sandbox-Id and E2b-Sandbox-Port headers".into(),
        )),
    }
}

async fn route_to_sandbox(
    State(shared): State<Shared>,
    mut request: Request,
    next: Next,
) -> Response<Body> {
    let id = match sandbox_id_from(request.headers()) {
        Ok(id) => id,
        Err((status, message)) => return error_response(status, &message, None),
    };
    let target = {
        let sandboxes = shared.sandboxes.lock().await;
        let Some(sandbox) = sandboxes.get(&id) else {
            return error_response(502, &format!("The sandbox {id} was not found"), None);
        };
        if let Some(token) = &sandbox.access_token {
            let given = request
                .headers()
                .get("x-access-token")
                .and_then(|v| v.to_str().ok());
            if given != Some(token.as_str()) {
                return error_response(
                    401,
                    "unauthorized access, please provide a valid access token",
                    None,
                );
            }
        }
        if sandbox.power != Power::Running {
            return error_response(
                502,
                &format!("The sandbox {id} is paused; resume it with POST /sandboxes/{id}/connect"),
                None,
            );
        }
        Target {
            id: id.clone(),
            container: sandbox.container.clone(),
        }
    };
    request.extensions_mut().insert(target);
    next.run(request).await
}

pub(crate) fn user_from_basic(headers: &HeaderMap) -> String {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|raw| String::from_utf8(raw).ok())
        .and_then(|s| s.split(':').next().map(str::to_string))
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| DEFAULT_USER.to_string())
}

fn absolute(path: &str, user: &str) -> String {
    if path.starts_with('/') {
        return path.to_string();
    }
    let home = if user == "root" {
        "/root".to_string()
    } else {
        format!("/home/{user}")
    };
    format!("{home}/{path}")
}

/// A helper script's exit code that means something to envd.
const EXIT_ABSENT: i64 = 20;
const EXIT_IS_DIR: i64 = 21;
const EXIT_NOT_DIR: i64 = 22;
const EXIT_EXISTS: i64 = 17;
const EXIT_NO_PARENT: i64 = 23;

/// Runs `script` with `sh -c` (its `$1` is `path`) as `user`.
async fn helper(
    shared: &Shared,
    target: &Target,
    user: &str,
    script: &str,
    path: &str,
) -> Result<(i64, Vec<u8>, Vec<u8>), ConnectError> {
    let argv = vec![
        "sh".into(),
        "-c".into(),
        script.into(),
        "sh".into(),
        path.into(),
    ];
    shared
        .engine
        .run(&target.container, user, argv)
        .await
        .map_err(|e| {
            if e.0.contains("unable to find user") || e.0.contains("no matching entries") {
                ConnectError::new(
                    "unauthenticated",
                    format!("error looking up user '{user}': {e}"),
                )
            } else {
                ConnectError::new("internal", format!("sandbox {}: {e}", target.id))
            }
        })
}

fn path_error(code: i64, path: &str, stderr: &[u8]) -> ConnectError {
    match code {
        EXIT_ABSENT => ConnectError::new("not_found", format!("path '{path}' does not exist")),
        EXIT_IS_DIR => {
            ConnectError::new("invalid_argument", format!("path '{path}' is a directory"))
        }
        EXIT_NOT_DIR => ConnectError::new(
            "invalid_argument",
            format!("path '{path}' is not a directory"),
        ),
        EXIT_EXISTS => ConnectError::new("already_exists", format!("path '{path}' already exists")),
        // envd answers 500 when it cannot create the parent directories.
        EXIT_NO_PARENT => ConnectError::new(
            "internal",
            format!(
                "error ensuring directories: {}",
                String::from_utf8_lossy(stderr).trim()
            ),
        ),
        _ => ConnectError::new(
            "internal",
            format!("{path}: {}", String::from_utf8_lossy(stderr).trim()),
        ),
    }
}

/// envd's HTTP endpoints answer with the API-style `{code, message}` body.
fn http_error(e: ConnectError) -> Response<Body> {
    let status = match e.code {
        "not_found" => 404,
        "invalid_argument" => 400,
        "unauthenticated" => 401,
        _ => 500,
    };
    error_response(status, &e.message, None)
}

#[derive(Debug, Default, Deserialize)]
struct FileParams {
    path: Option<String>,
    username: Option<String>,
}

async fn read_file(
    State(shared): State<Shared>,
    axum::Extension(target): axum::Extension<Target>,
    Query(params): Query<FileParams>,
) -> Response<Body> {
    let user = params.username.unwrap_or_else(|| DEFAULT_USER.into());
    let Some(path) = params.path.map(|p| absolute(&p, &user)) else {
        return error_response(400, "the path parameter is required", None);
    };
    let script = format!(
        "if [ -d \"$1\" ]; then exit {EXIT_IS_DIR}; fi; \
         if [ ! -e \"$1\" ]; then exit {EXIT_ABSENT}; fi; exec cat -- \"$1\""
    );
    match helper(&shared, &target, &user, &script, &path).await {
        Ok((0, stdout, _)) => {
            let mut response = Response::new(Body::from(stdout));
            response.headers_mut().insert(
                "content-type",
                HeaderValue::from_static("application/octet-stream"),
            );
            response
        }
        Ok((code, _, stderr)) => http_error(path_error(code, &path, &stderr)),
        Err(e) => http_error(e),
    }
}

/// Writes one uploaded file, keeping the mode of a file it replaces (new files: 0644), owned
/// by `user`.
async fn write_one(
    shared: &Shared,
    target: &Target,
    user: &str,
    path: &str,
    data: &[u8],
) -> Result<Value, ConnectError> {
    let script = format!(
        "if [ -d \"$1\" ]; then exit {EXIT_IS_DIR}; fi; \
         mkdir -p -- \"$(dirname -- \"$1\")\" || exit {EXIT_NO_PARENT}; id -u; id -g; \
         stat -c %a -- \"$1\" 2>/dev/null; exit 0"
    );
    let (code, stdout, stderr) = helper(shared, target, user, &script, path).await?;
    if code != 0 {
        return Err(path_error(code, path, &stderr));
    }
    let text = String::from_utf8_lossy(&stdout);
    let mut lines = text.lines();
    let mut number = |radix| {
        lines
            .next()
            .and_then(|l| u64::from_str_radix(l.trim(), radix).ok())
    };
    let uid = number(10).unwrap_or(0);
    let gid = number(10).unwrap_or(0);
    let mode = number(8).unwrap_or(0o644) as u32;
    let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
    let parent = if parent.is_empty() { "/" } else { parent };
    shared
        .engine
        .upload_file(&target.container, parent, name, data, mode, (uid, gid))
        .await
        .map_err(|e| ConnectError::new("internal", e.to_string()))?;
    Ok(json!({ "path": path, "name": name, "type": "file" }))
}

async fn write_file(
    State(shared): State<Shared>,
    axum::Extension(target): axum::Extension<Target>,
    Query(params): Query<FileParams>,
    request: Request,
) -> Response<Body> {
    let user = params
        .username
        .clone()
        .unwrap_or_else(|| DEFAULT_USER.into());
    let content_type = request
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let mut files: Vec<(String, Bytes)> = Vec::new();
    if content_type.starts_with("multipart/form-data") {
        let mut multipart = match Multipart::from_request(request, &()).await {
            Ok(m) => m,
            Err(e) => return error_response(400, &format!("invalid multipart body: {e}"), None),
        };
        loop {
            let field = match multipart.next_field().await {
                Ok(Some(field)) => field,
                Ok(None) => break,
                Err(e) => {
                    return error_response(400, &format!("invalid multipart body: {e}"), None);
                }
            };
            if field.name() != Some("file") {
                continue;
            }
            let path = params
                .path
                .clone()
                .or_else(|| field.file_name().map(str::to_string));
            let Some(path) = path else {
                return error_response(400, "a file part names no path", None);
            };
            match field.bytes().await {
                Ok(data) => files.push((absolute(&path, &user), data)),
                Err(e) => return error_response(400, &format!("reading a file part: {e}"), None),
            }
        }
    } else {
        let Some(path) = params.path.clone() else {
            return error_response(400, "the path parameter is required for a raw upload", None);
        };
        match axum::body::to_bytes(request.into_body(), usize::MAX).await {
            Ok(data) => files.push((absolute(&path, &user), data)),
            Err(e) => return error_response(400, &format!("reading the body: {e}"), None),
        }
    }
    if files.is_empty() {
        return error_response(400, "no file in the request", None);
    }
    let mut written = Vec::new();
    for (path, data) in files {
        match write_one(&shared, &target, &user, &path, &data).await {
            Ok(info) => written.push(info),
            Err(e) => return http_error(e),
        }
    }
    axum::Json(Value::Array(written)).into_response()
}

/// `find -printf` fields of one entry, NUL-terminated each.
const ENTRY_FORMAT: &str = "%y\\0%s\\0%m\\0%u\\0%g\\0%T@\\0%l\\0%p\\0";

fn permissions(kind: char, mode: u32) -> String {
    let mut out = String::with_capacity(10);
    out.push(match kind {
        'd' => 'd',
        'l' => 'l',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        out.push(if bits & 4 != 0 { 'r' } else { '-' });
        out.push(if bits & 2 != 0 { 'w' } else { '-' });
        out.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    out
}

/// Parses `find -printf ENTRY_FORMAT` output into envd `EntryInfo` JSON.
fn parse_entries(raw: &[u8]) -> Vec<Value> {
    let fields: Vec<String> = raw
        .split(|b| *b == 0)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    fields
        .chunks_exact(8)
        .map(|f| {
            let kind = f[0].chars().next().unwrap_or('?');
            let mode = u32::from_str_radix(&f[2], 8).unwrap_or(0);
            let secs = f[5].split('.').next().and_then(|s| s.parse::<i64>().ok()).unwrap_or(0);
            let path = f[7].clone();
            let name = path.rsplit('/').next().unwrap_or(&path).to_string();
            let mut entry = json!({
                "name": name,
                "type": match kind { 'f' => "FILE_TYPE_FILE", 'd' => "FILE_TYPE_DIRECTORY", 'l' => "FILE_TYPE_SYMLINK", _ => "FILE_TYPE_UNSPECIFIED" },
                "path": path,
                "size": f[1],
                "mode": mode,
                "permissions": permissions(kind, mode),
                "owner": f[3],
                "group": f[4],
                "modifiedTime": chrono::DateTime::from_timestamp(secs, 0).unwrap_or_default().to_rfc3339(),
            });
            if kind == 'l' {
                entry["symlinkTarget"] = Value::String(f[6].clone());
            }
            entry
        })
        .collect()
}

#[derive(Debug, Default, Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: u32,
}

async fn filesystem(
    State(shared): State<Shared>,
    axum::Extension(target): axum::Extension<Target>,
    axum::extract::Path(method): axum::extract::Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let user = user_from_basic(&headers);
    let request: PathRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return ConnectError::new("invalid_argument", e.to_string()).unary_response(),
    };
    if request.path.is_empty() {
        return ConnectError::new("invalid_argument", "path is required").unary_response();
    }
    let path = absolute(&request.path, &user);
    let script = match method.as_str() {
        "ListDir" => format!(
            "if [ ! -e \"$1\" ]; then exit {EXIT_ABSENT}; fi; if [ ! -d \"$1\" ]; then exit {EXIT_NOT_DIR}; fi; \
             exec find \"$1\" -mindepth 1 -maxdepth {} -printf '{ENTRY_FORMAT}'",
            request.depth.max(1)
        ),
        "Stat" => format!(
            "if [ ! -e \"$1\" ] && [ ! -L \"$1\" ]; then exit {EXIT_ABSENT}; fi; \
             exec find \"$1\" -maxdepth 0 -printf '{ENTRY_FORMAT}'"
        ),
        "MakeDir" => format!(
            "if [ -e \"$1\" ]; then exit {EXIT_EXISTS}; fi; mkdir -p -- \"$1\" || exit 1; \
             exec find \"$1\" -maxdepth 0 -printf '{ENTRY_FORMAT}'"
        ),
        "Remove" => format!(
            "if [ ! -e \"$1\" ] && [ ! -L \"$1\" ]; then exit {EXIT_ABSENT}; fi; exec rm -rf -- \"$1\""
        ),
        other => {
            return ConnectError::new(
                "unimplemented",
                format!("filesystem.Filesystem/{other} is not served by the double"),
            )
            .unary_response();
        }
    };
    let (code, stdout, stderr) = match helper(&shared, &target, &user, &script, &path).await {
        Ok(out) => out,
        Err(e) => return e.unary_response(),
    };
    if code != 0 {
        return path_error(code, &path, &stderr).unary_response();
    }
    let entries = parse_entries(&stdout);
    let body = match method.as_str() {
        "ListDir" => json!({ "entries": entries }),
        "Remove" => json!({}),
        _ => json!({ "entry": entries.into_iter().next() }),
    };
    axum::Json(body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_from_find_output() {
        let raw = b"f\x005\x00644\x00root\x00root\x001700000000.5\x00\x00/w/a b\x00l\x002\x00777\x00root\x00root\x001700000000.0\x00/etc\x00/w/link\x00";
        let entries = parse_entries(raw);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0]["name"], "a b");
        assert_eq!(entries[0]["type"], "FILE_TYPE_FILE");
        assert_eq!(entries[0]["size"], "5");
        assert_eq!(entries[0]["permissions"], "-rw-r--r--");
        assert_eq!(entries[1]["type"], "FILE_TYPE_SYMLINK");
        assert_eq!(entries[1]["symlinkTarget"], "/etc");
    }

    #[test]
    fn basic_auth_names_the_user_and_relative_paths_resolve_to_home() {
        let mut headers = HeaderMap::new();
        assert_eq!(user_from_basic(&headers), "root");
        let encoded = base64::engine::general_purpose::STANDARD.encode("user:");
        headers.insert("authorization", format!("Basic {encoded}").parse().unwrap());
        assert_eq!(user_from_basic(&headers), "user");
        assert_eq!(absolute("a.txt", "user"), "/home/user/a.txt");
        assert_eq!(absolute("/x", "user"), "/x");
    }
}
