//! The filesystem endpoints: `fs/read`, `fs/write`, `fs/list`, `fs/delete`, each taking the
//! path in `?path=`. Reads and writes go through the engine's archive endpoint, so bytes are
//! exact; listing and deleting run `find`/`rm` in the container.

use std::io::Read;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State as AxState};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::{
    DownloadFromContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use futures::StreamExt;

use super::api::{engine, error, first, no_sprite, pairs};
use super::state::{State, is_404};
use super::wire::{FsEntry, FsList};

/// The sprite's container (woken) and the absolute `path` of the request, or the response.
async fn target(
    state: &State,
    name: &str,
    raw: Option<&str>,
) -> Result<(String, String, Vec<(String, String)>), Response> {
    let q = pairs(raw);
    let Some(path) = first(&q, "path").map(String::from) else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "invalid_path",
            "path is required",
        ));
    };
    if !path.starts_with('/') {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "invalid_path",
            format!("path {path:?} is not absolute"),
        ));
    }
    match state.wake(name).await {
        Ok(Some(container)) => Ok((container, path, q)),
        Ok(None) => Err(no_sprite(name)),
        Err(e) => Err(engine(e)),
    }
}

fn absent(path: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("{path}: no such file or directory"),
    )
}

/// Runs `argv` in the container; returns the exit code and stdout.
pub(super) async fn run(
    state: &State,
    container: &str,
    argv: &[&str],
) -> Result<(i64, Vec<u8>), String> {
    let options = CreateExecOptions::<String> {
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        cmd: Some(argv.iter().map(|s| s.to_string()).collect()),
        ..Default::default()
    };
    let created = state
        .docker
        .create_exec(container, options)
        .await
        .map_err(|e| e.to_string())?;
    let mut stdout = Vec::new();
    if let StartExecResults::Attached { mut output, .. } = state
        .docker
        .start_exec(&created.id, None)
        .await
        .map_err(|e| e.to_string())?
    {
        while let Some(frame) = output.next().await {
            if let bollard::container::LogOutput::StdOut { message } =
                frame.map_err(|e| e.to_string())?
            {
                stdout.extend_from_slice(&message);
            }
        }
    }
    let code = state
        .docker
        .inspect_exec(&created.id)
        .await
        .map_err(|e| e.to_string())?
        .exit_code
        .unwrap_or(-1);
    Ok((code, stdout))
}

pub async fn read(
    AxState(state): AxState<Arc<State>>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let (container, path, _) = match target(&state, &name, raw.as_deref()).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let options = DownloadFromContainerOptionsBuilder::default()
        .path(&path)
        .build();
    let mut stream = state
        .docker
        .download_from_container(&container, Some(options));
    let mut archive = Vec::new();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(bytes) => archive.extend_from_slice(&bytes),
            Err(e) if is_404(&e) => return absent(&path),
            Err(e) => return engine(e.to_string()),
        }
    }
    match first_file(&archive) {
        Ok(Some(data)) => {
            ([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response()
        }
        Ok(None) => error(
            StatusCode::BAD_REQUEST,
            "is_directory",
            format!("{path} is not a regular file"),
        ),
        Err(e) => engine(e),
    }
}

/// The content of the archive's first member when it is a regular file.
fn first_file(archive: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut tar = tar::Archive::new(archive);
    let mut entries = tar.entries().map_err(|e| e.to_string())?;
    let Some(entry) = entries.next() else {
        return Ok(None);
    };
    let mut entry = entry.map_err(|e| e.to_string())?;
    if !entry.header().entry_type().is_file() {
        return Ok(None);
    }
    let mut data = Vec::new();
    entry.read_to_end(&mut data).map_err(|e| e.to_string())?;
    Ok(Some(data))
}

pub async fn write(
    AxState(state): AxState<Arc<State>>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
    body: Bytes,
) -> Response {
    let (container, path, q) = match target(&state, &name, raw.as_deref()).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let mode = first(&q, "mode")
        .and_then(|m| u32::from_str_radix(m, 8).ok())
        .unwrap_or(0o644)
        & 0o777;
    let (dir, file) = match path.rsplit_once('/') {
        Some((d, f)) if !f.is_empty() => (if d.is_empty() { "/" } else { d }, f),
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_path",
                format!("{path} names no file"),
            );
        }
    };
    if first(&q, "mkdirParents") == Some("true") {
        match run(&state, &container, &["mkdir", "-p", dir]).await {
            Ok((0, _)) => {}
            Ok((code, _)) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "mkdir_failed",
                    format!("cannot create {dir} (exit {code})"),
                );
            }
            Err(e) => return engine(e),
        }
    }
    let mut header = tar::Header::new_gnu();
    header.set_size(body.len() as u64);
    header.set_mode(mode);
    header.set_mtime(chrono::Utc::now().timestamp().max(0) as u64);
    let mut builder = tar::Builder::new(Vec::new());
    if let Err(e) = builder.append_data(&mut header, file, &body[..]) {
        return engine(e.to_string());
    }
    let archive = match builder.into_inner() {
        Ok(a) => a,
        Err(e) => return engine(e.to_string()),
    };
    let options = UploadToContainerOptionsBuilder::default()
        .path(dir)
        .no_overwrite_dir_non_dir("true")
        .build();
    match state
        .docker
        .upload_to_container(
            &container,
            Some(options),
            bollard::body_full(archive.into()),
        )
        .await
    {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) if is_404(&e) => absent(dir),
        Err(e) => error(StatusCode::BAD_REQUEST, "write_failed", e.to_string()),
    }
}

