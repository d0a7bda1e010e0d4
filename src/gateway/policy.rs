//! Per-sandbox policies: which allow-list applies to a connection, by its source address.
//!
//! The operator writes one file per sandbox into the policy directory, named after the
//! sandbox's container (`<name>.json`, `{"allowed": ["example.com", "*.pypi.org"]}`). The
//! gateway never trusts anything a sandbox says about itself: a sandbox is identified by the
//! source address of its packets on the internal network, mapped to a container name by
//! resolving each policy's name through the engine's embedded DNS (which answers for the
//! containers on the networks the gateway shares). A source with no policy gets nothing.
//!
//! The table is rebuilt every refresh interval and at once (throttled) when an unknown
//! address shows up, so a changed file applies within one interval and a sandbox that was
//! restarted with a new address is recognised on its first connection. A file that cannot
//! be read or parsed keeps the policy last read from it: a half-written file must neither
//! widen nor drop a sandbox's list.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use super::allow::AllowList;

/// The file the operator writes for one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyFile {
    /// Names the sandbox may reach (`*.x` = subdomains of x); empty = nothing.
    pub allowed: Vec<String>,
}

/// The suffix of a policy file.
pub const POLICY_SUFFIX: &str = ".json";

/// The policy file name of a sandbox container; `None` for a name that could escape the
/// directory or is not a container name.
pub fn file_name(sandbox: &str) -> Option<String> {
    let ok = sandbox.len() >= 2
        && sandbox.len() <= 253
        && sandbox
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !sandbox.starts_with('.');
    ok.then(|| format!("{sandbox}{POLICY_SUFFIX}"))
}

/// Resolves a container name to its addresses (the engine's embedded DNS in production).
pub type NameLookup =
    Arc<dyn Fn(String) -> futures::future::BoxFuture<'static, Vec<IpAddr>> + Send + Sync>;

/// The lookup through the system resolver.
pub fn system_lookup() -> NameLookup {
    Arc::new(|name: String| {
        Box::pin(async move {
            match tokio::net::lookup_host((name.as_str(), 0)).await {
                Ok(addrs) => addrs.map(|a| a.ip()).collect(),
                Err(_) => Vec::new(),
            }
        })
    })
}

#[derive(Default)]
struct Table {
    by_name: HashMap<String, Arc<AllowList>>,
    by_ip: HashMap<IpAddr, String>,
}

/// The live policy table.
pub struct Policies {
    dir: PathBuf,
    lookup: NameLookup,
    table: RwLock<Arc<Table>>,
    /// Serialises refreshes and remembers when the last one ran (for the throttle).
    refreshing: Mutex<Option<Instant>>,
}

/// Shortest time between two refreshes triggered by unknown addresses.
const MISS_THROTTLE: Duration = Duration::from_millis(250);
/// Names resolved at once during a refresh.
const LOOKUP_CONCURRENCY: usize = 16;

impl Policies {
    /// An empty table over `dir`; call [`refresh`](Self::refresh) to load it.
    pub fn new(dir: impl Into<PathBuf>, lookup: NameLookup) -> Self {
        Policies {
            dir: dir.into(),
            lookup,
            table: RwLock::new(Arc::new(Table::default())),
            refreshing: Mutex::new(None),
        }
    }

