//! The waiting room's Redis side: one typed method per script in `lua/` (sent with EVALSHA; the redis crate
//! loads the script again after NOSCRIPT) or per read, split by job:
//!
//! - [`keys`]: every key name the gateway builds;
//! - [`conn`]: connections made on first use inside each runtime, and which writes wait for replicas;
//! - [`queue`]: joining, admitting, passes, freed slots and the fan's standing;
//! - [`rooms`]: a room's settings, its schedule, adaptive rate and challenge difficulty, the node registry;
//! - [`codes`]: presale codes and demo sign-in codes;
//! - [`draws`]: the recorded pre-queue and lottery draws;
//! - [`log`]: booking's seat-map change log and order event stream, as the gateway reads them.
//!
//! pingora runs each service on its own runtime, and a Redis connection belongs to the runtime that made it,
//! so each part of the gateway (proxy, ticker, admin) holds its own [`LazyStore`], connected on first use from
//! inside its runtime. Every call is bounded by a timeout.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::{Script, Value};
use redisconn::Conn;

mod codes;
mod conn;
mod draws;
mod keys;
mod log;
mod queue;
mod rooms;

pub use conn::{LazyStore, Replication};
pub use draws::Draw;
pub use keys::{QueueKeys, SeatMapKeys, codes_index_key, nodes_key, outbox_key, retired_key, rooms_key, signin_key};
pub use log::{LogEntry, LogReader, Paid};
pub use queue::{CodeRefusal, Freed, FreedBy, Joined, Joining, Passed, Snapshot, StateChange, Stepped};
pub use rooms::Configured;

/// Why a Redis call did not give an answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("unexpected reply from redis: {0}")]
    Reply(String),
    #[error("{acked} of the {wanted} replicas asked for acknowledged the write in time")]
    Unreplicated { acked: u32, wanted: u32 },
}

/// The scripts, loaded once and shared by every connection.
struct Scripts {
    join: Script,
    admit: Script,
    set_state: Script,
    touch: Script,
    nodes: Script,
    tune: Script,
    pass: Script,
    free: Script,
    eta: Script,
    adapt: Script,
    schedule: Script,
    draw: Script,
    retire: Script,
}

impl Scripts {
    fn load() -> Self {
        Self {
            join: Script::new(include_str!("../../../lua/queue_join.lua")),
            admit: Script::new(include_str!("../../../lua/queue_admit.lua")),
            set_state: Script::new(concat!(
                include_str!("../../../lua/lib/queue_shuffle.lua"),
                include_str!("../../../lua/queue_set_state.lua")
            )),
            touch: Script::new(include_str!("../../../lua/queue_touch.lua")),
            nodes: Script::new(include_str!("../../../lua/gateway_nodes.lua")),
            tune: Script::new(include_str!("../../../lua/queue_tune_challenge.lua")),
            pass: Script::new(include_str!("../../../lua/queue_pass.lua")),
            free: Script::new(include_str!("../../../lua/queue_free.lua")),
            eta: Script::new(include_str!("../../../lua/queue_eta.lua")),
            adapt: Script::new(include_str!("../../../lua/queue_adapt.lua")),
            schedule: Script::new(include_str!("../../../lua/queue_schedule_take.lua")),
            draw: Script::new(concat!(
                include_str!("../../../lua/lib/queue_shuffle.lua"),
                include_str!("../../../lua/queue_draw.lua")
            )),
            retire: Script::new(include_str!("../../../lua/queue_retire.lua")),
        }
    }
}

/// Typed access to the waiting room's keys.
pub struct QueueStore {
    conn: Conn,
    prefix: String,
    timeout: Duration,
    replication: Replication,
    /// Since when the store counts time, for `unreplicated_until`.
    epoch: Instant,
    /// Until when (ms since `epoch`) writes do not wait for replicas: a wait came back short, so a replica is
    /// missing, and every wait would hold the shared connection for the whole timeout until it is back.
    unreplicated_until: AtomicU64,
    scripts: Arc<Scripts>,
}

/// How long writes stop waiting for replicas after a wait came back short.
const UNREPLICATED_PAUSE_MS: u64 = 250;

/// A script reply (a Lua table of strings and integers) as text.
fn parts(reply: Value) -> Result<Vec<String>, StoreError> {
    let Value::Array(items) = reply else { return Err(StoreError::Reply(format!("{reply:?}"))) };
    items
        .into_iter()
        .map(|item| match item {
            Value::BulkString(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
            Value::SimpleString(s) => Ok(s),
            Value::Int(i) => Ok(i.to_string()),
            other => Err(StoreError::Reply(format!("{other:?}"))),
        })
        .collect()
}

fn number(parts: &[String], i: usize) -> Result<u64, StoreError> {
    parts.get(i).and_then(|p| p.parse().ok()).ok_or_else(|| StoreError::Reply(parts.join(" ")))
}

/// Entries stored as JSON; one that does not read (written by another version) is left out.
fn parse_all<T: serde::de::DeserializeOwned>(raw: &[String]) -> Vec<T> {
    raw.iter().filter_map(|r| serde_json::from_str(r).ok()).collect()
}

impl QueueStore {
    async fn run<T>(&self, fut: impl Future<Output = redis::RedisResult<T>>) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    fn keys(&self, event: i64) -> QueueKeys {
        QueueKeys::new(&self.prefix, event)
    }

    /// After a write to `event`'s room that must survive a failover: waits until the configured replicas of
    /// the room's master hold it (see [`Replication`]). A wait that comes back short is counted and logged,
    /// and for a quarter of a second no write waits (a replica is missing: each wait would hold the shared
    /// connection for the whole timeout). Then a `strict` write is refused (`Unreplicated`: its caller answers
    /// 503, and the fan's retry finds the write in place), and any other stands on the master alone.
    async fn replicate(&self, event: i64, strict: bool) -> Result<(), StoreError> {
        let Replication { replicas, timeout } = self.replication;
        if replicas == 0 {
            return Ok(());
        }
        let now = self.epoch.elapsed().as_millis() as u64;
        let acked = if now < self.unreplicated_until.load(Ordering::Relaxed) {
            0
        } else {
            let waited = self.run(self.conn.wait_replicas(&self.keys(event).key("seq"), replicas, timeout)).await;
            // A wait that failed is a wait that came back short: the write itself is done.
            let acked = waited.unwrap_or_else(|e| {
                tracing::warn!(event, error = %e, "could not wait for the replicas");
                0
            });
            if acked < replicas {
                let back = self.epoch.elapsed().as_millis() as u64;
                self.unreplicated_until.store(back + UNREPLICATED_PAUSE_MS, Ordering::Relaxed);
                tracing::warn!(event, acked, replicas, "a queue write reached fewer replicas than asked");
            }
            acked
        };
        if acked >= replicas {
            return Ok(());
        }
        crate::metrics::record_unreplicated(strict);
        if strict { Err(StoreError::Unreplicated { acked, wanted: replicas }) } else { Ok(()) }
    }

    fn script<'a>(&self, script: &'a Script, event: i64) -> redis::ScriptInvocation<'a> {
        let mut inv = script.prepare_invoke();
        for key in self.keys(event).all() {
            inv.key(key);
        }
        inv
    }
}
