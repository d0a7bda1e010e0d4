//! `kubectl sandbox` (the built `kubectl-sandbox` binary) end to end: through the real
//! kube-apiserver's aggregation layer to an operator serving `subresources.sandboxes.dev`
//! (`harness::aggregated`), on sandboxes on the real Docker engine and on Pods on the test
//! kubelets (the Kubernetes provider). Exec with stdin and a TTY (on a pseudo-terminal,
//! `stty size` before and after a resize), an exit code passed through, `logs -f` following
//! new lines, `cp` of a tree with its modes both ways, and port-forward reaching an HTTP
//! server in the sandbox.
//!
//! Each check is one body taking the provider ([`On`]); `on_each_provider!` gives it one
//! test per provider, `docker::<check>` and `kubernetes::<check>`.

mod harness;

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;

use harness::aggregated::{AccessWorld, On, sandbox_yaml_on};
use harness::cluster::apply_yaml_ok;
use harness::plugin::{collect, http_answer, plugin, port_forward, run, wait_text};

/// One test per provider for each named check (`async fn check(on: On)`).
macro_rules! on_each_provider {
    ($($check:ident),* $(,)?) => {
        mod docker {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $check() {
                    super::$check(super::On::Docker).await;
                }
            )*
        }
        mod kubernetes {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $check() {
                    super::$check(super::On::Kubernetes).await;
                }
            )*
        }
    };
}

on_each_provider!(
    exec_passes_stdin_and_its_end_and_the_exit_code_through,
    exec_with_a_tty_follows_a_resize,
    logs_follow_prints_new_lines,
    cp_copies_a_tree_with_its_modes_both_ways,
    port_forward_reaches_an_http_server_in_the_sandbox,
    attach_is_refused_naming_exec_instead,
);

/// A namespace with a Ready Sandbox `box` on `on`'s provider (it printed `hello from box`
/// and idles) and an operator serving the aggregated API.
async fn world(on: On, prefix: &str) -> AccessWorld {
    let w = AccessWorld::start(on, prefix).await;
    apply_yaml_ok(&sandbox_yaml_on("box", on), &w.ns);
    w.wait_ready("box").await;
    w
}

async fn exec_passes_stdin_and_its_end_and_the_exit_code_through(on: On) {
    let w = world(on, "plugin-exec").await;
    let ns = &w.ns;
    harness::plugin::exec_passes_stdin_and_its_end_and_the_exit_code_through(ns, &w.api.operator);
    let (code, _, err) = run(ns, &["exec", "nope", "--", "true"], b"");
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!("kubectl get sandboxes -n {ns}")),
        "{err}"
    );
}

async fn exec_with_a_tty_follows_a_resize(on: On) {
    let w = world(on, "plugin-tty").await;
    harness::plugin::exec_with_a_tty_follows_a_resize(&w.ns, &w.api.operator).await;
}