    fn current(&self) -> Arc<Table> {
        match self.table.read() {
            Ok(t) => t.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The allow-list for a source address, refreshing once when the address is unknown.
    /// `None`: no sandbox with a policy has that address, so nothing is allowed.
    pub async fn for_source(&self, ip: IpAddr) -> Option<Arc<AllowList>> {
        let ip = canonical(ip);
        if let Some(list) = lookup(&self.current(), ip) {
            return Some(list);
        }
        self.refresh_throttled().await;
        lookup(&self.current(), ip)
    }

    async fn refresh_throttled(&self) {
        let mut last = self.refreshing.lock().await;
        if last.is_some_and(|t| t.elapsed() < MISS_THROTTLE) {
            return;
        }
        self.rebuild().await;
        *last = Some(Instant::now());
    }

    /// Re-reads the directory and re-resolves every sandbox's address.
    pub async fn refresh(&self) {
        let mut last = self.refreshing.lock().await;
        self.rebuild().await;
        *last = Some(Instant::now());
    }

    async fn rebuild(&self) {
        let previous = self.current();
        let by_name = read_dir(&self.dir, &previous.by_name).await;
        let lookup = self.lookup.clone();
        let resolved: Vec<(String, Vec<IpAddr>)> = stream::iter(by_name.keys().cloned())
            .map(|name| {
                let lookup = lookup.clone();
                async move {
                    let ips = lookup(name.clone()).await;
                    (name, ips)
                }
            })
            .buffer_unordered(LOOKUP_CONCURRENCY)
            .collect()
            .await;
        let mut by_ip = HashMap::new();
        for (name, ips) in resolved {
            for ip in ips {
                by_ip.insert(canonical(ip), name.clone());
            }
        }
        let table = Arc::new(Table { by_name, by_ip });
        match self.table.write() {
            Ok(mut t) => *t = table,
            Err(poisoned) => *poisoned.into_inner() = table,
        }
    }

    /// How many sandboxes have a policy (for logs).
    pub fn len(&self) -> usize {
        self.current().by_name.len()
    }

    /// Whether no sandbox has a policy.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn lookup(table: &Table, ip: IpAddr) -> Option<Arc<AllowList>> {
    table
        .by_ip
        .get(&ip)
        .and_then(|name| table.by_name.get(name))
        .cloned()
}

/// IPv4-mapped IPv6 addresses (from a dual-stack socket) as plain IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Reads every policy file; one that cannot be read keeps its previous list.
async fn read_dir(
    dir: &Path,
    previous: &HashMap<String, Arc<AllowList>>,
) -> HashMap<String, Arc<AllowList>> {
    let mut out = HashMap::new();
    let mut entries = match tokio::fs::read_dir(dir).await {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot read the policy directory; keeping the policies last read");
            return previous.clone();
        }
    };
    while let Ok(Some(entry)) = entries.next_entry().await {
        let file = entry.file_name().to_string_lossy().into_owned();
        let Some(name) = file.strip_suffix(POLICY_SUFFIX) else {
            continue;
        };
        match read_one(&entry.path()).await {
            Ok(list) => {
                out.insert(name.to_string(), Arc::new(list));
            }
            Err(e) => {
                tracing::warn!(file, error = %e, "unreadable policy file; keeping its last policy");
                if let Some(old) = previous.get(name) {
                    out.insert(name.to_string(), old.clone());
                }
            }
        }
    }
    out
}

async fn read_one(path: &Path) -> Result<AllowList, String> {
    let bytes = tokio::fs::read(path).await.map_err(|e| e.to_string())?;
    let file: PolicyFile = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    let (list, rejected) = AllowList::new(&file.allowed);
    if !rejected.is_empty() {
        tracing::warn!(path = %path.display(), ?rejected, "policy entries ignored: not domain names");
    }
    Ok(list)
}

/// Removes a sandbox's policy file (`gateway forget`); absent is a success.
pub fn forget(dir: &Path, sandbox: &str) -> Result<(), String> {
    let file = file_name(sandbox).ok_or_else(|| format!("{sandbox:?} is not a sandbox name"))?;
    match std::fs::remove_file(dir.join(file)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing the policy of {sandbox}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(map: HashMap<String, Vec<IpAddr>>) -> NameLookup {
        let map = Arc::new(map);
        Arc::new(move |name: String| {
            let ips = map.get(&name).cloned().unwrap_or_default();
            Box::pin(async move { ips })
        })
    }

    #[tokio::test]
    async fn a_source_gets_the_list_of_the_sandbox_at_its_address() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("sbx-a.json"), r#"{"allowed":["a.test"]}"#).unwrap();
        std::fs::write(dir.path().join("sbx-b.json"), r#"{"allowed":[]}"#).unwrap();
        let ip_a: IpAddr = "10.9.0.130".parse().unwrap();
        let ip_b: IpAddr = "10.9.0.131".parse().unwrap();
        let policies = Policies::new(
            dir.path(),
            fixed(HashMap::from([
                ("sbx-a".to_string(), vec![ip_a]),
                ("sbx-b".to_string(), vec![ip_b]),
            ])),
        );
        policies.refresh().await;
        assert!(policies.for_source(ip_a).await.unwrap().allows("a.test"));
        assert!(policies.for_source(ip_b).await.unwrap().is_empty());
        let mapped: IpAddr = "::ffff:10.9.0.130".parse().unwrap();
        assert!(policies.for_source(mapped).await.is_some());
        assert!(
            policies
                .for_source("10.9.0.200".parse().unwrap())
                .await
                .is_none(),
            "an address without a policy gets nothing"
        );

        // A half-written file keeps the last list; a removed one drops it.
        std::fs::write(dir.path().join("sbx-a.json"), r#"{"allowed":["#).unwrap();
        std::fs::remove_file(dir.path().join("sbx-b.json")).unwrap();
        policies.refresh().await;
        assert!(policies.for_source(ip_a).await.unwrap().allows("a.test"));
        assert!(policies.for_source(ip_b).await.is_none());
    }

    #[test]
    fn file_names_cannot_escape_the_directory() {
        assert_eq!(file_name("sbx-1").as_deref(), Some("sbx-1.json"));
        assert_eq!(file_name("../etc"), None);
        assert_eq!(file_name("a/b"), None);
        assert_eq!(file_name(".hidden"), None);
    }
}
