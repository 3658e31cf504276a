//! Logging: `tracing` to stderr, filtered by `RUST_LOG` (default `info`).

pub fn init() {
    telemetry::init_logging("info,sqlx::postgres::notice=warn");
}
