//! The scripts of the shell file protocol and the exit codes they answer with.
//!
//! Every script takes its paths as positional arguments (`sh -c SCRIPT sh PATH [MODE]`), never
//! spliced into its text, so no path can inject shell. Exit 0 is success; the codes below say
//! what the script found instead of doing its work; any other code is the failure of a tool
//! (a full disk, a read-only path) and comes with its stderr.

/// The path does not exist.
pub const ABSENT: i64 = 20;
/// A directory where a file is expected.
pub const IS_DIR: i64 = 21;
/// Neither a directory nor a regular file (device, fifo or socket) where a file is expected.
pub const NOT_REGULAR: i64 = 22;
/// Something other than a directory where a directory is expected.
pub const NOT_DIR: i64 = 23;
/// A symbolic link where what it points to is needed; stdout carries the link's target.
pub const SYMLINK: i64 = 24;
/// A parent of the path is a file, so nothing can be created below it.
pub const UNDER_A_FILE: i64 = 25;

/// The exact bytes of a regular file (following symlinks).
pub const READ: &str =
    r#"[ -e "$1" ] || exit 20; [ -d "$1" ] && exit 21; [ -f "$1" ] || exit 22; exec cat -- "$1""#;

/// Stdin replaces the whole file `$1` with mode `$2` (octal): written beside the target, then
/// renamed over it, so a reader never sees half a file and a write never appends. Missing
/// parents are created; a parent that is a file is `UNDER_A_FILE`. `$1` is normalised and
/// absolute (no `//`, no trailing `/`), so its parents come from parameter expansion; the file
/// is created under the umask `$3` (the complement of the mode), so it has its mode from the
/// start and `chmod` runs only when `$4` is set (a mode with execute bits, which a created
/// file never gets). A write into an existing directory runs `cat` and `mv` and nothing else.
///
/// With `$5` = `env`, the data is the environment variable [`DATA_VAR`] instead of stdin,
/// written by the shell's own `printf`: no `cat` to start, and no end of stdin to wait for
/// through the runtime's stream (measured on Docker under load: 11–13 ms for the write with
/// `cat`, 6–7 ms without). Only for small text (see `shellfs::reported_write`).
///
/// With `$6` = `staged` as well, the written file waits beside the target until the line
/// [`COMMIT`] arrives on stdin; anything else — the end of stdin, as when the caller drops
/// the process or its connection breaks — removes it, and the target is never touched.
/// A write can so be made ready before the caller knows it may make it (see
/// `ProviderHandle::stage_write`), leaving only the rename for after.
pub const WRITE: &str = r#"[ -d "$1" ] && exit 21; d=${1%/*}; [ -n "$d" ] || d=/;
if [ ! -d "$d" ]; then p=$d;
while [ "$p" != / ]; do [ -e "$p" ] && [ ! -d "$p" ] && exit 25; p=${p%/*}; [ -n "$p" ] || p=/; done;
mkdir -p -- "$d" || exit 1; fi;
t="$d/.sbx-write.$$"; umask "$3" && { if [ "$5" = env ]; then printf %s "$SANDBOXES_DEV_DATA"; else cat; fi; } > "$t" && { [ -z "$4" ] || chmod "$2" "$t"; } && { [ "$6" != staged ] || { IFS= read -r c && [ "$c" = commit ]; }; } && mv -f -- "$t" "$1" || { rm -f -- "$t"; exit 1; }"#;

/// How [`WRITE`] names the file it writes beside the target before renaming it over the
/// target (the shell's pid follows). Watchers leave such files out: a caller sees its write
/// land under the target's name, as a write in place would.
pub const STAGING_PREFIX: &str = ".sbx-write.";

/// Whether a file name is one [`WRITE`] stages under: [`STAGING_PREFIX`] and a pid.
pub fn is_staging_name(file_name: &str) -> bool {
    file_name
        .strip_prefix(STAGING_PREFIX)
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// The line that makes a staged [`WRITE`] put its file in place.
pub const COMMIT: &[u8] = b"commit\n";

/// The environment variable [`WRITE`] takes its data from when `$5` is `env`.
pub const DATA_VAR: &str = "SANDBOXES_DEV_DATA";

/// Put before a script, it makes the script's end known in band: whatever way the shell
/// exits (a script's `exit N` included), it writes [`STATUS_START`], its exit code in
/// decimal and [`STATUS_END`] to stdout last. A caller whose script writes nothing else to
/// stdout learns the outcome as soon as it is written, without waiting for the exec's
/// streams to close and its runtime to record the exit (measured on Docker: ~4 ms). A
/// script that `exec`s a program loses the trap, so it is only for scripts that do not.
pub const REPORTED: &str = r#"trap 'printf "\037%d\036" "$?"' EXIT
"#;

/// The first byte of a status [`REPORTED`] writes.
pub const STATUS_START: u8 = 0x1f;

/// The last byte of a status [`REPORTED`] writes.
pub const STATUS_END: u8 = 0x1e;

/// One level of directory `$1` (following a symlink to one), as [`LISTING_FORMAT`] records.
pub const LIST: &str = r#"[ -d "$1" ] || { [ -e "$1" ] && exit 23; exit 20; }; cd -- "$1" && exec find . -mindepth 1 -maxdepth 1 -printf '%y\0%s\0%P\0%l\0'"#;

/// What `find -printf` writes per entry for [`LIST`] and for any other `find` listing:
/// type letter, size, name, link target — each NUL-terminated, so every name is exact.
pub const LISTING_FORMAT: &str = r"%y\0%s\0%P\0%l\0";

/// `rm -rf` of `$1`; absent is success.
pub const DELETE: &str = r#"exec rm -rf -- "$1""#;

/// A tar of `$1` rooted at its last segment, to stdout. Its exit code is `tar`'s, so a failing
/// `tar` is an error, never a short archive taken for a whole one.
pub const EXPORT: &str = r#"[ -L "$1" ] && { readlink -- "$1"; exit 24; }; [ -e "$1" ] || exit 20;
cd -- "$(dirname -- "$1")" && exec tar -cf - -- "$(basename -- "$1")""#;

/// The (already sanitised) archive on stdin extracted at `$1`, created when missing, without
/// restoring ownership.
pub const IMPORT: &str = r#"mkdir -p -- "$1" && exec tar -x --no-same-owner -C "$1" -f -"#;

/// For an exec API whose streams carry text only: runs the script (`$0`) with its arguments,
/// stdin decoded from base64 (when `INTAKE` is the decoding line) and stdout kept in a
/// temporary file, then sends that file as base64 and exits with the script's code. The
/// script's own exit code survives, which a pipe into `base64` would lose.
pub const BASE64_WRAPPER: &str = r#"t=$(mktemp -d) || exit 1; trap 'rm -rf -- "$t"' EXIT
INTAKE
sh -c "$0" sh "$@" < "$t/in" > "$t/out"; rc=$?
base64 -w0 -- "$t/out" || exit 1; exit $rc"#;

/// `INTAKE` of [`BASE64_WRAPPER`] when the call has stdin.
pub const DECODE_STDIN: &str = r#"base64 -d > "$t/in" || exit 1"#;

/// `INTAKE` of [`BASE64_WRAPPER`] when the call has none.
pub const NO_STDIN: &str = r#": > "$t/in""#;
