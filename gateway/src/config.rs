//! Command line and environment of the `gateway` binary; `gateway --help` lists every option.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use ipnet::IpNet;
use secrecy::SecretString;

#[derive(Debug, Parser)]
#[command(name = "gateway", version, about = "Waiting-room gateway in front of booking")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway: the public listener (waiting room and proxy) and the admin listener.
    Serve(Box<Config>),
    /// Read or change an event's waiting room through a gateway's admin listener.
    Admin(Box<AdminArgs>),
    /// Print the OpenAPI document of the waiting room and the admin API.
    Openapi,
}

/// The server's configuration.
#[derive(Debug, Args)]
pub struct Config {
    /// Public listener: the waiting room and the proxy to booking.
    #[arg(long, env = "GATEWAY_LISTEN", default_value = "127.0.0.1:18000")]
    pub listen: SocketAddr,
    /// Admin listener (its own port; `/admin/...` needs the admin bearer token, `/metrics` does not).
    #[arg(long, env = "GATEWAY_ADMIN_LISTEN", default_value = "127.0.0.1:18001")]
    pub admin_listen: SocketAddr,
    /// Bearer token of the admin API (at least 16 characters).
    #[arg(long, env = "GATEWAY_ADMIN_TOKEN", value_parser = admin_token)]
    pub admin_token: SecretString,
    /// Booking's nodes, comma-separated: `host:port` or `unix:/path/to/booking.sock` (a node on this machine,
    /// at less CPU per request on both sides). Requests are spread round robin over the nodes that answer
    /// booking's `/readyz`; the availability poll uses the same nodes.
    #[arg(long, env = "BOOKING_UPSTREAMS", default_value = "127.0.0.1:18080", value_delimiter = ',', num_args = 1.., value_parser = upstream)]
    pub upstreams: Vec<Upstream>,
    /// Longest wait for booking, in milliseconds: to connect, and for each read of its answer; past it the
    /// client gets 503 `booking_unavailable` (or, mid-answer, a closed connection).
    #[arg(long, env = "GATEWAY_UPSTREAM_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub upstream_timeout_ms: u64,
    /// Longest a write to a client may make no progress, in milliseconds: a forwarded answer, the gateway's own,
    /// or a seat map stream. Past it the client's connection is closed (and booking's, for a forwarded answer),
    /// so a client that never reads holds neither for long.
    #[arg(long, env = "GATEWAY_CLIENT_WRITE_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub client_write_timeout_ms: u64,
    /// Longest a client may take to send a request's head, in seconds: from the connection's accept, or from
    /// the end of the idle time the gateway allows after a request (60 s). A connection whose head is not in
    /// by then is closed at its next byte (one that sends nothing, after the 60 s wait for a read). HTTP/2
    /// connections keep HTTP/2's own rules.
    #[arg(long, env = "GATEWAY_HEAD_TIMEOUT_SECONDS", default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub head_timeout_seconds: u64,
    /// How often each booking node's `/readyz` is asked, in milliseconds. A node that fails once is taken out
    /// of the rotation; one that answers once is put back.
    #[arg(long, env = "GATEWAY_HEALTH_CHECK_MS", default_value_t = 500, value_parser = clap::value_parser!(u64).range(50..))]
    pub health_check_ms: u64,
    /// PEM certificate chain of the public listener: with `GATEWAY_TLS_KEY`, the listener speaks TLS (HTTP/2
    /// offered by ALPN) instead of plain HTTP.
    #[arg(long, env = "GATEWAY_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of `GATEWAY_TLS_CERT`.
    #[arg(long, env = "GATEWAY_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Largest request body forwarded to booking, in bytes, at most 65,536 (read whole before booking is
    /// asked, so a body that is cut short or badly framed never reaches it); a larger one gets 413
    /// `body_too_large`.
    #[arg(long, env = "GATEWAY_MAX_BODY_BYTES", default_value_t = 65_536, value_parser = clap::value_parser!(u64).range(0..=65_536))]
    pub max_body_bytes: u64,
    /// Keyring of admission proofs and queue tickets, `kid:secret[,kid:secret...]` (the first signs; booking
    /// verifies admission proofs with the same keys).
    #[arg(long, env = "ADMISSION_KEYS", value_parser = secret)]
    pub admission_keys: SecretString,
    /// Keyring that verifies the platform's account tokens, `kid:secret[,kid:secret...]`.
    #[arg(long, env = "ACCOUNT_KEYS", value_parser = secret)]
    pub account_keys: SecretString,
    /// Issuer (`iss`) the platform's account tokens must carry.
    #[arg(long, env = "ACCOUNT_ISSUER", default_value = "platform")]
    pub account_issuer: String,
    /// Redis connection URL (the queue; shared by every gateway node).
    #[arg(long, env = "REDIS_URL", value_parser = secret)]
    pub redis_url: SecretString,
    /// Prefix of every Redis key (namespaces a deployment; no braces).
    #[arg(long, env = "REDIS_KEY_PREFIX", default_value = "")]
    pub redis_key_prefix: String,
    /// Longest wait for one Redis call, in milliseconds.
    #[arg(long, env = "GATEWAY_REDIS_TIMEOUT_MS", default_value_t = 500)]
    pub redis_timeout_ms: u64,
    /// Replicas of the room's Redis master that must hold a new queue place, an admission step or a room's
    /// settings before the gateway answers (`WAIT`), so that a failover keeps them. 0: none (a single Redis);
    /// 1 on a cluster with a replica per master.
    #[arg(long, env = "GATEWAY_REDIS_WAIT_REPLICAS", default_value_t = 0)]
    pub redis_wait_replicas: u32,
    /// Longest wait for those replicas, in milliseconds; a wait that comes back short stops the waits for a
    /// quarter of a second (a replica is missing): joins are refused meanwhile, other writes stand on the
    /// master alone.
    #[arg(long, env = "GATEWAY_REDIS_WAIT_MS", default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub redis_wait_ms: u64,
    /// How often this node runs the admission step and refreshes its view of every queue, in milliseconds.
    #[arg(long, env = "GATEWAY_TICK_MS", default_value_t = 200, value_parser = clap::value_parser!(u64).range(20..=1000))]
    pub tick_ms: u64,
    /// Most admission credit that may pile up, in milliseconds of the admission rate (the burst bound).
    #[arg(long, env = "GATEWAY_ADMIT_BURST_MS", default_value_t = 500)]
    pub admit_burst_ms: u64,
    /// A node whose view of a queue is older than this answers 503 instead of guessing, in milliseconds.
    #[arg(long, env = "GATEWAY_STALE_AFTER_MS", default_value_t = 2000)]
    pub stale_after_ms: u64,
    /// How long a room stays over before it retires, in seconds (0: never on its own). A room is over while it
    /// is sold out, or closed after admitting fans, with nobody inside and nothing scheduled; retired, its keys
    /// are deleted and it is forgotten (`gateway admin retire` does it at once).
    #[arg(long, env = "GATEWAY_RETIRE_AFTER_SECONDS", default_value_t = 86_400)]
    pub retire_after_seconds: u64,
    /// How often to ask booking what an open room's event has left (sold out; every seat left held), in
    /// milliseconds (0: never).
    #[arg(long, env = "GATEWAY_AVAILABILITY_POLL_MS", default_value_t = 1000)]
    pub availability_poll_ms: u64,
    /// Free a fan's slot as soon as booking's order event stream says its order was paid (false: the slot is
    /// held until the fan's session ends, as before; the replay compares the two).
    #[arg(long, env = "GATEWAY_FREE_ON_PAID", default_value_t = true, action = clap::ArgAction::Set)]
    pub free_on_paid: bool,
    /// Requests per second one admitted account may send to booking through the gateway.
    #[arg(long, env = "GATEWAY_ACCOUNT_RPS", default_value_t = 20)]
    pub account_rps: u32,
    /// Burst above the per-account rate.
    #[arg(long, env = "GATEWAY_ACCOUNT_BURST", default_value_t = 40)]
    pub account_burst: u32,
    /// Joins and status polls per second from one client IP (coarse: many fans may share an IP).
    #[arg(long, env = "GATEWAY_IP_RPS", default_value_t = 50)]
    pub ip_rps: u32,
    /// Burst above the per-IP rate.
    #[arg(long, env = "GATEWAY_IP_BURST", default_value_t = 200)]
    pub ip_burst: u32,
    /// Networks of trusted proxies (a CDN, a load balancer), comma-separated CIDRs. Only when the TCP peer is in
    /// one is the client IP read from the client IP header.
    #[arg(long, env = "GATEWAY_TRUSTED_PROXIES", value_delimiter = ',', num_args = 0..)]
    pub trusted_proxies: Vec<IpNet>,
    /// The one header the trusted proxies name the client in: `X-Forwarded-For` (its right-most address that is
    /// not a trusted proxy), or one holding a single address (`CF-Connecting-IP` behind Cloudflare, `X-Real-IP`...).
    #[arg(long, env = "GATEWAY_CLIENT_IP_HEADER", default_value = "x-forwarded-for")]
    pub client_ip_header: crate::limits::ClientIpHeader,
    /// Most connections open at once from one client IP (an IPv6 client's /64); trusted proxies are not
    /// limited. A connection beyond it is closed at once. 0: no limit.
    #[arg(long, env = "GATEWAY_MAX_CONNECTIONS_PER_IP", default_value_t = 256)]
    pub max_connections_per_ip: u32,
    /// Mark cookies `Secure` (turn off only for plain-HTTP development on a non-localhost name).
    #[arg(long, env = "GATEWAY_COOKIE_SECURE", default_value_t = true, action = clap::ArgAction::Set)]
    pub cookie_secure: bool,
    /// Serve the demo sign-in: `GET /queue/{id}/signin?code=` exchanges a one-time code made on the admin
    /// listener (`POST /admin/signin-codes`, `deploy/stack url`) for the account cookie. For demos and tests
    /// only: a platform signs its fans in itself and sets the cookie.
    #[arg(long, env = "GATEWAY_DEV_SIGNIN", default_value_t = false, action = clap::ArgAction::Set)]
    pub dev_signin: bool,
    /// Lifetime of a queue ticket, in seconds.
    #[arg(long, env = "GATEWAY_TICKET_TTL_SECONDS", default_value_t = 43_200)]
    pub ticket_ttl_seconds: u64,
    /// Worker threads of the public listener (more than one share their work); about one per core the
    /// gateway may use.
    #[arg(long, env = "GATEWAY_THREADS", default_value_t = 2)]
    pub threads: usize,
    /// Live seat map streams open at once from one client address prefix (`GATEWAY_STREAMS_PREFIX_V4` /
    /// `_V6` bits; the client IP as the rate limits read it, so behind a CDN the fan's own); past it, 429
    /// `too_many_streams`. 0: no cap.
    #[arg(long, env = "GATEWAY_STREAMS_PER_PREFIX", default_value_t = 64)]
    pub streams_per_prefix: u32,
    /// The IPv4 prefix length a room's `places_per_network` counts places by (the client IP as the rate limits
    /// read it, so behind a CDN the fan's own).
    #[arg(long, env = "GATEWAY_NETWORK_PREFIX_V4", default_value_t = 24, value_parser = clap::value_parser!(u8).range(0..=32))]
    pub network_prefix_v4: u8,
    /// The IPv6 prefix length a room's `places_per_network` counts places by.
    #[arg(long, env = "GATEWAY_NETWORK_PREFIX_V6", default_value_t = 48, value_parser = clap::value_parser!(u8).range(0..=128))]
    pub network_prefix_v6: u8,
    /// The IPv4 prefix length streams are counted by.
    #[arg(long, env = "GATEWAY_STREAMS_PREFIX_V4", default_value_t = 32, value_parser = clap::value_parser!(u8).range(0..=32))]
    pub streams_prefix_v4: u8,
    /// The IPv6 prefix length streams are counted by (a subscriber is usually given a /56 or a /48).
    #[arg(long, env = "GATEWAY_STREAMS_PREFIX_V6", default_value_t = 56, value_parser = clap::value_parser!(u8).range(0..=128))]
    pub streams_prefix_v6: u8,
    /// Live seat map streams open at once for one event on this node; past it, 503 `streams_full`. 0: no cap.
    #[arg(long, env = "GATEWAY_STREAMS_PER_EVENT", default_value_t = 10_000)]
    pub streams_per_event: u32,
    /// Live seat map streams open at once on this node (each holds a file descriptor); past it, 503
    /// `streams_full`. 0: no cap.
    #[arg(long, env = "GATEWAY_STREAMS_MAX", default_value_t = 12_000)]
    pub streams_max: u32,
    /// Seconds a live seat map stream lasts (less a random tenth) before it ends cleanly and its client
    /// resumes with `Last-Event-ID`.
    #[arg(long, env = "GATEWAY_STREAM_LIFETIME_SECONDS", default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
    pub stream_lifetime_seconds: u64,
    /// Seconds a SIGTERM waits for in-flight requests before the gateway exits (SIGINT exits at once).
    #[arg(long, env = "GATEWAY_GRACE_SECONDS", default_value_t = 5)]
    pub grace_seconds: u64,
}

