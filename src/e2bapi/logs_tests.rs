use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::access::fake::Fake;
use crate::access::lookup;
use crate::metrics::Metrics;
use crate::registry::ProviderHandle;

const LOG: &str = "2026-12-02T08:00:00.000000001Z one\n2026-12-02T08:00:01Z two\r\n\
                   2026-12-02T08:00:02.5Z three two\n";

/// A sandbox of the access layer's fake provider (`capable`: with a logs capability whose
/// lines carry no timestamps).
fn target(capable: bool) -> lookup::Target {
    let provider = Arc::new(Fake {
        capable,
        uploaded: Default::default(),
    });
    let handle = ProviderHandle::new(provider, 1, Duration::from_secs(5), Metrics::new());
    lookup::Target {
        handle,
        id: "sbx-1".into(),
        heartbeat: None,
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

#[test]
fn lines_carry_their_times() {
    let lines = parse(LOG.as_bytes(), "p").unwrap();
    assert_eq!(texts(&lines), ["one", "two", "three two"]);
    assert_eq!(stamp(lines[0].at), "2026-12-02T08:00:00.000000001Z");
    assert_eq!(stamp(lines[2].at), "2026-12-02T08:00:02.500Z");
}

#[tokio::test]
async fn a_provider_without_logs_is_named_never_an_empty_list() {
    let e = read_target(&target(false), &all()).await.unwrap_err();
    assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(e.message.contains("provider fake"), "{e}");
}

#[tokio::test]
async fn a_log_line_without_a_time_is_an_error_naming_the_provider() {
    let e = read_target(&target(true), &all()).await.unwrap_err();
    assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(e.message.contains("provider fake"), "{e}");
    assert!(e.message.contains("line 1"), "{e}");
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
fn limits_are_bounded() {
    assert_eq!(limit(Some(0)).unwrap_err().status, StatusCode::BAD_REQUEST);
    assert_eq!(limit(Some(1 << 40)).unwrap(), MAX_LIMIT);
    assert_eq!(limit(None).unwrap(), DEFAULT_LIMIT);
}
