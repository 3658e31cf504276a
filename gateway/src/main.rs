//! The `gateway` binary: `gateway serve` parses the configuration and runs the pingora server (a plain
//! `fn main`: pingora owns its runtimes, and `run_forever` inside `#[tokio::main]` panics): the public
//! listener (pingora's HTTP proxy, plain or TLS), the health check of booking's nodes, the queue ticker and the
//! admin listener. `gateway admin` is the operators' client of the admin listener.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use gateway::admin::Admin;
use gateway::config::{Cli, Command, Config};
use gateway::edge::Edge;
use gateway::edge::connections::PerClientCap;
use gateway::edge::queue::{Queue, QueueOptions};
use gateway::gate::Gate;
use gateway::limits::Limits;
use gateway::room::Rooms;
use gateway::store::LazyStore;
use gateway::ticker::Ticker;
use gateway::upstreams::{Timeouts, Upstreams};
use pingora::listeners::{DEFAULT_L4_WRITE_BUFFER_SIZE, L4BufferSettings, ListenerConfig};
use pingora::server::Server;
use pingora::server::configuration::ServerConf;
use pingora::services::background::background_service;
use secrecy::ExposeSecret;
use tokens::Keyring;

// glibc's malloc and free are a large share of a proxy's CPU under load (perf); mimalloc's thread-local
// free lists cost less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Most places one admission step may walk past (bounds the Lua script's run time).
const MAX_WALK: u64 = 2000;

fn main() -> anyhow::Result<()> {
    telemetry::init_logging("info");

    match Cli::parse().command {
        Command::Serve(cfg) => serve(*cfg),
        Command::Admin(args) => gateway::admin::client::run(*args),
        Command::Openapi => {
            println!("{}", gateway::openapi::document());
            Ok(())
        }
    }
}

/// Bytes pingora reads ahead of the parser on each client connection (0: none).
const LISTENER_READ_BUFFER: usize = 0;

