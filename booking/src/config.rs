//! Command line and environment: one `Cli` for the `booking` binary. Every option is also an environment
//! variable; `booking <command> --help` lists them.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use secrecy::SecretString;

#[derive(Debug, Parser)]
#[command(name = "booking", version, about = "Seat holds and checkout for high-demand on-sales")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the booking HTTP API.
    Serve(Box<ServeConfig>),
    /// Apply database migrations and exit.
    Migrate(DatabaseArgs),
    /// Create a synthetic venue, an event, ticket types and allocations; print the event id.
    Seed(SeedArgs),
    /// Mint development tokens (account tokens for the gateway, admission proofs for booking).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Print the OpenAPI document generated from the code.
    Openapi,
    /// Run only the outbox relay (publishes order events to the Redis Stream), e.g. beside `serve
    /// --outbox-relay-interval-ms 0`.
    Relay(RelayArgs),
}

#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub outbox: OutboxArgs,
    /// Fault injection for tests: abort the process right after publishing this many events, before marking
    /// them published (a crash in the window between the two).
    #[arg(long, hide = true)]
    pub crash_after_publish: Option<usize>,
}

#[derive(Debug, Clone, Args)]
pub struct OutboxArgs {
    /// How often the outbox relay looks for unpublished order events, in milliseconds (0: no relay here).
    #[arg(long, env = "OUTBOX_RELAY_INTERVAL_MS", default_value_t = 200)]
    pub outbox_relay_interval_ms: u64,
    /// Events published per relay transaction at most.
    #[arg(long, env = "OUTBOX_RELAY_BATCH", default_value_t = 500)]
    pub outbox_relay_batch: i64,
    /// Approximate cap on the stream's length (XADD MAXLEN ~); 0 keeps every entry.
    #[arg(long, env = "OUTBOX_STREAM_MAX_LEN", default_value_t = 1_000_000)]
    pub outbox_stream_max_len: usize,
}

#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// Postgres connection URL.
    #[arg(long, env = "DATABASE_URL", value_parser = secret)]
    pub database_url: SecretString,
}

#[derive(Debug, Clone, Args)]
pub struct RedisArgs {
    /// Redis connection URL.
    #[arg(long, env = "REDIS_URL", value_parser = secret)]
    pub redis_url: SecretString,
    /// Prefix of every Redis key this service writes (namespaces a deployment; no braces).
    #[arg(long, env = "REDIS_KEY_PREFIX", default_value = "")]
    pub redis_key_prefix: String,
}

#[derive(Debug, Clone, Args)]
pub struct SeedArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// Seats in the synthetic venue (sections of 20 rows of 25).
    #[arg(long, env = "SEED_SEATS", default_value_t = 20_000)]
    pub seats: u32,
    /// Seats held back for sponsors: never allocated, so never on sale.
    #[arg(long, env = "SEED_SPONSOR_SEATS", default_value_t = 50)]
    pub sponsor_seats: u32,
    /// Name of the event.
    #[arg(long, env = "SEED_EVENT_NAME", default_value = "Demo on-sale")]
    pub event_name: String,
    /// Seed only when the database has no event yet; otherwise print the first event's id (the demo's).
    #[arg(long)]
    pub if_empty: bool,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// An account token, as the platform's login would issue (presented to the gateway).
    Account {
        /// The account id (`sub`).
        #[arg(long)]
        account: String,
        /// Lifetime in seconds.
        #[arg(long, default_value_t = 3600)]
        ttl_seconds: u64,
        /// Issuer the gateway expects.
        #[arg(long, env = "ACCOUNT_ISSUER", default_value = "platform")]
        issuer: String,
        /// Keyring of account tokens, `kid:secret[,kid:secret...]`; the first key signs.
        #[arg(long, env = "ACCOUNT_KEYS", value_parser = secret)]
        keys: SecretString,
    },
    /// An admission proof for one event, as the gateway issues on admission (presented to booking).
    Admission {
        /// The account id (`sub`).
        #[arg(long)]
        account: String,
        /// The event the proof admits to.
        #[arg(long)]
        event: i64,
        /// Lifetime in seconds.
        #[arg(long, default_value_t = 900)]
        ttl_seconds: u64,
        /// Keyring of admission proofs, `kid:secret[,kid:secret...]`; the first key signs.
        #[arg(long, env = "ADMISSION_KEYS", value_parser = secret)]
        keys: SecretString,
    },
}