async fn logs_follow_prints_new_lines(on: On) {
    let w = world(on, "plugin-logs").await;
    let (ns, api) = (&w.ns, &w.api);
    let mut follower = plugin(ns, &["logs", "-f", "box"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kubectl-sandbox logs -f");
    let seen = collect(follower.stdout.take().expect("stdout"));
    wait_text("the log so far", &seen, "hello from box").await;
    let line = "echo a-later-line > /proc/1/fd/1";
    let (code, _, err) = run(ns, &["exec", "box", "--", "sh", "-c", line], b"");
    assert_eq!(code, 0, "{err}\n{}", api.operator.log_tail());
    wait_text("the followed new line", &seen, "a-later-line").await;
    assert_eq!(
        follower.try_wait().expect("try_wait"),
        None,
        "-f must keep following"
    );
    let _ = follower.kill();
    let _ = follower.wait();
}

/// A small tree with distinct modes: (relative path, mode, content; `None` for a directory).
const TREE: &[(&str, u32, Option<&str>)] = &[
    ("bin", 0o750, None),
    ("bin/run.sh", 0o755, Some("#!/bin/sh\necho run\n")),
    ("data", 0o700, None),
    ("data/secret", 0o600, Some("s3cret\n")),
    ("data/readonly", 0o444, Some("ro\n")),
];

fn write_tree(root: &std::path::Path) {
    std::fs::create_dir(root).expect("root");
    for (path, _, content) in TREE {
        let p = root.join(path);
        match content {
            None => std::fs::create_dir(&p).expect("dir"),
            Some(c) => std::fs::write(&p, c).expect("file"),
        }
    }
    for (path, mode, _) in TREE.iter().rev() {
        let p = root.join(path);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).expect("chmod");
    }
}

fn assert_tree(root: &std::path::Path) {
    for (path, mode, content) in TREE {
        let p = root.join(path);
        let meta = std::fs::metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert_eq!(meta.permissions().mode() & 0o7777, *mode, "{path}");
        if let Some(c) = content {
            assert_eq!(std::fs::read_to_string(&p).expect("read"), *c, "{path}");
        }
    }
}

async fn cp_copies_a_tree_with_its_modes_both_ways(on: On) {
    let w = world(on, "plugin-cp").await;
    let (ns, api) = (&w.ns, &w.api);
    let dir = tempfile::tempdir().expect("tempdir");
    let local = dir.path().join("tree");
    write_tree(&local);
    let remote = format!("{ns}/box:/tmp/copied");
    let (code, _, err) = run(ns, &["cp", &local.to_string_lossy(), &remote], b"");
    assert_eq!(code, 0, "{err}\n{}", api.operator.log_tail());
    let listing = "cd /tmp/copied && stat -c '%a %n' bin bin/run.sh data data/secret data/readonly";
    let (code, out, err) = run(ns, &["exec", "box", "--", "sh", "-c", listing], b"");
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "750 bin\n755 bin/run.sh\n700 data\n600 data/secret\n444 data/readonly\n"
    );
    let back = dir.path().join("back");
    let (code, _, err) = run(ns, &["cp", "box:/tmp/copied", &back.to_string_lossy()], b"");
    assert_eq!(code, 0, "{err}");
    assert_tree(&back);
}

/// A Sandbox on `on`'s provider serving `hello from web` over HTTP on 8080 (perl-base only).
fn web_yaml(on: On) -> String {
    format!(
        r#"apiVersion: sandboxes.dev/v1alpha1
kind: Sandbox
metadata: {{name: web}}
spec:
  provider: {provider}
  image: {image}
  command:
    - perl
    - -MIO::Socket::INET
    - -e
    - |
      my $s = IO::Socket::INET->new(LocalPort => 8080, Listen => 16, ReuseAddr => 1) or die "$!";
      while (my $c = $s->accept) {{
        while (my $l = <$c>) {{ last if $l =~ /^\r?\n$/ }}
        print $c "HTTP/1.1 200 OK\r\nContent-Length: 15\r\nConnection: close\r\n\r\nhello from web\n";
        close $c;
      }}
"#,
        provider = on.provider(),
        image = harness::docker::base_image()
    )
}

async fn port_forward_reaches_an_http_server_in_the_sandbox(on: On) {
    let w = world(on, "plugin-pf").await;
    apply_yaml_ok(&web_yaml(on), &w.ns);
    w.wait_ready("web").await;
    let (mut forwarder, port) = port_forward(&w.ns, "web", 8080).await;
    // Ready means the process runs; the answer is polled until perl has bound its socket.
    let answer = http_answer(port, "hello from web").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    let _ = forwarder.kill();
    let _ = forwarder.wait();
}

/// No provider attaches to a sandbox's main process yet: `attach` says that this provider
/// cannot attach and names the `kubectl sandbox exec` that works, rather than claiming the
/// provider cannot run interactive processes at all.
async fn attach_is_refused_naming_exec_instead(on: On) {
    let w = world(on, "plugin-attach").await;
    let (code, out, err) = run(&w.ns, &["attach", "box"], b"");
    assert_eq!(code, 1, "stdout {out:?} stderr {err:?}");
    let provider = on.provider();
    assert!(
        err.contains(&format!("provider {provider} cannot attach")),
        "{err}"
    );
    let instead = format!("kubectl sandbox exec -it box -n {} -- sh", w.ns);
    assert!(err.contains(&instead), "{err}");
    assert!(!err.contains("cannot run an interactive process"), "{err}");
}
