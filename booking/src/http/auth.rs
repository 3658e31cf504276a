//! The admission proof: booking serves `/events/...` only to requests that carry one, signed with the
//! gateway's key, unexpired, and for the event in the path. It is read from `Authorization: Bearer` or, for
//! browsers coming through the gateway, the `wr_admission` cookie. Checked locally: no store is consulted.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use tokens::{AccountId, AdmissionClaims, TokenError};

use super::AppState;
use super::error::ApiError;
use crate::domain::EventId;

/// Name of the cookie the gateway sets on admission.
pub const ADMISSION_COOKIE: &str = "wr_admission";

/// A verified admission proof (signature, key id, algorithm, expiry, audience, issuer).
pub struct Proof(pub AdmissionClaims);

impl Proof {
    /// The admitted account, if the proof is for `event`.
    pub fn account_for(&self, event: EventId) -> Result<&AccountId, ApiError> {
        if self.0.evt == event.0 {
            Ok(&self.0.sub)
        } else {
            Err(ApiError::forbidden("admission_wrong_event", "the admission proof is for another event"))
        }
    }
}

impl FromRequestParts<AppState> for Proof {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = bearer(parts).or_else(|| cookie(parts, ADMISSION_COOKIE)).ok_or_else(|| {
            ApiError::unauthorized("admission_required", "this request needs an admission proof from the waiting room")
        })?;
        state.keyring.verify_admission(token).map(Proof).map_err(|e| match e {
            TokenError::Expired => ApiError::unauthorized("admission_expired", "the admission proof has expired"),
            other => ApiError::unauthorized("admission_invalid", format!("the admission proof is not valid: {other}")),
        })
    }
}

fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

fn cookie<'a>(parts: &'a Parts, name: &str) -> Option<&'a str> {
    parts
        .headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}
