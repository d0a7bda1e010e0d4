//! The core seam on E2B: create, describe, find, the power verbs, destroy and exec (the
//! calls each makes are tabled in the module docs of `e2b`).

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::api::metadata_filter;
use super::convert::{self, NAME_KEY};
use super::{E2bProvider, Inner, lock};
use super::{envd, process};
use crate::provider::labels::{MANAGED_BY, OWNER};
use crate::provider::stream::{Logs, StreamingExec};
use crate::provider::{
    BulkFiles, CreateRequest, EgressPolicy, ErrorKind, ExecOutput, ExecRequest, Files, Hibernation,
    Provider, ProviderError, ProviderEvents, ProviderResult, SandboxDescriptor, SandboxQuery,
    SandboxState,
};

/// Output held in memory for one exec, stdout and stderr together.
pub(crate) const MAX_EXEC_OUTPUT: usize = 64 * 1024 * 1024;

impl Inner {
    /// The E2B states that can hold sandboxes in `states`; `None` = all.
    fn e2b_states(states: Option<&Vec<SandboxState>>) -> Option<Vec<&'static str>> {
        let states = states?;
        let mut out = Vec::new();
        if states.contains(&SandboxState::Running) {
            out.push("running");
        }
        if states.contains(&SandboxState::Sleeping) || states.contains(&SandboxState::Stopped) {
            out.push("paused");
        }
        Some(out)
    }

    pub(crate) async fn find(
        &self,
        query: &SandboxQuery,
    ) -> ProviderResult<Vec<SandboxDescriptor>> {
        let mut filters = query.labels.clone();
        if let Some(owner) = &query.owner {
            filters.insert(OWNER.into(), owner.clone());
        }
        if let Some(instance) = filters.get(MANAGED_BY) {
            self.learn(instance);
        }
        let states = Self::e2b_states(query.states.as_ref());
        if states.as_ref().is_some_and(Vec::is_empty) {
            // E2B has no sandbox in a state it does not have (e.g. `Creating`): looked, none.
            return Ok(Vec::new());
        }
        let listed = self
            .api
            .list(&metadata_filter(&filters), states.as_deref().unwrap_or(&[]))
            .await?;
        for l in &listed {
            self.own(&l.sandbox_id, l.metadata.as_ref());
        }
        for l in &listed {
            self.own(&l.sandbox_id, l.metadata.as_ref());
        }
        let mut found: Vec<SandboxDescriptor> = listed
            .iter()
            .map(|l| {
                let domain = self.domain_of(&l.sandbox_id);
                convert::descriptor(l, &domain, self.is_stopped(&l.sandbox_id))
            })
            .filter(|d| query.states.as_ref().is_none_or(|s| s.contains(&d.state)))
            .collect();
        found.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(found)
    }

    pub(crate) async fn describe(&self, id: &str) -> ProviderResult<Option<SandboxDescriptor>> {
        let Some(detail) = self.api.detail(id).await? else {
            self.forget(id);
            return Ok(None);
        };
        self.own(id, detail.listed.metadata.as_ref());
        if let Some(instance) = detail
            .listed
            .metadata
            .as_ref()
            .and_then(|m| m.get(MANAGED_BY))
        {
            self.learn(instance);
        }
        if detail.listed.state == "running" {
            lock(&self.stopped).remove(id);
        }
        self.remember(id, detail.envd_access_token.clone(), detail.domain.clone());
        let default = self.settings.default_domain();
        Ok(Some(convert::detail_descriptor(
            &detail,
            &default,
            self.is_stopped(id),
        )))
    }

    async fn create(&self, request: &CreateRequest) -> ProviderResult<SandboxDescriptor> {
        let body = convert::create_body(request, &self.settings)?;
        let same_name = BTreeMap::from([(NAME_KEY.to_string(), request.name.clone())]);
        if let Some(existing) = self
            .api
            .list(&metadata_filter(&same_name), &[])
            .await?
            .first()
        {
            return Err(ProviderError::conflict(format!(
                "E2B sandbox {} already carries the name {:?}; find it by its owner-uid label \
                 and adopt it instead of creating another",
                existing.sandbox_id, request.name
            )));
        }
        self.learn(&request.owner.instance);
        let created = self.api.create(&body).await.map_err(|e| {
            if e.is(ErrorKind::NotFound) {
                ProviderError::invalid(format!(
                    "{}; set spec.image to an E2B template id or alias that exists in this \
                     account (default {:?})",
                    e.message(),
                    self.settings.default_template()
                ))
            } else {
                e.context(format!("sandbox {:?}", request.name))
            }
        })?;
        let id = created.sandbox_id;
        self.remember(&id, created.envd_access_token, created.domain);
        let described = self.describe(&id).await?;
        self.notify(&id, "create");
        described.ok_or_else(|| {
            ProviderError::transient(format!(
                "E2B sandbox {id} ({:?}) was created but was gone when read back",
                request.name
            ))
        })
    }

    /// `POST /connect`: resumes a paused sandbox (`true`) or confirms a running one.
    pub(crate) async fn connect(&self, id: &str) -> ProviderResult<bool> {
        let (resumed, created) = self.api.connect(id, self.settings.timeout_secs).await?;
        lock(&self.stopped).remove(id);
        self.remember(id, created.envd_access_token, created.domain);
        if resumed {
            self.notify(id, "resume");
        }
        Ok(resumed)
    }

    /// The current E2B state of `id` (`NotFound` when gone).
    pub(crate) async fn e2b_state(&self, id: &str) -> ProviderResult<String> {
        let detail =
            self.api.detail(id).await?.ok_or_else(|| {
                ProviderError::not_found(format!("E2B sandbox {id} does not exist"))
            })?;
        Ok(detail.listed.state)
    }

    async fn stop(&self, id: &str) -> ProviderResult<()> {
        match self.api.pause(id, false).await {
            Ok(()) => {}
            Err(e) if e.is(ErrorKind::Conflict) => {
                // Already paused. With its memory, it is asleep, not stopped: stop it for real.
                if self.e2b_state(id).await? != "paused" {
                    return Err(e);
                }
                if !self.is_stopped(id) {
                    self.connect(id).await?;
                    self.api.pause(id, false).await?;
                }
            }
            Err(e) => return Err(e),
        }
        lock(&self.stopped).insert(id.to_string());
        self.notify(id, "stop");
        Ok(())
    }

    pub(crate) async fn exec_request(
        &self,
        id: &str,
        request: &ExecRequest,
    ) -> ProviderResult<ExecOutput> {
        let Some(process) = process::config(&request.argv, &request.env, request.cwd.as_deref())
        else {
            return Err(ProviderError::invalid(format!(
                "exec in E2B sandbox {id}: the command is empty; give at least the program to run"
            )));
        };
        let start = process::start_request(process, false, None);
        let context = format!("exec {:?} in E2B sandbox {id}", request.argv);
        let call = self.envd_call(id, |access| {
            let (start, context) = (&start, context.clone());
            async move {
                let events = self
                    .envd
                    .start(id, &access, start, Some(request.timeout), context.clone())
                    .await?;
                envd::collect(events, MAX_EXEC_OUTPUT, &context).await
            }
        });
        let collected = tokio::time::timeout(request.timeout, call)
            .await
            .map_err(|_| {
                ProviderError::transient(format!(
                    "{context}: did not finish within its timeout of {:.1} s",
                    request.timeout.as_secs_f64()
                ))
            })??;
        Ok(ExecOutput {
            stdout: collected.stdout,
            stderr: collected.stderr,
            exit_code: collected.exit_code.unwrap_or(-1),
        })
    }
}

