//! A fake provider with the access capabilities, for the handlers' unit tests: `cat` echoes
//! stdin, `exit N` writes to both streams and exits N, the log is two lines, port-forward
//! echoes, and files keep the last upload.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::{mpsc, oneshot};

use crate::provider::stream::*;
use crate::provider::*;

/// Every upload: (path, archive).
pub type Uploads = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// The fake; `capable: false` has no access capability at all.
pub struct Fake {
    pub capable: bool,
    pub uploaded: Uploads,
}

fn receiver_stream(rx: mpsc::Receiver<Bytes>) -> BoxStream<'static, ProviderResult<Bytes>> {
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|b| (Ok(b), rx)) },
    )
    .boxed()
}

#[async_trait]
impl Provider for Fake {
    fn name(&self) -> &str {
        "fake"
    }
    fn kind(&self) -> &'static str {
        "fake"
    }
    async fn create(&self, _: &CreateRequest) -> ProviderResult<SandboxDescriptor> {
        Err(ProviderError::unsupported("fake"))
    }
    async fn describe(&self, _: &str) -> ProviderResult<Option<SandboxDescriptor>> {
        Ok(None)
    }
    async fn find(&self, _: &SandboxQuery) -> ProviderResult<Vec<SandboxDescriptor>> {
        Ok(Vec::new())
    }
    async fn start(&self, _: &str) -> ProviderResult<()> {
        Ok(())
    }
    async fn stop(&self, _: &str) -> ProviderResult<()> {
        Ok(())
    }
    async fn sleep(&self, _: &str) -> ProviderResult<()> {
        Ok(())
    }
    async fn wake(&self, _: &str) -> ProviderResult<()> {
        Ok(())
    }
    async fn destroy(&self, _: &str) -> ProviderResult<()> {
        Ok(())
    }
    async fn exec(&self, _: &str, _: &ExecRequest) -> ProviderResult<ExecOutput> {
        Err(ProviderError::unsupported("fake"))
    }
    fn streaming_exec(&self) -> Option<&dyn StreamingExec> {
        self.capable.then_some(self as &dyn StreamingExec)
    }
    fn logs(&self) -> Option<&dyn Logs> {
        self.capable.then_some(self as &dyn Logs)
    }
    fn port_forward(&self) -> Option<&dyn PortForward> {
        self.capable.then_some(self as &dyn PortForward)
    }
    fn bulk_files(&self) -> Option<&dyn BulkFiles> {
        self.capable.then_some(self as &dyn BulkFiles)
    }
}

async fn run_process(
    argv: Vec<String>,
    mut input: mpsc::Receiver<ExecInput>,
    out: mpsc::Sender<Bytes>,
    err: mpsc::Sender<Bytes>,
    exit: oneshot::Sender<i64>,
) {
    if argv[0] == "exit" {
        let _ = out.send(Bytes::from_static(b"out")).await;
        let _ = err.send(Bytes::from_static(b"err")).await;
        let _ = exit.send(argv[1].parse().unwrap_or(255));
        return;
    }
    while let Some(event) = input.recv().await {
        match event {
            ExecInput::Stdin(b) => {
                let _ = out.send(b).await;
            }
            ExecInput::Resize(s) => {
                let _ = out.send(format!("{}x{}", s.cols, s.rows).into()).await;
            }
            ExecInput::CloseStdin | ExecInput::Signal(_) => break,
        }
    }
    let _ = exit.send(0);
}

#[async_trait]
impl StreamingExec for Fake {
    async fn exec_stream(
        &self,
        _: &str,
        request: &StreamExecRequest,
    ) -> ProviderResult<ExecSession> {
        let (input, input_rx) = mpsc::channel(4);
        let (out, out_rx) = mpsc::channel(4);
        let (err, err_rx) = mpsc::channel(4);
        let (exit, exit_rx) = oneshot::channel();
        tokio::spawn(run_process(request.argv.clone(), input_rx, out, err, exit));
        Ok(ExecSession {
            input,
            stdout: receiver_stream(out_rx),
            stderr: request.tty.is_none().then(|| receiver_stream(err_rx)),
            exit: Box::pin(async move {
                let code = exit_rx
                    .await
                    .map_err(|_| ProviderError::transient("gone"))?;
                Ok(ExitStatus { code })
            }),
        })
    }
}

#[async_trait]
impl Logs for Fake {
    async fn logs(
        &self,
        _: &str,
        request: &LogRequest,
    ) -> ProviderResult<BoxStream<'static, ProviderResult<Bytes>>> {
        let tail = format!("tail={:?}\n", request.tail_lines);
        Ok(futures::stream::iter([Ok(Bytes::from_static(b"line 1\n")), Ok(tail.into())]).boxed())
    }
}

#[async_trait]
impl PortForward for Fake {
    async fn connect(&self, _: &str, port: u16) -> ProviderResult<TunnelStream> {
        if port == 1 {
            return Err(ProviderError::transient("nothing listens on port 1"));
        }
        let (ours, theirs) = tokio::io::duplex(1024);
        tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(theirs);
            let _ = tokio::io::copy(&mut r, &mut w).await;
        });
        Ok(Box::pin(ours))
    }
}

#[async_trait]
impl BulkFiles for Fake {
    async fn export(
        &self,
        _: &str,
        path: &str,
    ) -> ProviderResult<BoxStream<'static, ProviderResult<Bytes>>> {
        if path == "/absent" {
            return Err(ProviderError::not_found("/absent: no such file"));
        }
        Ok(futures::stream::iter([Ok(Bytes::from(format!("tar of {path}")))]).boxed())
    }
    async fn import(&self, _: &str, path: &str, archive: ArchiveStream) -> ProviderResult<()> {
        let archive = archive
            .try_fold(Vec::new(), |mut all, piece| async move {
                all.extend_from_slice(&piece);
                Ok(all)
            })
            .await
            .map_err(|e| ProviderError::invalid(format!("reading the archive: {e}")))?;
        self.uploaded
            .lock()
            .map_err(|_| ProviderError::transient("poisoned"))?
            .push((path.to_string(), archive));
        Ok(())
    }
}
