//! Logging and metrics, set up the same way by every binary of the workspace.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

/// `tracing` to stderr, filtered by `RUST_LOG` (else `default_filter`). Also bridges `log` records (pingora
/// writes those) into `tracing`. Harmless when called twice.
pub fn init_logging(default_filter: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// The process-wide Prometheus recorder, installed on first use.
pub fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        // Fails only if another recorder was installed first; metrics then go there.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}