impl Config {
    pub fn upstream_timeout(&self) -> Duration {
        Duration::from_millis(self.upstream_timeout_ms)
    }

    pub fn redis_timeout(&self) -> Duration {
        Duration::from_millis(self.redis_timeout_ms)
    }

    pub fn replication(&self) -> crate::store::Replication {
        crate::store::Replication {
            replicas: self.redis_wait_replicas,
            timeout: Duration::from_millis(self.redis_wait_ms),
        }
    }

    pub fn stream_caps(&self) -> crate::edge::stream::CapOptions {
        crate::edge::stream::CapOptions {
            per_prefix: self.streams_per_prefix,
            prefix_v4: self.streams_prefix_v4,
            prefix_v6: self.streams_prefix_v6,
            per_event: self.streams_per_event,
            total: self.streams_max,
            lifetime: Duration::from_secs(self.stream_lifetime_seconds),
        }
    }

    pub fn tick(&self) -> Duration {
        Duration::from_millis(self.tick_ms)
    }

    pub fn stale_after(&self) -> Duration {
        Duration::from_millis(self.stale_after_ms.max(self.tick_ms * 2))
    }
}

/// `gateway admin ...`: a client of the admin listener.
#[derive(Debug, Args)]
pub struct AdminArgs {
    /// The admin listener's base URL.
    #[arg(long, env = "GATEWAY_ADMIN_URL", default_value = "http://127.0.0.1:18001")]
    pub url: String,
    /// The admin bearer token.
    #[arg(long, env = "GATEWAY_ADMIN_TOKEN", value_parser = secret)]
    pub token: SecretString,
    #[command(subcommand)]
    pub action: AdminAction,
}

