//! The HTTP surface: routes, the shared state, and the only code that knows status codes, headers and JSON
//! shapes.

mod admin;
mod auth;
mod error;
mod events;
mod hold_views;
mod holds;
mod idempotency;
mod lifecycle;
pub mod live_map;
pub mod openapi;
mod ops;
mod orders;
mod pages;
mod picking;
mod seat_maps;
mod webhooks;

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{delete, get, post};
use futures::FutureExt;
use secrecy::{ExposeSecret, SecretString};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokens::Keyring;
use tokio::net::{TcpListener, UnixListener};

pub use error::{ApiError, ErrorBody};

use crate::config::ServeConfig;
use crate::provider;
use crate::store::batcher::{BatchPolicy, CheckoutBatcher};
use crate::store::catalogues::Catalogues;
use crate::store::holds::{HoldTimes, Holds, Keys};
use crate::store::lifecycle::Window;
use crate::store::outbox;
use crate::workers;

/// How long a released or expired hold's record is kept, so late callers hear "expired".
const HOLD_RECORD_RETENTION: Duration = Duration::from_secs(3600);

/// Business limits, from configuration.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_seats_per_basket: usize,
    pub max_seats_per_account: usize,
    pub payment_window_seconds: u32,
}

/// The payment step: the provider, its webhook secret, and the payment window.
#[derive(Clone)]
pub struct Payments {
    pub provider: provider::Client,
    pub webhook_secret: Option<SecretString>,
    /// What the provider is told to call back.
    pub webhook_url: String,
    pub window: Window,
}

/// Background work this process runs beside the API.
#[derive(Clone, Debug)]
struct Background {
    sweep_every: Option<Duration>,
    lapse_every: Option<Duration>,
    relay: Option<workers::Relay>,
}

/// Everything a handler needs, behind one `Arc`: axum clones the state for every extractor and middleware of
/// every request, and a clone of the fields themselves (connection handles, key prefixes, URLs) would allocate
/// and count references each time.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`AppState`] shares.
pub struct Shared {
    pub pool: PgPool,
    pub holds: Holds,
    pub catalogues: Catalogues,
    pub seat_maps: Arc<seat_maps::SeatMaps>,
    pub keyring: Arc<Keyring>,
    pub limits: Limits,
    pub payments: Payments,
    /// Checkouts go to Postgres through here, batched when they arrive together.
    pub checkouts: CheckoutBatcher,
    admin_token: Option<SecretString>,
    background: Background,
    body_limit_bytes: usize,
    deadlines: serving::Deadlines,
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
        let conn = tokio::time::timeout(
            Duration::from_secs(5),
            crate::store::redis_connection(cfg.redis.redis_url.expose_secret()),
        )
        .await
        .context("Redis did not answer within 5 s (is it running? `deploy/stack up` starts it)")?
        .context("connecting to Redis")?;
        let times =
            HoldTimes { ttl: cfg.hold_ttl(), max_total: cfg.hold_max(), record_retention: HOLD_RECORD_RETENTION };
        let keys = Keys::new(&cfg.redis.redis_key_prefix)?;
        let stream = outbox::Stream { key: keys.outbox_stream(), max_len: cfg.outbox.outbox_stream_max_len };
        let holds = Holds::new(conn, keys, cfg.redis_timeout(), times);
        anyhow::ensure!(
            cfg.payment_window_seconds > 0 && cfg.payment_max_seconds >= cfg.payment_window_seconds,
            "need 0 < PAYMENT_WINDOW_SECONDS <= PAYMENT_MAX_SECONDS"
        );
        let payments = Payments {
            provider: provider::Client::new(
                &cfg.payment_provider_url,
                Duration::from_secs(5),
                cfg.payment_webhook_secret.clone(),
            ),
            webhook_secret: cfg.payment_webhook_secret.clone(),
            webhook_url: cfg
                .payment_webhook_url
                .clone()
                .unwrap_or_else(|| format!("http://{}/webhooks/payments", cfg.listen)),
            window: Window { seconds: cfg.payment_window_seconds, max_seconds: cfg.payment_max_seconds },
        };
        let background = Background {
            sweep_every: (cfg.sweep_interval_ms > 0).then(|| Duration::from_millis(cfg.sweep_interval_ms)),
            lapse_every: (cfg.lapse_interval_ms > 0).then(|| Duration::from_millis(cfg.lapse_interval_ms)),
            relay: (cfg.outbox.outbox_relay_interval_ms > 0).then(|| workers::Relay {
                stream,
                every: Duration::from_millis(cfg.outbox.outbox_relay_interval_ms),
                batch: cfg.outbox.outbox_relay_batch.max(1),
                crash_after_publish: None,
            }),
        };
        anyhow::ensure!(
            (1..=64).contains(&cfg.checkout_batch_max),
            "CHECKOUT_BATCH_MAX must be between 1 and 64 (one subtransaction per item at most)"
        );
        anyhow::ensure!(cfg.checkout_batches_in_flight >= 1, "CHECKOUT_BATCHES_IN_FLIGHT must be at least 1");
        // Each batch holds a connection: never more batches than the pool has connections.
        let batches_in_flight = cfg.checkout_batches_in_flight.min(cfg.database_pool_size.max(1) as usize);
        Ok(Self(Arc::new(Shared {
            payments,
            checkouts: CheckoutBatcher::start(
                pool.clone(),
                Some(holds.clone()),
                BatchPolicy {
                    max: cfg.checkout_batch_max,
                    in_flight: batches_in_flight,
                    wait: Duration::from_micros(cfg.checkout_batch_wait_us),
                },
            ),
            admin_token: cfg.admin_token.clone(),
            background,
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
            deadlines: cfg.deadlines(),
        })))
    }
}

