//! The Fly Sprites provider.
//!
//! A sprite is a persistent Linux VM that the service parks by itself when it idles: first
//! *warm* (suspended, processes frozen), later *cold* (stopped, processes gone, filesystem
//! kept); any request wakes it. There is no call to stop or suspend one on demand, and no
//! image or main process to choose. The sandbox id is the sprite's name (our deterministic
//! external name): every API path is keyed by it.
//!
//! | seam operation | Sprites API call |
//! |---|---|
//! | `create` | `POST /v1/sprites` (`name`, `config`, `environment`, `labels` as `key=value`), then `PUT /v1/sprites/{name}` (`url_settings.auth = sprite`, a private URL), then `POST …/policy/network` when `allowedDomains` is set; a failure after the first call deletes the sprite |
//! | `describe` | `GET /v1/sprites/{name}` (404 → `None`) |
//! | `find` | `GET /v1/sprites?max_results=…&continuation_token=…`, every page, filtered here by labels, states, owner |
//! | `start`, `wake` | `GET /v1/sprites/{name}`, then an exec of `true` (a request wakes the sprite) |
//! | `stop`, `sleep` | `GET /v1/sprites/{name}` (404 → `NotFound`), then `Unsupported`: the API cannot stop or suspend a sprite |
//! | `destroy` | `DELETE /v1/sprites/{name}` (404 = already gone) |
//! | `exec` | the exec WebSocket `GET /v1/sprites/{name}/exec` (see `exec.rs`) |
//! | `port_forward().connect` | `GET /v1/sprites/{name}` (must be running), then the port proxy WebSocket `GET /v1/sprites/{name}/proxy` (see `forward.rs`) |
//! | `streaming_exec().exec_stream` | `GET /v1/sprites/{name}` (must be running), then the exec WebSocket with `tty`/`cols`/`rows`, resize and signal control messages, or `POST …/exec/{session_id}/kill` for a signal when the socket does not take them (see `stream.rs`) |
//! | `files().read_file` | `GET /v1/sprites/{name}/fs/read?path=` |
//! | `files().write_file` | `PUT /v1/sprites/{name}/fs/write?path=&mode=&mkdirParents=true` |
//! | `files().list_dir` | `GET /v1/sprites/{name}/fs/list?path=` |
//! | `files().delete_path` | `DELETE /v1/sprites/{name}/fs/delete?path=&recursive=true` |
//! | `bulk_files().export` | exec of `tar -cf -` over the exec WebSocket (see `bulk.rs`) |
//! | `bulk_files().import` | the sanitised archive on the stdin of an exec of `tar -xf - --no-same-owner` |
//! | [`SpritesProvider::replace_egress`] | `POST /v1/sprites/{name}/policy/network` |
//! | `egress().egress_verdict` | `GET /v1/sprites/{name}/policy/network`: the policy the service enforces (see `egress.rs`) |
//!
//! States: `running` → Running, `warm` → Sleeping, `cold` → Stopped (Creating while the sprite
//! has never run: `last_running_at` is absent, rule 6). `started_at` is `last_running_at`;
//! without it, `Never` only from the sprite's own record (`GET`) of a sprite that is not
//! running or warm, `Unknown` from a listing (which need not carry the field). Sprite labels
//! cannot change after create, so no first start is recorded beside the service's own.
//!
//! Capabilities it does not have are `None`: hibernation (the service alone decides when a
//! sprite is suspended, and whether processes survive depends on how long it idled, which the
//! API does not let us choose), volumes, templates (a checkpoint restores only its own sprite,
//! so templates go through the controller-side templates service and a store), set_resources,
//! capacity, events, logs (no main process).

mod bulk;
mod client;
mod convert;
mod egress;
mod exec;
mod files;
mod forward;
mod frames;
mod settings;
mod stream;
mod wire;

use async_trait::async_trait;
use reqwest::Method;

pub use settings::{DEFAULT_API_URL, SpritesSettings};

use self::client::Client;
use self::wire::{CreateSprite, SpriteInfo, SpriteList, UpdateSprite, UrlSettings};
use super::labels::OWNER;
use super::{
    BulkFiles, Egress, EgressPolicy, ErrorKind, ExecOutput, ExecRequest, Files, Provider,
    ProviderError, ProviderResult, SandboxDescriptor, SandboxQuery,
};

