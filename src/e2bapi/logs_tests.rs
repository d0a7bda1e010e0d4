use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;

use super::*;
use crate::access::lookup;
use crate::metrics::Metrics;
use crate::provider::stream::Logs;
use crate::provider::*;
use crate::registry::ProviderHandle;

const LOG: &str = "2026-12-02T08:00:00.000000001Z one\n2026-12-02T08:00:01Z two\r\n\
                   2026-12-02T08:00:02.5Z three two\n";

/// A provider whose logs capability answers [`LOG`], or that has none.
struct Printer {
    logs: bool,
}

#[async_trait]
impl Provider for Printer {
    fn name(&self) -> &str {
        "printer"
    }
    fn kind(&self) -> &'static str {
        "printer"
    }
    async fn create(&self, _: &CreateRequest) -> ProviderResult<SandboxDescriptor> {
        Err(ProviderError::unsupported("printer"))
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
        Err(ProviderError::unsupported("printer"))
    }
    fn logs(&self) -> Option<&dyn Logs> {
        self.logs.then_some(self as &dyn Logs)
    }
}

#[async_trait]
impl Logs for Printer {
    async fn logs(
        &self,
        _: &str,
        request: &LogRequest,
    ) -> ProviderResult<BoxStream<'static, ProviderResult<Bytes>>> {
        assert!(request.timestamps && !request.follow, "{request:?}");
        // Split inside a line: the reader joins chunks before it splits lines.
        let (a, b) = LOG.split_at(40);
        Ok(futures::stream::iter([Ok(Bytes::from(a)), Ok(Bytes::from(b))]).boxed())
    }
}

fn target(logs: bool) -> lookup::Target {
    let provider = Arc::new(Printer { logs });
    let handle = ProviderHandle::new(provider, 1, Duration::from_secs(5), Metrics::new());
    lookup::Target {
        handle,
        id: "sbx-1".into(),
    }
}

fn all() -> Pick {
    Pick {
        from: None,
        backward: false,
        limit: DEFAULT_LIMIT,
        search: None,
    }
}

fn texts(lines: &[Line]) -> Vec<&str> {
    lines.iter().map(|l| l.text.as_str()).collect()
}

#[tokio::test]
async fn lines_come_from_the_providers_log_with_their_times() {
    let lines = read_target(&target(true), &all()).await.unwrap();
    assert_eq!(texts(&lines), ["one", "two", "three two"]);
    assert_eq!(stamp(lines[0].at), "2026-12-02T08:00:00.000000001Z");
    assert_eq!(stamp(lines[2].at), "2026-12-02T08:00:02.500Z");
}

#[tokio::test]
async fn a_provider_without_logs_is_named_never_an_empty_list() {
    let e = read_target(&target(false), &all()).await.unwrap_err();
    assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(e.message.contains("provider printer"), "{e}");
}

#[test]
fn start_cursor_direction_limit_and_search_select() {
    let lines = parse(LOG.as_bytes(), "p").unwrap();
    let at = |s: &str| Some(DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc));
    let from = Pick {
        from: at("2026-12-02T08:00:01Z"),
        ..all()
    };
    assert_eq!(texts(&select(lines.clone(), &from)), ["two", "three two"]);
    let back = Pick {
        backward: true,
        limit: 1,
        ..from.clone()
    };
    assert_eq!(texts(&select(lines.clone(), &back)), ["two"]);
    let newest = Pick {
        backward: true,
        limit: 2,
        ..all()
    };
    assert_eq!(texts(&select(lines.clone(), &newest)), ["three two", "two"]);
    let found = Pick {
        search: Some("two".into()),
        limit: 1,
        ..all()
    };
    assert_eq!(texts(&select(lines, &found)), ["two"]);
}

#[test]
fn a_line_without_a_time_and_a_zero_limit_are_errors() {
    let e = parse(b"no time here\n", "printer").unwrap_err();
    assert!(e.message.contains("printer"), "{e}");
    assert_eq!(limit(Some(0)).unwrap_err().status, StatusCode::BAD_REQUEST);
    assert_eq!(limit(Some(1 << 40)).unwrap(), MAX_LIMIT);
    assert_eq!(limit(None).unwrap(), DEFAULT_LIMIT);
}
