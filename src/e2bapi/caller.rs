//! The extractors every handler starts with: [`Caller`] authenticates the `X-API-KEY` (401
//! first, before anything else is looked at) and gives the key's namespace's Sandbox API as
//! its ServiceAccount; [`Target`] adds the Sandbox that the path's id names (404 for an id
//! of another namespace, or of an object this API did not make), and counts as traffic for
//! the sandbox's idleness (recorded, never a wake: reading about a sandbox is not using it).

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use kube::Api;

use super::error::ApiError;
use super::keys::Tenant;
use super::routes::E2bState;
use super::{id, view};
use crate::api::Sandbox;

/// The header carrying the API key.
const KEY_HEADER: &str = "x-api-key";

/// An authenticated request.
pub struct Caller {
    /// Who the key speaks for.
    pub tenant: Tenant,
    /// Sandboxes in the key's namespace, as its ServiceAccount.
    pub api: Api<Sandbox>,
    /// The API's shared state.
    pub state: E2bState,
}

impl FromRequestParts<E2bState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &E2bState) -> Result<Self, ApiError> {
        let presented = parts.headers.get(KEY_HEADER).and_then(|v| v.to_str().ok());
        let tenant = s.keys.authenticate(presented).await?;
        let api = Api::namespaced(s.clients.client(&tenant)?, &tenant.namespace);
        Ok(Caller {
            tenant,
            api,
            state: s.clone(),
        })
    }
}

/// An authenticated request about one of the key's sandboxes.
pub struct Target {
    /// The caller.
    pub caller: Caller,
    /// The id in the path.
    pub sid: String,
    /// The Sandbox it names.
    pub sandbox: Sandbox,
}

impl FromRequestParts<E2bState> for Target {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &E2bState) -> Result<Self, ApiError> {
        let caller = Caller::from_request_parts(parts, s).await?;
        let Path(sid) = Path::<String>::from_request_parts(parts, s)
            .await
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let sandbox = find(&caller.api, &caller.tenant, &sid).await?;
        crate::access::activity::record(&s.operator, &sandbox);
        Ok(Target {
            caller,
            sid,
            sandbox,
        })
    }
}

/// The key's Sandbox behind `sid`.
async fn find(api: &Api<Sandbox>, tenant: &Tenant, sid: &str) -> Result<Sandbox, ApiError> {
    let object = id::parse(sid)
        .filter(|r| r.namespace == tenant.namespace)
        .ok_or_else(|| ApiError::sandbox_not_found(sid))?;
    api.get_opt(&object.name)
        .await
        .map_err(|e| ApiError::from_kube("reading the Sandbox", e))?
        .filter(view::live)
        .ok_or_else(|| ApiError::sandbox_not_found(sid))
}
