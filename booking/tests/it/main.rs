//! Booking's integration tests: a real server on an ephemeral port, real Postgres (a fresh migrated
//! database per test) and real Redis (a key prefix per test). Run them with `deploy/test`.

mod app;
mod bad_input;
mod batch;
mod checkout;
mod holds;
mod hostile;
mod lifecycle;
mod lifecycle_model;
mod ops;
mod outbox;
mod picking;
mod seat_log;
