//! The `kubectl sandbox` plugin (the built `kubectl-sandbox` binary) as a test drives it:
//! run in a namespace with the test cluster's kubeconfig, to its end or on a pseudo-terminal
//! whose output is collected and whose size the test sets.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::cluster::kubeconfig;
use super::wait_for;

/// The plugin, in `ns`, with the test cluster's kubeconfig.
pub fn plugin(ns: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kubectl-sandbox"));
    cmd.env("KUBECONFIG", kubeconfig())
        .arg("-n")
        .arg(ns)
        .args(args);
    cmd
}

/// Runs the plugin to its end with `stdin`; (exit code, stdout, stderr).
pub fn run(ns: &str, args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    let mut child = plugin(ns, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kubectl-sandbox");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    let out = child.wait_with_output().expect("kubectl-sandbox");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// A pseudo-terminal: (master, the slave's path).
pub fn pty(rows: u16, cols: u16) -> (std::fs::File, std::path::PathBuf) {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("openpt");
    grantpt(&master).expect("grantpt");
    unlockpt(&master).expect("unlockpt");
    let name = ptsname(&master, Vec::new()).expect("ptsname");
    resize(&master, rows, cols);
    let path = std::path::PathBuf::from(name.to_string_lossy().into_owned());
    (std::fs::File::from(master), path)
}

pub fn resize(master: &impl std::os::fd::AsFd, rows: u16, cols: u16) {
    let size = rustix::termios::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    rustix::termios::tcsetwinsize(master, size).expect("TIOCSWINSZ");
}

/// Collects everything `reader` yields into a shared string, on a thread.
pub fn collect(mut reader: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let seen = Arc::new(Mutex::new(String::new()));
    let sink = seen.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    seen
}

pub async fn wait_exit(child: &mut Child) -> i32 {
    wait_for("kubectl-sandbox to exit", Duration::from_secs(30), || {
        let r = child.try_wait();
        async move {
            match r {
                Ok(Some(status)) => Ok(status.code().unwrap_or(-1)),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await
}

/// Types `line` into the terminal until `needle` shows in what it printed.
pub async fn type_until(
    master: &mut std::fs::File,
    seen: &Arc<Mutex<String>>,
    line: &[u8],
    needle: &str,
) {
    wait_for(needle, Duration::from_secs(30), || {
        let text = seen.lock().unwrap().clone();
        let done = text.contains(needle);
        if !done {
            let _ = master.write_all(line);
        }
        async move { if done { Ok(()) } else { Err(text) } }
    })
    .await;
}
