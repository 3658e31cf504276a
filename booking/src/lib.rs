//! Booking: atomic all-or-nothing seat holds in Redis and a Postgres checkout guarded by one active sale per
//! (event, seat). See ARCHITECTURE.md for the map.

pub mod config;
pub mod domain;
pub mod http;
pub mod provider;
pub mod seed;
pub mod store;
pub mod telemetry;
pub mod workers;

/// Whether a bearer token in `authorization` is `expected`, compared in constant time.
pub fn bearer_is(authorization: Option<&axum::http::HeaderValue>, expected: &[u8]) -> bool {
    let given = authorization.and_then(|v| v.as_bytes().strip_prefix(b"Bearer ")).unwrap_or_default();
    tokens::same_secret(given, expected)
}

/// Migrations of the booking database, embedded at build time from `migrations/`.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Resolves on SIGINT or SIGTERM: when a service starts its graceful shutdown.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
