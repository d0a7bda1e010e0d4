//! The controller-side templates service: every template operation the controllers issue,
//! on any provider, through the provider's own capabilities only.
//!
//! A provider keeps its templates in one of two homes ([`Home`]):
//!
//! - **native** — it commits images itself (`Provider::templates()` is `Some`, Docker). The
//!   service captures, looks up and removes through that capability, and shares a template
//!   through the provider's configured S3 store: *publish* boots a helper sandbox from the
//!   template and captures its paths into the store over `exec`; *fetch* restores the
//!   archive into a fresh helper (the restore is the security boundary) and commits that, with
//!   the owner labels of the object that asked, so the sweeper can claim it once that object
//!   is gone;
//! - **store** — it has no image commit (Fly Machines, E2B). Its templates ARE archives in
//!   its store: a capture runs over `exec` into the store, a sandbox "from" a template is
//!   created from the manifest's base image and the archive is restored into it after start
//!   ([`TemplateService::restore`]), and publishing is inherent.
//!
//! One client per configured store, shared by every provider that names it. The archive bytes
//! never pass through the operator: they move between a sandbox and the store over presigned
//! URLs.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::manifest::{self, Access, Keys, Manifest};
use super::store::TemplateStore;
use super::transfer::{self, Limits};
use crate::provider::labels::{Owner, ensure_owned};
use crate::provider::{
    CommitRequest, Provider, ProviderError, ProviderResult, Template, Templates, validate,
};

/// Where a provider's templates live.
pub enum Home<'a> {
    /// The provider commits images itself; `store` is where they are shared, when it names one.
    Native {
        /// The provider's template capability.
        templates: &'a dyn Templates,
        /// Its shared store, if configured.
        store: Option<&'a TemplateStore>,
    },
    /// The provider has no image commit: its templates are archives in this store.
    Store(&'a TemplateStore),
}

/// How a sandbox boots from a template on its provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Boot {
    /// Created from the provider's own template (`CreateRequest::template`).
    Native,
    /// Created from `image` (the provider's default when `None`), then the template's archive
    /// is restored into it after start, before it is handed out.
    Restore {
        /// The manifest's base image.
        image: Option<String>,
    },
}

/// The templates service (see the module docs).
#[derive(Debug, Default)]
pub struct TemplateService {
    /// One client per configured store, by store name.
    stores: BTreeMap<String, Arc<TemplateStore>>,
    /// The store each provider names, by provider name.
    assigned: BTreeMap<String, String>,
    limits: Limits,
}

impl TemplateService {
    /// A service without stores, with these transfer limits.
    pub fn new(limits: Limits) -> Self {
        TemplateService {
            limits,
            ..TemplateService::default()
        }
    }

    /// Adds a store client, under its settings' name.
    pub fn add_store(&mut self, store: Arc<TemplateStore>) {
        self.stores.insert(store.settings().name.clone(), store);
    }

    /// Says that `provider` keeps (or shares) its templates in the store named `store`.
    pub fn assign(&mut self, provider: &str, store: &str) {
        self.assigned
            .insert(provider.to_string(), store.to_string());
    }

    /// The transfer limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The store `provider` names, if any.
    pub fn store_of(&self, provider: &str) -> Option<&Arc<TemplateStore>> {
        self.stores.get(self.assigned.get(provider)?)
    }

    /// Where `provider` keeps templates. `Unsupported` (naming the setting) for a provider
    /// without image commit that names no store: it cannot hold templates at all.
    pub fn home<'a>(&'a self, provider: &'a dyn Provider) -> ProviderResult<Home<'a>> {
        let store = self.store_of(provider.name()).map(Arc::as_ref);
        match (provider.templates(), store) {
            (Some(templates), store) => Ok(Home::Native { templates, store }),
            (None, Some(store)) => Ok(Home::Store(store)),
            (None, None) => Err(ProviderError::unsupported(format!(
                "provider {:?} cannot commit images, so its templates live in an S3 template store, \
                 and it names none; set templateStore on that provider in the operator configuration",
                provider.name()
            ))),
        }
    }

    /// Captures `request.capture_paths` of a running sandbox as template `request.template_id`
    /// (replacing an earlier capture), labelled with `request.owner`. In a store, the capture
    /// belongs to the owner's namespace, is shared with `shared_with`, and never replaces a
    /// template of another namespace.
    pub async fn commit(
        &self,
        provider: &dyn Provider,
        request: &CommitRequest,
        shared_with: &[String],
    ) -> ProviderResult<Template> {
        match self.home(provider)? {
            Home::Native { templates, .. } => templates.commit(request).await,
            Home::Store(store) => {
                let source = provider
                    .describe(&request.sandbox_id)
                    .await?
                    .ok_or_else(|| {
                        ProviderError::not_found(format!(
                            "sandbox {} does not exist, so template {} cannot be captured from it",
                            request.sandbox_id, request.template_id
                        ))
                    })?;
                let (image, limits) = (source.image, self.limits);
                let m =
                    transfer::capture(provider, store, request, image, shared_with, limits).await?;
                Ok(from_manifest(store, m, false))
            }
        }
    }

