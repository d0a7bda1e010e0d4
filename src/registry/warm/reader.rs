//! The reader: the `sh` script a warm process runs while it waits, and the header that tells
//! it what to become.
//!
//! The header is a few lines on the process's stdin: a version line, then the argv, the
//! environment and the working directory, each field on a line of its own. A field is
//! escaped so that it holds no newline (`\n`) and so that every backslash is doubled; the
//! reader undoes that with `printf %b`, forking only for the rare field that holds a
//! backslash. `read -r` takes one byte at a time from a pipe and stops at the newline, so
//! whatever follows on stdin is left, untouched, for the program.
//!
//! Starting is a handshake. Once the whole header has been read and applied, the reader
//! writes one [`MARKER`] byte to stdout and waits for the line [`GO`]; only then does it
//! `exec` the argv. The program keeps the reader's pid (and the token wrapper's, which
//! started the reader, so signals find it as they find any session's program), its stdin,
//! stdout and stderr. So the program runs only when the caller has seen the reader alive and
//! said go: a reader that does not answer (its sandbox frozen, say) is abandoned by closing
//! its stdin, and when it reads on, it finds the end of file where the go should be and
//! ends. Anything that fails before the go — a header cut short by a dropped connection, an
//! environment name that is no shell name, a working directory that does not exist — ends
//! the reader with [`REFUSED`], and the program never ran: the caller starts it the ordinary
//! way instead and gets the provider's own answer.

/// The reader script (`sh -c READER`). Its own variables are prefixed `__sbx_`, and a header
/// setting such a name is never sent (see [`header`]), so the environment it exports cannot
/// change the loop that exports it.
pub const READER: &str = r#"__sbx_r() { IFS= read -r __sbx_l || exit 97; case $__sbx_l in *\\*) __sbx_l=$(printf '%bx' "$__sbx_l"); __sbx_l=${__sbx_l%x};; esac; }
__sbx_r; [ "$__sbx_l" = sbx-warm-1 ] || exit 97
__sbx_r; __sbx_n=$__sbx_l; set --
while [ "$__sbx_n" -gt 0 ]; do __sbx_r; set -- "$@" "$__sbx_l"; __sbx_n=$((__sbx_n-1)); done
__sbx_r; __sbx_n=$__sbx_l
while [ "$__sbx_n" -gt 0 ]; do __sbx_r; case ${__sbx_l%%=*} in ''|[0-9]*|*[!A-Za-z0-9_]*) exit 97;; esac; export "$__sbx_l"; __sbx_n=$((__sbx_n-1)); done
__sbx_r; [ -z "$__sbx_l" ] || cd -- "$__sbx_l" 2>/dev/null || exit 97
printf '\006'; IFS= read -r __sbx_l || exit 97; [ "$__sbx_l" = go ] || exit 97
unset __sbx_l __sbx_n; unset -f __sbx_r
exec "$@""#;

/// The byte the reader writes once it has applied the header.
pub const MARKER: u8 = 0x06;

/// The line that makes a reader that wrote its marker `exec` the program.
pub const GO: &[u8] = b"go\n";

/// The reader's exit code when it ends without starting the program.
pub const REFUSED: i64 = 97;

/// The first line of every header (the reader refuses any other).
const VERSION: &str = "sbx-warm-1";

/// The prefix of the reader's own variables, which a header may not set.
const OWN: &str = "__sbx_";

/// The header that makes a waiting reader run `argv` with `env` in `cwd`; `None` when it
/// cannot carry them (a NUL byte, which no argv or environment can hold, or a name of the
/// reader's own), so the caller starts the program the ordinary way.
pub fn header<'a>(
    argv: &[String],
    env: impl IntoIterator<Item = (&'a String, &'a String)>,
    cwd: Option<&str>,
) -> Option<Vec<u8>> {
    let mut lines = vec![VERSION.to_string(), argv.len().to_string()];
    for arg in argv {
        lines.push(escape(arg)?);
    }
    let env: Vec<_> = env.into_iter().collect();
    lines.push(env.len().to_string());
    for (name, value) in env {
        if name.starts_with(OWN) || name.is_empty() || name.contains('=') {
            return None;
        }
        lines.push(escape(&format!("{name}={value}"))?);
    }
    lines.push(escape(cwd.unwrap_or_default())?);
    let mut out = lines.join("\n").into_bytes();
    out.push(b'\n');
    Some(out)
}

