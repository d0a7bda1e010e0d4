//! The protocol run for real: the scripts execute in a local `sh` over a temporary directory,
//! through both transports, so the exit codes, the base64 wrapper and the error kinds are
//! checked together.

use std::io::Write as _;
use std::process::Stdio;

use tokio::io::AsyncWriteExt;

use super::*;
use crate::provider::{EntryKind, ErrorKind};

struct LocalShell(Transport);

#[async_trait]
impl Shell for LocalShell {
    fn transport(&self) -> Transport {
        self.0
    }

    async fn shell_exec(
        &self,
        _id: &str,
        argv: Vec<String>,
        stdin: Option<&[u8]>,
        timeout: Duration,
    ) -> ProviderResult<ExecOutput> {
        let mut child = tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| ProviderError::transient(e.to_string()))?;
        let mut input = child
            .stdin
            .take()
            .ok_or_else(|| ProviderError::transient("stdin"))?;
        // A script may exit without reading its input (a refused write).
        match input.write_all(stdin.unwrap_or_default()).await {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                return Err(ProviderError::transient(e.to_string()));
            }
            _ => drop(input),
        }
        let out = tokio::time::timeout(timeout, child.wait_with_output())
            .await
            .map_err(|_| ProviderError::transient("timed out"))?
            .map_err(|e| ProviderError::transient(e.to_string()))?;
        Ok(ExecOutput {
            stdout: out.stdout,
            stderr: out.stderr,
            exit_code: i64::from(out.status.code().unwrap_or(-1)),
        })
    }
}

fn kind<T>(result: ProviderResult<T>) -> ErrorKind {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.kind(),
    }
}

async fn files_round_trip(shell: &LocalShell) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let file = format!("{root}/a/b/data.bin");
    let every_byte: Vec<u8> = (0..=255u8).collect();

    write_file(shell, "s", &file, &every_byte, 0o6755)
        .await
        .unwrap();
    assert_eq!(read_file(shell, "s", &file).await.unwrap(), every_byte);
    let mode = std::fs::metadata(&file).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o7777,
        0o755
    );

    assert_eq!(
        kind(read_file(shell, "s", &format!("{root}/none")).await),
        ErrorKind::NotFound
    );
    assert_eq!(
        kind(read_file(shell, "s", &format!("{root}/a")).await),
        ErrorKind::Invalid
    );
    assert_eq!(kind(list_dir(shell, "s", &file).await), ErrorKind::Invalid);
    let under = format!("{file}/x");
    assert_eq!(
        kind(write_file(shell, "s", &under, b"x", 0o644).await),
        ErrorKind::Invalid
    );
    assert_eq!(
        kind(write_file(shell, "s", "/", b"x", 0o644).await),
        ErrorKind::Invalid
    );

    let listed = list_dir(shell, "s", &format!("{root}/a/b")).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].name.as_str(), listed[0].kind),
        ("data.bin", EntryKind::File)
    );
    assert_eq!(listed[0].size, Some(256));

    delete_path(shell, "s", &format!("{root}/a")).await.unwrap();
    delete_path(shell, "s", &format!("{root}/a")).await.unwrap();
    assert_eq!(
        kind(list_dir(shell, "s", &format!("{root}/a")).await),
        ErrorKind::NotFound
    );
}

async fn trees_round_trip(shell: &LocalShell) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    std::fs::create_dir(format!("{root}/src")).unwrap();
    let mut f = std::fs::File::create(format!("{root}/src/f")).unwrap();
    f.write_all(b"tree").unwrap();
    std::os::unix::fs::symlink("src", format!("{root}/link")).unwrap();

    let chunks: Vec<_> = export(shell, "s", &format!("{root}/src"))
        .await
        .unwrap()
        .collect()
        .await;
    let archive: Vec<u8> = chunks
        .into_iter()
        .flat_map(|c| c.unwrap().to_vec())
        .collect();
    import(
        shell,
        "s",
        &format!("{root}/copy"),
        crate::provider::whole_archive(archive),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read(format!("{root}/copy/src/f")).unwrap(),
        b"tree"
    );

    let link = export(shell, "s", &format!("{root}/link"))
        .await
        .map(|_| ());
    let err = link.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid);
    assert!(
        err.message().contains("symbolic link to src"),
        "{}",
        err.message()
    );
    assert_eq!(
        kind(export(shell, "s", &format!("{root}/none")).await),
        ErrorKind::NotFound
    );
    let hostile = b"not a tar archive at all".repeat(40);
    assert_eq!(
        kind(import(shell, "s", &root, crate::provider::whole_archive(hostile)).await),
        ErrorKind::Invalid
    );
}

#[tokio::test]
async fn the_protocol_holds_over_a_binary_transport() {
    files_round_trip(&LocalShell(Transport::Binary)).await;
    trees_round_trip(&LocalShell(Transport::Binary)).await;
}

#[tokio::test]
async fn the_protocol_holds_over_a_base64_transport() {
    files_round_trip(&LocalShell(Transport::Base64)).await;
    trees_round_trip(&LocalShell(Transport::Base64)).await;
}

