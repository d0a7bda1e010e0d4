//! The subresources and their query parameters, named as Pod exec, log and port-forward
//! name theirs, so a client written for Pods builds the same query for a Sandbox.

use crate::provider::stream::{LogRequest, StreamExecRequest, TermSize};

use super::lookup::Need;
use super::status::AccessError;

/// A subresource of `sandboxes/{name}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    /// A new process, over a WebSocket.
    Exec,
    /// The main process's stdio, over a WebSocket.
    Attach,
    /// The main process's log, streamed.
    Log,
    /// TCP ports, over a WebSocket.
    PortForward,
    /// A tar of a path, down (GET) or up (PUT).
    Files,
}

impl Subresource {
    /// Every subresource, in discovery order.
    pub const ALL: [Subresource; 5] = [
        Subresource::Exec,
        Subresource::Attach,
        Subresource::Log,
        Subresource::PortForward,
        Subresource::Files,
    ];

    /// The URL segment (and RBAC subresource).
    pub fn name(self) -> &'static str {
        match self {
            Subresource::Exec => "exec",
            Subresource::Attach => "attach",
            Subresource::Log => "log",
            Subresource::PortForward => "portforward",
            Subresource::Files => "files",
        }
    }

    /// The segment's subresource.
    pub fn parse(segment: &str) -> Option<Subresource> {
        Subresource::ALL.into_iter().find(|s| s.name() == segment)
    }

    /// The RBAC verb: reading the log is `get`; everything that runs something in the
    /// sandbox or moves data in or out of it is `create`, whatever the HTTP method.
    pub fn verb(self) -> &'static str {
        match self {
            Subresource::Log => "get",
            _ => "create",
        }
    }

    /// The smallest aggregated role that grants it: `view` gets log, `edit` the rest.
    pub fn role(self) -> &'static str {
        match self {
            Subresource::Log => "view",
            _ => "edit",
        }
    }

    /// What a provider without the capability cannot do, for an error message.
    pub fn capability(self) -> &'static str {
        match self {
            Subresource::Exec => "run an interactive process",
            Subresource::Attach => "attach to its main process",
            Subresource::Log => "stream its main process's logs",
            Subresource::PortForward => "forward ports",
            Subresource::Files => "transfer files",
        }
    }

    /// What the sandbox must be for this subresource.
    pub fn need(self) -> Need {
        match self {
            Subresource::Log => Need::Existing,
            _ => Need::Running,
        }
    }
}

/// The query's `key=value` pairs, decoded, in order (keys may repeat).
pub fn pairs(query: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn flag(pairs: &[(String, String)], key: &str) -> bool {
    pairs
        .iter()
        .any(|(k, v)| k == key && (v == "true" || v == "1"))
}

fn number(pairs: &[(String, String)], key: &str) -> Result<Option<u64>, AccessError> {
    match pairs.iter().find(|(k, _)| k == key) {
        None => Ok(None),
        Some((_, v)) => v.parse().map(Some).map_err(|_| {
            AccessError::BadRequest(format!("{key}={v:?} is not a non-negative integer"))
        }),
    }
}

/// Exec's parameters: `command` (repeated, argv), `stdin`, `stdout`, `stderr`, `tty`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecParams {
    /// What to start.
    pub request: StreamExecRequest,
    /// Whether the client wants stdout.
    pub stdout: bool,
    /// Whether the client wants stderr.
    pub stderr: bool,
}

impl ExecParams {
    /// Reads them; no `command` is a 400.
    pub fn from_query(query: Option<&str>) -> Result<ExecParams, AccessError> {
        let pairs = pairs(query);
        let argv: Vec<String> = pairs
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.clone())
            .collect();
        if argv.is_empty() {
            return Err(AccessError::BadRequest(
                "exec needs a command: one `command` query parameter per argument".into(),
            ));
        }
        let tty = flag(&pairs, "tty");
        Ok(ExecParams {
            request: StreamExecRequest {
                argv,
                env: Default::default(),
                cwd: None,
                stdin: flag(&pairs, "stdin"),
                // The client's first resize frame sets the real size.
                tty: tty.then_some(TermSize { cols: 80, rows: 24 }),
            },
            stdout: flag(&pairs, "stdout"),
            stderr: flag(&pairs, "stderr") && !tty,
        })
    }
}

/// Log's parameters: `follow`, `tailLines`, `sinceSeconds`, `timestamps`.
pub fn log_request(query: Option<&str>) -> Result<LogRequest, AccessError> {
    let pairs = pairs(query);
    Ok(LogRequest {
        follow: flag(&pairs, "follow"),
        tail_lines: number(&pairs, "tailLines")?,
        since_seconds: number(&pairs, "sinceSeconds")?,
        timestamps: flag(&pairs, "timestamps"),
    })
}

/// Port-forward's `ports` (repeated, or comma-separated in one value).
pub fn ports(query: Option<&str>) -> Result<Vec<u16>, AccessError> {
    let mut out = Vec::new();
    for (_, value) in pairs(query).iter().filter(|(k, _)| k == "ports") {
        for p in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match p.parse::<u16>() {
                Ok(port) if port > 0 => out.push(port),
                _ => {
                    return Err(AccessError::BadRequest(format!(
                        "ports={p:?} is not a TCP port (1-65535)"
                    )));
                }
            }
        }
    }
    if out.is_empty() {
        return Err(AccessError::BadRequest(
            "port-forward needs at least one `ports` query parameter".into(),
        ));
    }
    Ok(out)
}

/// Files' `path`: absolute, required.
pub fn path(query: Option<&str>) -> Result<String, AccessError> {
    let path = pairs(query)
        .into_iter()
        .find(|(k, _)| k == "path")
        .map(|(_, v)| v)
        .unwrap_or_default();
    if !path.starts_with('/') {
        return Err(AccessError::BadRequest(format!(
            "files needs an absolute `path` query parameter (got {path:?})"
        )));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_reads_the_pod_exec_query() {
        let p = ExecParams::from_query(Some(
            "command=sh&command=-c&command=echo%20hi&stdin=true&stdout=true&stderr=true&tty=false",
        ))
        .unwrap();
        assert_eq!(p.request.argv, ["sh", "-c", "echo hi"]);
        assert!(p.request.stdin && p.stdout && p.stderr);
        assert_eq!(p.request.tty, None);
        let t = ExecParams::from_query(Some("command=bash&tty=true&stderr=true")).unwrap();
        assert!(t.request.tty.is_some() && !t.stderr);
        assert!(ExecParams::from_query(Some("stdin=true")).is_err());
    }

    #[test]
    fn log_ports_and_path_parameters() {
        let l = log_request(Some(
            "follow=true&tailLines=5&sinceSeconds=60&timestamps=true",
        ))
        .unwrap();
        assert!(l.follow && l.timestamps);
        assert_eq!((l.tail_lines, l.since_seconds), (Some(5), Some(60)));
        assert!(log_request(Some("tailLines=-1")).is_err());
        assert_eq!(
            ports(Some("ports=80&ports=8080,9090")).unwrap(),
            [80, 8080, 9090]
        );
        assert!(ports(Some("ports=0")).is_err() && ports(None).is_err());
        assert_eq!(path(Some("path=%2Fworkspace")).unwrap(), "/workspace");
        assert!(path(Some("path=rel")).is_err());
        assert_eq!(Subresource::Log.verb(), "get");
        assert_eq!(
            Subresource::parse("portforward"),
            Some(Subresource::PortForward)
        );
    }
}
