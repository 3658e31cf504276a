//! The waiting-room gateway, on pingora: a fair Redis-backed queue per event (one place per account, exact FIFO
//! across nodes, a seeded draw for the pre-queue), admission at an operator-set rate by a leaderless Lua step,
//! signed admission proofs checked in-process on every request pingora's proxy forwards to booking,
//! per-account and per-IP rate limits, a proof-of-work gate at joining, and an admin listener with Prometheus
//! metrics.
//!
//! Imports flow one way: `edge` (HTTP: routes, refusals, the proxy phases) uses `room` (pure decisions),
//! `gate` (proof-of-work challenges, pure),
//! `store` (Redis), `view` (a room read from `store` into this node's `room` view), `seatmap` (the live seat
//! maps' feeds, over `store`), `limits`, `upstreams` (booking's nodes) and `health` (booking's answers as timed
//! here); `ticker` and `admin` use `room` and `store`, the ticker also `view`, `upstreams` and `health`; nothing
//! imports `edge` or `ticker` but `main` and the OpenAPI document.

pub mod admin;
pub mod codes;
pub mod config;
pub mod edge;
pub mod gate;
pub mod health;
pub mod limits;
pub mod metrics;
pub mod openapi;
pub mod room;
pub mod seatmap;
pub mod store;
pub mod ticker;
pub mod upstreams;
pub mod view;