    /// Looks a template up where the provider keeps it. `Ok(None)` only when it is absent
    /// (rule 3); a store template is in use while a restore of it is in flight, and when that
    /// cannot be told (rule 4).
    pub async fn get(
        &self,
        provider: &dyn Provider,
        template_id: &str,
    ) -> ProviderResult<Option<Template>> {
        match self.home(provider)? {
            Home::Native { templates, .. } => templates.get_template(template_id).await,
            Home::Store(store) => {
                let Some(m) = transfer::manifest(store, template_id).await? else {
                    return Ok(None);
                };
                let in_use = self.restoring(store, template_id).await;
                Ok(Some(from_manifest(store, m, in_use)))
            }
        }
    }

    /// Whether a restore of a store template is in flight; `true` when the leases cannot be
    /// read (rule 4).
    async fn restoring(&self, store: &TemplateStore, template_id: &str) -> bool {
        let keys = Keys::new(&store.settings().prefix, template_id);
        match store.list(&keys.leases()).await {
            Ok(leases) => {
                let times: Vec<_> = leases.iter().map(|l| l.last_modified).collect();
                manifest::has_live_lease(&times, self.limits.lease_ttl_secs(), Utc::now())
            }
            Err(e) => {
                tracing::warn!(template = template_id, error = %e, "template use unknown; reporting in use");
                true
            }
        }
    }

    /// Removes a template from where the provider keeps it (absent = success; in use =
    /// `Conflict`). A native template's published copy is [`TemplateService::unpublish`]ed
    /// separately: it may belong to someone else.
    pub async fn remove(&self, provider: &dyn Provider, template_id: &str) -> ProviderResult<()> {
        match self.home(provider)? {
            Home::Native { templates, .. } => templates.remove_template(template_id).await,
            Home::Store(store) => transfer::remove(store, template_id, self.limits).await,
        }
    }

    /// Whether templates on `provider` are in its shared store by nature (no image commit).
    pub fn always_published(&self, provider: &dyn Provider) -> bool {
        matches!(self.home(provider), Ok(Home::Store(_)))
    }

    /// Copies a native template into the provider's shared store (see the module docs), owned
    /// by the namespace of the template's owner labels and shared with `shared_with`; a copy
    /// another namespace owns is never replaced. A store template is there already.
    /// `Unsupported` when the provider names no store.
    pub async fn publish(
        &self,
        provider: &dyn Provider,
        template_id: &str,
        shared_with: &[String],
    ) -> ProviderResult<()> {
        let (templates, store) = match self.home(provider)? {
            Home::Store(_) => return Ok(()),
            Home::Native { templates, store } => (templates, self.shared(provider, store)?),
        };
        validate::resource_name("template id", template_id).map_err(ProviderError::invalid)?;
        let template = templates.get_template(template_id).await?.ok_or_else(|| {
            ProviderError::not_found(format!(
                "template {template_id} does not exist on provider {:?}, so it cannot be published; \
                 capture it first",
                provider.name()
            ))
        })?;
        transfer::publish_template(provider, store, &template, shared_with, self.limits)
            .await
            .map(|_| ())
    }

    /// Removes a native template's copy from the shared store (a restore in flight holds it
    /// back with `Conflict`). Refused for a store template: the copy IS the template.
    pub async fn unpublish(
        &self,
        provider: &dyn Provider,
        template_id: &str,
    ) -> ProviderResult<()> {
        match self.home(provider)? {
            Home::Native { store, .. } => {
                let store = self.shared(provider, store)?;
                transfer::remove(store, template_id, self.limits).await
            }
            Home::Store(_) => Err(ProviderError::invalid(format!(
                "provider {:?} keeps its templates only in its template store, so template \
                 {template_id} cannot be unpublished; delete its SandboxTemplate instead",
                provider.name()
            ))),
        }
    }

    /// Brings a template from the shared store onto the provider, labelled with `owner`:
    /// restored into a fresh helper and committed (native), or simply looked up (store).
    /// `Ok(None)` when the store does not have it; `Invalid` ([`transfer::NOT_SHARED`]) when
    /// another namespace owns it and does not share it with `owner`'s.
    pub async fn fetch(
        &self,
        provider: &dyn Provider,
        template_id: &str,
        owner: &Owner,
    ) -> ProviderResult<Option<Template>> {
        match self.home(provider)? {
            Home::Store(store) => {
                let namespace = &owner.namespace;
                match transfer::manifest_for(store, template_id, namespace, Access::Read).await? {
                    Some(_) => self.get(provider, template_id).await,
                    None => Ok(None),
                }
            }
            Home::Native { store, .. } => {
                let store = self.shared(provider, store)?;
                transfer::fetch_into(provider, store, template_id, owner, None, self.limits).await
            }
        }
    }