/// A Postgres pool sized and timed by configuration, its connections without JIT compilation: booking's
/// statements are point lookups and small writes that never run long enough to pay back a compilation, and a
/// plan whose estimate passes `jit_above_cost` is compiled at every execution (migration 015 has the
/// measurement).
pub async fn connect_postgres(cfg: &ServeConfig) -> anyhow::Result<PgPool> {
    let options = PgConnectOptions::from_str(cfg.db.database_url.expose_secret())
        .context("DATABASE_URL")?
        .options([("jit", "off")]);
    PgPoolOptions::new()
        .max_connections(cfg.database_pool_size)
        .acquire_timeout(Duration::from_millis(cfg.database_acquire_timeout_ms))
        .connect_with(options)
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
        .route("/events/{event_id}/seats/status", get(live_map::get_status))
        .route("/events/{event_id}/seats/layout/{catalogue_version}", get(live_map::get_layout))
        .route("/events/{event_id}/availability", get(events::get_availability))
        .route("/events/{event_id}/buy", get(pages::page))
        .route("/events/{event_id}/buy/{asset}", get(pages::page_asset))
        .route("/events/{event_id}/holds", post(holds::create_hold))
        .route("/events/{event_id}/holds/{hold_token}", delete(holds::release_hold))
        .route("/events/{event_id}/holds/{hold_token}/extend", post(holds::extend_hold))
        .route("/events/{event_id}/orders", post(orders::create_order))
        .route("/events/{event_id}/orders/{order_id}", get(lifecycle::get_order))
        .route("/events/{event_id}/orders/{order_id}/payment", post(lifecycle::start_payment))
        .route("/events/{event_id}/orders/{order_id}/extend", post(lifecycle::extend_order))
        .route("/webhooks/payments", post(webhooks::payment_webhook))
        .route("/admin/orders/{order_id}", get(admin::get_order))
        .route("/admin/orders/{order_id}/cancel", post(admin::cancel_order))
        .route("/admin/orders/{order_id}/refund", post(admin::refund_order))
        .route("/admin/events/{event_id}/orders", get(admin::event_orders))
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

/// Serves `router(state)` on a bound listener until `shutdown` resolves, with the configured background work
/// (sweeper, lapse step, outbox relay) running beside it and stopped with it.
pub async fn serve(
    listener: TcpListener,
    unix: Option<UnixListener>,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut background = Vec::new();
    if let Some(every) = state.background.sweep_every {
        let check = workers::PaymentCheck {
            provider: state.payments.provider.clone(),
            window: state.payments.window,
            holds: state.holds.clone(),
            max_seats_per_account: state.limits.max_seats_per_account,
        };
        background.push(tokio::spawn(workers::sweeper(state.pool.clone(), every, check)));
    }
    if let Some(every) = state.background.lapse_every {
        let window = Duration::from_secs(state.payments.window.seconds.into());
        background.push(tokio::spawn(workers::lapses(state.pool.clone(), state.holds.clone(), every, window)));
    }
    if let Some(relay) = state.background.relay.clone() {
        let (conn, _) = state.holds.connection();
        background.push(tokio::spawn(workers::relay(state.pool.clone(), conn, relay)));
    }
    let deadlines = state.deadlines;
    let app = router(state);
    let shutdown = shutdown.shared();
    let tcp = serving::serve(listener, app.clone(), deadlines, shutdown.clone());
    let served = match unix {
        Some(unix) => {
            let (tcp, unix) = tokio::join!(tcp, serving::serve(unix, app, deadlines, shutdown));
            tcp.and(unix)
        }
        None => tcp.await,
    };
    for task in &background {
        task.abort();
    }
    for task in background {
        let _ = task.await;
    }
    served
}

/// Binds booking's Unix socket at `path`, replacing a stale socket file (never any other kind of file), open to
/// every local user as the loopback port is.
pub fn bind_unix(path: &std::path::Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        anyhow::ensure!(meta.file_type().is_socket(), "{} exists and is not a socket", path.display());
        std::fs::remove_file(path).with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let listener = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .with_context(|| format!("opening {} to local users", path.display()))?;
    tracing::info!(path = %path.display(), "booking listening on a Unix socket");
    Ok(listener)
}

/// Counts requests and their latency by route template and status (low cardinality: never an id).
async fn track(req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned()).unwrap_or_default();
    let method = req.method().as_str().to_owned();
    // The gateway gives every request it forwards an id (or passes on the client's): the one to look for in
    // both services' logs.
    let request_id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let start = Instant::now();
    let mut res = next.run(req).await;
    // Every answer is personal (a fan's hold, order, proof-bound view) unless its handler said it is public.
    if !res.headers().contains_key(header::CACHE_CONTROL) {
        res.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("private, no-store"));
    }
    let request_id = request_id.as_deref().unwrap_or("-");
    if res.status().is_server_error() {
        tracing::warn!(request_id, %method, %route, status = res.status().as_u16(), "answered with a server error");
    } else {
        tracing::debug!(request_id, %method, %route, status = res.status().as_u16(), "answered");
    }
    let status = res.status().as_u16().to_string();
    metrics::counter!("booking_http_requests_total", "method" => method.clone(), "route" => route.clone(), "status" => status)
        .increment(1);
    metrics::histogram!("booking_http_request_duration_seconds", "method" => method, "route" => route)
        .record(start.elapsed().as_secs_f64());
    res
}
