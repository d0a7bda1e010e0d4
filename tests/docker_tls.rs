//! A remote Docker engine over mutual TLS: a second dockerd of this test's own (own data
//! root, exec root, pidfile, own bridge; no iptables) listening with `--tlsverify` on a
//! loopback port, with a CA and certificates the test makes with the openssl CLI. The right
//! client certificate works; one from another CA is refused with `Unauthorized` naming the
//! settings; a TCP endpoint without TLS is refused by validation unless explicitly allowed.
//!
//! Needs root (a second dockerd), openssl and dockerd.

mod harness;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use harness::unique;
use sandbox_operator::provider::docker::tls::EngineTls;
use sandbox_operator::provider::docker::{DockerProvider, DockerSettings};
use sandbox_operator::provider::{ErrorKind, Provider, SandboxQuery};
use sandbox_operator::secret::SecretSource;
use sandbox_operator::validation::Issues;

fn run(dir: &Path, args: &str) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and, signed by it, a certificate with `name` (server: SAN 127.0.0.1; client:
/// clientAuth).
fn pki(dir: &Path, ca: &str, name: &str, server: bool) {
    if !dir.join(format!("{ca}.pem")).exists() {
        run(
            dir,
            &format!(
                "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN={ca} \
                 -keyout {ca}-key.pem -out {ca}.pem"
            ),
        );
    }
    let ext = if server {
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"
    } else {
        "extendedKeyUsage=clientAuth"
    };
    std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
    run(
        dir,
        &format!(
            "openssl req -newkey rsa:2048 -nodes -subj /CN={name} -keyout {name}-key.pem \
             -out {name}.csr && openssl x509 -req -in {name}.csr -CA {ca}.pem -CAkey {ca}-key.pem \
             -CAcreateserial -days 1 -extfile {name}.ext -out {name}.pem"
        ),
    );
}

/// The second engine; stopped and its state removed on drop.
struct TlsEngine {
    child: Child,
    dir: tempfile::TempDir,
    exec_root: PathBuf,
    bridge: String,
    port: u16,
}

impl TlsEngine {
    fn start() -> TlsEngine {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        pki(d, "ca", "server", true);
        pki(d, "ca", "client", false);
        pki(d, "rogue-ca", "rogue", false);
        std::fs::write(d.join("daemon.json"), "{}").unwrap();
        let port = sandbox_doubles::ports::quiet_port();
        let exec_root = PathBuf::from(format!("/run/{}", unique("sbx-tls")));
        // A bridge of its own: `--bridge=none` would make dockerd DELETE the host's docker0
        // (it removes the default bridge interface it is told not to use), which the shared
        // engine needs.
        let tag = &unique("b")[2..10];
        let bridge = format!("sbxt{tag}");
        let third = u8::from_str_radix(&tag[..2], 16).unwrap();
        run(
            d,
            &format!(
                "ip link add {bridge} type bridge && ip addr add 198.19.{third}.1/24 dev {bridge} \
                 && ip link set {bridge} up"
            ),
        );
        let p = |f: &str| d.join(f).to_string_lossy().into_owned();
        let child = Command::new("dockerd")
            .args(["--config-file", &p("daemon.json")])
            .args(["--data-root", &p("data"), "--exec-root"])
            .arg(&exec_root)
            .args(["--pidfile", &p("dockerd.pid")])
            .args(["-H", &format!("tcp://127.0.0.1:{port}")])
            .args(["--tlsverify", "--tlscacert", &p("ca.pem")])
            .args([
                "--tlscert",
                &p("server.pem"),
                "--tlskey",
                &p("server-key.pem"),
            ])
            .args(["--bridge", &bridge, "--iptables=false", "--ip-masq=false"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("dockerd.log")).unwrap())
            .spawn()
            .expect("dockerd starts");
        TlsEngine {
            child,
            dir,
            exec_root,
            bridge,
            port,
        }
    }

    fn settings(&self, client: &str) -> DockerSettings {
        let f = |n: &str| SecretSource::file(self.dir.path().join(n));
        DockerSettings {
            endpoint: Some(format!("tcp://127.0.0.1:{}", self.port)),
            tls: Some(EngineTls {
                ca: f("ca.pem"),
                cert: f(&format!("{client}.pem")),
                key: f(&format!("{client}-key.pem")),
            }),
            ..Default::default()
        }
    }

    /// A provider with the right client certificate, once the engine answers.
    async fn wait_answering(&mut self) -> DockerProvider {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let last =
                match DockerProvider::connect_negotiated("tls", self.settings("client")).await {
                    Ok(p) => return p,
                    Err(e) => e,
                };
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(self.dir.path().join("dockerd.log"));
                panic!("dockerd exited ({status}): {log:?}");
            }
            assert!(Instant::now() < deadline, "engine never answered: {last}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for TlsEngine {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "findmnt -rn -o TARGET | grep -E '^({}|{})' | sort -r | xargs -r umount -l",
                self.exec_root.display(),
                self.dir.path().display()
            ))
            .status();
        let _ = std::fs::remove_dir_all(&self.exec_root);
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
    }
}

#[tokio::test]
async fn the_right_client_certificate_works_and_a_foreign_one_is_unauthorized() {
    let mut engine = TlsEngine::start();
    let provider = engine.wait_answering().await;
    let found = provider
        .find(&SandboxQuery::default())
        .await
        .expect("an enumeration over mutual TLS");
    assert!(found.is_empty(), "a fresh engine holds no sandboxes");

    let rogue = DockerProvider::connect("tls-rogue", engine.settings("rogue")).unwrap();
    let err = rogue.find(&SandboxQuery::default()).await.unwrap_err();
    assert!(err.is(ErrorKind::Unauthorized), "{err:?}");
    assert_eq!(err.reason(), "EngineTlsRefused");
    assert!(err.message().contains("docker.tls.cert"), "{err}");

    // Plain HTTP to the TLS port gets nowhere either.
    let plain = DockerProvider::connect(
        "tls-plain",
        DockerSettings {
            endpoint: Some(format!("tcp://127.0.0.1:{}", engine.port)),
            allow_plain_tcp: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(plain.find(&SandboxQuery::default()).await.is_err());
}

#[test]
fn a_tcp_endpoint_without_tls_is_refused_unless_explicitly_allowed() {
    let plain = DockerSettings {
        endpoint: Some("tcp://10.0.0.1:2375".into()),
        ..Default::default()
    };
    let mut issues = Issues::default();
    plain.validate("providers[0].docker", &mut issues);
    let (path, message) = issues.iter().next().expect("refused");
    assert_eq!(path, "providers[0].docker.endpoint");
    assert!(message.contains("allowPlainTcp"), "{message}");

    let allowed = DockerSettings {
        allow_plain_tcp: true,
        ..plain
    };
    let mut issues = Issues::default();
    allowed.validate("providers[0].docker", &mut issues);
    assert!(issues.is_empty(), "{issues:?}");
}