#[test]
fn exit_codes_map_to_error_kinds() {
    let out = |exit_code| ExecOutput {
        stdout: b"target".to_vec(),
        stderr: b"why".to_vec(),
        exit_code,
    };
    assert_eq!(verdict("s", "/p", out(0)).unwrap(), b"target");
    let kinds = [
        (scripts::ABSENT, ErrorKind::NotFound),
        (scripts::IS_DIR, ErrorKind::Invalid),
        (scripts::NOT_REGULAR, ErrorKind::Invalid),
        (scripts::NOT_DIR, ErrorKind::Invalid),
        (scripts::SYMLINK, ErrorKind::Invalid),
        (scripts::UNDER_A_FILE, ErrorKind::Invalid),
        (127, ErrorKind::Unsupported),
        (1, ErrorKind::Transient),
    ];
    for (code, expected) in kinds {
        assert_eq!(kind(verdict("s", "/p", out(code))), expected, "exit {code}");
    }
}

#[tokio::test]
async fn a_reported_write_ends_its_stdout_with_its_status() {
    use std::os::unix::fs::PermissionsExt as _;
    let shell = &LocalShell(Transport::Binary);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let write = |path: String, mode| async move {
        let (argv, _) = reported_write("s", &path, mode).unwrap();
        let out = shell
            .shell_exec("s", argv, Some(b"data"), Duration::from_secs(10))
            .await
            .unwrap();
        reported_status(&out.stdout)
    };
    let mode = |p: &str| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;

    let plain = format!("{root}/new/plain");
    assert_eq!(write(plain.clone(), 0o640).await, Some(0));
    assert_eq!(std::fs::read(&plain).unwrap(), b"data");
    assert_eq!(mode(&plain), 0o640);
    let tool = format!("{root}/tool");
    assert_eq!(write(tool.clone(), 0o750).await, Some(0));
    assert_eq!(mode(&tool), 0o750);
    let into_a_dir = format!("{root}/new");
    assert_eq!(write(into_a_dir, 0o644).await, Some(scripts::IS_DIR));
}

#[test]
fn a_status_is_read_only_when_whole() {
    let status = |s: &str| reported_status(s.as_bytes());
    assert_eq!(status("\u{1f}0\u{1e}"), Some(0));
    assert_eq!(status("\u{1f}21\u{1e}"), Some(21));
    assert_eq!(status("\u{1f}21"), None);
    assert_eq!(status("noise\u{1f}0\u{1e}"), None);
    assert_eq!(status(""), None);
}

#[test]
fn a_write_from_the_environment_writes_the_exact_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = format!("{}/run/env", dir.path().to_str().unwrap());
    let text = "-n A='x y'\\n\\\nB=\"$HOME\" `id`\n\n%s%%\n";
    let (argv, env) = reported_write_from_env("s", &path, 0o600, text.as_bytes())
        .unwrap()
        .expect("small text goes in the environment");
    let out = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .envs(&env)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(reported_status(&out.stdout), Some(0), "{out:?}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn only_small_text_goes_in_the_environment() {
    let carried = |data: &[u8]| {
        reported_write_from_env("s", "/run/f", 0o600, data)
            .unwrap()
            .is_some()
    };
    assert!(carried(b"A=1\n"));
    assert!(carried(&vec![b'a'; ENV_DATA_MAX]));
    assert!(!carried(&vec![b'a'; ENV_DATA_MAX + 1]), "too large");
    assert!(!carried(b"a\0b"), "a NUL");
    assert!(!carried(&[0xff, 0xfe]), "not UTF-8");
}

#[test]
fn a_staged_write_puts_its_file_in_place_on_commit_and_only_then() {
    let dir = tempfile::tempdir().unwrap();
    let path = format!("{}/run/sandboxes.dev/env", dir.path().to_str().unwrap());
    let run = |text: &str, stdin: &[u8]| {
        let (argv, env) = staged_write_from_env("s", &path, 0o600, text.as_bytes())
            .unwrap()
            .expect("small text is staged");
        let mut child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .envs(&env)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        reported_status(&out.stdout)
    };
    let leftovers = || {
        let parent = std::path::Path::new(&path).parent().unwrap();
        std::fs::read_dir(parent)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(scripts::STAGING_PREFIX))
                    .count()
            })
            .unwrap_or(0)
    };
    for abandoned in [&b""[..], b"no\n", b"commit"] {
        assert_eq!(run("A='1'\n", abandoned), Some(1), "{abandoned:?}");
        assert!(!std::path::Path::new(&path).exists(), "{abandoned:?}");
        assert_eq!(leftovers(), 0, "{abandoned:?}: the staged file is removed");
    }
    assert_eq!(run("A='1'\n", scripts::COMMIT), Some(0));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "A='1'\n");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(run("B='2'\n", b""), Some(1));
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "A='1'\n",
        "an abandoned write leaves the file as it was"
    );
    assert_eq!(leftovers(), 0);
    // Watchers know staged files by this name (see `STAGING_PREFIX`).
    let staged_name = format!("t=\"$d/{}$$\"", scripts::STAGING_PREFIX);
    assert!(scripts::WRITE.contains(&staged_name), "{staged_name}");
}
