//! `kubectl sandbox` (the built `kubectl-sandbox` binary) end to end on the Sprites provider:
//! through the real kube-apiserver's aggregation layer to an operator whose only provider is
//! Sprites, pointed at the Sprites double (every sprite a real local container). The plugin's
//! exec rides the provider's streaming exec (the exec WebSocket): stdin and its end, stdout
//! and stderr apart, and the exit code passed through; its port-forward rides the provider's
//! port proxy to an HTTP server in the sprite.

mod harness;

use harness::aggregated::Aggregated;
use harness::cluster::{apply_yaml_ok, client, namespace};
use harness::docker::Purge;
use harness::objects::wait_ready;
use harness::plugin::{http_answer, port_forward, run};
use harness::world::token_file;
use kube::Api;
use sandbox_doubles::sprites::{self, SpritesDouble, SpritesOptions};
use sandbox_operator::api::Sandbox;

/// The operator's `providers:` section: Sprites at the double, its token in a file.
fn providers(double: &SpritesDouble, token: &tempfile::NamedTempFile) -> String {
    format!(
        "providers:\n  - name: sprites\n    type: sprites\n    sprites:\n      apiUrl: {}\n      \
         org: e2e\n      token: {{file: {}}}\n",
        double.base_url,
        token.path().display()
    )
}

/// A Sandbox on the Sprites provider (a sprite has no image or command of ours).
const SANDBOX: &str = r#"apiVersion: sandboxes.dev/v1alpha1
kind: Sandbox
metadata: {name: box}
spec:
  provider: sprites
"#;

/// One test's world: a namespace, the double, the operator serving the aggregated API with
/// Sprites as its provider, and a Ready Sandbox `box`.
struct World {
    ns: String,
    double: SpritesDouble,
    api: Option<Aggregated>,
    _token: tempfile::NamedTempFile,
    _purge: Purge,
}

impl World {
    async fn new(prefix: &str) -> World {
        let ns = namespace(prefix).await;
        let purge = Purge(ns.clone());
        let double = sprites::spawn(SpritesOptions::new(harness::docker::base_image())).await;
        let token = token_file(&double.token);
        let api = Aggregated::start_with(&ns, &providers(&double, &token)).await;
        apply_yaml_ok(SANDBOX, &ns);
        let sandboxes: Api<Sandbox> = Api::namespaced(client().await, &ns);
        wait_ready(&sandboxes, "box", &api.operator).await;
        World {
            ns,
            double,
            api: Some(api),
            _token: token,
            _purge: purge,
        }
    }

    async fn shutdown(mut self) {
        drop(self.api.take());
        self.double.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_on_a_sprite_passes_stdin_streams_and_the_exit_code_through() {
    let world = World::new("plugin-sprites").await;
    let script = "cat; echo to-stderr >&2; exit 5";
    let (code, out, err) = run(
        &world.ns,
        &["exec", "-i", "box", "--", "sh", "-c", script],
        b"hello sprite\n",
    );
    assert_eq!(code, 5, "the exit code passes through (stderr {err:?})");
    assert_eq!(out, "hello sprite\n", "stdin crossed and ended");
    assert!(err.contains("to-stderr"), "stderr apart: {err:?}");
    assert!(
        !out.contains("to-stderr"),
        "stderr kept out of stdout: {out:?}"
    );
    assert!(
        !world.double.requests_to("GET", "/exec").is_empty(),
        "the exec went over the double's exec WebSocket"
    );
    world.shutdown().await;
}

/// A perl HTTP/1.0 server on port 8080 of the sprite, started in the background.
const HTTP_SERVER: &str = r#"cat > /tmp/http.pl <<'PERL'
use IO::Socket::INET;
my $s = IO::Socket::INET->new(LocalPort => 8080, Listen => 5, ReuseAddr => 1) or die $!;
while (my $c = $s->accept) {
  while (my $l = <$c>) { last if $l =~ /^\r?$/ }
  print $c "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nhello from a sprite\n";
  close $c;
}
PERL
nohup perl /tmp/http.pl >/dev/null 2>&1 &"#;

#[tokio::test(flavor = "multi_thread")]
async fn port_forward_reaches_an_http_server_in_a_sprite() {
    let world = World::new("plugin-sprites-pf").await;
    let (code, _, err) = run(
        &world.ns,
        &["exec", "box", "--", "sh", "-c", HTTP_SERVER],
        b"",
    );
    assert_eq!(code, 0, "the server started: {err}");
    let (mut forwarder, port) = port_forward(&world.ns, "box", 8080).await;
    let answer = http_answer(port, "hello from a sprite").await;
    assert!(answer.starts_with("HTTP/1.0 200 OK"), "{answer}");
    assert!(
        !world.double.requests_to("GET", "/proxy").is_empty(),
        "the connection went through the double's port proxy"
    );
    let _ = forwarder.kill();
    let _ = forwarder.wait();
    world.shutdown().await;
}