#[derive(Debug, Subcommand)]
pub enum AdminAction {
    /// Show an event's settings and live figures.
    Get { event: i64 },
    /// Create or change an event's waiting room; unset options stay as they are.
    Set {
        event: i64,
        #[command(flatten)]
        patch: crate::room::SettingsPatch,
    },
    /// Schedule a change of an event's waiting room (the same options as `set`) at --at; with --list, show the
    /// schedule; with --cancel, cancel a change still waiting.
    Schedule {
        event: i64,
        /// When the change applies: Unix seconds, or `+N` for N seconds from now.
        #[arg(long, value_parser = crate::room::unix_time_arg, required_unless_present_any = ["list", "cancel"])]
        at: Option<u64>,
        /// Show the changes waiting and the last applied; change nothing.
        #[arg(long, conflicts_with_all = ["at", "cancel"])]
        list: bool,
        /// Cancel the waiting change with this id.
        #[arg(long, conflicts_with = "at")]
        cancel: Option<String>,
        #[command(flatten)]
        patch: crate::room::SettingsPatch,
    },
    /// Show the recorded pre-queue draw (seed, join order) and check it by recomputing every place.
    Draw { event: i64 },
    /// Retire an event's waiting room now: its places, codes and history are deleted and every node forgets
    /// it; a later `set` makes it anew, empty.
    Retire { event: i64 },
    /// Mint a sponsor pass: signed, expiring, for one account and this event; it admits at once (within
    /// max_active), once. Prints it with its expiry.
    Pass {
        event: i64,
        /// The account the pass admits.
        #[arg(long)]
        account: String,
        /// How long the pass may wait to be used, in seconds (60 to 2,592,000).
        #[arg(long, default_value_t = 86_400)]
        ttl_seconds: u64,
    },
    /// Make a batch of presale codes for this event and print them; with --list, show the batches and who
    /// redeemed what instead.
    Codes {
        event: i64,
        /// Show the room's batches and redemptions; make nothing.
        #[arg(long, conflicts_with_all = ["count", "uses", "code", "starts_at", "ends_at"])]
        list: bool,
        /// How many codes, 1 to 100,000.
        #[arg(long)]
        count: Option<u32>,
        /// How many accounts each code admits (1: single use).
        #[arg(long)]
        uses: Option<u32>,
        /// The code itself, for one shared code (4 to 32 of A-Z 0-9).
        #[arg(long)]
        code: Option<String>,
        /// When the codes start to work: Unix seconds or `+N` seconds from now (now by default).
        #[arg(long)]
        starts_at: Option<String>,
        /// When they stop: Unix seconds or `+N` seconds from now (never by default).
        #[arg(long)]
        ends_at: Option<String>,
    },
}

