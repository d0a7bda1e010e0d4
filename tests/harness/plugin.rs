//! The `kubectl sandbox` plugin (the built `kubectl-sandbox` binary) as a test drives it:
//! run in a namespace with the test cluster's kubeconfig, to its end or on a pseudo-terminal
//! whose output is collected and whose size the test sets; and the exec checks every
//! provider's plugin test runs on its Sandbox `box`.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::cluster::kubeconfig;
use super::operator::Operator;
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

/// Waits until `needle` shows in what `seen` collected; `what` names it in a failure.
pub async fn wait_text(what: &str, seen: &Arc<Mutex<String>>, needle: &str) {
    wait_for(what, Duration::from_secs(30), || {
        let text = seen.lock().unwrap().clone();
        let found = text.contains(needle);
        async move { if found { Ok(()) } else { Err(text) } }
    })
    .await;
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

/// `kubectl sandbox exec -i box` of a script that copies stdin, writes to stderr and exits 5:
/// stdin and its end, stdout and stderr apart, and the exit code pass through; a plain
/// `exec box -- true` exits 0. A failure shows `op`'s log.
pub fn exec_passes_stdin_and_its_end_and_the_exit_code_through(ns: &str, op: &Operator) {
    let script = "cat; echo to-stderr >&2; exit 5";
    let (code, out, err) = run(
        ns,
        &["exec", "-i", "box", "--", "sh", "-c", script],
        b"hello\n",
    );
    assert_eq!(code, 5, "stdout {out:?} stderr {err:?}\n{}", op.log_tail());
    assert_eq!(out, "hello\n");
    assert_eq!(err, "to-stderr\n");
    let (code, _, err) = run(ns, &["exec", "box", "--", "true"], b"");
    assert_eq!(code, 0, "{err}");
}

/// `kubectl sandbox exec -it box -- sh` on a pseudo-terminal: `stty size` reads the initial
/// 24x80, then 40x120 after a resize, and `exit 3` passes through. A failure shows `op`'s log.
pub async fn exec_with_a_tty_follows_a_resize(ns: &str, op: &Operator) {
    let (mut master, slave_path) = pty(24, 80);
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&slave_path)
        .expect("open the pty's slave");
    let mut child = plugin(ns, &["exec", "-it", "box", "--", "sh"])
        .stdin(slave.try_clone().expect("slave"))
        .stdout(slave.try_clone().expect("slave"))
        .stderr(slave)
        .spawn()
        .expect("start kubectl-sandbox");
    let seen = collect(master.try_clone().expect("master"));
    type_until(&mut master, &seen, b"stty size\n", "24 80").await;
    resize(&master, 40, 120);
    // The pty is not the plugin's controlling terminal: deliver the SIGWINCH a shell would.
    let winch = Command::new("kill")
        .args(["-WINCH", &child.id().to_string()])
        .status()
        .expect("kill -WINCH");
    assert!(winch.success());
    type_until(&mut master, &seen, b"stty size\n", "40 120").await;
    master.write_all(b"exit 3\n").expect("type");
    let code = wait_exit(&mut child).await;
    assert_eq!(code, 3, "{}\n{}", seen.lock().unwrap(), op.log_tail());
}

/// `kubectl sandbox port-forward <sandbox> :<port>`, running: the process and the local port
/// it said it listens on.
pub async fn port_forward(ns: &str, sandbox: &str, port: u16) -> (Child, u16) {
    let remote = format!(":{port}");
    let mut forwarder = plugin(ns, &["port-forward", sandbox, &remote])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start kubectl-sandbox port-forward");
    let said = collect(forwarder.stdout.take().expect("stdout"));
    wait_text("the local listener", &said, &format!(" -> {port}")).await;
    let text = said.lock().unwrap().clone();
    let local: u16 = text
        .split_once("127.0.0.1:")
        .and_then(|(_, rest)| rest.split_once(' '))
        .and_then(|(p, _)| p.parse().ok())
        .unwrap_or_else(|| panic!("no local port in {text:?}"));
    (forwarder, local)
}

/// The answer to an HTTP GET of `/` at `port` on loopback, asked again until it carries
/// `needle`: a server in a Ready sandbox may not have bound its socket yet.
pub async fn http_answer(port: u16, needle: &str) -> String {
    wait_for(
        "an HTTP answer through the forward",
        Duration::from_secs(30),
        || {
            let r = http_get(port).and_then(|a| if a.contains(needle) { Ok(a) } else { Err(a) });
            async move { r }
        },
    )
    .await
}

/// One HTTP/1.0 GET of `/` at `port` on loopback; the whole answer.
fn http_get(port: u16) -> Result<String, String> {
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    tcp.write_all(b"GET / HTTP/1.0\r\nHost: sandbox\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    Ok(answer)
}
