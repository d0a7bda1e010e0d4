//! Why the engine's Unix socket cannot be used, said in the OS's terms and with the setting
//! that fixes it. A refused socket reaches bollard as a bare "client error (Connect)"; the
//! operator's most common install fault (a non-root pod without the socket's group) would
//! otherwise read like an engine outage.

use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::DockerProvider;
use crate::provider::ProviderError;

impl DockerProvider {
    /// For a failure to reach the engine over its Unix socket: the OS-level cause and the
    /// setting that fixes it. `None` for an engine's answer or a timeout, and when the socket
    /// itself accepts connections.
    pub(crate) fn socket_cause(
        &self,
        context: &str,
        err: &bollard::errors::Error,
    ) -> Option<ProviderError> {
        use bollard::errors::Error as E;
        if matches!(
            err,
            E::DockerResponseServerError { .. } | E::RequestTimeoutError
        ) {
            return None;
        }
        let cause = diagnose(&socket_path(self.settings.endpoint.as_deref())?)?;
        Some(
            ProviderError::transient(format!(
                "{context}: cannot reach the Docker engine: {cause}"
            ))
            .with_reason("EngineSocketRefused"),
        )
    }
}

/// The socket path the provider dials: a `unix://` or absolute endpoint, else `DOCKER_HOST`
/// when it names a socket, else the engine's default. `None` for a TCP endpoint.
pub(crate) fn socket_path(endpoint: Option<&str>) -> Option<PathBuf> {
    let from_env = std::env::var("DOCKER_HOST").ok();
    let ep = endpoint
        .or(from_env.as_deref())
        .unwrap_or("/var/run/docker.sock");
    let path = ep.strip_prefix("unix://").unwrap_or(ep);
    path.starts_with('/').then(|| PathBuf::from(path))
}

/// What stops this process from using the socket at `path`, or `None` when a connect works
/// (the failure is then elsewhere: the engine's answer, not the socket).
pub(crate) fn diagnose(path: &Path) -> Option<String> {
    let err = std::os::unix::net::UnixStream::connect(path).err()?;
    let shown = path.display();
    Some(match err.kind() {
        ErrorKind::NotFound => format!(
            "{shown} does not exist: start the engine, or point the provider's \
             docker.endpoint (chart: providers[].docker.socket.hostPath) at its socket"
        ),
        ErrorKind::PermissionDenied => permission_denied(path),
        ErrorKind::ConnectionRefused => format!(
            "connection refused on {shown}: the socket exists but no engine listens on it \
             (is dockerd running?)"
        ),
        _ => format!("{shown}: {err}"),
    })
}

/// The permission-denied cause: who owns the socket, who we are, and the group to add.
fn permission_denied(path: &Path) -> String {
    let shown = path.display();
    let Ok(meta) = std::fs::metadata(path) else {
        return format!("permission denied on {shown}");
    };
    let (uid, groups) = identity();
    format!(
        "permission denied on {shown} (mode {:o}, owner uid {}, group {}; this process runs \
         as uid {uid} with groups [{groups}]): give the operator the socket's group — in the \
         chart, set providers[].docker.socket.groupId={}",
        meta.permissions().mode() & 0o777,
        meta.uid(),
        meta.gid(),
        meta.gid(),
    )
}

/// This process's uid and supplementary groups, from `/proc/self/status`.
fn identity() -> (String, String) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let uid = field("Uid:")
        .first()
        .map_or("?".to_string(), |u| u.to_string());
    (uid, field("Groups:").join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_path_comes_from_the_endpoint() {
        assert_eq!(
            socket_path(Some("unix:///run/d.sock")),
            Some(PathBuf::from("/run/d.sock"))
        );
        assert_eq!(socket_path(Some("tcp://h:2375")), None);
    }

    #[test]
    fn a_missing_socket_names_the_setting() {
        let dir = std::env::temp_dir().join(format!("sock-{}", std::process::id()));
        let msg = diagnose(&dir.join("absent.sock")).expect("a cause");
        assert!(msg.contains("does not exist"), "{msg}");
        assert!(msg.contains("socket.hostPath"), "{msg}");
    }

    #[test]
    fn permission_denied_names_the_group_to_add() {
        let file = std::env::temp_dir().join(format!("sock-p-{}", std::process::id()));
        std::fs::write(&file, b"").unwrap();
        let gid = std::fs::metadata(&file).unwrap().gid();
        let msg = permission_denied(&file);
        assert!(msg.contains(&format!("socket.groupId={gid}")), "{msg}");
        assert!(msg.contains("this process runs as uid"), "{msg}");
        std::fs::remove_file(&file).unwrap();
    }

    #[test]
    fn a_socket_nobody_listens_on_is_refused() {
        let dir = std::env::temp_dir().join(format!("sock-r-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("dead.sock");
        let _ = std::fs::remove_file(&path);
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let msg = diagnose(&path).expect("a cause");
        assert!(msg.contains("connection refused"), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn the_provider_names_the_socket_cause_when_it_cannot_reach_the_engine() {
        let dir = std::env::temp_dir().join(format!("sock-e-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("engine.sock");
        let _ = std::fs::remove_file(&path);
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let settings = crate::provider::docker::DockerSettings {
            endpoint: Some(format!("unix://{}", path.display())),
            ..Default::default()
        };
        let provider = DockerProvider::connect("d", settings).unwrap();
        let Err(err) = provider.engine().await else {
            panic!("no engine listens, yet the engine answered")
        };
        let msg = err.to_string();
        assert!(msg.contains("connection refused on"), "{msg}");
        assert!(msg.contains("negotiating the Docker API version"), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
