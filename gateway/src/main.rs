//! The `gateway` binary: parses the configuration and runs the pingora server. A plain `fn main`: pingora
//! owns its runtimes (`run_forever` inside `#[tokio::main]` panics).

use anyhow::Context;
use clap::Parser;
use gateway::config::Config;
use gateway::proxy::Gateway;
use pingora::server::Server;
use pingora::server::configuration::ServerConf;
use secrecy::ExposeSecret;
use tokens::Keyring;

fn main() -> anyhow::Result<()> {
    // `try_init` also bridges the `log` records pingora writes into `tracing` (the `tracing-log` feature).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();

    let cfg = Config::parse();
    let keyring = Keyring::parse(cfg.admission_keys.expose_secret()).context("ADMISSION_KEYS")?;
    let conf = ServerConf {
        threads: cfg.threads.max(1),
        grace_period_seconds: Some(cfg.grace_seconds),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut proxy = pingora::proxy::http_proxy_service(&server.configuration, Gateway::new(keyring, cfg.upstream));
    proxy.add_tcp(&cfg.listen.to_string());
    server.add_service(proxy);
    tracing::info!(listen = %cfg.listen, upstream = %cfg.upstream, "gateway listening");
    server.run_forever()
}
