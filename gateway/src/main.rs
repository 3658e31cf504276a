//! The `gateway` binary: `gateway serve` parses the configuration and runs the pingora server (a plain
//! `fn main`: pingora owns its runtimes, and `run_forever` inside `#[tokio::main]` panics); `gateway admin`
//! is the operators' client of the admin listener.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use gateway::admin::Admin;
use gateway::config::{Cli, Command, Config};
use gateway::forward::Target;
use gateway::limits::Limits;
use gateway::proxy::Gateway;
use gateway::queue::{Queue, QueueOptions};
use gateway::room::Rooms;
use gateway::store::LazyStore;
use gateway::ticker::Ticker;
use pingora::server::Server;
use pingora::server::configuration::ServerConf;
use pingora::services::background::background_service;
use secrecy::ExposeSecret;
use tokens::Keyring;

// glibc's malloc and free took about 13% of the proxy's CPU under load (perf); mimalloc lifted forwarded
// requests from 38k to 43k per second on the 2-core box.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Most places one admission step may walk past (bounds the Lua script's run time).
const MAX_WALK: u64 = 2000;

fn main() -> anyhow::Result<()> {
    telemetry::init_logging("info");

    match Cli::parse().command {
        Command::Serve(cfg) => serve(*cfg),
        Command::Admin(args) => gateway::admin_client::run(args),
        Command::Openapi => {
            println!("{}", gateway::openapi::document());
            Ok(())
        }
    }
}

fn serve(cfg: Config) -> anyhow::Result<()> {
    let keyring = Arc::new(Keyring::parse(cfg.admission_keys.expose_secret()).context("ADMISSION_KEYS")?);
    let accounts = Keyring::parse(cfg.account_keys.expose_secret()).context("ACCOUNT_KEYS")?;
    let store = LazyStore::new(cfg.redis_url.expose_secret(), &cfg.redis_key_prefix, cfg.redis_timeout())
        .context("REDIS_URL")?;
    let admin_listener = std::net::TcpListener::bind(cfg.admin_listen)
        .with_context(|| format!("binding the admin listener on {}", cfg.admin_listen))?;
    admin_listener.set_nonblocking(true)?;
    telemetry::prometheus();

    let rooms = Arc::new(Rooms::default());
    let limits = Arc::new(Limits::new(
        cfg.account_rps,
        cfg.account_burst,
        cfg.ip_rps,
        cfg.ip_burst,
        cfg.trusted_proxies.clone(),
    ));
    let admit_burst = std::time::Duration::from_millis(cfg.admit_burst_ms);
    let queue = Queue {
        admission: keyring.clone(),
        accounts,
        rooms: rooms.clone(),
        store: store.fork(),
        options: QueueOptions {
            account_issuer: cfg.account_issuer.clone(),
            ticket_ttl_seconds: cfg.ticket_ttl_seconds,
            stale_after: cfg.stale_after(),
            cookie_secure: cfg.cookie_secure,
            admit_burst,
            max_walk: MAX_WALK,
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
    let target = match cfg.upstream_unix() {
        Some(path) => Target::Unix(path.to_owned()),
        None => Target::Tcp(cfg.upstream),
    };
    let upstream = gateway::forward::Upstream::new(target, cfg.upstream_timeout());
    let gateway = Gateway::new(keyring.clone(), upstream, queue, limits.clone(), cfg.max_body_bytes);
    let mut proxy = pingora::services::listening::Service::new("gateway".into(), gateway);
    proxy.add_tcp(&cfg.listen.to_string());
    server.add_service(proxy);
    let availability = (cfg.availability_poll_ms > 0).then(|| gateway::ticker::Availability {
        upstream: cfg.upstream,
        keyring: keyring.clone(),
        every: std::time::Duration::from_millis(cfg.availability_poll_ms),
    });
    let ticker = Ticker {
        rooms: rooms.clone(),
        availability,
        limits,
        store: store.fork(),
        every: cfg.tick(),
        admit_burst,
        max_walk: MAX_WALK,
    };
    server.add_service(background_service("queue ticker", ticker));
    let admin = Admin {
        listener: std::sync::Mutex::new(Some(admin_listener)),
        token: cfg.admin_token.clone(),
        rooms,
        store,
        stale_after: cfg.stale_after(),
    };
    server.add_service(background_service("admin listener", admin));
    tracing::info!(
        listen = %cfg.listen, admin = %cfg.admin_listen, upstream = %cfg.upstream, upstream_unix = ?cfg.upstream_unix(),
        "gateway listening"
    );
    server.run_forever()
}
