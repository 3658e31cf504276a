//! Booking: atomic all-or-nothing seat holds in Redis and a Postgres checkout guarded by one active sale per
//! (event, seat). See ARCHITECTURE.md for the map.

pub mod bench;
pub mod config;
pub mod domain;
pub mod http;
pub mod provider;
pub mod seed;
pub mod store;
pub mod telemetry;
pub mod workers;

/// Migrations of the booking database, embedded at build time from `migrations/`.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");