#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// Address to listen on.
    #[arg(long, env = "BOOKING_LISTEN", default_value = "127.0.0.1:18080")]
    pub listen: SocketAddr,
    /// Also serve the same API on this Unix socket (for a gateway on the same machine: a request over it costs
    /// both sides less CPU than over TCP loopback). A stale socket file there is replaced; the socket is
    /// open to every local user, as the loopback port is. Empty: none.
    #[arg(long, env = "BOOKING_LISTEN_UNIX", value_parser = clap::builder::TypedValueParser::map(clap::builder::OsStringValueParser::new(), std::path::PathBuf::from))]
    listen_unix: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Keyring that verifies admission proofs, `kid:secret[,kid:secret...]`.
    #[arg(long, env = "ADMISSION_KEYS", value_parser = secret)]
    pub admission_keys: SecretString,
    /// How long a hold lasts, and how far one extension pushes it, in milliseconds.
    #[arg(long, env = "HOLD_TTL_MS", default_value_t = 600_000)]
    pub hold_ttl_ms: u64,
    /// Absolute cap on a hold's life from its creation, however often extended, in milliseconds.
    #[arg(long, env = "HOLD_MAX_MS", default_value_t = 1_200_000)]
    pub hold_max_ms: u64,
    /// Seats in one basket at most.
    #[arg(long, env = "MAX_SEATS_PER_BASKET", default_value_t = 8)]
    pub max_seats_per_basket: usize,
    /// Seats one account may hold and buy per event at most.
    #[arg(long, env = "MAX_SEATS_PER_ACCOUNT", default_value_t = 8)]
    pub max_seats_per_account: usize,
    /// Payment window of a new order, in seconds; also how far one extension pushes the deadline.
    #[arg(long, env = "PAYMENT_WINDOW_SECONDS", default_value_t = 600)]
    pub payment_window_seconds: u32,
    /// Absolute cap on an order's payment deadline from its creation, however often extended, in seconds.
    #[arg(long, env = "PAYMENT_MAX_SECONDS", default_value_t = 1_200)]
    pub payment_max_seconds: u32,
    /// Base URL of the payment provider (the `payments` binary in the local stack).
    #[arg(long, env = "PAYMENT_PROVIDER_URL", default_value = "http://127.0.0.1:18090")]
    pub payment_provider_url: String,
    /// Secret that verifies the provider's webhooks (HMAC-SHA256). Without it `POST /webhooks/payments`
    /// answers 503 `payments_not_configured`.
    #[arg(long, env = "PAYMENT_WEBHOOK_SECRET", value_parser = secret)]
    pub payment_webhook_secret: Option<SecretString>,
    /// The URL the provider calls back (this service's `/webhooks/payments`, as the provider reaches it);
    /// default: `http://<listen>/webhooks/payments`.
    #[arg(long, env = "PAYMENT_WEBHOOK_URL")]
    pub payment_webhook_url: Option<String>,
    /// Bearer token of the operator routes (`/admin/...`). Without it they answer 403 `admin_disabled`.
    #[arg(long, env = "BOOKING_ADMIN_TOKEN", value_parser = secret)]
    pub admin_token: Option<SecretString>,
    /// How often the sweeper cancels unpaid orders past their deadline, in milliseconds (0: no sweeper here).
    /// Only tidiness depends on it: a deadline frees the seats by itself.
    #[arg(long, env = "SWEEP_INTERVAL_MS", default_value_t = 1_000)]
    pub sweep_interval_ms: u64,
    /// How often the seats whose hold or unpaid order ran out are logged as available in each event's seat
    /// map, in milliseconds (0: not by this process). Fans watching the map learn of a lapse this much after
    /// it at most.
    #[arg(long, env = "LAPSE_INTERVAL_MS", default_value_t = 250)]
    pub lapse_interval_ms: u64,
    #[command(flatten)]
    pub outbox: OutboxArgs,
    /// How long a serialised seat map is served to every fan before it is rebuilt, in milliseconds (0: rebuilt
    /// on every request).
    #[arg(long, env = "SEAT_MAP_CACHE_MS", default_value_t = 250)]
    pub seat_map_cache_ms: u64,
    /// How often an event's catalogue (allocations, prices) is re-read from Postgres, in milliseconds.
    #[arg(long, env = "CATALOGUE_REFRESH_MS", default_value_t = 5_000)]
    pub catalogue_refresh_ms: u64,
    /// Longest wait for one Redis reply before answering 503, in milliseconds.
    #[arg(long, env = "REDIS_TIMEOUT_MS", default_value_t = 1_000)]
    pub redis_timeout_ms: u64,
    /// Postgres connections in the pool.
    #[arg(long, env = "DATABASE_POOL_SIZE", default_value_t = 16)]
    pub database_pool_size: u32,
    /// Checkouts written together in one statement and one commit at most (group commit); 1 writes each
    /// checkout on its own. Batches form only from checkouts that arrive while earlier batches run. At most 64:
    /// a checkout settled the slow way in a batch uses a subtransaction, and Postgres keeps 64 per backend
    /// cached. 64 rather than 32: under many concurrent checkouts, larger batches cost Postgres less per
    /// checkout.
    #[arg(long, env = "CHECKOUT_BATCH_MAX", default_value_t = 64)]
    pub checkout_batch_max: usize,
    /// Checkout batches running at once (each holds one Postgres connection; at most DATABASE_POOL_SIZE).
    #[arg(long, env = "CHECKOUT_BATCHES_IN_FLIGHT", default_value_t = 2)]
    pub checkout_batches_in_flight: usize,
    /// Longest wait, in microseconds, for checkouts already on their way (past HTTP, in the Redis gate) before
    /// a batch goes to Postgres; 0 sends at once whatever is queued. A lone checkout with nothing on its way
    /// never waits.
    #[arg(long, env = "CHECKOUT_BATCH_WAIT_US", default_value_t = 2_000)]
    pub checkout_batch_wait_us: u64,
    /// Longest wait for a Postgres connection before answering 503, in milliseconds.
    #[arg(long, env = "DATABASE_ACQUIRE_TIMEOUT_MS", default_value_t = 3_000)]
    pub database_acquire_timeout_ms: u64,
    /// Largest request body accepted, in bytes.
    #[arg(long, env = "BODY_LIMIT_BYTES", default_value_t = 16 * 1024)]
    pub body_limit_bytes: usize,
    /// Longest wait for a request's whole head, and longest idle time between a connection's requests.
    #[arg(long, env = "HTTP_HEAD_TIMEOUT_MS", default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_head_timeout_ms: u64,
    /// Longest wait for a request's whole body, from its head.
    #[arg(long, env = "HTTP_BODY_TIMEOUT_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_body_timeout_ms: u64,
    /// Most client connections served at once; more wait in the listen backlog.
    #[arg(long, env = "HTTP_MAX_CONNECTIONS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub http_max_connections: u64,
}

