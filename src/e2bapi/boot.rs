//! What an E2B `templateID` boots, looked up in the key's namespace as the key's
//! ServiceAccount. In this order:
//!
//! 1. a `SandboxWarmPool` of that name: the create is a claim of one of its running members
//!    (cold from the pool's template when none is free);
//! 2. a `SandboxTemplate` of that name;
//! 3. the image the platform team aliased to the id (`e2bApi.templates`).
//!
//! Objects in the namespace come before the operator-wide aliases, as a tenant's own names
//! shadow only its own creates. A pool and a SandboxTemplate of the same name are the usual
//! way to keep a template warm: the pool is taken when its `spec.template.templateRef` names
//! that very template, so the id boots the same filesystem warm or cold. Any other pool of
//! that name is refused (a 400 naming both), since the id would mean two filesystems.
//!
//! A ServiceAccount that may not `get` sandboxwarmpools (a key made before pools) sees no
//! pools: its creates resolve as before, and a "not found" says why pools were not looked at.

use kube::Client;
use kube::api::Api;

use super::error::ApiError;
use super::keys::Tenant;
use super::mapping::Boot;
use crate::api::{SandboxTemplate, SandboxWarmPool};

/// What the key's ServiceAccount found under a template id.
#[derive(Debug, Default)]
pub struct Found {
    /// The pool of that name; `None` when absent or not readable by the key.
    pub pool: Option<SandboxWarmPool>,
    /// Whether the key may read pools at all.
    pub pools_readable: bool,
    /// Whether a SandboxTemplate of that name exists.
    pub template: bool,
}

/// Looks `template` up in the tenant's namespace (both kinds at once) and decides.
pub async fn resolve(
    client: Client,
    tenant: &Tenant,
    aliases: &std::collections::BTreeMap<String, String>,
    template: &str,
) -> Result<Boot, ApiError> {
    let found = match crate::validation::check_dns_label(template) {
        Ok(()) => look_up(client, &tenant.namespace, template).await?,
        Err(_) => Found {
            pools_readable: true,
            ..Found::default()
        },
    };
    choose(template, &found, aliases.get(template), &tenant.namespace)
}

async fn look_up(client: Client, ns: &str, name: &str) -> Result<Found, ApiError> {
    let pools: Api<SandboxWarmPool> = Api::namespaced(client.clone(), ns);
    let templates: Api<SandboxTemplate> = Api::namespaced(client, ns);
    let (pool, template) = tokio::join!(pools.get_opt(name), templates.get_opt(name));
    let template = template
        .map_err(|e| ApiError::from_kube("looking up the SandboxTemplate", e))?
        .is_some();
    let (pool, pools_readable) = match pool {
        Ok(p) => (p, true),
        Err(kube::Error::Api(e)) if e.code == 403 => (None, false),
        Err(e) => return Err(ApiError::from_kube("looking up the SandboxWarmPool", e)),
    };
    Ok(Found {
        pool,
        pools_readable,
        template,
    })
}

/// The decision (pure): see the module's order and collision rule.
pub fn choose(
    template: &str,
    found: &Found,
    alias: Option<&String>,
    ns: &str,
) -> Result<Boot, ApiError> {
    if let Some(pool) = &found.pool {
        let boots = pool.spec.template.template_ref.as_ref().map(|t| &t.name);
        if found.template && boots.map(String::as_str) != Some(template) {
            return Err(ApiError::bad_request(format!(
                "template {template:?} names both a SandboxWarmPool and a SandboxTemplate in \
                 namespace {ns:?}, and the pool does not boot that template (its \
                 spec.template.templateRef is {boots:?}); rename one of them"
            )));
        }
        return Ok(Boot::Pool(template.to_string()));
    }
    if found.template {
        return Ok(Boot::Template(template.to_string()));
    }
    if let Some(image) = alias {
        return Ok(Boot::Image(image.clone()));
    }
    let pools = match found.pools_readable {
        true => "no SandboxWarmPool",
        false => {
            "no SandboxWarmPool visible (the key's ServiceAccount may not get sandboxwarmpools)"
        }
    };
    Err(ApiError::bad_request(format!(
        "template {template:?} not found: {pools} or SandboxTemplate of that name in namespace \
         {ns:?} and no image alias in the operator's e2bApi.templates"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LocalObjectRef, SandboxSpec, SandboxWarmPoolSpec};

    fn pool(template_ref: Option<&str>) -> SandboxWarmPool {
        let template = SandboxSpec {
            template_ref: template_ref.map(|t| LocalObjectRef { name: t.into() }),
            ..SandboxSpec::default()
        };
        SandboxWarmPool::new(
            "py",
            SandboxWarmPoolSpec {
                replicas: 1,
                template,
                progress_deadline_seconds: None,
            },
        )
    }

    fn found(pool: Option<SandboxWarmPool>, template: bool) -> Found {
        Found {
            pool,
            pools_readable: true,
            template,
        }
    }

    fn boot(found: &Found, alias: Option<&str>) -> Result<Boot, ApiError> {
        choose("py", found, alias.map(String::from).as_ref(), "team-a")
    }

    #[test]
    fn a_pool_comes_before_a_template_and_an_alias() {
        let f = found(Some(pool(None)), false);
        assert_eq!(boot(&f, Some("img")).unwrap(), Boot::Pool("py".into()));
        let f = found(None, true);
        assert_eq!(boot(&f, Some("img")).unwrap(), Boot::Template("py".into()));
        let f = found(None, false);
        assert_eq!(boot(&f, Some("img")).unwrap(), Boot::Image("img".into()));
    }

    #[test]
    fn a_pool_and_a_template_of_one_name_agree_or_are_refused() {
        let keeps_it_warm = found(Some(pool(Some("py"))), true);
        assert_eq!(boot(&keeps_it_warm, None).unwrap(), Boot::Pool("py".into()));
        for other in [pool(None), pool(Some("node"))] {
            let e = boot(&found(Some(other), true), None).unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
            assert!(
                e.message
                    .contains("both a SandboxWarmPool and a SandboxTemplate")
            );
        }
    }

    #[test]
    fn not_found_says_when_pools_could_not_be_read() {
        let e = boot(&found(None, false), None).unwrap_err();
        assert!(
            e.message.contains("not found: no SandboxWarmPool or"),
            "{}",
            e.message
        );
        let unreadable = Found::default();
        let e = boot(&unreadable, None).unwrap_err();
        assert!(
            e.message.contains("may not get sandboxwarmpools"),
            "{}",
            e.message
        );
    }
}
