//! Background work of booking: the sweeper (tidies unpaid orders past their deadline) and the outbox relay
//! (publishes order events to the Redis Stream). Both are safe to run in any number of processes at once.

use std::time::Duration;

use redis::aio::ConnectionManager;
use sqlx::PgPool;

use crate::store::{lifecycle, outbox};

/// Orders one sweep transaction cancels at most.
const SWEEP_BATCH: i64 = 500;

/// Longest a relay batch may take (Redis and Postgres together) before it is abandoned and retried.
const RELAY_TIMEOUT: Duration = Duration::from_secs(10);

/// Cancels unpaid orders past their deadline every `every`, forever. Correctness never waits for it: a passed
/// deadline frees the seats by itself; this writes the cancellation and its outbox row down.
pub async fn sweeper(pool: PgPool, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // Drain a backlog in batches, then wait for the next tick.
        loop {
            match lifecycle::sweep(&pool, SWEEP_BATCH).await {
                Ok(n) => {
                    metrics::counter!("booking_orders_expired_total").increment(n);
                    if n < SWEEP_BATCH as u64 {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "sweep failed; retrying at the next tick");
                    break;
                }
            }
        }
    }
}

/// How the relay runs.
#[derive(Debug, Clone)]
pub struct Relay {
    pub stream: outbox::Stream,
    pub every: Duration,
    pub batch: i64,
    /// Fault injection: abort the process after publishing this many events, before marking them.
    pub crash_after_publish: Option<usize>,
}

/// Publishes unpublished order events every `every` (at once again while batches come back full), forever.
pub async fn relay(pool: PgPool, mut conn: ConnectionManager, relay: Relay) {
    let mut published_total = 0usize;
    let mut tick = tokio::time::interval(relay.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        loop {
            let crash_after = relay.crash_after_publish;
            let batch = outbox::relay_batch(&pool, &mut conn, &relay.stream, relay.batch, |n| {
                if crash_after.is_some_and(|limit| published_total + n >= limit) {
                    tracing::error!(published = published_total + n, "fault injection: aborting before marking");
                    std::process::abort();
                }
            });
            match tokio::time::timeout(RELAY_TIMEOUT, batch).await {
                Ok(Ok(n)) => {
                    published_total += n;
                    metrics::counter!("booking_outbox_published_total").increment(n as u64);
                    if (n as i64) < relay.batch {
                        break;
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "outbox relay failed; retrying at the next tick");
                    break;
                }
                Err(_) => {
                    tracing::warn!("outbox relay batch timed out; retrying at the next tick");
                    break;
                }
            }
        }
    }
}