impl ServeConfig {
    /// The deadlines every listener of this process serves under.
    pub fn deadlines(&self) -> serving::Deadlines {
        serving::Deadlines {
            head: Duration::from_millis(self.http_head_timeout_ms),
            body: Duration::from_millis(self.http_body_timeout_ms),
            max_body: self.body_limit_bytes,
            max_connections: usize::try_from(self.http_max_connections).unwrap_or(usize::MAX),
        }
    }

    /// The Unix socket to serve on too, if one is set (an empty setting is none).
    pub fn listen_unix(&self) -> Option<&std::path::Path> {
        self.listen_unix.as_deref().filter(|p| !p.as_os_str().is_empty())
    }

    pub fn hold_ttl(&self) -> Duration {
        Duration::from_millis(self.hold_ttl_ms)
    }
    pub fn hold_max(&self) -> Duration {
        Duration::from_millis(self.hold_max_ms)
    }
    pub fn catalogue_refresh(&self) -> Duration {
        Duration::from_millis(self.catalogue_refresh_ms)
    }
    pub fn redis_timeout(&self) -> Duration {
        Duration::from_millis(self.redis_timeout_ms)
    }
}

fn secret(raw: &str) -> Result<SecretString, String> {
    Ok(SecretString::from(raw.to_owned()))
}
