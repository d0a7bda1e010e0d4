//! The local terminal of `exec -t`: raw mode for the session (every key goes to the remote
//! terminal, which does its own echo and line editing), its size, and its resizes (SIGWINCH).

use std::io::{self, IsTerminal};

use futures::stream::{self, BoxStream, StreamExt};
use rustix::termios::{self, OptionalActions, Termios};
use tokio::signal::unix::{SignalKind, signal};

use crate::provider::stream::TermSize;

/// Whether stdin is a terminal (what `-t` needs, as with kubectl).
pub fn stdin_is_terminal() -> bool {
    io::stdin().is_terminal()
}

/// Stdin in raw mode until dropped, when its previous settings come back (also on an error
/// path: the user's shell must never be left raw).
pub struct RawMode {
    saved: Termios,
}

impl RawMode {
    /// Puts stdin in raw mode.
    pub fn enter() -> io::Result<RawMode> {
        let stdin = io::stdin();
        let saved = termios::tcgetattr(&stdin)?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(&stdin, OptionalActions::Now, &raw)?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // Nothing more to do if this fails: the process is ending its session either way.
        let _ = termios::tcsetattr(io::stdin(), OptionalActions::Now, &self.saved);
    }
}

/// The terminal's size, read from stdin, else stdout; `None` when neither is a terminal.
pub fn size() -> Option<TermSize> {
    let from = |ws: termios::Winsize| TermSize {
        cols: ws.ws_col,
        rows: ws.ws_row,
    };
    termios::tcgetwinsize(io::stdin())
        .or_else(|_| termios::tcgetwinsize(io::stdout()))
        .ok()
        .map(from)
        .filter(|s| s.cols > 0 && s.rows > 0)
}

/// The size now, then the size after every SIGWINCH (each sent once: a signal for an
/// unchanged size is not repeated).
pub fn resizes() -> io::Result<BoxStream<'static, TermSize>> {
    let winch = signal(SignalKind::window_change())?;
    let later = stream::unfold(winch, |mut winch| async move {
        winch.recv().await?;
        Some((size(), winch))
    })
    .filter_map(|s| async move { s });
    let sizes = stream::iter(size()).chain(later);
    let mut last = None;
    Ok(sizes
        .filter(move |s| {
            let changed = last != Some(*s);
            last = Some(*s);
            async move { changed }
        })
        .boxed())
}
