//! The waiting-room gateway, on pingora: a fair Redis-backed queue per event (one place per account, exact FIFO
//! across nodes, a seeded draw for the pre-queue), admission at an operator-set rate by a leaderless Lua step,
//! signed admission proofs checked in-process on every request forwarded to booking, per-account and per-IP
//! rate limits, and an admin listener with Prometheus metrics.

pub mod admin;
pub mod admin_client;
pub mod admission;
pub mod answer;
pub mod client;
pub mod config;
pub mod forward;
pub mod limits;
pub mod metrics;
pub mod openapi;
pub mod proxy;
pub mod queue;
pub mod room;
pub mod shuffle;
pub mod store;
pub mod ticker;
pub mod wire;
