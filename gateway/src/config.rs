//! Command line and environment of the `gateway` binary; `gateway --help` lists every option.

use std::net::SocketAddr;

use clap::Parser;
use secrecy::SecretString;

#[derive(Debug, Parser)]
#[command(name = "gateway", version, about = "Waiting-room gateway in front of booking")]
pub struct Config {
    /// Public listener.
    #[arg(long, env = "GATEWAY_LISTEN", default_value = "127.0.0.1:18000")]
    pub listen: SocketAddr,
    /// Booking's address (HTTP/1.1, connections kept alive and reused).
    #[arg(long, env = "BOOKING_UPSTREAM", default_value = "127.0.0.1:18080")]
    pub upstream: SocketAddr,
    /// Keyring of admission proofs, `kid:secret[,kid:secret...]` (the same booking verifies with).
    #[arg(long, env = "ADMISSION_KEYS", value_parser = secret)]
    pub admission_keys: SecretString,
    /// Worker threads of the proxy service.
    #[arg(long, env = "GATEWAY_THREADS", default_value_t = 2)]
    pub threads: usize,
    /// Seconds a SIGTERM waits for in-flight requests before the gateway exits (SIGINT exits at once).
    #[arg(long, env = "GATEWAY_GRACE_SECONDS", default_value_t = 5)]
    pub grace_seconds: u64,
}

fn secret(raw: &str) -> Result<SecretString, String> {
    Ok(SecretString::from(raw.to_owned()))
}
