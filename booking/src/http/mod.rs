//! The HTTP surface: routes, the shared state, and the only code that knows status codes, headers and JSON
//! shapes.

mod auth;
mod error;
mod events;
mod holds;
pub mod openapi;
mod ops;
mod orders;
mod seat_maps;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{delete, get, post};
use secrecy::ExposeSecret;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokens::Keyring;
use tokio::net::TcpListener;

pub use error::{ApiError, ErrorBody};

use crate::config::ServeConfig;
use crate::store::catalogues::Catalogues;
use crate::store::holds::{HoldTimes, Holds, Keys};

/// How long a released or expired hold's record is kept, so late callers hear "expired".
const HOLD_RECORD_RETENTION: Duration = Duration::from_secs(3600);

/// Business limits, from configuration.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_seats_per_basket: usize,
    pub max_seats_per_account: usize,
    pub payment_window_seconds: u32,
}

/// Everything a handler needs. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub holds: Holds,
    pub catalogues: Catalogues,
    pub seat_maps: Arc<seat_maps::SeatMaps>,
    pub keyring: Arc<Keyring>,
    pub limits: Limits,
    body_limit_bytes: usize,
}

impl AppState {
    /// Connects Redis and assembles the state around an existing Postgres pool.
    pub async fn build(cfg: &ServeConfig, pool: PgPool) -> anyhow::Result<Self> {
        anyhow::ensure!(
            cfg.hold_ttl_ms > 0 && cfg.hold_max_ms >= cfg.hold_ttl_ms,
            "need 0 < HOLD_TTL_MS <= HOLD_MAX_MS"
        );
        anyhow::ensure!(cfg.max_seats_per_basket > 0, "MAX_SEATS_PER_BASKET must be at least 1");
        let keyring = Keyring::parse(cfg.admission_keys.expose_secret()).context("ADMISSION_KEYS")?;
        let client = redis::Client::open(cfg.redis_url.expose_secret()).context("REDIS_URL")?;
        let conn = tokio::time::timeout(Duration::from_secs(5), client.get_connection_manager())
            .await
            .context("Redis did not answer within 5 s (is it running? `deploy/stack up` starts it)")?
            .context("connecting to Redis")?;
        let times =
            HoldTimes { ttl: cfg.hold_ttl(), max_total: cfg.hold_max(), record_retention: HOLD_RECORD_RETENTION };
        let holds = Holds::new(conn, Keys::new(&cfg.redis_key_prefix)?, cfg.redis_timeout(), times);
        Ok(Self {
            catalogues: Catalogues::new(pool.clone(), cfg.catalogue_refresh()),
            seat_maps: Arc::new(seat_maps::SeatMaps::new(Duration::from_millis(cfg.seat_map_cache_ms))),
            pool,
            holds,
            keyring: Arc::new(keyring),
            limits: Limits {
                max_seats_per_basket: cfg.max_seats_per_basket,
                max_seats_per_account: cfg.max_seats_per_account,
                payment_window_seconds: cfg.payment_window_seconds,
            },
            body_limit_bytes: cfg.body_limit_bytes,
        })
    }
}

/// A Postgres pool sized and timed by configuration.
pub async fn connect_postgres(cfg: &ServeConfig) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(cfg.database_pool_size)
        .acquire_timeout(Duration::from_millis(cfg.database_acquire_timeout_ms))
        .connect(cfg.db.database_url.expose_secret())
        .await
        .context("connecting to Postgres (is it running? `deploy/stack up` starts it)")
}

/// Every route of the booking API.
pub fn router(state: AppState) -> Router {
    let limit = state.body_limit_bytes;
    // Install the Prometheus recorder before the first request, so no early count is lost.
    telemetry::prometheus();
    Router::new()
        .route("/events/{event_id}", get(events::get_event))
        .route("/events/{event_id}/seats", get(events::get_seats))
        .route("/events/{event_id}/availability", get(events::get_availability))
        .route("/events/{event_id}/holds", post(holds::create_hold))
        .route("/events/{event_id}/holds/{hold_token}", delete(holds::release_hold))
        .route("/events/{event_id}/holds/{hold_token}/extend", post(holds::extend_hold))
        .route("/events/{event_id}/orders", post(orders::create_order))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(ops::openapi))
        .route_layer(middleware::from_fn(track))
        .fallback(ops::not_found)
        .method_not_allowed_fallback(ops::method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Serves `router(state)` on a bound listener until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await
}

/// Counts requests and their latency by route template and status (low cardinality: never an id).
async fn track(req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned()).unwrap_or_default();
    let method = req.method().as_str().to_owned();
    let start = Instant::now();
    let res = next.run(req).await;
    let status = res.status().as_u16().to_string();
    metrics::counter!("booking_http_requests_total", "method" => method.clone(), "route" => route.clone(), "status" => status)
        .increment(1);
    metrics::histogram!("booking_http_request_duration_seconds", "method" => method, "route" => route)
        .record(start.elapsed().as_secs_f64());
    res
}
