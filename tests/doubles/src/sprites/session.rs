//! Exec sessions: how the double runs a command so that it can be signalled, the registry of
//! running sessions (the `session_id` of `session_info`), and the kill endpoint
//! `POST /v1/sprites/{name}/exec/{session_id}/kill?signal=SIGTERM`.
//!
//! Docker has no call that signals an exec, and the pid it reports is a host pid. So the
//! double starts every command under a `sh` wrapper that writes its own pid into a pid file
//! (inside the container) and then `exec`s the command, which keeps that pid; a signal is a
//! second exec, `kill -s NAME $(cat pidfile)`. The wrapper also sets the terminal's initial
//! size with `stty` before the command runs, as the service starts a TTY at `cols`×`rows`.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State as AxState};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::api::{error, first, pairs};
use super::fs::run;
use super::state::State;

/// The wrapper: `$0` the pid file, `$1`/`$2` rows and columns (empty without a TTY).
const WRAPPER: &str = r#"echo $$ >"$0" 2>/dev/null
[ -n "$1" ] && stty rows "$1" cols "$2" 2>/dev/null
shift 2
exec "$@""#;

/// The signaller: waits (bounded) for the pid file, then signals. `$0` pid file, `$1` name.
const SIGNALLER: &str = r#"i=0
while [ ! -s "$0" ] && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i+1)); done
kill -s "$1" "$(cat "$0")""#;

/// Signal names the API takes (with or without the `SIG` prefix).
const SIGNALS: [&str; 7] = ["INT", "TERM", "HUP", "KILL", "QUIT", "USR1", "USR2"];

/// A running exec session.
#[derive(Debug, Clone)]
pub struct Session {
    /// The sprite it runs in.
    pub sprite: String,
    /// The sprite's container.
    pub container: String,
    /// Where its pid is recorded inside the container.
    pub pid_file: String,
}

impl Session {
    /// A session of `sprite` (container `container`) with a fresh pid file.
    pub fn new(sprite: &str, container: &str) -> Self {
        Session {
            sprite: sprite.to_string(),
            container: container.to_string(),
            pid_file: format!("/tmp/.sprites-double-{:016x}.pid", fastrand::u64(..)),
        }
    }

    /// `argv` wrapped so that it records its pid and starts at `tty` (rows, cols).
    pub fn wrap(&self, argv: Vec<String>, tty: Option<(u16, u16)>) -> Vec<String> {
        let (rows, cols) = match tty {
            Some((rows, cols)) => (rows.to_string(), cols.to_string()),
            None => (String::new(), String::new()),
        };
        let mut wrapped = vec![
            "sh".to_string(),
            "-c".into(),
            WRAPPER.into(),
            self.pid_file.clone(),
            rows,
            cols,
        ];
        wrapped.extend(argv);
        wrapped
    }

    /// Delivers `signal` (`INT`, `SIGINT`, …) to the session's process.
    pub async fn signal(&self, state: &State, signal: &str) -> Result<(), String> {
        let name = signal_name(signal)?;
        let argv = vec![
            "sh".to_string(),
            "-c".into(),
            SIGNALLER.into(),
            self.pid_file.clone(),
            name.into(),
        ];
        run_to_end(state, &self.container, argv).await
    }

    /// Removes the pid file once the process has ended (best effort).
    pub async fn cleanup(&self, state: &State) {
        let argv = vec!["rm".into(), "-f".into(), self.pid_file.clone()];
        let _ = run_to_end(state, &self.container, argv).await;
    }
}

/// The bare name of a signal the API accepts, or why not.
pub fn signal_name(signal: &str) -> Result<&'static str, String> {
    let bare = signal.strip_prefix("SIG").unwrap_or(signal);
    SIGNALS
        .iter()
        .find(|s| s.eq_ignore_ascii_case(bare))
        .copied()
        .ok_or_else(|| format!("unknown signal {signal:?}; use one of {SIGNALS:?}"))
}

/// Runs a helper command in `container` to its end; a non-zero exit is an error.
async fn run_to_end(state: &State, container: &str, argv: Vec<String>) -> Result<(), String> {
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    match run(state, container, &argv).await? {
        (0, _) => Ok(()),
        (code, _) => Err(format!("{:?} exited {code}", argv.last())),
    }
}

/// `POST /v1/sprites/{name}/exec/{session_id}/kill?signal=` (default `SIGTERM`): signals the
/// session's process and answers NDJSON. The double reports the `signal` event only; it does
/// not wait for the process to exit (no `exited`/`complete` events).
pub async fn kill(
    AxState(state): AxState<Arc<State>>,
    Path((name, session_id)): Path<(String, u64)>,
    RawQuery(raw): RawQuery,
) -> Response {
    let q = pairs(raw.as_deref());
    let signal = first(&q, "signal").unwrap_or("SIGTERM").to_string();
    let session = state.session(session_id);
    let Some(session) = session.filter(|s| s.sprite == name) else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no exec session {session_id} in sprite {name}"),
        );
    };
    let line = match session.signal(&state, &signal).await {
        Ok(()) => serde_json::json!({
            "type": "signal",
            "message": format!("Signaling {signal} to process {session_id}"),
            "signal": signal,
            "pid": session_id,
        }),
        Err(e) => serde_json::json!({"type": "error", "message": e}),
    };
    let body = format!("{line}\n");
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names_take_the_prefix_or_not() {
        assert_eq!(signal_name("SIGINT"), Ok("INT"));
        assert_eq!(signal_name("term"), Ok("TERM"));
        assert!(signal_name("SIGSEGV").is_err());
    }

    #[test]
    fn the_wrapper_keeps_the_argv_and_the_size() {
        let s = Session::new("a", "c");
        let argv = s.wrap(vec!["echo".into(), "a b".into()], Some((24, 80)));
        assert_eq!(argv[3], s.pid_file);
        assert_eq!(&argv[4..], ["24", "80", "echo", "a b"]);
    }
}