#[async_trait]
impl Provider for E2bProvider {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn kind(&self) -> &'static str {
        "e2b"
    }

    async fn create(&self, request: &CreateRequest) -> ProviderResult<SandboxDescriptor> {
        self.inner.create(request).await
    }

    async fn describe(&self, id: &str) -> ProviderResult<Option<SandboxDescriptor>> {
        self.inner.describe(id).await
    }

    async fn find(&self, query: &SandboxQuery) -> ProviderResult<Vec<SandboxDescriptor>> {
        self.inner.find(query).await
    }

    /// Resumes a paused sandbox; a running one is already started.
    async fn start(&self, id: &str) -> ProviderResult<()> {
        self.inner.connect(id).await.map(drop)
    }

    /// Pauses without memory: the processes end, the filesystem stays.
    async fn stop(&self, id: &str) -> ProviderResult<()> {
        self.inner.stop(id).await
    }

    async fn sleep(&self, id: &str) -> ProviderResult<()> {
        self.inner.hibernate(id).await.map(drop)
    }

    async fn wake(&self, id: &str) -> ProviderResult<()> {
        self.inner.resume(id).await.map(drop)
    }

    async fn destroy(&self, id: &str) -> ProviderResult<()> {
        if self.inner.api.kill(id).await? {
            self.inner.notify(id, "destroy");
        }
        self.inner.forget(id);
        Ok(())
    }

    async fn exec(&self, id: &str, request: &ExecRequest) -> ProviderResult<ExecOutput> {
        self.inner.exec_request(id, request).await
    }

    fn hibernation(&self) -> Option<&dyn Hibernation> {
        Some(self)
    }

    fn files(&self) -> Option<&dyn Files> {
        Some(self)
    }

    fn egress_policy(&self) -> Option<&dyn EgressPolicy> {
        Some(self)
    }

    fn bulk_files(&self) -> Option<&dyn BulkFiles> {
        Some(self)
    }

    fn events(&self) -> Option<&dyn ProviderEvents> {
        Some(self)
    }

    fn streaming_exec(&self) -> Option<&dyn StreamingExec> {
        Some(self)
    }

    /// `None`: E2B has no main process whose output could be followed. A sandbox runs its
    /// template's start command, and `GET /sandboxes/{id}/logs` returns the sandbox's own
    /// log entries (from a start time, up to a limit, with no follow), not a process's
    /// stdout and stderr; commands run through envd are streamed by [`StreamingExec`].
    fn logs(&self) -> Option<&dyn Logs> {
        None
    }
}

