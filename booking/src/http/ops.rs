//! Liveness, readiness, metrics, the OpenAPI document and JSON answers for unknown routes.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::error::ApiError;
use crate::store::{orders, outbox};

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, description = "alive")))]
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// Postgres and Redis both answer.
#[utoipa::path(get, path = "/readyz", tag = "ops", responses(
    (status = 200, description = "ready"),
    (status = 503, description = "a dependency is down", body = super::ErrorBody),
))]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    let (pg, redis) = tokio::join!(
        tokio::time::timeout(std::time::Duration::from_secs(2), orders::ping(&state.pool)),
        state.holds.ping()
    );
    match pg {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(ApiError::from(e)),
        Err(_) => return Err(ApiError::unavailable("postgres")),
    }
    redis?;
    Ok(Json(json!({"status": "ready", "postgres": "ok", "redis": "ok"})))
}

/// Longest a scrape waits for the outbox backlog's count; past it the gauge keeps its last value.
const BACKLOG_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Prometheus text exposition. The figures read at scrape time are set first: the connection pool's use, and
/// the order events not yet published (the same count on every node: the relay's backlog).
pub async fn metrics(State(state): State<AppState>) -> Response {
    let (size, idle) = (state.pool.size(), state.pool.num_idle() as u32);
    metrics::gauge!("booking_db_connections", "state" => "in_use").set(f64::from(size.saturating_sub(idle)));
    metrics::gauge!("booking_db_connections", "state" => "idle").set(f64::from(idle));
    metrics::gauge!("booking_db_connections_max").set(f64::from(state.pool.options().get_max_connections()));
    match tokio::time::timeout(BACKLOG_WAIT, outbox::backlog(&state.pool)).await {
        Ok(Ok(rows)) => metrics::gauge!("booking_outbox_backlog").set(rows as f64),
        Ok(Err(e)) => tracing::debug!(error = %e, "could not count the outbox backlog for a scrape"),
        Err(_) => tracing::debug!("the outbox backlog's count took too long for a scrape"),
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], telemetry::prometheus().render()).into_response()
}

/// The OpenAPI document of this API, generated from the code.
pub async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], super::openapi::document()).into_response()
}

pub async fn not_found() -> ApiError {
    ApiError::not_found("not_found", "no such route")
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this route does not take that method")
}
