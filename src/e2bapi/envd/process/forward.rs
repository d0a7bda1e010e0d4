//! Requests for another replica's process, forwarded to it. The pid names the replica
//! ([`peers::pid_tag`]); the request goes there unchanged — path, headers (the sandbox's
//! access token among them, so the peer authenticates it the same way) and body, streamed
//! both ways (`Connect`'s server stream, `StreamInput`'s client stream) — marked so that
//! the peer answers it itself and never forwards again.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::Response;

use super::peers::{self, Peers};
use super::table::{Process, ProcessTable};
use super::wire::Selector;
use crate::e2bapi::envd::error::{Code, EnvdError};

/// The header marking a request one replica forwarded to another.
pub const FORWARDED: &str = "x-sandbox-operator-envd-forwarded";
/// The header naming the sandbox (the host that may have named it is the peer's now).
const SANDBOX_HEADER: &str = "e2b-sandbox-id";

/// How long a peer may take to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// This replica's processes and its peers: the process service's state.
#[derive(Clone)]
pub struct Replica {
    /// The processes this replica started.
    pub table: ProcessTable,
    peers: Arc<Peers>,
    http: reqwest::Client,
}

/// The path and headers of a request, to forward it.
pub struct Call {
    path: String,
    headers: HeaderMap,
}

impl Call {
    /// Its headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// Whether another replica forwarded it (then it is answered here, whatever it names).
    pub fn forwarded(&self) -> bool {
        self.headers.contains_key(FORWARDED)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Call {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Call {
            path: parts.uri.path().to_string(),
            headers: parts.headers.clone(),
        })
    }
}

/// A process reached.
pub enum Reached {
    /// This replica's.
    Here(Arc<Process>),
    /// Another replica's, which answered.
    Answered(Response),
}

/// Where a process is served.
pub enum Owner {
    /// By this replica.
    Here,
    /// By the live replica at this URL.
    Peer(String),
}

impl Replica {
    /// The process service's state for the replica registered as `peers`.
    pub fn new(peers: Arc<Peers>) -> Result<Replica, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()?;
        Ok(Replica {
            table: ProcessTable::new(peers.tag()),
            peers,
            http,
        })
    }

    /// Where the process `selector` names is served. A pid carries its replica's tag;
    /// a tag names a process of this replica (tags are not looked up elsewhere).
    pub async fn owner(&self, call: &Call, selector: &Selector) -> Result<Owner, EnvdError> {
        let Selector::Pid(pid) = *selector else {
            return Ok(Owner::Here);
        };
        let tag = peers::pid_tag(pid);
        if call.forwarded() || tag == 0 || tag == self.peers.tag() {
            return Ok(Owner::Here);
        }
        match self.peers.url_of(tag).await? {
            Some(url) => Ok(Owner::Peer(url)),
            None => Err(stopped(pid, tag)),
        }
    }

    /// The answer of the replica serving `selector`'s process, or `None` when that is this
    /// one.
    pub async fn elsewhere(
        &self,
        call: &Call,
        sid: &str,
        selector: &Selector,
        body: bytes::Bytes,
    ) -> Result<Option<Response>, EnvdError> {
        match self.owner(call, selector).await? {
            Owner::Here => Ok(None),
            Owner::Peer(url) => self.forward(&url, call, sid, body.into()).await.map(Some),
        }
    }

    /// The process `selector` names in sandbox `sid`, or the answer of the replica holding
    /// it.
    pub async fn reach(
        &self,
        call: &Call,
        sid: &str,
        selector: &Selector,
        body: bytes::Bytes,
    ) -> Result<Reached, EnvdError> {
        match self.elsewhere(call, sid, selector, body).await? {
            Some(answer) => Ok(Reached::Answered(answer)),
            None => self.table.find(sid, selector).map(Reached::Here),
        }
    }

    /// The URLs of the other live replicas, unless `call` was forwarded (then it is this
    /// replica's alone to answer).
    pub async fn others(&self, call: &Call) -> Result<Vec<String>, EnvdError> {
        if call.forwarded() {
            return Ok(Vec::new());
        }
        self.peers.others().await
    }

    /// `call` with `body`, sent to the replica at `url` for sandbox `sid`; its answer,
    /// streamed.
    pub async fn forward(
        &self,
        url: &str,
        call: &Call,
        sid: &str,
        body: reqwest::Body,
    ) -> Result<Response, EnvdError> {
        let mut headers = call.headers.clone();
        for hop in [
            header::HOST,
            header::CONTENT_LENGTH,
            header::TRANSFER_ENCODING,
            header::CONNECTION,
            header::ACCEPT_ENCODING,
            header::TE,
            header::UPGRADE,
        ] {
            headers.remove(hop);
        }
        let sid = HeaderValue::from_str(sid)
            .map_err(|_| EnvdError::new(Code::InvalidArgument, "the sandbox id"))?;
        headers.insert(HeaderName::from_static(SANDBOX_HEADER), sid);
        headers.insert(
            HeaderName::from_static(FORWARDED),
            HeaderValue::from_static("1"),
        );
        let answer = self
            .http
            .post(format!("{}{}", url.trim_end_matches('/'), call.path))
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| {
                EnvdError::new(
                    Code::Unavailable,
                    format!(
                        "the operator replica at {url} holding this process did not answer: {e}"
                    ),
                )
            })?;
        Ok(relayed(answer))
    }
}

/// A peer's answer as ours: status, headers (but the framing) and the body as it streams.
fn relayed(answer: reqwest::Response) -> Response {
    let status = answer.status();
    let mut headers = answer.headers().clone();
    for hop in [
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::CONNECTION,
    ] {
        headers.remove(hop);
    }
    let mut response = Response::new(Body::from_stream(answer.bytes_stream()));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// The not_found answer for a process of a replica that stopped.
fn stopped(pid: u32, tag: u16) -> EnvdError {
    EnvdError::new(
        Code::NotFound,
        format!(
            "process {pid} ran in operator replica {tag}, which stopped: a process lives in \
             the replica that started it and ends with it; start it again"
        ),
    )
}