/// One field as a line: backslashes doubled, newlines as `\n`; `None` for a NUL.
fn escape(field: &str) -> Option<String> {
    if field.contains('\0') {
        return None;
    }
    Some(field.replace('\\', "\\\\").replace('\n', "\\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::io::Write;
    use std::process::{Command, Stdio};

    /// Runs the reader with the host's `sh`, `input` on its stdin.
    fn read_with_host_sh(input: &[u8]) -> std::process::Output {
        let mut child = Command::new("sh")
            .args(["-c", READER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sh");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(input).expect("write");
        drop(stdin);
        child.wait_with_output().expect("wait")
    }

    #[test]
    fn the_reader_runs_the_argv_exactly_with_its_env_and_cwd_and_leaves_stdin_to_it() {
        let argv: Vec<String> = [
            "sh",
            "-c",
            r#"printf '%s|' "$@" "$(pwd)" "$A" "$B"; cat"#,
            "x",
            "two words",
            "back\\slash\\n",
            "new\nline\n",
            "",
            "%b \\c end",
        ]
        .map(String::from)
        .to_vec();
        let env: BTreeMap<String, String> = [
            ("A".to_string(), "a=1\nsecond".to_string()),
            ("B".to_string(), String::new()),
        ]
        .into();
        let mut input = header(&argv, &env, Some("/tmp")).expect("a header");
        input.extend_from_slice(GO);
        input.extend_from_slice(b"stdin\\n\nrest");
        let out = read_with_host_sh(&input);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let mut want = vec![MARKER];
        want.extend_from_slice(
            "two words|back\\slash\\n|new\nline\n||%b \\c end|/tmp|a=1\nsecond||stdin\\n\nrest"
                .as_bytes(),
        );
        assert_eq!(out.stdout, want, "{}", String::from_utf8_lossy(&out.stdout));
    }

    #[test]
    fn the_reader_starts_nothing_without_a_whole_header_and_its_go() {
        let argv = vec!["echo".to_string(), "ran".into()];
        let mut whole = header(&argv, &BTreeMap::new(), None).expect("a header");
        let header_len = whole.len();
        whole.extend_from_slice(GO);
        for cut in [0, 5, header_len - 1] {
            let out = read_with_host_sh(&whole[..cut]);
            assert_eq!(out.status.code(), Some(REFUSED as i32), "cut at {cut}");
            assert!(out.stdout.is_empty(), "cut at {cut}: {out:?}");
        }
        for cut in [header_len, whole.len() - 1] {
            let out = read_with_host_sh(&whole[..cut]);
            assert_eq!(out.status.code(), Some(REFUSED as i32), "cut at {cut}");
            assert_eq!(out.stdout, [MARKER], "cut at {cut}: only the marker");
        }
        let mut wrong = whole[..header_len].to_vec();
        wrong.extend_from_slice(b"no\n");
        assert_eq!(
            read_with_host_sh(&wrong).status.code(),
            Some(REFUSED as i32)
        );
        let out = read_with_host_sh(&whole);
        assert_eq!(out.stdout, [&[MARKER][..], b"ran\n"].concat());
    }

    #[test]
    fn the_reader_refuses_what_the_program_could_not_start_with() {
        let argv = vec!["true".to_string()];
        let bad_name: BTreeMap<String, String> = [("A-B".to_string(), "x".to_string())].into();
        let out = read_with_host_sh(&header(&argv, &bad_name, None).expect("a header"));
        assert_eq!(out.status.code(), Some(REFUSED as i32));
        assert!(out.stdout.is_empty());
        let nowhere = header(&argv, &BTreeMap::new(), Some("/no/such/dir")).expect("a header");
        let out = read_with_host_sh(&nowhere);
        assert_eq!(out.status.code(), Some(REFUSED as i32));
        assert!(out.stdout.is_empty());
        let wrong = b"sbx-warm-0\n1\ntrue\n0\n\n";
        assert_eq!(read_with_host_sh(wrong).status.code(), Some(REFUSED as i32));
    }

    #[test]
    fn a_header_cannot_carry_a_nul_or_the_readers_own_names() {
        let env = BTreeMap::new();
        assert!(header(&["a\0b".to_string()], &env, None).is_none());
        let own: BTreeMap<String, String> = [("__sbx_n".to_string(), "1".to_string())].into();
        assert!(header(&["true".to_string()], &own, None).is_none());
        assert!(header(&["true".to_string()], &env, Some("/a\0")).is_none());
    }
}
