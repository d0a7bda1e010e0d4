//! Which sandbox port a port URL request reaches, and whether it may: the id names the
//! namespace and the object; a sandbox not made with `allowPublicTraffic: true` admits only a
//! request carrying its traffic access token (compared in constant time, checked before
//! anything wakes the sandbox, never logged); then the access layer's directory finds it
//! Ready and confirmed at its provider — recording the traffic for idleness and waking a
//! sandbox that idleness parked, as envd requests do — and the provider's port-forward
//! capability opens one connection to the port.

use axum::http::HeaderMap;
use kube::Api;
use subtle::ConstantTimeEq;

use super::error::PortError;
use crate::access::lookup::{Need, Target};
use crate::api::Sandbox;
use crate::e2bapi::id::{self, SandboxRef};
use crate::e2bapi::mapping::restricts_traffic;
use crate::e2bapi::routes::E2bState;
use crate::e2bapi::view::live;
use crate::provider::ErrorKind;
use crate::provider::stream::TunnelStream;

/// The header carrying a sandbox's traffic access token.
pub const TRAFFIC_HEADER: &str = "e2b-traffic-access-token";

/// An admitted request's sandbox and port.
pub struct PortTarget {
    /// The sandbox id.
    pub sid: String,
    /// The port inside the sandbox.
    pub port: u16,
    /// Its provider and the provider's id.
    pub target: Target,
}

/// Admits a request for `port` of sandbox `sid`.
pub async fn admit(
    s: &E2bState,
    headers: &HeaderMap,
    sid: &str,
    port: u16,
) -> Result<PortTarget, PortError> {
    let object =
        id::parse(sid).ok_or_else(|| PortError::not_found(sid, port, "not a sandbox id"))?;
    let sandbox = read(s, &object, sid, port).await?;
    if restricts_traffic(&sandbox) && !token_matches(headers, &s.site.tokens.traffic_token(sid)) {
        return Err(PortError::forbidden(sid, port, TRAFFIC_HEADER));
    }
    let target = s
        .sandboxes
        .find(&object.namespace, &object.name, Need::Live)
        .await
        .map_err(|e| PortError::from_access(sid, port, &e))?;
    forwardable(sid, port, target)
}

/// The target, when its provider has the port-forward capability; a 502 naming the
/// provider and the capability otherwise.
fn forwardable(sid: &str, port: u16, target: Target) -> Result<PortTarget, PortError> {
    if target.handle.provider.port_forward().is_none() {
        return Err(PortError::no_port_forward(sid, port, target.handle.name()));
    }
    Ok(PortTarget {
        sid: sid.to_string(),
        port,
        target,
    })
}

/// The Sandbox this API made under the id (its traffic setting is on the object).
async fn read(
    s: &E2bState,
    object: &SandboxRef,
    sid: &str,
    port: u16,
) -> Result<Sandbox, PortError> {
    let api: Api<Sandbox> = Api::namespaced(s.operator.clone(), &object.namespace);
    let found = api.get_opt(&object.name).await.map_err(|e| {
        let e = crate::access::status::AccessError::Unavailable(format!(
            "cannot read the Sandbox: {e}"
        ));
        PortError::from_access(sid, port, &e)
    })?;
    found
        .filter(live)
        .ok_or_else(|| PortError::not_found(sid, port, "no sandbox of this API has this id"))
}

/// The request's traffic token equals `expected`, compared in constant time.
fn token_matches(headers: &HeaderMap, expected: &str) -> bool {
    let presented = headers
        .get(TRAFFIC_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    !expected.is_empty() && bool::from(presented.ct_eq(expected.as_bytes()))
}

/// One connection to the port: a sandbox gone at its provider is not found; anything else
/// (nothing listening, unreachable) is E2B's closed port, with the provider's words.
pub async fn connect(t: &PortTarget) -> Result<TunnelStream, PortError> {
    let handle = &t.target.handle;
    let Some(forward) = handle.provider.port_forward() else {
        return Err(PortError::no_port_forward(&t.sid, t.port, handle.name()));
    };
    handle
        .call("port_forward", forward.connect(&t.target.id, t.port))
        .await
        .map_err(|e| match e.kind() {
            ErrorKind::NotFound => PortError::not_found(&t.sid, t.port, e.to_string()),
            _ => PortError::closed(&t.sid, t.port, e.to_string()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::fake::Fake;
    use crate::metrics::Metrics;
    use crate::registry::ProviderHandle;
    use axum::http::{HeaderValue, StatusCode};
    use std::sync::Arc;
    use std::time::Duration;

    fn target(capable: bool) -> Target {
        let fake = Fake {
            capable,
            uploaded: Default::default(),
        };
        let handle = ProviderHandle::new(Arc::new(fake), 4, Duration::from_secs(5), Metrics::new());
        Target {
            handle,
            id: "c1".into(),
            heartbeat: None,
        }
    }

    #[tokio::test]
    async fn a_provider_without_port_forward_is_a_502_naming_it_and_the_capability() {
        let Err(e) = forwardable("abc-ns", 8080, target(false)) else {
            panic!("a provider without port-forward must be refused");
        };
        assert_eq!(e.status, StatusCode::BAD_GATEWAY);
        assert!(e.message.contains("\"fake\""), "{e}");
        assert!(e.message.contains("port-forward capability"), "{e}");
    }

    #[tokio::test]
    async fn a_port_with_nothing_listening_is_the_closed_port_502_naming_it() {
        let closed = forwardable("abc-ns", 1, target(true)).unwrap();
        let Err(e) = connect(&closed).await else {
            panic!("nothing listens on port 1 of the fake");
        };
        assert_eq!(e.status, StatusCode::BAD_GATEWAY);
        assert_eq!(e.message, super::super::error::PORT_CLOSED);
        assert_eq!(e.port, 1);
        assert!(e.detail.unwrap_or_default().contains("port 1"));
        let open = forwardable("abc-ns", 8080, target(true)).unwrap();
        assert!(connect(&open).await.is_ok());
    }

    #[test]
    fn only_the_exact_traffic_token_passes() {
        let mut h = HeaderMap::new();
        assert!(!token_matches(&h, "t0k"));
        h.insert(TRAFFIC_HEADER, HeaderValue::from_static("t0k"));
        assert!(token_matches(&h, "t0k"));
        assert!(!token_matches(&h, "t0K"));
        assert!(!token_matches(&h, "t0kx"));
        assert!(!token_matches(&h, ""));
    }
}
