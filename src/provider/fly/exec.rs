//! Exec, exact file I/O and bulk tar transfer, all through `POST .../exec`.
//!
//! The exec API carries `stdin`, `stdout` and `stderr` as JSON strings, so bytes that are not
//! UTF-8 would not survive. Plain `exec` returns what the API gives (text); every capability
//! that moves bytes (`Files`, `BulkFiles`) base64-encodes them inside the sandbox
//! (`base64` from coreutils) and decodes them here, so all 256 byte values cross unchanged.
//! Scripts take their paths as positional arguments (`sh -c SCRIPT sh PATH`), never spliced
//! into the script text, so no path can inject shell.
//!
//! Exit codes the scripts use to say what they found: 20 = absent, 21 = wrong kind (a
//! directory where a file was expected, or the reverse), 22 = a symbolic link.
//!
//! `ExecRequest.cwd` and `env` have no field in the API: the argv is wrapped in
//! `sh -c 'cd -- "$0" && exec env "$@"'` (or just `env`) to apply them.

use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use futures::stream::{self, BoxStream, StreamExt};

use super::FlyProvider;
use crate::provider::tarsafe;
use crate::provider::{
    BulkFiles, DirEntry, EntryKind, ErrorKind, ExecOutput, ExecRequest, Files, ProviderError,
    ProviderResult,
};

/// Bound on one file operation.
const FILE_TIMEOUT: Duration = Duration::from_secs(120);
/// Script exit codes (see the module docs).
const ABSENT: i64 = 20;
const WRONG_KIND: i64 = 21;
const SYMLINK: i64 = 22;

const READ: &str = r#"[ -d "$1" ] && exit 21; [ -e "$1" ] || exit 20; base64 -w0 -- "$1""#;
const WRITE: &str = r#"[ -d "$1" ] && exit 21
d=$(dirname -- "$1")
if ! mkdir -p -- "$d" 2>/dev/null; then
  while [ "$d" != / ]; do [ -e "$d" ] && [ ! -d "$d" ] && exit 21; d=$(dirname -- "$d"); done
  exit 1
fi
set -e; t="$1.sbx-write.$$"; base64 -d > "$t"; chmod "$2" "$t"; mv -f -- "$t" "$1""#;
const LIST: &str = r#"[ -d "$1" ] || { [ -e "$1" ] && exit 21; exit 20; }; cd -- "$1" && find . -mindepth 1 -maxdepth 1 -printf '%y\0%s\0%P\0%l\0' | base64 -w0"#;
const EXPORT: &str = r#"[ -L "$1" ] && exit 22; [ -e "$1" ] || exit 20; t=$(mktemp) || exit 1; trap 'rm -f "$t"' EXIT; tar -C "$(dirname -- "$1")" -cf "$t" -- "$(basename -- "$1")" && base64 -w0 "$t""#;
const IMPORT: &str = r#"set -e; t=$(mktemp); trap 'rm -f "$t"' EXIT; base64 -d > "$t"; mkdir -p -- "$1"; tar -C "$1" -xf "$t" --no-same-owner"#;

impl FlyProvider {
    /// Runs `request` through the exec API (see the module docs for cwd/env).
    pub(crate) async fn run_exec(
        &self,
        id: &str,
        request: &ExecRequest,
    ) -> ProviderResult<ExecOutput> {
        if request.argv.is_empty() {
            return Err(ProviderError::invalid(format!(
                "exec in sandbox {id}: the command is empty; give at least the program to run"
            )));
        }
        let argv = wrap(request);
        self.exec_text(id, &argv, None, request.timeout).await
    }

    /// One exec; a 408 is `Transient` naming the timeout, a machine that is not running is
    /// `Conflict`.
    async fn exec_text(
        &self,
        id: &str,
        argv: &[String],
        stdin: Option<&str>,
        timeout: Duration,
    ) -> ProviderResult<ExecOutput> {
        let reply = self
            .exec_call(id, argv, stdin, timeout)
            .await
            .map_err(|e| match e.kind() {
                ErrorKind::Conflict => ProviderError::conflict(format!(
                    "exec in sandbox {id}: it is not running; start it ({})",
                    e.message()
                )),
                ErrorKind::NotFound => ProviderError::not_found(format!(
                    "sandbox {id} does not exist ({})",
                    e.message()
                )),
                _ => e.context(format!("exec of {argv:?} in sandbox {id}")),
            })?;
        Ok(ExecOutput {
            stdout: reply.stdout.into_bytes(),
            stderr: reply.stderr.into_bytes(),
            exit_code: reply.exit_code,
        })
    }

