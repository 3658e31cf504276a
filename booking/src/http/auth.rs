//! The admission proof: booking serves `/events/...` only to requests that carry one, signed with the
//! gateway's key, unexpired, and for the event in the path. It is read from `Authorization: Bearer` or, for
//! browsers coming through the gateway, the `wr_admission` cookie (`tokens::find_admission_proof`). Checked
//! locally: no store is consulted.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use tokens::{AccountId, AdmissionClaims, AdmissionRefusal};

use super::AppState;
use super::error::ApiError;
use crate::domain::EventId;

/// A verified admission proof (signature, key id, algorithm, expiry, audience, issuer).
pub struct Proof(pub Arc<AdmissionClaims>);

impl Proof {
    /// The admitted account, if the proof is for `event`. An id no event can have is a bad path (400), as the
    /// gateway answers it, not a proof for another event (403).
    pub fn account_for(&self, event: EventId) -> Result<&AccountId, ApiError> {
        if event.0 <= 0 {
            return Err(ApiError::bad_request("invalid_path", "event_id must be a positive integer"));
        }
        self.0.account_for(event.0).map_err(refused)
    }
}

fn refused(r: AdmissionRefusal) -> ApiError {
    let status = StatusCode::from_u16(r.status()).unwrap_or(StatusCode::UNAUTHORIZED);
    ApiError::new(status, r.code(), r.to_string())
}

impl FromRequestParts<AppState> for Proof {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let authorization = tokens::authorization_text(parts.headers.get(header::AUTHORIZATION).map(|v| v.as_bytes()))
            .map_err(refused)?;
        let cookies = parts.headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok());
        state.keyring.check_admission(authorization, cookies).map(Proof).map_err(refused)
    }
}