    /// Whether `owner`'s namespace may fetch `template_id` from the provider's store: the
    /// refusal [`TemplateService::fetch`] would end with, after one small read (the
    /// manifest); `Ok` when the namespace may, when the store does not have the template
    /// (the fetch reports that), or when the provider names no store. What a reconcile
    /// checks before it starts a fetch in the background.
    pub async fn may_fetch(
        &self,
        provider: &dyn Provider,
        template_id: &str,
        owner: &Owner,
    ) -> ProviderResult<()> {
        let store = match self.home(provider)? {
            Home::Store(store)
            | Home::Native {
                store: Some(store), ..
            } => store,
            Home::Native { store: None, .. } => return Ok(()),
        };
        let namespace = &owner.namespace;
        transfer::manifest_for(store, template_id, namespace, Access::Read)
            .await
            .map(|_| ())
    }

    /// How a sandbox on `provider` boots from `template_id`, bringing a native template that
    /// is not on the provider from the shared store first (owned by `owner`, the template's
    /// object). `Ok(None)` when it is nowhere — never a plain-image boot. A store template
    /// of another namespace that is not shared with `owner`'s is refused, as in `fetch`.
    pub async fn boot(
        &self,
        provider: &dyn Provider,
        template_id: &str,
        owner: &Owner,
    ) -> ProviderResult<Option<Boot>> {
        match self.home(provider)? {
            Home::Native { templates, store } => {
                if let Some(t) = templates.get_template(template_id).await? {
                    // The id comes from the SandboxTemplate's status: boot only its own.
                    let field = "SandboxTemplate status.templateId";
                    ensure_owned(field, template_id, &t.labels, &owner.uid)?;
                    return Ok(Some(Boot::Native));
                }
                let Some(store) = store else {
                    return Ok(None);
                };
                let fetched =
                    transfer::fetch_into(provider, store, template_id, owner, None, self.limits)
                        .await?;
                Ok(fetched.map(|_| Boot::Native))
            }
            Home::Store(store) => {
                let namespace = &owner.namespace;
                let m = transfer::manifest_for(store, template_id, namespace, Access::Read).await?;
                Ok(m.map(|m| Boot::Restore {
                    image: m.base_image,
                }))
            }
        }
    }

    /// Restores a store template into the running sandbox `sandbox_id` (rule 11: only the
    /// manifest's capture paths, no escapes, no setuid/setgid). On `Err` the sandbox holds a
    /// partial or refused restore: the caller destroys it instead of handing it out.
    pub async fn restore(
        &self,
        provider: &dyn Provider,
        sandbox_id: &str,
        template_id: &str,
    ) -> ProviderResult<Manifest> {
        let Home::Store(store) = self.home(provider)? else {
            return Err(ProviderError::invalid(format!(
                "provider {:?} creates sandboxes from its own templates; template {template_id} is \
                 never restored into one",
                provider.name()
            )));
        };
        transfer::restore(provider, sandbox_id, store, template_id, self.limits)
            .await?
            .ok_or_else(|| {
                ProviderError::not_found(format!(
                    "template {template_id} is no longer in the template store of provider {:?}",
                    provider.name()
                ))
            })
    }

    /// Rewrites who a stored template is shared with, in place (no recapture), when `owner`'s
    /// namespace owns it. `Ok(false)` when the store does not have it. This is how a change of
    /// `spec.sharedWith` (including a revocation) reaches the store without a new capture.
    pub async fn share(
        &self,
        provider: &dyn Provider,
        template_id: &str,
        owner: &Owner,
        shared_with: &[String],
    ) -> ProviderResult<bool> {
        let store = match self.home(provider)? {
            Home::Store(store) => store,
            Home::Native { store, .. } => self.shared(provider, store)?,
        };
        transfer::share(store, template_id, &owner.namespace, shared_with).await
    }

    /// The shared store of a native provider, or `Unsupported` naming the setting.
    fn shared<'a>(
        &self,
        provider: &dyn Provider,
        store: Option<&'a TemplateStore>,
    ) -> ProviderResult<&'a TemplateStore> {
        store.ok_or_else(|| {
            ProviderError::unsupported(format!(
                "provider {:?} names no template store, so its templates cannot be shared; set \
                 templateStore on that provider in the operator configuration",
                provider.name()
            ))
        })
    }
}

/// A store template as the seam describes templates.
fn from_manifest(store: &TemplateStore, m: Manifest, in_use: bool) -> Template {
    let keys = Keys::new(&store.settings().prefix, &m.id);
    Template {
        reference: store.reference(&keys.archive()),
        created_at: DateTime::parse_from_rfc3339(&m.created_at)
            .ok()
            .map(|t| t.with_timezone(&Utc)),
        size_bytes: Some(m.size_bytes),
        label: m.label,
        labels: m.labels,
        capture_paths: m.capture_paths,
        base_image: m.base_image,
        in_use,
        id: m.id,
    }
}
