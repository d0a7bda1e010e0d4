//! Public ports: how a sandbox gets a URL that reaches it alone.
//!
//! All sandboxes of a provider are machines of one app, and the Fly Proxy routes a request
//! for a public port of the app only to the machines whose `services` list that port. So each
//! sandbox port gets a public port of its own from the configured range
//! (`firstPublicPort..=lastPublicPort`), and its URL is `http://<publicHost>:<port>`: no other
//! machine serves that port, so nothing else answers it.
//!
//! The port is chosen from a hash of the sandbox's external name and port (so a retried create
//! tends to the same port), skipping every port another machine of the app already uses
//! (read from one listing). Choices are serialised inside the provider, so two creates of one
//! operator never pick the same port; two operators sharing one app and one range could, so
//! give each operator instance its own range or app.

use std::collections::HashSet;

use sha2::{Digest, Sha256};

use super::wire::Machine;

/// Every public port the machines of the app use.
pub(crate) fn taken(machines: &[Machine]) -> HashSet<u16> {
    machines
        .iter()
        .filter(|m| m.state != "destroyed")
        .flat_map(|m| m.read().services)
        .flat_map(|s| s.ports)
        .filter_map(|p| p.port)
        .collect()
}

/// A free port of `first..=last` for `(name, sandbox_port)`, marking it taken; `None` when
/// the range is full.
pub(crate) fn choose(
    taken: &mut HashSet<u16>,
    name: &str,
    sandbox_port: u16,
    first: u16,
    last: u16,
) -> Option<u16> {
    let span = u64::from(last.checked_sub(first)?) + 1;
    let digest = Sha256::digest(format!("{name}:{sandbox_port}").as_bytes());
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    let start = u64::from_be_bytes(head) % span;
    let port = (0..span)
        .map(|i| first + ((start + i) % span) as u16)
        .find(|p| !taken.contains(p))?;
    taken.insert(port);
    Some(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_name_gets_the_same_port_and_taken_ports_are_skipped() {
        let mut none = HashSet::new();
        let a = choose(&mut none.clone(), "sbx-1", 8080, 10_000, 10_009).unwrap();
        assert_eq!(
            choose(&mut none.clone(), "sbx-1", 8080, 10_000, 10_009),
            Some(a)
        );
        let mut taken = HashSet::from([a]);
        let b = choose(&mut taken, "sbx-1", 8080, 10_000, 10_009).unwrap();
        assert_ne!(a, b);
        assert!(taken.contains(&b), "a chosen port is marked taken");
        assert!((10_000..=10_009).contains(&b));
        let _ = choose(&mut none, "x", 1, 1, 1);
    }

    #[test]
    fn a_full_range_has_no_port() {
        let mut taken: HashSet<u16> = (10_000..=10_002).collect();
        assert_eq!(choose(&mut taken, "sbx", 80, 10_000, 10_002), None);
        assert_eq!(choose(&mut HashSet::new(), "sbx", 80, 10, 9), None);
    }
}
