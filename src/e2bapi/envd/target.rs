//! The sandbox an envd request reaches. The request names it by the `E2b-Sandbox-Id`
//! header, else by its host `{port}-{sandboxID}.{domain}`; it must carry that sandbox's
//! access token, checked in constant time before anything is looked up, so an id alone
//! opens nothing and a token of one sandbox opens no other. The id names the namespace and
//! the object, and the object is reached through the access layer's directory: found by
//! namespace and name, Ready, and confirmed at its provider as that very object's.

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::ENVD_PORT;
use super::error::{Code, EnvdError};
use crate::access::lookup::{Need, Target};
use crate::access::status::AccessError;
use crate::e2bapi::id::{self, SandboxRef};
use crate::e2bapi::ports::error::PortError;
use crate::e2bapi::routes::E2bState;

/// The header naming the sandbox (`E2B_SANDBOX_URL` mode).
const SANDBOX_HEADER: &str = "e2b-sandbox-id";
/// The header carrying the envd access token.
const TOKEN_HEADER: &str = "x-access-token";

/// A request for one sandbox's envd, its token checked.
pub struct EnvdTarget {
    /// The sandbox id.
    pub sid: String,
    /// The Sandbox object it names.
    pub object: SandboxRef,
    /// Its provider and the provider's id.
    pub target: Target,
    /// The API's shared state.
    pub state: E2bState,
}

/// Why a request reaches no envd: envd's own refusal (a bad token, say), or — for a sandbox
/// that is not there (never was, killed, timed out) — the answer of E2B's proxy in front of
/// envd: a 502 "The sandbox was not found", which both SDKs report as the sandbox having
/// stopped (Python's `SandboxNotRunningException`, JS's `TimeoutError`), where envd's own 404
/// would read as "unimplemented" on a Connect stream.
#[derive(Debug)]
pub enum Unreached {
    /// envd refuses the request.
    Envd(EnvdError),
    /// No such sandbox, answered as E2B's proxy does.
    Gone(PortError),
}

impl From<EnvdError> for Unreached {
    fn from(e: EnvdError) -> Self {
        Unreached::Envd(e)
    }
}

impl IntoResponse for Unreached {
    fn into_response(self) -> Response {
        match self {
            Unreached::Envd(e) => e.into_response(),
            Unreached::Gone(e) => e.into_response(),
        }
    }
}

impl FromRequestParts<E2bState> for EnvdTarget {
    type Rejection = Unreached;

    async fn from_request_parts(parts: &mut Parts, s: &E2bState) -> Result<Self, Unreached> {
        let (sid, port) = addressed(&parts.headers, s.site.domain.as_deref())?;
        if port != ENVD_PORT {
            return Err(EnvdError::new(
                Code::NotFound,
                format!("port {port} of sandbox {sid:?} is not envd ({ENVD_PORT})"),
            )
            .into());
        }
        check_token(&parts.headers, &s.site.tokens.token(&sid))?;
        let gone = |detail: String| Unreached::Gone(PortError::not_found(&sid, port, detail));
        let Some(object) = id::parse(&sid) else {
            return Err(gone(format!("{sid:?} is not a sandbox id of this API")));
        };
        let target = match s
            .sandboxes
            .find(&object.namespace, &object.name, Need::Live)
            .await
        {
            Ok(target) => target,
            Err(AccessError::NotFound(m)) => return Err(gone(m)),
            Err(e) => return Err(EnvdError::from(e).into()),
        };
        Ok(EnvdTarget {
            sid,
            object,
            target,
            state: s.clone(),
        })
    }
}

/// The sandbox id and port a request addresses: the `E2b-Sandbox-Id` header (with
/// `E2b-Sandbox-Port`, envd's when absent), else the host under `domain`.
pub fn addressed(headers: &HeaderMap, domain: Option<&str>) -> Result<(String, u16), EnvdError> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(sid) = text(SANDBOX_HEADER) {
        let port = match text("e2b-sandbox-port") {
            Some(p) => p.parse().map_err(|_| {
                EnvdError::new(Code::InvalidArgument, format!("E2b-Sandbox-Port {p:?}"))
            })?,
            None => ENVD_PORT,
        };
        return Ok((sid.to_string(), port));
    }
    let host = text("host").unwrap_or_default();
    from_host(host, domain).ok_or_else(|| {
        EnvdError::new(
            Code::NotFound,
            "no sandbox named: send the E2b-Sandbox-Id header (E2B_SANDBOX_URL) or use the host \
             {port}-{sandboxID}.{domain} under the operator's e2bApi.domain",
        )
    })
}

/// `{port}-{sandboxID}.{domain}[:port]` → the id and the port.
fn from_host(host: &str, domain: Option<&str>) -> Option<(String, u16)> {
    let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
    let label = host.strip_suffix(domain?)?.strip_suffix('.')?;
    let (port, sid) = label.split_once('-')?;
    Some((sid.to_string(), port.parse().ok()?))
}

/// The request's `X-Access-Token` equals `expected`, compared in constant time.
fn check_token(headers: &HeaderMap, expected: &str) -> Result<(), EnvdError> {
    let presented = headers
        .get(TOKEN_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if !expected.is_empty() && bool::from(presented.ct_eq(expected.as_bytes())) {
        Ok(())
    } else {
        Err(EnvdError::new(
            Code::Unauthenticated,
            "missing or invalid X-Access-Token: send the envdAccessToken of this sandbox's \
             create or connect answer",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_header_names_the_sandbox_before_the_host() {
        let h = headers(&[("e2b-sandbox-id", "abc-ns"), ("host", "80-x-ns.e2b.test")]);
        assert_eq!(
            addressed(&h, Some("e2b.test")).unwrap(),
            ("abc-ns".into(), ENVD_PORT)
        );
        let h = headers(&[("e2b-sandbox-id", "abc-ns"), ("e2b-sandbox-port", "8080")]);
        assert_eq!(addressed(&h, None).unwrap().1, 8080);
    }

    #[test]
    fn the_host_names_port_and_sandbox_under_the_domain_only() {
        let h = headers(&[("host", "49983-abcdefghijkl-team-a.e2b.test:443")]);
        assert_eq!(
            addressed(&h, Some("e2b.test")).unwrap(),
            ("abcdefghijkl-team-a".into(), 49983)
        );
        assert!(addressed(&h, Some("other.test")).is_err());
        assert!(addressed(&h, None).is_err());
        let h = headers(&[("host", "x-abc.e2b.test")]);
        assert!(addressed(&h, Some("e2b.test")).is_err());
    }

    #[test]
    fn only_the_exact_token_passes() {
        assert!(check_token(&headers(&[("x-access-token", "t0k")]), "t0k").is_ok());
        let wrong = check_token(&headers(&[("x-access-token", "t0K")]), "t0k").unwrap_err();
        assert_eq!(wrong.code, Code::Unauthenticated);
        assert!(check_token(&HeaderMap::new(), "t0k").is_err());
        assert!(check_token(&HeaderMap::new(), "").is_err());
    }
}
