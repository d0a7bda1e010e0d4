//! Loopback ports for what a test publishes on the host: a double's public service ports, a
//! registry a test stops and starts again.
//!
//! Why not "bind port 0 and take what the kernel gives": that port comes from the kernel's
//! ephemeral range, where every outgoing connection of the busy test suite also takes its
//! source port. A port picked there can be taken by an unrelated connection before it is
//! bound again (Docker then fails with "address already in use"), and a connect to a
//! loopback port of that range with nothing listening can even connect to itself. So the
//! block is picked below the range, where only listeners live, and checked free.

use std::net::TcpListener;

/// Where blocks start: above the test cluster's fixed listeners (kubelets 10248–10260, the
/// registry 15000, the apiserver 16443, etcd 23790 and 23800), though every port is checked.
const LOW: u16 = 24_000;
/// Linux's default `ip_local_port_range` starts at 32768; blocks end below it.
const EPHEMERAL_START: u16 = 32_768;

/// The first of `len` consecutive ports below the ephemeral range that are free to bind now
/// on every address (so on loopback too). Random, so concurrent tests rarely pick overlapping blocks.
pub fn quiet_block(len: u16) -> u16 {
    assert!(
        len > 0 && len < EPHEMERAL_START - LOW,
        "a block of {len} ports"
    );
    for _ in 0..1_000 {
        let first = LOW + fastrand::u16(0..EPHEMERAL_START - LOW - len);
        if (first..first + len).all(|p| TcpListener::bind(("0.0.0.0", p)).is_ok()) {
            return first;
        }
    }
    panic!("no {len} free loopback ports in {LOW}..{EPHEMERAL_START}");
}

/// One free loopback port below the ephemeral range.
pub fn quiet_port() -> u16 {
    quiet_block(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_below_the_ephemeral_range_and_free() {
        let first = quiet_block(50);
        assert!((LOW..EPHEMERAL_START - 50).contains(&first), "{first}");
        for p in first..first + 50 {
            TcpListener::bind(("0.0.0.0", p)).expect("free");
        }
    }
}