/// Sprites per page asked of the listing.
const PAGE_SIZE: usize = 100;

/// The Fly Sprites provider.
#[derive(Debug)]
pub struct SpritesProvider {
    name: String,
    client: Client,
}

impl SpritesProvider {
    /// A provider named `name` at the API `api_url`, authenticating with `token`.
    pub fn new(name: &str, api_url: &str, token: String) -> ProviderResult<Self> {
        Ok(SpritesProvider {
            name: name.to_string(),
            client: Client::new(api_url, token)?,
        })
    }

    /// A provider from its settings, resolving the token reference (an unreadable reference
    /// names the setting, never the value).
    pub fn from_settings(name: &str, settings: &SpritesSettings) -> ProviderResult<Self> {
        let token = settings
            .token
            .resolve_for("sprites.token")
            .map_err(|e| ProviderError::invalid(e.to_string()))?;
        Self::new(name, &settings.api_url, token)
    }

    /// Replaces a sprite's egress allow-list in place (`POST …/policy/network`): `None`
    /// unrestricted, `Some([])` nothing, else those domains only. The controller calls this
    /// when `spec.egress.allowedDomains` changes on a Sandbox of a Sprites provider; the
    /// sprite is neither recreated nor restarted.
    pub async fn replace_egress(&self, id: &str, allowed: Option<&[String]>) -> ProviderResult<()> {
        let policy = convert::policy(allowed);
        let request = self
            .client
            .request(Method::POST, &format!("/v1/sprites/{id}/policy/network"))
            .json(&policy);
        self.client
            .send(
                request,
                &format!("setting the network policy of sandbox {id}"),
            )
            .await
            .map(|_| ())
    }

    async fn get(&self, id: &str) -> ProviderResult<Option<SpriteInfo>> {
        let request = self
            .client
            .request(Method::GET, &format!("/v1/sprites/{id}"));
        match self
            .client
            .json::<SpriteInfo>(request, &format!("describing sandbox {id}"))
            .await
        {
            Ok(info) => Ok(Some(info)),
            Err(e) if e.is(ErrorKind::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn must_exist(&self, id: &str) -> ProviderResult<SpriteInfo> {
        self.get(id)
            .await?
            .ok_or_else(|| ProviderError::not_found(format!("sandbox {id}: no such sprite")))
    }

    /// Wakes a sprite the way the API offers: by using it.
    async fn touch(&self, id: &str) -> ProviderResult<()> {
        self.must_exist(id).await?;
        let out = self
            .exec(id, &ExecRequest::shell("true", exec::HELPER_TIMEOUT))
            .await?;
        match out.exit_code {
            0 => Ok(()),
            code => Err(ProviderError::transient(format!(
                "waking sandbox {id}: a no-op command exited with {code}"
            ))),
        }
    }

    /// The steps of create after the sprite exists: private URL, egress policy.
    async fn configure(&self, id: &str, allowed: Option<&[String]>) -> ProviderResult<()> {
        let body = UpdateSprite {
            url_settings: UrlSettings {
                auth: Some("sprite".into()),
            },
        };
        let request = self
            .client
            .request(Method::PUT, &format!("/v1/sprites/{id}"))
            .json(&body);
        self.client
            .send(request, &format!("making the URL of sandbox {id} private"))
            .await?;
        if allowed.is_some() {
            self.replace_egress(id, allowed).await?;
        }
        Ok(())
    }

    fn refuse_power(&self, id: &str, what: &str) -> ProviderError {
        ProviderError::unsupported(format!(
            "{what} sandbox {id}: Fly Sprites has no call to {what} a sprite; the service \
             suspends an idle sprite by itself. Leave spec.state at Running"
        ))
    }
}

/// Whether a descriptor matches a query (labels all equal, state among those asked, owner).
fn matches(d: &SandboxDescriptor, query: &SandboxQuery) -> bool {
    query.labels.iter().all(|(k, v)| d.labels.get(k) == Some(v))
        && query.states.as_ref().is_none_or(|s| s.contains(&d.state))
        && query
            .owner
            .as_ref()
            .is_none_or(|o| d.labels.get(OWNER) == Some(o))
}

#[async_trait]
impl Provider for SpritesProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        "sprites"
    }

    async fn create(
        &self,
        request: &crate::provider::CreateRequest,
    ) -> ProviderResult<SandboxDescriptor> {
        let config = convert::check_request(request)?;
        let body = CreateSprite {
            name: &request.name,
            config,
            environment: &request.env,
            labels: convert::labels(request)?,
        };
        let what = format!("creating sandbox {}", request.name);
        let call = self.client.request(Method::POST, "/v1/sprites").json(&body);
        self.client.send(call, &what).await?;
        if let Err(e) = self
            .configure(&request.name, request.allowed_domains.as_deref())
            .await
        {
            // Never hand out a sprite whose URL or egress is not what was asked.
            let _ = self.destroy(&request.name).await;
            return Err(e.context(&what));
        }
        let info = self.must_exist(&request.name).await?;
        Ok(convert::descriptor(&info, convert::Answer::Record))
    }

    async fn describe(&self, id: &str) -> ProviderResult<Option<SandboxDescriptor>> {
        Ok(self
            .get(id)
            .await?
            .as_ref()
            .map(|i| convert::descriptor(i, convert::Answer::Record)))
    }

    async fn find(&self, query: &SandboxQuery) -> ProviderResult<Vec<SandboxDescriptor>> {
        let mut found = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut params = vec![("max_results", PAGE_SIZE.to_string())];
            if let Some(t) = &token {
                params.push(("continuation_token", t.clone()));
            }
            let request = self
                .client
                .request(Method::GET, "/v1/sprites")
                .query(&params);
            let page: SpriteList = self.client.json(request, "listing sprites").await?;
            found.extend(
                page.sprites
                    .iter()
                    .map(|i| convert::descriptor(i, convert::Answer::Listing))
                    .filter(|d| matches(d, query)),
            );
            match (page.has_more, page.next_continuation_token) {
                (true, Some(next)) if token.as_ref() != Some(&next) => token = Some(next),
                (true, _) => {
                    return Err(ProviderError::transient(
                        "listing sprites: the API said more pages follow but gave no new \
                         continuation token; the listing is incomplete",
                    ));
                }
                (false, _) => return Ok(found),
            }
        }
    }

