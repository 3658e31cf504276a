//! `payments`: the fake payment provider, a small service of its own. Booking creates a payment here per order;
//! a person pays on its checkout page (or a program posts the outcome); it calls booking back with a signed
//! webhook, retrying while booking answers 5xx or nothing. Payments live in memory.
//!
//! A development tool: it listens on loopback unless told otherwise, and calls back only its one webhook URL.

use std::net::SocketAddr;

use anyhow::Context;
use clap::Parser;
use secrecy::{ExposeSecret, SecretString};

#[derive(Debug, Parser)]
#[command(
    name = "payments",
    version,
    about = "The fake payment provider: payments in memory, signed webhooks back to booking"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "PROVIDER_LISTEN", default_value = "127.0.0.1:18090")]
    listen: SocketAddr,
    /// Listen on an address other than loopback (a demo cluster only: this provider is a development tool).
    #[arg(long, env = "PROVIDER_ALLOW_REMOTE")]
    allow_remote: bool,
    /// The account's secret: booking sends it to create payments, and it signs webhooks (HMAC-SHA256).
    #[arg(long, env = "PAYMENT_WEBHOOK_SECRET", value_parser = secret)]
    webhook_secret: SecretString,
    /// The one URL events are posted to; a payment asking for another is refused.
    #[arg(long, env = "PAYMENT_WEBHOOK_URL")]
    webhook_url: String,
    /// Deliveries of one event at most, with doubling pauses from 100 ms, while booking answers 5xx or nothing.
    #[arg(long, env = "PROVIDER_DELIVERY_ATTEMPTS", default_value_t = 5)]
    delivery_attempts: u32,
    /// Settle every new payment as succeeded this many milliseconds after it is created, as a test card that
    /// always pays would (for tools that drive booking's API with nobody to press Pay). Off unless given.
    #[arg(long, env = "PROVIDER_AUTO_SETTLE_MS")]
    auto_settle_ms: Option<u64>,
    /// Origins (`scheme://host[:port]`, comma-separated) the checkout page may send the buyer back to with
    /// `?return=`; any other return URL is ignored, so the page is no open redirect.
    #[arg(long, env = "PROVIDER_RETURN_ORIGINS", value_delimiter = ',', num_args = 0..)]
    return_origins: Vec<String>,
}

fn secret(raw: &str) -> Result<SecretString, String> {
    if raw.is_empty() { Err("must not be empty".into()) } else { Ok(SecretString::from(raw.to_owned())) }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    booking::telemetry::init();
    let args = Args::parse();
    anyhow::ensure!(
        args.allow_remote || args.listen.ip().is_loopback(),
        "the fake provider listens on loopback only; PROVIDER_ALLOW_REMOTE=true to listen on {}",
        args.listen
    );
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(addr = %listener.local_addr()?, "fake payment provider listening");
    let options = booking::provider::Options {
        attempts: args.delivery_attempts,
        auto_settle: args.auto_settle_ms.map(std::time::Duration::from_millis),
        return_origins: args.return_origins,
    };
    let app =
        booking::provider::router_with(args.webhook_secret.expose_secret().as_bytes(), &args.webhook_url, options);
    serving::serve(listener, app, serving::Deadlines::default(), booking::shutdown_signal()).await?;
    Ok(())
}