fn serve(cfg: Config) -> anyhow::Result<()> {
    let keyring = Arc::new(Keyring::parse(cfg.admission_keys.expose_secret()).context("ADMISSION_KEYS")?);
    let accounts = Keyring::parse(cfg.account_keys.expose_secret()).context("ACCOUNT_KEYS")?;
    let store = LazyStore::new(cfg.redis_url.expose_secret(), &cfg.redis_key_prefix, cfg.redis_timeout())
        .context("REDIS_URL")?
        .with_replication(cfg.replication())
        .context("GATEWAY_REDIS_WAIT_MS")?;
    let admin_listener = std::net::TcpListener::bind(cfg.admin_listen)
        .with_context(|| format!("binding the admin listener on {}", cfg.admin_listen))?;
    admin_listener.set_nonblocking(true)?;
    telemetry::prometheus();
    gateway::metrics::register_zeros();

    let rooms = Arc::new(Rooms::default());
    let limits = Arc::new(Limits::with_header(
        cfg.account_rps,
        cfg.account_burst,
        cfg.ip_rps,
        cfg.ip_burst,
        cfg.trusted_proxies.clone(),
        cfg.client_ip_header.clone(),
    ));
    let admit_burst = std::time::Duration::from_millis(cfg.admit_burst_ms);
    let queue = Queue {
        admission: keyring.clone(),
        accounts,
        rooms: rooms.clone(),
        store: store.fork(),
        gate: Gate::from_keyring_spec(cfg.admission_keys.expose_secret()),
        limits: limits.clone(),
        options: QueueOptions {
            account_issuer: cfg.account_issuer.clone(),
            ticket_ttl_seconds: cfg.ticket_ttl_seconds,
            stale_after: cfg.stale_after(),
            cookie_secure: cfg.cookie_secure,
            admit_burst,
            max_walk: MAX_WALK,
            dev_signin: cfg.dev_signin,
            network_prefix: (cfg.network_prefix_v4, cfg.network_prefix_v6),
        },
    };

    let conf = ServerConf {
        threads: cfg.threads.max(1),
        // One worker: a plain current-thread runtime. Several: let them share work, so a Redis connection made on
        // one runtime is driven wherever it is used.
        work_stealing: cfg.threads > 1,
        grace_period_seconds: Some(cfg.grace_seconds),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let timeouts = Timeouts { io: cfg.upstream_timeout(), health_every: Duration::from_millis(cfg.health_check_ms) };
    let (upstreams, health_check) = Upstreams::new(&cfg.upstreams, timeouts)?;
    let upstreams = Arc::new(upstreams);
    let health = Arc::new(gateway::health::Health::default());
    let edge = Edge {
        health: health.clone(),
        keyring: keyring.clone(),
        upstreams: upstreams.clone(),
        queue,
        limits: limits.clone(),
        max_body: cfg.max_body_bytes as usize,
        write_timeout: Duration::from_millis(cfg.client_write_timeout_ms),
        feeds: gateway::seatmap::Feeds::new(store.fork(), gateway::seatmap::FeedOptions::default()),
        stream_caps: gateway::edge::stream::Caps::new(cfg.stream_caps()),
    };
    let heads = gateway::edge::connections::HeadTimes {
        head: Duration::from_secs(cfg.head_timeout_seconds),
        idle: Duration::from_secs(gateway::edge::KEEPALIVE_SECONDS),
    };
    let app = PerClientCap::new(
        pingora::proxy::http_proxy(&server.configuration, edge),
        limits.clone(),
        cfg.max_connections_per_ip,
        heads,
    );
    let mut proxy = pingora::services::listening::Service::new("gateway".into(), app);
    // A fan's connection spends its life waiting (between requests, or on a live map's stream), and pingora
    // gives each one a 64 KiB read buffer by default: the largest cost of a waiting connection by far. Requests
    // here are a few hundred bytes, read straight into pingora's header buffer.
    let mut listener = ListenerConfig::tcp(cfg.listen.to_string())
        .l4_buffer(L4BufferSettings::new(LISTENER_READ_BUFFER, DEFAULT_L4_WRITE_BUFFER_SIZE));
    if let (Some(cert), Some(key)) = (&cfg.tls_cert, &cfg.tls_key) {
        let (cert, key) = (path_str(cert)?, path_str(key)?);
        let mut tls = pingora::listeners::tls::TlsSettings::intermediate(cert, key)
            .map_err(|e| anyhow::anyhow!("GATEWAY_TLS_CERT / GATEWAY_TLS_KEY: {e}"))?;
        tls.enable_h2();
        listener = listener.tls(tls);
    }
    proxy.add_listener(listener);
    server.add_service(proxy);
    server.add_service(health_check);
    if cfg.availability_poll_ms > 0 {
        let availability = gateway::ticker::Availability {
            upstreams: upstreams.clone(),
            keyring: keyring.clone(),
            every: Duration::from_millis(cfg.availability_poll_ms),
        };
        let sell_out = gateway::ticker::SellOut { rooms: rooms.clone(), store: store.fork(), availability };
        server.add_service(background_service("sell-out watch", sell_out));
    }
    let ticker = Ticker {
        rooms: rooms.clone(),
        limits,
        store: store.fork(),
        every: cfg.tick(),
        admit_burst,
        max_walk: MAX_WALK,
        quiet_every: (cfg.stale_after() / 4).min(Duration::from_millis(500)).max(cfg.tick()),
        free_on_paid: cfg.free_on_paid,
        health,
        slow_pass: cfg.stale_after() / 2,
        retire_after: (cfg.retire_after_seconds > 0).then(|| Duration::from_secs(cfg.retire_after_seconds)),
        node: format!("{:016x}", rand::random::<u64>()),
    };
    server.add_service(background_service("queue ticker", ticker));
    let admin = Admin {
        listener: std::sync::Mutex::new(Some(admin_listener)),
        token: cfg.admin_token.clone(),
        keyring: keyring.clone(),
        rooms,
        store,
        stale_after: cfg.stale_after(),
    };
    server.add_service(background_service("admin listener", admin));
    let upstreams: Vec<String> = cfg.upstreams.iter().map(ToString::to_string).collect();
    tracing::info!(
        listen = %cfg.listen, tls = cfg.tls_cert.is_some(), admin = %cfg.admin_listen, ?upstreams,
        "gateway listening"
    );
    server.run_forever()
}

fn path_str(path: &std::path::Path) -> anyhow::Result<&str> {
    path.to_str().with_context(|| format!("{} is not a UTF-8 path", path.display()))
}