    async fn start(&self, id: &str) -> ProviderResult<()> {
        self.touch(id).await
    }

    async fn stop(&self, id: &str) -> ProviderResult<()> {
        self.must_exist(id).await?;
        Err(self.refuse_power(id, "stop"))
    }

    async fn sleep(&self, id: &str) -> ProviderResult<()> {
        self.must_exist(id).await?;
        Err(self.refuse_power(id, "sleep"))
    }

    async fn wake(&self, id: &str) -> ProviderResult<()> {
        self.touch(id).await
    }

    async fn destroy(&self, id: &str) -> ProviderResult<()> {
        let request = self
            .client
            .request(Method::DELETE, &format!("/v1/sprites/{id}"));
        match self
            .client
            .send(request, &format!("destroying sandbox {id}"))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is(ErrorKind::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn exec(&self, id: &str, request: &ExecRequest) -> ProviderResult<ExecOutput> {
        exec::run(&self.client, id, request, None).await
    }

    fn files(&self) -> Option<&dyn Files> {
        Some(self)
    }

    fn bulk_files(&self) -> Option<&dyn BulkFiles> {
        Some(self)
    }

    fn egress(&self) -> Option<&dyn Egress> {
        Some(self)
    }

    fn egress_policy(&self) -> Option<&dyn EgressPolicy> {
        Some(self)
    }

    fn streaming_exec(&self) -> Option<&dyn super::stream::StreamingExec> {
        Some(self)
    }

    /// `None`: a sprite has no main process (create refuses `command`), so there is no
    /// process log to read or follow; an exec session's own output is all the API streams.
    fn logs(&self) -> Option<&dyn super::stream::Logs> {
        None
    }

    fn port_forward(&self) -> Option<&dyn super::stream::PortForward> {
        Some(self)
    }
}

#[async_trait]
impl EgressPolicy for SpritesProvider {
    async fn set_allowed_domains(
        &self,
        id: &str,
        allowed: Option<&[String]>,
    ) -> ProviderResult<()> {
        self.replace_egress(id, allowed).await
    }
}