/// One booking node: where it listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    Tcp(SocketAddr),
    /// A Unix socket: booking on the same machine.
    Unix(std::path::PathBuf),
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(addr) => write!(f, "{addr}"),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

fn upstream(raw: &str) -> Result<Upstream, String> {
    let raw = raw.trim();
    match raw.strip_prefix("unix:") {
        Some("") => Err("`unix:` needs a socket path".into()),
        Some(path) => Ok(Upstream::Unix(path.into())),
        None => raw.parse().map(Upstream::Tcp).map_err(|_| format!("`{raw}` is neither host:port nor unix:/path")),
    }
}

fn secret(raw: &str) -> Result<SecretString, String> {
    Ok(SecretString::from(raw.to_owned()))
}

fn admin_token(raw: &str) -> Result<SecretString, String> {
    if raw.len() < 16 {
        return Err("the admin token must be at least 16 characters".into());
    }
    secret(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(upstreams: &str) -> Result<Box<Config>, clap::Error> {
        let key = format!("k1:{}", "ab".repeat(32));
        let args = ["gateway", "serve", "--admin-token", "0123456789abcdef0123", "--admission-keys", &key];
        let args = args.into_iter().chain(["--account-keys", &key, "--redis-url", "redis://127.0.0.1:1/"]);
        match Cli::try_parse_from(args.chain(["--upstreams", upstreams]))?.command {
            Command::Serve(config) => Ok(config),
            other => panic!("not serve: {other:?}"),
        }
    }

    #[test]
    fn upstreams_are_tcp_addresses_and_unix_sockets() {
        let config = serve("127.0.0.1:18080, unix:/run/booking.sock").expect("parses");
        assert_eq!(
            config.upstreams,
            [Upstream::Tcp("127.0.0.1:18080".parse().expect("addr")), Upstream::Unix("/run/booking.sock".into())]
        );
        assert!(serve("unix:").is_err());
        assert!(serve("booking:80").is_err(), "names are not resolved: give addresses");
    }
}
