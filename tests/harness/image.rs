//! The operator image, built from the test build's binary the way `make image` builds it from
//! the release build (strip into `target/image/`, then the Dockerfile), and loaded into the
//! test nodes' containerd so the Helm chart's Pods can run it with `pullPolicy: Never`.

use std::process::{Command, Output};

use super::docker::base_image;
use super::repo;

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Builds the image `tag` in a scratch build context holding only the stripped binary.
pub fn build_image(tag: &str) {
    let ctx = tempfile::tempdir().unwrap();
    let staged = ctx.path().join("target/image");
    std::fs::create_dir_all(&staged).unwrap();
    let out = Command::new("strip")
        .args(["-o"])
        .arg(staged.join("sandbox-operator"))
        .arg(env!("CARGO_BIN_EXE_sandbox-operator"))
        .output()
        .expect("run strip");
    assert!(out.status.success(), "strip: {}", text(&out));
    // The build stage first, under a tag of its own: the classic builder would leave it
    // untagged (a few hundred MB per run); tagged, `Image` removes it. The full build then
    // takes it from the cache.
    for (target, tag) in [(Some("rootfs"), stage_tag(tag)), (None, tag.to_string())] {
        let out = Command::new("docker")
            .args(["build", "--build-arg"])
            .arg(format!("BASE_IMAGE={}", base_image()))
            .args(target.map(|t| ["--target", t]).iter().flatten())
            .args(["-t", &tag, "-f"])
            .arg(repo().join("Dockerfile"))
            .arg(ctx.path())
            .output()
            .expect("run docker build");
        assert!(out.status.success(), "docker build failed:\n{}", text(&out));
    }
}

/// The tag of an image's build stage (see [`build_image`]).
pub fn stage_tag(tag: &str) -> String {
    format!("{tag}-rootfs")
}

/// Removes the image and its build stage from the engine when dropped.
pub struct Image(pub String);

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rmi", "-f", &self.0, &stage_tag(&self.0)])
            .output();
    }
}

/// The containerd socket of test node `name` (`tests/setup/node.sh`).
fn node_socket(name: &str) -> String {
    format!("/run/sandbox-operator/node/{name}/containerd.sock")
}

/// The name containerd gives a Docker image `tag` it imported (`docker.io/library/…`).
pub fn node_image_name(tag: &str) -> String {
    if tag.contains('/') {
        format!("docker.io/{tag}")
    } else {
        format!("docker.io/library/{tag}")
    }
}

/// Imports the engine's image `tag` into the containerd of every node in `nodes`.
pub fn import_into_nodes(tag: &str, nodes: &[String]) {
    for node in nodes {
        let script = format!(
            "docker save {tag} | ctr --address {} --namespace k8s.io images import -",
            node_socket(node)
        );
        let out = Command::new("bash")
            .args(["-o", "pipefail", "-c", &script])
            .output()
            .expect("run docker save | ctr import");
        assert!(out.status.success(), "import into {node}: {}", text(&out));
    }
}

/// Removes an imported image from every node's containerd when dropped.
pub struct NodeImage {
    /// The image's name in containerd.
    pub name: String,
    /// The nodes it was imported into.
    pub nodes: Vec<String>,
}

impl Drop for NodeImage {
    fn drop(&mut self) {
        for node in &self.nodes {
            let _ = Command::new("ctr")
                .args(["--address", &node_socket(node), "--namespace", "k8s.io"])
                .args(["images", "rm", &self.name])
                .output();
        }
    }
}
