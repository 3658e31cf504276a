//! The one HTTP error type: a status, a stable snake_case code, a human sentence and optional details.
//! Server faults get an opaque body; their cause goes to the log.

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::store::StoreError;

/// Error body of every non-2xx answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// Stable snake_case code, e.g. `seat_unavailable`.
    #[schema(example = "seat_unavailable")]
    pub error: String,
    /// A sentence for people.
    pub message: String,
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub details: Map<String, Value>,
    pub retry_after_seconds: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), details: Map::new(), retry_after_seconds: None }
    }

    /// Adds a detail field to the body (e.g. `seat_id`, `label`).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_owned(), value.into());
        self
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }
    pub fn unauthorized(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, code, message)
    }
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, code, message)
    }
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    /// A dependency is down: 503 with `Retry-After`.
    pub fn unavailable(store: &'static str) -> Self {
        let code = if store == "postgres" { "database_unavailable" } else { "redis_unavailable" };
        let mut e =
            Self::new(StatusCode::SERVICE_UNAVAILABLE, code, format!("{store} is not answering; retry shortly"));
        e.retry_after_seconds = Some(1);
        e
    }

    /// A fault of ours: logged with its cause, answered with an opaque body.
    pub fn internal(cause: &dyn std::fmt::Display) -> Self {
        tracing::error!(%cause, "internal error");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", "something went wrong on our side")
    }

    /// The JSON body, as sent and as stored for idempotent replays.
    pub fn body(&self) -> Value {
        let mut body = Map::new();
        body.insert("error".into(), json!(self.code));
        body.insert("message".into(), json!(self.message));
        body.extend(self.details.clone());
        Value::Object(body)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after_seconds {
            res.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        res
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        if e.is_unavailable() {
            tracing::warn!(error = %e, "store unavailable");
            ApiError::unavailable(e.store())
        } else {
            ApiError::internal(&e)
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        let code = match r.status() {
            StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
            StatusCode::UNPROCESSABLE_ENTITY => "invalid_body",
            _ => "malformed_json",
        };
        let status = if r.status().is_client_error() { r.status() } else { StatusCode::BAD_REQUEST };
        ApiError::new(status, code, r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        ApiError::bad_request("invalid_path", r.body_text())
    }
}

/// `axum::Json` whose refusals are [`ApiError`]s.
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

/// `axum::extract::Path` whose refusals are [`ApiError`]s.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);