pub async fn list(
    AxState(state): AxState<Arc<State>>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let (container, path, _) = match target(&state, &name, raw.as_deref()).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    match run(&state, &container, &["test", "-d", &path]).await {
        Ok((0, _)) => {}
        Ok(_) => {
            return match run(&state, &container, &["test", "-e", &path]).await {
                Ok((0, _)) => error(
                    StatusCode::BAD_REQUEST,
                    "not_a_directory",
                    format!("{path} is not a directory"),
                ),
                Ok(_) => absent(&path),
                Err(e) => engine(e),
            };
        }
        Err(e) => return engine(e),
    }
    // One NUL-terminated record per entry: type, size, octal mode, link target, name.
    let argv = [
        "find",
        &path,
        "-mindepth",
        "1",
        "-maxdepth",
        "1",
        "-printf",
        "%y\\t%s\\t%m\\t%l\\t%f\\0",
    ];
    let (code, out) = match run(&state, &container, &argv).await {
        Ok(r) => r,
        Err(e) => return engine(e),
    };
    if code != 0 {
        return absent(&path);
    }
    let entries: Vec<FsEntry> = out
        .split(|b| *b == 0)
        .filter(|r| !r.is_empty())
        .filter_map(|r| entry(&path, &String::from_utf8_lossy(r)))
        .collect();
    Json(FsList {
        path,
        count: entries.len(),
        entries,
    })
    .into_response()
}

fn entry(dir: &str, record: &str) -> Option<FsEntry> {
    let mut f = record.splitn(5, '\t');
    let (kind, size, mode, link, name) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
    let kind = match kind {
        "f" => "file",
        "d" => "directory",
        "l" => "symlink",
        _ => "other",
    };
    Some(FsEntry {
        path: format!("{}/{name}", dir.trim_end_matches('/')),
        name: name.to_string(),
        kind: kind.into(),
        size: size.parse().unwrap_or(0),
        mode: mode.to_string(),
        is_dir: kind == "directory",
        link_target: (kind == "symlink").then(|| link.to_string()),
    })
}

pub async fn delete(
    AxState(state): AxState<Arc<State>>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let (container, path, q) = match target(&state, &name, raw.as_deref()).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    match run(&state, &container, &["test", "-e", &path]).await {
        Ok((0, _)) => {}
        Ok(_) => {
            // A dangling symlink is not `-e` but is still there.
            match run(&state, &container, &["test", "-L", &path]).await {
                Ok((0, _)) => {}
                Ok(_) => return absent(&path),
                Err(e) => return engine(e),
            }
        }
        Err(e) => return engine(e),
    }
    let flag = if first(&q, "recursive") == Some("true") {
        "-rf"
    } else {
        "-f"
    };
    match run(&state, &container, &["rm", flag, "--", &path]).await {
        Ok((0, _)) => StatusCode::OK.into_response(),
        Ok((code, _)) => error(
            StatusCode::BAD_REQUEST,
            "delete_failed",
            format!("cannot delete {path} (exit {code}); a directory needs recursive=true"),
        ),
        Err(e) => engine(e),
    }
}
