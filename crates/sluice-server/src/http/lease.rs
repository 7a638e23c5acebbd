//! `POST`/`DELETE /v1/lease`: capacity leases for clients that decide locally (the JSON in
//! and out, and the answers).

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse as _;
use serde::{Deserialize, Serialize};

use super::{HttpResponse, HttpState, JSON, Refusal};
use crate::engine::Descriptor;
use crate::lease::{LeaseError, LeaseGrant, LeaseRequest};

pub(super) async fn lease_acquire(
    State(s): State<HttpState>,
    body: Result<Bytes, BytesRejection>,
) -> HttpResponse {
    let request = match body
        .map_err(Refusal::body)
        .and_then(|b| parse_lease(&b, true))
    {
        Ok(r) => r,
        Err(refusal) => return refusal.into_response(),
    };
    let now = s.clock.now();
    match s.leases.acquire(&s.engine, now, &request) {
        Ok(grant) => ([(header::CONTENT_TYPE, JSON)], lease_json(&grant)).into_response(),
        Err(e) => lease_refusal(&e).into_response(),
    }
}

pub(super) async fn lease_release(
    State(s): State<HttpState>,
    body: Result<Bytes, BytesRejection>,
) -> HttpResponse {
    let request = match body
        .map_err(Refusal::body)
        .and_then(|b| parse_lease(&b, false))
    {
        Ok(r) => r,
        Err(refusal) => return refusal.into_response(),
    };
    let now = s.clock.now();
    if s.leases.release(
        now,
        &request.domain,
        &request.descriptor,
        &request.client_id,
    ) {
        StatusCode::NO_CONTENT.into_response()
    } else {
        Refusal {
            status: StatusCode::NOT_FOUND,
            message: "this client holds no lease on this descriptor".to_owned(),
        }
        .into_response()
    }
}

fn lease_refusal(e: &LeaseError) -> Refusal {
    let status = match e {
        LeaseError::UnknownDomain(_) | LeaseError::NoRule(_) => StatusCode::NOT_FOUND,
        LeaseError::TooManyClients(_) | LeaseError::TooManyResources(_) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        _ => StatusCode::BAD_REQUEST,
    };
    Refusal {
        status,
        message: e.to_string(),
    }
}

/// The lease request of a `/v1/lease` body (`wants` required when `acquiring`).
///
/// # Errors
/// A one-line reason: malformed JSON, an unknown field, not exactly one descriptor, or
/// `wants` missing when acquiring. (Values are checked by [`Leases`].)
pub fn lease_request_from_json(body: &[u8], acquiring: bool) -> Result<LeaseRequest, String> {
    let r: JsonLease =
        serde_json::from_slice(body).map_err(|e| format!("malformed lease request JSON: {e}"))?;
    let descriptor = match (r.descriptor, r.descriptors) {
        (Some(d), None) => d,
        (None, Some(mut ds)) if ds.len() == 1 => ds.remove(0),
        _ => {
            return Err(
                "a lease is for one descriptor: give \"descriptor\": {\"entries\": [...]} \
                 (or \"descriptors\" with exactly one)"
                    .to_owned(),
            );
        }
    };
    let wants = match (r.wants, acquiring) {
        (Some(w), _) => w,
        (None, false) => 0.0,
        (None, true) => return Err("missing \"wants\": the rate wanted, per second".to_owned()),
    };
    Ok(LeaseRequest {
        domain: r.domain,
        descriptor: Descriptor::new(descriptor.entries.into_iter().map(|e| (e.key, e.value))),
        client_id: r.client_id,
        wants,
    })
}

fn parse_lease(body: &[u8], acquiring: bool) -> Result<LeaseRequest, Refusal> {
    lease_request_from_json(body, acquiring).map_err(Refusal::bad)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonLease {
    domain: String,
    descriptor: Option<JsonLeaseDescriptor>,
    descriptors: Option<Vec<JsonLeaseDescriptor>>,
    #[serde(alias = "clientId")]
    client_id: String,
    wants: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonLeaseDescriptor {
    entries: Vec<JsonEntryStrict>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntryStrict {
    key: String,
    value: String,
}

#[derive(Serialize)]
struct JsonLeaseGrant {
    rate: f64,
    expires_in_ms: u64,
    refresh_in_ms: u64,
    limit: Option<f64>,
    share: Option<f64>,
    policy: &'static str,
    clients: usize,
}

/// The JSON answer of `POST /v1/lease` for `grant`. Durations are rounded down to whole
/// milliseconds, so a client that counts them from before it sent the request never holds
/// a grant longer than the node does.
#[must_use]
pub fn lease_json(grant: &LeaseGrant) -> String {
    let json = JsonLeaseGrant {
        rate: grant.rate_per_second(),
        expires_in_ms: grant.expires_in / 1_000_000,
        refresh_in_ms: grant.refresh_in / 1_000_000,
        limit: grant.limit_per_second,
        share: grant.share_per_second,
        policy: crate::config::RuleLeases::policy_name(grant.policy),
        clients: grant.clients,
    };
    // Numbers and strings only: serialising cannot fail.
    serde_json::to_string(&json).unwrap_or_default()
}