    /// Runs one of this module's scripts with `args`; returns its output on exit 0 and maps
    /// the agreed exit codes.
    async fn script(
        &self,
        id: &str,
        script: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> ProviderResult<String> {
        let mut argv = vec!["sh".to_string(), "-c".into(), script.into(), "sh".into()];
        argv.extend(args.iter().map(|a| a.to_string()));
        let out = self.exec_text(id, &argv, stdin, FILE_TIMEOUT).await?;
        let path = args.first().copied().unwrap_or("");
        match out.exit_code {
            0 => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
            ABSENT => Err(ProviderError::not_found(format!(
                "{path} does not exist in sandbox {id}"
            ))),
            WRONG_KIND => Err(ProviderError::invalid(format!(
                "{path} in sandbox {id} is not what the call expects (a directory where a file \
                 was expected, or the reverse)"
            ))),
            SYMLINK => Err(ProviderError::invalid(format!(
                "{path} in sandbox {id} is a symbolic link; name what it points to"
            ))),
            code => Err(ProviderError::transient(format!(
                "file operation on {path} in sandbox {id} failed with exit code {code}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))),
        }
    }
}

/// The argv with `cwd` and `env` applied.
fn wrap(request: &ExecRequest) -> Vec<String> {
    let env = request.env.iter().map(|(k, v)| format!("{k}={v}"));
    match &request.cwd {
        Some(cwd) => {
            let mut argv = vec![
                "sh".to_string(),
                "-c".into(),
                r#"cd -- "$0" && exec env "$@""#.into(),
                cwd.clone(),
            ];
            argv.extend(env);
            argv.extend(request.argv.iter().cloned());
            argv
        }
        None if request.env.is_empty() => request.argv.clone(),
        None => {
            let mut argv = vec!["env".to_string()];
            argv.extend(env);
            argv.extend(request.argv.iter().cloned());
            argv
        }
    }
}

/// An absolute path without NUL and without `.` or `..` segments (which would let one
/// path name another); `what` names it in the error.
fn absolute(what: &str, path: &str) -> ProviderResult<String> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(ProviderError::invalid(format!(
            "{what} {path:?} must be an absolute path"
        )));
    }
    if path.split('/').any(|s| s == "." || s == "..") {
        return Err(ProviderError::invalid(format!(
            "{what} {path:?} contains a \".\" or \"..\" segment; give a normalised absolute path"
        )));
    }
    let trimmed = path.trim_end_matches('/');
    Ok(if trimmed.is_empty() {
        "/".into()
    } else {
        trimmed.into()
    })
}

fn decode(id: &str, text: &str) -> ProviderResult<Vec<u8>> {
    let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    STANDARD.decode(compact).map_err(|e| {
        ProviderError::transient(format!(
            "sandbox {id}: the file data came back damaged (not base64: {e})"
        ))
    })
}

#[async_trait]
impl Files for FlyProvider {
    /// `base64` of the file, decoded here. Absent = `NotFound` (rule 2).
    async fn read_file(&self, id: &str, path: &str) -> ProviderResult<Vec<u8>> {
        let path = absolute("read path", path)?;
        let text = self.script(id, READ, &[&path], None).await?;
        decode(id, &text)
    }

    /// The bytes go in as base64 on stdin, into a temporary file that replaces the target
    /// (never appends); parents are created; setuid/setgid/sticky are masked off.
    async fn write_file(&self, id: &str, path: &str, data: &[u8], mode: u32) -> ProviderResult<()> {
        let path = absolute("write path", path)?;
        let mode = format!("{:o}", mode & 0o777);
        let encoded = STANDARD.encode(data);
        self.script(id, WRITE, &[&path, &mode], Some(&encoded))
            .await
            .map(|_| ())
    }

    /// `find -printf` of one level, NUL-separated and base64-encoded. Absent = `NotFound`.
    async fn list_dir(&self, id: &str, path: &str) -> ProviderResult<Vec<DirEntry>> {
        let path = absolute("directory", path)?;
        let text = self.script(id, LIST, &[&path], None).await?;
        let raw = decode(id, &text)?;
        let fields: Vec<String> = raw
            .split(|b| *b == 0)
            .map(|f| String::from_utf8_lossy(f).into_owned())
            .collect();
        Ok(fields
            .chunks(4)
            .filter(|c| c.len() == 4 && !c[2].is_empty())
            .map(|c| {
                let kind = match c[0].as_str() {
                    "f" => EntryKind::File,
                    "d" => EntryKind::Directory,
                    "l" => EntryKind::Symlink,
                    _ => EntryKind::Other,
                };
                DirEntry {
                    name: c[2].clone(),
                    kind,
                    size: (kind == EntryKind::File)
                        .then(|| c[1].parse().ok())
                        .flatten(),
                    symlink_target: (kind == EntryKind::Symlink).then(|| c[3].clone()),
                }
            })
            .collect())
    }

    /// `rm -rf`; absent = success. `/` is refused.
    async fn delete_path(&self, id: &str, path: &str) -> ProviderResult<()> {
        let path = absolute("delete path", path)?;
        if path == "/" {
            return Err(ProviderError::invalid(format!(
                "refusing to delete \"/\" of sandbox {id}; name what to delete"
            )));
        }
        let argv: Vec<String> = ["rm", "-rf", "--", &path].map(String::from).into();
        let out = self.exec_text(id, &argv, None, FILE_TIMEOUT).await?;
        if out.exit_code != 0 {
            return Err(ProviderError::transient(format!(
                "deleting {path} in sandbox {id} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }
}

#[async_trait]
impl BulkFiles for FlyProvider {
    /// `tar` of the path rooted at its last segment, written to a temporary file in the
    /// sandbox and sent back as base64 (so a failing `tar` is an error, not a short archive).
    /// Absent = `NotFound`; a symbolic link = `Invalid`; `/` = `Invalid`.
    async fn export(
        &self,
        id: &str,
        path: &str,
    ) -> ProviderResult<BoxStream<'static, ProviderResult<bytes::Bytes>>> {
        let path = absolute("export path", path)?;
        if path == "/" {
            return Err(ProviderError::invalid(format!(
                "refusing to export \"/\" of sandbox {id}: archives are rooted at the path's last \
                 segment, so name a directory below \"/\""
            )));
        }
        let text = self.script(id, EXPORT, &[&path], None).await?;
        let archive = decode(id, &text)?;
        Ok(stream::once(async move { Ok(bytes::Bytes::from(archive)) }).boxed())
    }

    /// The archive is re-written by the one sanitiser (`provider::tarsafe`) first — traversal,
    /// absolute names and writes through its own symlinks refused, devices dropped,
    /// setuid/setgid/sticky cleared, ownership reset — then extracted at `path` as base64 on
    /// stdin.
    async fn import(&self, id: &str, path: &str, archive: Vec<u8>) -> ProviderResult<()> {
        let path = absolute("import path", path)?;
        let sanitised = tokio::task::spawn_blocking(move || tarsafe::sanitise(&archive, ""))
            .await
            .map_err(|e| ProviderError::transient(format!("sanitising the archive failed: {e}")))?
            .map_err(|e| {
                ProviderError::invalid(format!(
                    "refusing to import into {path} in sandbox {id}: {e}"
                ))
            })?;
        let encoded = STANDARD.encode(&sanitised.archive);
        self.script(id, IMPORT, &[&path], Some(&encoded))
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn cwd_and_env_wrap_the_argv_without_reparsing_it() {
        let mut request = ExecRequest::shell("echo $A", Duration::from_secs(1));
        assert_eq!(wrap(&request), ["sh", "-c", "echo $A"]);
        request.env = BTreeMap::from([("A".into(), "x y".into())]);
        assert_eq!(wrap(&request), ["env", "A=x y", "sh", "-c", "echo $A"]);
        request.cwd = Some("/tmp/a b".into());
        let argv = wrap(&request);
        assert_eq!(&argv[3..], ["/tmp/a b", "A=x y", "sh", "-c", "echo $A"]);
    }

    #[test]
    fn paths_must_be_absolute() {
        assert!(absolute("p", "rel").is_err());
        assert!(absolute("p", "/a\0b").is_err());
        assert!(absolute("p", "/tmp/..").is_err());
        assert!(absolute("p", "/a/./b").is_err());
        assert_eq!(absolute("p", "/a/b/").unwrap(), "/a/b");
        assert_eq!(absolute("p", "/").unwrap(), "/");
    }
}
