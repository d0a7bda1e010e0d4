//! The label that ties every Docker object a double creates to the process running it.
//!
//! A double removes its containers and volumes on `shutdown` and (best effort) when dropped,
//! but a test process that is killed, or aborts, runs neither. `tests/cluster/gc.sh` (run at
//! the end of `make test`) therefore removes every container and volume carrying this label
//! whose process no longer runs, and never one whose process is alive: another test run may
//! be using it. The key is the one the harness puts on test namespaces.

/// Label key: the pid of the process that created the object.
pub const TEST_PID_LABEL: &str = "test.sandboxes.dev/pid";

/// The `(key, value)` of [`TEST_PID_LABEL`] for this process.
pub fn pid_label() -> (String, String) {
    (TEST_PID_LABEL.to_string(), std::process::id().to_string())
}