impl E2bProvider {
    /// Replaces the sandbox's egress policy in place (`PUT /sandboxes/{id}/network`):
    /// `None` unrestricted, `Some([])` nothing, else only the named domains. The sandbox must
    /// be running (`Conflict` otherwise): E2B applies the rules to a live sandbox, and a
    /// resumed one keeps the rules it was paused with until this is called again.
    pub async fn set_allowed_domains(
        &self,
        id: &str,
        allowed: Option<Vec<String>>,
    ) -> ProviderResult<()> {
        let body = convert::network(allowed.as_deref());
        self.inner.api.update_network(id, &body).await
    }

    /// The allow-list E2B holds for the sandbox: `None` when its policy is unrestricted (or
    /// not one this provider writes), `Some(list)` when everything else is denied.
    pub async fn allowed_domains(&self, id: &str) -> ProviderResult<Option<Vec<String>>> {
        let detail =
            self.inner.api.detail(id).await?.ok_or_else(|| {
                ProviderError::not_found(format!("E2B sandbox {id} does not exist"))
            })?;
        Ok(convert::allowed_domains(detail.network.as_ref()))
    }
}

/// The seam's form of [`E2bProvider::set_allowed_domains`]: E2B replaces a live sandbox's
/// network rules in place.
#[async_trait]
impl EgressPolicy for E2bProvider {
    async fn set_allowed_domains(
        &self,
        id: &str,
        allowed: Option<&[String]>,
    ) -> ProviderResult<()> {
        E2bProvider::set_allowed_domains(self, id, allowed.map(<[String]>::to_vec)).await
    }
}
