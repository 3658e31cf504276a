//! The `booking` binary: parses the command line and hands over to the library.

use anyhow::Context;
use booking::config::{Cli, Command, TokenCommand};
use booking::{http, seed, shutdown_signal, telemetry};
use clap::Parser;
use secrecy::ExposeSecret;
use sqlx::PgPool;
use tokens::{AccountClaims, AccountId, AdmissionClaims, Keyring, unix_now};

// glibc's malloc and free are a large share of booking's CPU under load (perf); mimalloc's thread-local free
// lists make a hold cheaper. The gateway uses it too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    telemetry::init();
    match Cli::parse().command {
        Command::Serve(cfg) => {
            let pool = http::connect_postgres(&cfg).await?;
            booking::MIGRATOR.run(&pool).await.context("applying migrations")?;
            let state = http::AppState::build(&cfg, pool).await?;
            let listener =
                tokio::net::TcpListener::bind(cfg.listen).await.with_context(|| format!("binding {}", cfg.listen))?;
            tracing::info!(addr = %listener.local_addr()?, "booking listening");
            let unix = match cfg.listen_unix() {
                Some(path) => Some(http::bind_unix(path)?),
                None => None,
            };
            http::serve(listener, unix, state, shutdown_signal()).await?;
            if let Some(path) = cfg.listen_unix() {
                let _ = std::fs::remove_file(path);
            }
            tracing::info!("booking stopped");
        }
        Command::Migrate(db) => {
            let pool = PgPool::connect(db.database_url.expose_secret()).await.context("connecting to Postgres")?;
            booking::MIGRATOR.run(&pool).await.context("applying migrations")?;
            println!("migrations applied");
        }
        Command::Seed(args) => {
            let pool = PgPool::connect(args.db.database_url.expose_secret()).await.context("connecting to Postgres")?;
            booking::MIGRATOR.run(&pool).await.context("applying migrations")?;
            if args.if_empty
                && let Some(event) = seed::first_event(&pool).await?
            {
                println!("{event}");
                return Ok(());
            }
            let opts = seed::SeedOptions {
                seats: args.seats,
                sponsor_seats: args.sponsor_seats,
                event_name: args.event_name,
                ..Default::default()
            };
            let seeded = seed::seed(&pool, &opts).await?;
            eprintln!(
                "seeded event {} with {} seats, {} on sale ({} held back for sponsors)",
                seeded.event_id,
                seeded.seats,
                seeded.allocated,
                seeded.seats - seeded.allocated
            );
            println!("{}", seeded.event_id);
        }
        Command::Token(TokenCommand::Account { account, ttl_seconds, issuer, keys }) => {
            let ring = Keyring::parse(keys.expose_secret()).context("ACCOUNT_KEYS")?;
            let account = AccountId::parse(&account).context("--account")?;
            let claims = AccountClaims::new(account, &issuer, unix_now(), ttl_seconds);
            println!("{}", ring.sign(&claims));
        }
        Command::Token(TokenCommand::Admission { account, event, ttl_seconds, keys }) => {
            let ring = Keyring::parse(keys.expose_secret()).context("ADMISSION_KEYS")?;
            let account = AccountId::parse(&account).context("--account")?;
            println!("{}", ring.sign(&AdmissionClaims::new(account, event, unix_now(), ttl_seconds)));
        }
        Command::Openapi => println!("{}", http::openapi::document()),
        Command::Relay(args) => {
            let pool = PgPool::connect(args.db.database_url.expose_secret()).await.context("connecting to Postgres")?;
            let conn = booking::store::redis_connection(args.redis.redis_url.expose_secret())
                .await
                .context("connecting to Redis (REDIS_URL)")?;
            let keys = booking::store::holds::Keys::new(&args.redis.redis_key_prefix)?;
            let every = std::time::Duration::from_millis(args.outbox.outbox_relay_interval_ms.max(1));
            let relay = booking::workers::Relay {
                stream: booking::store::outbox::Stream {
                    key: keys.outbox_stream(),
                    max_len: args.outbox.outbox_stream_max_len,
                },
                every,
                batch: args.outbox.outbox_relay_batch.max(1),
                crash_after_publish: args.crash_after_publish,
            };
            tracing::info!(stream = %relay.stream.key, "outbox relay running");
            tokio::select! {
                () = booking::workers::relay(pool, conn, relay) => {}
                () = shutdown_signal() => {}
            }
        }
    }
    Ok(())
}
