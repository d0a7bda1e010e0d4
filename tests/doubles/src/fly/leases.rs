//! Machine leases: an exclusive lock on modifying one machine, identified by a nonce the
//! holder sends in `fly-machine-lease-nonce`. While a lease is live, every mutation without
//! its nonce is refused with 409 (see `MachineRec::check_lease`).

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use chrono::{Duration, Utc};
use serde_json::{Value, json};

use super::Shared;
use super::faults::lock;
use super::machines::{NONCE_HEADER, parse_body, query_pairs};
use super::store::{ApiError, ApiResult, LeaseRec, MachineRec, random_id};
use super::wire::{LeaseBody, LeaseData, LeaseRequest};

/// TTL of a lease whose request names none, in seconds.
const DEFAULT_TTL: u64 = 30;

fn body_of(m: &MachineRec, lease: &LeaseRec) -> LeaseBody {
    LeaseBody {
        status: "success".into(),
        data: LeaseData {
            nonce: lease.nonce.clone(),
            expires_at: lease.expires.timestamp(),
            owner: "sandbox-double".into(),
            version: m.instance_id.clone(),
            description: lease.description.clone(),
        },
    }
}

fn header_nonce(headers: &HeaderMap) -> Option<&str> {
    headers.get(NONCE_HEADER).and_then(|v| v.to_str().ok())
}

/// `POST .../lease` (`ttl` in the body or the query): a new lease, or a refresh of the one the
/// caller holds (its nonce in the header). 409 while someone else holds one.
pub async fn acquire(
    State(shared): State<Arc<Shared>>,
    Path((app, id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<LeaseBody>> {
    let request: LeaseRequest = parse_body(&body)?;
    let query_ttl = query_pairs(&raw)
        .into_iter()
        .find(|(k, _)| k == "ttl")
        .and_then(|(_, v)| v.parse::<u64>().ok());
    let ttl = request.ttl.or(query_ttl).unwrap_or(DEFAULT_TTL).max(1);
    let now = Utc::now();
    let mut store = lock(&shared.store);
    let m = store.machine_mut(&app, &id)?;
    let mine = header_nonce(&headers);
    if let Some(held) = m.live_lease(now)
        && Some(held.nonce.as_str()) != mine
    {
        return Err(ApiError::conflict(format!(
            "lease currently held by another client ({}), expires at {}",
            held.description,
            held.expires.to_rfc3339()
        )));
    }
    let nonce = match m.live_lease(now) {
        Some(held) => held.nonce.clone(),
        None => random_id(32),
    };
    let lease = LeaseRec {
        nonce,
        expires: now + Duration::seconds(ttl as i64),
        description: request
            .description
            .unwrap_or_else(|| "sandbox-double client".into()),
    };
    m.lease = Some(lease.clone());
    Ok(Json(body_of(m, &lease)))
}

/// `GET .../lease`: the live lease, or 404.
pub async fn show(
    State(shared): State<Arc<Shared>>,
    Path((app, id)): Path<(String, String)>,
) -> ApiResult<Json<LeaseBody>> {
    let store = lock(&shared.store);
    let m = store.machine(&app, &id)?;
    let lease = m
        .live_lease(Utc::now())
        .ok_or_else(|| ApiError::not_found(format!("no lease on machine {id}")))?;
    Ok(Json(body_of(m, lease)))
}

/// `DELETE .../lease` with the nonce: releases it. Releasing a lease someone else holds is
/// 409; releasing when none is held succeeds.
pub async fn release(
    State(shared): State<Arc<Shared>>,
    Path((app, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let mut store = lock(&shared.store);
    let m = store.machine_mut(&app, &id)?;
    if let Some(held) = m.live_lease(Utc::now()) {
        if Some(held.nonce.as_str()) != header_nonce(&headers) {
            return Err(ApiError::conflict(
                "lease is held by another client; send its nonce in fly-machine-lease-nonce",
            ));
        }
        m.lease = None;
    }
    Ok(Json(json!({"ok": true})))
}
