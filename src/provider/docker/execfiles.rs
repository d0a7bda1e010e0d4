//! File I/O through `exec`, for sandboxes under gVisor (see `runtime`).
//!
//! gVisor's kernel keeps its own view of the container's files: an archive `PUT` into a
//! running runsc container is not seen inside (worse, the directory it touched stops
//! working there), and an archive `GET` can miss what the workload wrote. So under gVisor
//! every file operation runs inside the sandbox, through its own kernel, by the shell file
//! protocol every exec-based provider shares ([`shellfs`](crate::provider::shellfs)); Docker
//! only says how to run one command. The exec streams are binary, so bytes cross unchanged.

use std::time::Duration;

use async_trait::async_trait;

use super::DockerProvider;
use crate::provider::shellfs::{Shell, Transport};
use crate::provider::{ExecOutput, ExecRequest, ProviderResult};

#[async_trait]
impl Shell for DockerProvider {
    fn transport(&self) -> Transport {
        Transport::Binary
    }

    async fn shell_exec(
        &self,
        id: &str,
        argv: Vec<String>,
        stdin: Option<&[u8]>,
        timeout: Duration,
    ) -> ProviderResult<ExecOutput> {
        let request = ExecRequest {
            argv,
            cwd: None,
            env: Default::default(),
            timeout,
        };
        self.run_exec_with_stdin(id, &request, stdin).await
    }
}
