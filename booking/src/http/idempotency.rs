//! The `Idempotency-Key` header, as checkout and holds read it, and the refusals they share about it.

use axum::http::HeaderMap;

use super::error::ApiError;

/// Longest accepted idempotency key (also written out in the OpenAPI header parameters; the bad-input test holds
/// both to it).
pub(super) const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

/// The request's `Idempotency-Key`, which it must have.
pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<&str, ApiError> {
    optional_idempotency_key(headers)?
        .ok_or_else(|| ApiError::bad_request("idempotency_key_missing", "checkout needs an Idempotency-Key header"))
}

/// The request's `Idempotency-Key`, if it has one; 400 if it is not 1 to 255 visible ASCII characters.
pub(super) fn optional_idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let Some(raw) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = raw.to_str().unwrap_or("");
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_BYTES || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::bad_request(
            "idempotency_key_invalid",
            format!("Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_BYTES} visible ASCII characters"),
        ));
    }
    Ok(Some(key))
}

pub(super) fn in_flight() -> ApiError {
    ApiError::conflict(
        "request_in_flight",
        "a request with this Idempotency-Key is still being processed; retry shortly",
    )
}

pub(super) fn key_reused() -> ApiError {
    ApiError::unprocessable("idempotency_key_reused", "this Idempotency-Key was already used for a different request")
}
