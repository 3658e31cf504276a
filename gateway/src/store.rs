//! The waiting room's Redis side: the one place queue keys are built, and one typed method per script in
//! `lua/` (sent with EVALSHA; the redis crate loads the script again after NOSCRIPT) or per read.
//!
//! pingora runs each service on its own runtime, and a Redis connection belongs to the runtime that made it,
//! so each part of the gateway (proxy, ticker, admin) holds its own [`LazyStore`], connected on first use from
//! inside its runtime. Every call is bounded by a timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use redis::{AsyncCommands, Script, Value};
use redisconn::{Conn, Options, Target};

use crate::gate::Payment;
use crate::room::{Applied, Batch, Counts, EtaSample, QueueState, SCHEDULE_MAX, Scheduled, Settings, SettingsPatch};

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

/// Builds every key of one event's queue. The prefix namespaces a deployment (or a test) and never contains a
/// brace, so `{ev<id>}` is the key's hash tag.
#[derive(Debug, Clone)]
pub struct QueueKeys {
    base: String,
}

/// The keys every queue script receives, in this order (the scripts' headers list them).
const KEY_NAMES: [&str; 29] = [
    "settings", "seq", "head", "places", "who", "joined", "seen", "active", "skipped", "batches", "stats", "waits",
    "pre", "prelist", "shuffle", "spent", "networks", "codes", "uses", "holders", "later", "laterwho", "left",
    "health", "schedule", "applied", "draws", "etas", "etaerrs",
];

impl QueueKeys {
    pub fn new(prefix: &str, event: i64) -> Self {
        Self { base: redisconn::keys::queue_base(prefix, event) }
    }

    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.base)
    }

    /// All twenty-nine keys, in script order.
    pub fn all(&self) -> Vec<String> {
        KEY_NAMES.iter().map(|name| self.key(name)).collect()
    }
}

/// Booking's keys of an event's seat map that the gateway reads: the version and the change log (booking
/// writes them, `lua/lib/seatmap_log.lua`; both services share `REDIS_KEY_PREFIX`).
#[derive(Debug, Clone)]
pub struct SeatMapKeys {
    pub version: String,
    pub log: String,
}

impl SeatMapKeys {
    pub fn new(prefix: &str, event: i64) -> Self {
        Self {
            version: redisconn::keys::seatmap(prefix, event, "version"),
            log: redisconn::keys::seatmap(prefix, event, "log"),
        }
    }
}

/// One entry of an event's change log: its map version, its changes as booking wrote them
/// ("seat:status,seat:status", status a, h or s), and when (unix ms by Redis's clock; 0 if unknown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub version: u64,
    pub changes: String,
    pub at_ms: u64,
}

/// A field of a stream entry (`[field, value, field, value, ...]`).
fn stream_field<'a>(fields: &'a [String], name: &str) -> Option<&'a String> {
    fields.chunks(2).find(|f| f[0] == name).and_then(|f| f.get(1))
}

/// Entries stored as JSON; one that does not read (written by another version) is left out.
fn parse_all<T: serde::de::DeserializeOwned>(raw: &[String]) -> Vec<T> {
    raw.iter().filter_map(|r| serde_json::from_str(r).ok()).collect()
}

/// Raw log entries as XRANGE gives them: `[[id, [field, value, ...]], ...]`.
type RawEntries = Vec<(String, Vec<String>)>;

/// Log entries from an XRANGE or XREAD reply's entry list (`[[id, [field, value, ...]], ...]`). An entry id
/// is "<version>-0".
fn log_entries(raw: RawEntries) -> Result<Vec<LogEntry>, StoreError> {
    raw.into_iter()
        .map(|(id, fields)| {
            let version = id.strip_suffix("-0").and_then(|v| v.parse().ok());
            let field = |name: &str| stream_field(&fields, name).cloned();
            let at_ms = field("t").and_then(|t| t.parse().ok()).unwrap_or(0);
            match (version, field("c")) {
                (Some(version), Some(changes)) => Ok(LogEntry { version, changes, at_ms }),
                _ => Err(StoreError::Reply(format!("seat map log entry {id}"))),
            }
        })
        .collect()
}

/// A connection of its own for blocking reads of one event's change log (a blocked read would hold up every
/// other call on a shared connection).
pub struct LogReader {
    conn: Conn,
    keys: SeatMapKeys,
    timeout: Duration,
}

impl LogReader {
    /// The newest entry (`None`: no log yet).
    pub async fn last(&mut self) -> Result<Option<LogEntry>, StoreError> {
        self.one("XREVRANGE", "+", "-").await
    }

    /// The entry of `version`, if the log has it.
    pub async fn entry(&mut self, version: u64) -> Result<Option<LogEntry>, StoreError> {
        let id = format!("{version}-0");
        self.one("XRANGE", &id, &id).await
    }

    async fn one(&mut self, command: &str, from: &str, to: &str) -> Result<Option<LogEntry>, StoreError> {
        let mut cmd = redis::cmd(command);
        let fut = cmd.arg(&self.keys.log).arg(from).arg(to).arg("COUNT").arg(1).query_async(&mut self.conn);
        let raw: RawEntries = match tokio::time::timeout(self.timeout, fut).await {
            Ok(reply) => reply?,
            Err(_) => return Err(StoreError::Timeout(self.timeout)),
        };
        Ok(log_entries(raw)?.into_iter().next())
    }

    /// The entries after `after`, at most `count`, waiting up to `block` for the first one.
    pub async fn next(&mut self, after: u64, block: Duration, count: usize) -> Result<Vec<LogEntry>, StoreError> {
        let mut cmd = redis::cmd("XREAD");
        let fut = cmd
            .arg("COUNT")
            .arg(count)
            .arg("BLOCK")
            .arg(block.as_millis() as u64)
            .arg("STREAMS")
            .arg(&self.keys.log)
            .arg(format!("{after}-0"))
            .query_async(&mut self.conn);
        let limit = block + self.timeout;
        let raw: Option<Vec<(String, RawEntries)>> = match tokio::time::timeout(limit, fut).await {
            Ok(reply) => reply?,
            Err(_) => return Err(StoreError::Timeout(limit)),
        };
        log_entries(raw.into_iter().flatten().flat_map(|(_, entries)| entries).collect())
    }
}

/// The set of events that have a waiting room (no hash tag: read on its own, never inside a script).
pub fn rooms_key(prefix: &str) -> String {
    format!("{prefix}queue:rooms")
}

/// Which room each presale code belongs to (no hash tag: it spans every event), so that a code sent to another
/// room is told apart from one that does not exist.
pub fn codes_index_key(prefix: &str) -> String {
    format!("{prefix}queue:codes")
}

/// A demo sign-in code (no hash tag: a key on its own).
pub fn signin_key(prefix: &str, code: &str) -> String {
    format!("{prefix}gateway:signin:{code}")
}

/// The gateway nodes that said lately that they are alive (`lua/gateway_nodes.lua`).
pub fn nodes_key(prefix: &str) -> String {
    format!("{prefix}gateway:nodes")
}

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
}

impl Scripts {
    fn load() -> Self {
        Self {
            join: Script::new(include_str!("../../lua/queue_join.lua")),
            admit: Script::new(include_str!("../../lua/queue_admit.lua")),
            set_state: Script::new(concat!(
                include_str!("../../lua/lib/queue_shuffle.lua"),
                include_str!("../../lua/queue_set_state.lua")
            )),
            touch: Script::new(include_str!("../../lua/queue_touch.lua")),
            nodes: Script::new(include_str!("../../lua/gateway_nodes.lua")),
            tune: Script::new(include_str!("../../lua/queue_tune_challenge.lua")),
            pass: Script::new(include_str!("../../lua/queue_pass.lua")),
            free: Script::new(include_str!("../../lua/queue_free.lua")),
            eta: Script::new(include_str!("../../lua/queue_eta.lua")),
            adapt: Script::new(include_str!("../../lua/queue_adapt.lua")),
            schedule: Script::new(include_str!("../../lua/queue_schedule_take.lua")),
            draw: Script::new(concat!(
                include_str!("../../lua/lib/queue_shuffle.lua"),
                include_str!("../../lua/queue_draw.lua")
            )),
        }
    }
}

/// What joining gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// No waiting room is configured for this event.
    Unknown,
    /// The queue takes nobody now.
    Closed(QueueState),
    /// The pre-queue's opening time has passed: open it and join again.
    Opening,
    /// In the pre-queue, with `count` fans.
    Prequeue { count: u64 },
    /// The account's place; `head` is the last place passed; `fresh` if given now.
    Place { place: u64, head: u64, fresh: bool },
    /// The room's challenge is on and the join solved none (and holds no place): nothing was done.
    ChallengeRequired,
    /// The challenge sent already paid for a join: nothing was done.
    Spent,
    /// The client's network was given the room's `places_per_network` places already: nothing was done.
    NetworkFull { cap: u64 },
    /// A `reject` room has no room now (or fans wait): the fan is turned away, nothing was done.
    NoPlaces,
    /// In a `lottery` room's pool for its next draw, with `count` fans.
    Pool { count: u64 },
    /// In the line behind the code holders (a `codes_first` room, joined without a code): `number` in that
    /// line, at `position` (every queue place waiting comes first).
    Later { number: u64, position: u64 },
    /// The presale code was refused (or the room takes code holders only and none was sent): nothing was done.
    Code(CodeRefusal),
}

/// Why a join's presale code was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeRefusal {
    /// The room takes code holders only and the join sent no code.
    Required,
    /// No such code in this room.
    Unknown,
    /// Redeemed by as many accounts as it allows.
    Spent,
    /// Its window begins at `starts_ms`.
    NotYet { starts_ms: u64 },
    /// Its window ended at `ends_ms`.
    Ended { ends_ms: u64 },
}

/// Who joins: the account, its client's network (address prefix; empty when unknown), and the challenge it
/// pays with.
#[derive(Debug, Clone, Copy)]
pub struct Joining<'a> {
    pub account: &'a str,
    pub network: &'a str,
    pub payment: Option<&'a Payment>,
    /// The presale code sent, normalised ([`crate::codes::normalise`]); empty when none.
    pub code: &'a str,
}

/// What a sponsor pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Passed {
    Unknown,
    Closed(QueueState),
    /// The pass was used before.
    Spent,
    /// The room has `max_active` fans within their session: the pass is kept for later.
    Full {
        max_active: u64,
    },
    /// Admitted at `at_ms` (Redis's clock) for the room's session.
    Admitted {
        at_ms: u64,
        session_seconds: u64,
    },
}

/// What an admission step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stepped {
    Idle,
    Opening,
    Moved { head: u64, seq: u64, admitted: u64, skipped: u64 },
}

/// What a state change did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateChange {
    Unknown,
    /// The state was not the one expected; nothing done.
    Changed(String),
    /// Back to prequeue after places were given: refused.
    Refused(String),
    Done {
        drawn: u64,
    },
}

/// One read of an event's queue (an atomic MULTI/EXEC), with the steps and skips after what the node knew.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub settings: Option<Settings>,
    pub counts: Counts,
    pub waits_ms: Vec<u64>,
    pub new_batches: Vec<Batch>,
    pub new_skipped: Vec<u64>,
    /// Fans who left at or after the `left_since` asked for: account, when (ms).
    pub new_left: Vec<(String, u64)>,
    /// The room's scheduled changes still to apply, earliest first.
    pub schedule: Vec<Scheduled>,
    pub redis_ms: u64,
}

/// Why a fan's slot is freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreedBy {
    /// Its order was paid.
    Paid,
    /// It left (`POST /queue/{id}/leave`): its admission ends too.
    Left,
}

/// What freeing a slot did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freed {
    Unknown,
    /// The slot was freed now (`at_ms`, Redis's clock).
    Now {
        at_ms: u64,
    },
    /// The fan held no slot.
    NotActive {
        at_ms: u64,
    },
}

/// An order paid, as booking's order event stream says: the entry's stream id, and whose order in which event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paid {
    pub event: i64,
    pub account: String,
}

/// Booking's order event stream (booking writes it, `booking/src/store/outbox.rs`; both services share
/// `REDIS_KEY_PREFIX`).
pub fn outbox_key(prefix: &str) -> String {
    redisconn::keys::order_stream(prefix)
}

/// The recorded pre-queue draw, for anyone to recompute.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Draw {
    pub seed: u64,
    pub base: u64,
    pub at_ms: u64,
    /// The accounts in the order they joined the pre-queue.
    pub join_order: Vec<String>,
}

/// A connection made on first use, inside the runtime of the caller.
pub struct LazyStore {
    target: Target,
    prefix: String,
    timeout: Duration,
    replication: Replication,
    scripts: Arc<Scripts>,
    store: OnceLock<QueueStore>,
}

/// Which writes wait for replicas, and how long: a queue place is answered only once `replicas` replicas of the
/// room's master hold it (`WAIT`), so a failover to one of them keeps it; an admission step and a room's
/// settings wait too, best effort. `replicas` 0: nothing waits (a single Redis has no replica to wait for).
#[derive(Debug, Clone, Copy, Default)]
pub struct Replication {
    pub replicas: u32,
    pub timeout: Duration,
}

impl LazyStore {
    pub fn new(url: &str, prefix: &str, timeout: Duration) -> anyhow::Result<Self> {
        anyhow::ensure!(!prefix.contains(['{', '}']), "the Redis key prefix must not contain braces");
        Ok(Self {
            target: Target::parse(url)?,
            prefix: prefix.to_owned(),
            timeout,
            replication: Replication::default(),
            scripts: Arc::new(Scripts::load()),
            store: OnceLock::new(),
        })
    }

    /// Makes the writes that must survive a failover wait for replicas (see [`Replication`]).
    pub fn with_replication(mut self, replication: Replication) -> anyhow::Result<Self> {
        anyhow::ensure!(
            replication.replicas == 0 || replication.timeout < self.timeout,
            "the wait for replicas must be shorter than the Redis timeout"
        );
        self.replication = replication;
        Ok(self)
    }

    /// A copy for another runtime: same settings, its own connection.
    pub fn fork(&self) -> Self {
        Self {
            target: self.target.clone(),
            prefix: self.prefix.clone(),
            timeout: self.timeout,
            replication: self.replication,
            scripts: self.scripts.clone(),
            store: OnceLock::new(),
        }
    }

    /// A connection of its own for reading `event`'s change log as it grows; made inside the caller's runtime.
    pub async fn log_reader(&self, event: i64, block: Duration) -> Result<LogReader, StoreError> {
        let options = Options {
            connection_timeout: self.timeout,
            response_timeout: Some(block + self.timeout),
            ..Default::default()
        };
        let fut = self.target.dedicated(options);
        let conn = match tokio::time::timeout(self.timeout, fut).await {
            Ok(conn) => conn?,
            Err(_) => return Err(StoreError::Timeout(self.timeout)),
        };
        Ok(LogReader { conn, keys: SeatMapKeys::new(&self.prefix, event), timeout: self.timeout })
    }

    /// The store; must be called from inside the runtime that will use it.
    pub fn get(&self) -> Result<&QueueStore, StoreError> {
        if let Some(store) = self.store.get() {
            return Ok(store);
        }
        let options = Options {
            connection_timeout: self.timeout,
            response_timeout: Some(self.timeout),
            max_delay: Duration::from_millis(200),
            retries: 1,
        };
        let conn = self.target.lazy(options)?;
        let store = QueueStore {
            conn,
            prefix: self.prefix.clone(),
            timeout: self.timeout,
            replication: self.replication,
            epoch: Instant::now(),
            unreplicated_until: AtomicU64::new(0),
            scripts: self.scripts.clone(),
        };
        Ok(self.store.get_or_init(|| store))
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

    /// Gives `account`, joining from `network` (its address prefix), its place in `event`'s queue
    /// (`lua/queue_join.lua`), above `floor`, the highest place this node knows was given out, spending the
    /// challenge it paid with, if any. A place is answered only once the replicas asked for hold it.
    pub async fn join(&self, event: i64, joining: &Joining<'_>, floor: u64) -> Result<Joined, StoreError> {
        let mut inv = self.script(&self.scripts.join, event);
        inv.arg(joining.account).arg(floor);
        match joining.payment {
            Some(paid) => inv.arg(&paid.nonce).arg(paid.expires_at_ms),
            None => inv.arg("").arg(0),
        };
        inv.arg(joining.network).arg(joining.code);
        let mut conn = self.conn.clone();
        let p = parts(self.run(inv.invoke_async(&mut conn)).await?)?;
        let joined = match p.first().map(String::as_str) {
            Some("unknown") => Joined::Unknown,
            Some("closed") => Joined::Closed(p.get(1).and_then(|s| QueueState::parse(s)).unwrap_or(QueueState::Closed)),
            Some("opening") => Joined::Opening,
            Some("pre") => Joined::Prequeue { count: number(&p, 1)? },
            Some("place") => Joined::Place { place: number(&p, 1)?, head: number(&p, 2)?, fresh: number(&p, 3)? == 1 },
            Some("challenge") => Joined::ChallengeRequired,
            Some("spent") => Joined::Spent,
            Some("network_full") => Joined::NetworkFull { cap: number(&p, 1)? },
            Some("no_places") => Joined::NoPlaces,
            Some("pool") => Joined::Pool { count: number(&p, 1)? },
            Some("later") => Joined::Later { number: number(&p, 1)?, position: number(&p, 2)? },
            Some("code_required") => Joined::Code(CodeRefusal::Required),
            Some("code_unknown") => Joined::Code(CodeRefusal::Unknown),
            Some("code_spent") => Joined::Code(CodeRefusal::Spent),
            Some("code_not_yet") => Joined::Code(CodeRefusal::NotYet { starts_ms: number(&p, 1)? }),
            Some("code_ended") => Joined::Code(CodeRefusal::Ended { ends_ms: number(&p, 1)? }),
            _ => return Err(StoreError::Reply(p.join(" "))),
        };
        // A place given earlier is waited for too: the answer that gave it may have been refused unreplicated.
        if matches!(joined, Joined::Prequeue { .. } | Joined::Place { .. } | Joined::Later { .. }) {
            self.replicate(event, true).await?;
        }
        Ok(joined)
    }

    /// The `auto` challenge's step (`lua/queue_tune_challenge.lua`): the difficulty in force after it, when the
    /// room's challenge is `auto`.
    pub async fn tune_challenge(&self, event: i64) -> Result<Option<u64>, StoreError> {
        let inv = self.script(&self.scripts.tune, event);
        let mut conn = self.conn.clone();
        let p = parts(self.run(inv.invoke_async(&mut conn)).await?)?;
        match p.first().map(String::as_str) {
            Some("manual") => Ok(None),
            Some("waiting") => Ok(Some(number(&p, 1)?)),
            Some("tuned") => {
                let difficulty = number(&p, 1)?;
                tracing::debug!(event, difficulty, joins = %p[2], capacity = %p[3], "challenge difficulty decided");
                Ok(Some(difficulty))
            }
            _ => Err(StoreError::Reply(p.join(" "))),
        }
    }

    /// Adds what this node saw of booking's answers for `event` and, at most once a second across the nodes,
    /// decides an `adaptive` room's rate (`lua/queue_adapt.lua`): the rate in force and why, when decided now.
    pub async fn adapt(&self, event: i64, seen: &crate::health::Report) -> Result<Option<(u64, String)>, StoreError> {
        let mut inv = self.script(&self.scripts.adapt, event);
        inv.arg(seen.answered).arg(seen.slow).arg(seen.unavailable).arg(seen.stalled);
        let mut conn = self.conn.clone();
        let p = parts(self.run(inv.invoke_async(&mut conn)).await?)?;
        match p.first().map(String::as_str) {
            Some("fixed" | "waiting") => Ok(None),
            Some("decided") => Ok(Some((number(&p, 1)?, p.get(2).cloned().unwrap_or_default()))),
            _ => Err(StoreError::Reply(p.join(" "))),
        }
    }

    /// Adds a change to `event`'s schedule; `Ok(false)`, and nothing added, when it holds
    /// [`SCHEDULE_MAX`] already.
    pub async fn schedule_add(&self, event: i64, change: &Scheduled) -> Result<bool, StoreError> {
        let key = self.keys(event).key("schedule");
        let mut conn = self.conn.clone();
        let waiting: usize = self.run(conn.zcard(&key)).await?;
        if waiting >= SCHEDULE_MAX {
            return Ok(false);
        }
        let member = serde_json::to_string(change).map_err(|e| StoreError::Reply(e.to_string()))?;
        let _: i64 = self.run(conn.zadd(&key, member, change.at.saturating_mul(1000))).await?;
        self.replicate(event, false).await?;
        Ok(true)
    }

    /// `event`'s schedule: the changes waiting, earliest first, and the last applied, latest first.
    pub async fn schedule(&self, event: i64) -> Result<(Vec<Scheduled>, Vec<Applied>), StoreError> {
        let k = self.keys(event);
        let mut conn = self.conn.clone();
        let (waiting, applied): (Vec<String>, Vec<String>) = self
            .run(redis::pipe().zrange(k.key("schedule"), 0, -1).lrange(k.key("applied"), 0, -1).query_async(&mut conn))
            .await?;
        Ok((parse_all(&waiting), parse_all(&applied)))
    }

    /// Removes the waiting change `id` from `event`'s schedule: whether it was there.
    pub async fn schedule_cancel(&self, event: i64, id: &str) -> Result<bool, StoreError> {
        let key = self.keys(event).key("schedule");
        let mut conn = self.conn.clone();
        let waiting: Vec<String> = self.run(conn.zrange(&key, 0, -1)).await?;
        let Some(member) = waiting.iter().find(|m| serde_json::from_str::<Scheduled>(m).is_ok_and(|c| c.id == id))
        else {
            return Ok(false);
        };
        let removed: i64 = self.run(conn.zrem(&key, member)).await?;
        Ok(removed == 1)
    }

    /// Claims the changes of `event`'s schedule whose time has come (`lua/queue_schedule_take.lua`), earliest
    /// first: this node is to apply them, or [`Self::schedule_add`] them back.
    pub async fn schedule_take_due(&self, event: i64) -> Result<Vec<Scheduled>, StoreError> {
        let mut inv = self.script(&self.scripts.schedule, event);
        inv.arg(SCHEDULE_MAX);
        let mut conn = self.conn.clone();
        let due: Vec<String> = self.run(inv.invoke_async(&mut conn)).await?;
        Ok(parse_all(&due))
    }

    /// Records a scheduled change as applied (the last fifty are kept).
    pub async fn schedule_applied(&self, event: i64, applied: &Applied) -> Result<(), StoreError> {
        let key = self.keys(event).key("applied");
        let entry = serde_json::to_string(applied).map_err(|e| StoreError::Reply(e.to_string()))?;
        let mut conn = self.conn.clone();
        let () = self
            .run(redis::pipe().lpush(&key, entry).ignore().ltrim(&key, 0, 49).ignore().query_async(&mut conn))
            .await?;
        Ok(())
    }

    /// Admits `account` at once on a sponsor pass (`lua/queue_pass.lua`), spending the pass `id` until
    /// `expires_at_ms`.
    pub async fn admit_pass(
        &self,
        event: i64,
        account: &str,
        id: &str,
        expires_at_ms: u64,
    ) -> Result<Passed, StoreError> {
        let mut inv = self.script(&self.scripts.pass, event);
        inv.arg(account).arg(id).arg(expires_at_ms);
        let mut conn = self.conn.clone();
        let p = parts(self.run(inv.invoke_async(&mut conn)).await?)?;
        let passed = match p.first().map(String::as_str) {
            Some("unknown") => Passed::Unknown,
            Some("closed") => Passed::Closed(p.get(1).and_then(|s| QueueState::parse(s)).unwrap_or(QueueState::Closed)),
            Some("spent") => Passed::Spent,
            Some("full") => Passed::Full { max_active: number(&p, 1)? },
            Some("admitted") => Passed::Admitted { at_ms: number(&p, 1)?, session_seconds: number(&p, 2)? },
            _ => return Err(StoreError::Reply(p.join(" "))),
        };
        if matches!(passed, Passed::Admitted { .. }) {
            self.replicate(event, true).await?;
        }
        Ok(passed)
    }

    /// Frees `account`'s slot in `event`'s room at once (`lua/queue_free.lua`); one that left also gives up its
    /// admission and any place it waits in.
    pub async fn free(&self, event: i64, account: &str, by: FreedBy) -> Result<Freed, StoreError> {
        let mut inv = self.script(&self.scripts.free, event);
        inv.arg(account).arg(match by {
            FreedBy::Paid => "paid",
            FreedBy::Left => "left",
        });
        let mut conn = self.conn.clone();
        let p = parts(self.run(inv.invoke_async(&mut conn)).await?)?;
        let freed = match p.first().map(String::as_str) {
            Some("unknown") => Freed::Unknown,
            Some("freed") => Freed::Now { at_ms: number(&p, 1)? },
            Some("not_active") => Freed::NotActive { at_ms: number(&p, 1)? },
            _ => return Err(StoreError::Reply(p.join(" "))),
        };
        if by == FreedBy::Left {
            self.replicate(event, true).await?;
        }
        Ok(freed)
    }

    /// Counts `account`'s `sample` in the room's ETA error, once whichever nodes ask (`lua/queue_eta.lua`); true
    /// when it was counted now.
    pub async fn count_eta(&self, event: i64, account: &str, sample: &EtaSample) -> Result<bool, StoreError> {
        let mut inv = self.script(&self.scripts.eta, event);
        inv.arg(account).arg(sample.encode());
        let mut conn = self.conn.clone();
        let counted: u8 = self.run(inv.invoke_async(&mut conn)).await?;
        Ok(counted == 1)
    }

    /// The ETA samples of the room's last admitted fans (every node's), newest first; one that does not read is
    /// left out.
    pub async fn eta_samples(&self, event: i64) -> Result<Vec<EtaSample>, StoreError> {
        let mut conn = self.conn.clone();
        let raw: Vec<String> =
            self.run(conn.lrange(self.keys(event).key("etaerrs"), 0, EtaSample::KEPT as isize - 1)).await?;
        Ok(raw.iter().filter_map(|r| EtaSample::parse(r)).collect())
    }

    /// The id of the last entry of booking's order event stream ("0-0" when there is none): where a reader that
    /// starts now begins.
    pub async fn outbox_end(&self) -> Result<String, StoreError> {
        let mut conn = self.conn.clone();
        let last: RawEntries = self
            .run(
                redis::cmd("XREVRANGE")
                    .arg(outbox_key(&self.prefix))
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(1)
                    .query_async(&mut conn),
            )
            .await?;
        Ok(last.into_iter().next().map_or_else(|| "0-0".to_owned(), |(id, _)| id))
    }

    /// The orders paid in booking's order event stream after entry `after`, at most `count` entries read, and
    /// the id of the last entry read (`after` when none).
    pub async fn paid_after(&self, after: &str, count: usize) -> Result<(Vec<Paid>, String), StoreError> {
        let mut conn = self.conn.clone();
        let entries: RawEntries = self
            .run(
                redis::cmd("XRANGE")
                    .arg(outbox_key(&self.prefix))
                    .arg(format!("({after}"))
                    .arg("+")
                    .arg("COUNT")
                    .arg(count)
                    .query_async(&mut conn),
            )
            .await?;
        let last = entries.last().map_or_else(|| after.to_owned(), |(id, _)| id.clone());
        let paid = entries
            .into_iter()
            .filter_map(|(_, fields)| {
                let field = |name: &str| stream_field(&fields, name);
                if field("kind").map(String::as_str) != Some("order.paid") {
                    return None;
                }
                let event = field("event_id")?.parse().ok()?;
                let data: serde_json::Value = serde_json::from_str(field("data")?).ok()?;
                Some(Paid { event, account: data["account_id"].as_str()?.to_owned() })
            })
            .collect();
        Ok((paid, last))
    }

    /// One admission step (`lua/queue_admit.lua`).
    pub async fn admit(&self, event: i64, max_walk: u64, burst: Duration) -> Result<Stepped, StoreError> {
        let mut inv = self.script(&self.scripts.admit, event);
        inv.arg(max_walk).arg(burst.as_millis() as u64);
        let mut conn = self.conn.clone();
        let p = parts(self.run(inv.invoke_async(&mut conn)).await?)?;
        let stepped = match p.first().map(String::as_str) {
            Some("idle") => Stepped::Idle,
            Some("opening") => Stepped::Opening,
            Some("stepped") => Stepped::Moved {
                head: number(&p, 1)?,
                seq: number(&p, 2)?,
                admitted: number(&p, 3)?,
                skipped: number(&p, 4)?,
            },
            _ => return Err(StoreError::Reply(p.join(" "))),
        };
        if matches!(stepped, Stepped::Moved { admitted, skipped, .. } if admitted + skipped > 0) {
            self.replicate(event, false).await?;
        }
        Ok(stepped)
    }

    /// Changes the state, drawing the pre-queue when it opens (`lua/queue_set_state.lua`).
    pub async fn set_state(
        &self,
        event: i64,
        state: QueueState,
        seed: u64,
        expect: Option<QueueState>,
    ) -> Result<StateChange, StoreError> {
        let mut inv = self.script(&self.scripts.set_state, event);
        inv.arg(state.as_str()).arg(seed).arg(expect.map_or("", QueueState::as_str));
        let mut conn = self.conn.clone();
        let p = parts(self.run(inv.invoke_async(&mut conn)).await?)?;
        let state_of = |p: &[String]| p.get(1).cloned().unwrap_or_default();
        let change = match p.first().map(String::as_str) {
            Some("unknown") => StateChange::Unknown,
            Some("changed") => StateChange::Changed(state_of(&p)),
            Some("refused") => StateChange::Refused(state_of(&p)),
            Some("ok") => StateChange::Done { drawn: number(&p, 2)? },
            _ => return Err(StoreError::Reply(p.join(" "))),
        };
        if matches!(change, StateChange::Done { .. }) {
            self.replicate(event, false).await?;
        }
        Ok(change)
    }

    /// Records that these accounts polled (`lua/queue_touch.lua`).
    pub async fn touch(&self, event: i64, accounts: &[String]) -> Result<(), StoreError> {
        if accounts.is_empty() {
            return Ok(());
        }
        let mut inv = self.scripts.touch.prepare_invoke();
        inv.key(self.keys(event).key("seen"));
        for account in accounts {
            inv.arg(account);
        }
        let mut conn = self.conn.clone();
        let _: u64 = self.run(inv.invoke_async(&mut conn)).await?;
        Ok(())
    }

    /// Says this node is alive (or, `leaving`, that it is not) and returns how many nodes are.
    pub async fn register_node(&self, node: &str, alive: Duration, leaving: bool) -> Result<u32, StoreError> {
        let mut inv = self.scripts.nodes.prepare_invoke();
        inv.key(nodes_key(&self.prefix)).arg(node).arg(alive.as_millis() as u64).arg(if leaving { "1" } else { "0" });
        let mut conn = self.conn.clone();
        let count: u64 = self.run(inv.invoke_async(&mut conn)).await?;
        Ok(u32::try_from(count).unwrap_or(u32::MAX))
    }

    /// The events that have a waiting room.
    pub async fn rooms(&self) -> Result<Vec<i64>, StoreError> {
        let mut conn = self.conn.clone();
        let members: Vec<String> = self.run(conn.smembers(rooms_key(&self.prefix))).await?;
        Ok(members.iter().filter_map(|m| m.parse().ok()).collect())
    }

    /// The event's seat map version (0: nothing logged yet).
    pub async fn map_version(&self, event: i64) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        let version: Option<u64> = self.run(conn.get(SeatMapKeys::new(&self.prefix, event).version)).await?;
        Ok(version.unwrap_or(0))
    }

    /// The event's change log after `after`, at most `count` entries.
    pub async fn map_log(&self, event: i64, after: u64, count: usize) -> Result<Vec<LogEntry>, StoreError> {
        let mut conn = self.conn.clone();
        let key = SeatMapKeys::new(&self.prefix, event).log;
        let mut cmd = redis::cmd("XRANGE");
        let fut = cmd.arg(key).arg(format!("({after}-0")).arg("+").arg("COUNT").arg(count).query_async(&mut conn);
        log_entries(self.run(fut).await?)
    }

    /// Whether the event's log still holds every entry it was ever given (nothing trimmed), so a client that has
    /// seen none of them (version 0) can be replayed all of them.
    pub async fn map_log_whole(&self, event: i64) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("XINFO");
        let fut = cmd.arg("STREAM").arg(SeatMapKeys::new(&self.prefix, event).log).query_async(&mut conn);
        let info: HashMap<String, Value> = self.run(fut).await?;
        // Every entry ever added is still there (trimming does not count as a deletion; the lengths tell).
        let count = |field: &str| match info.get(field) {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        };
        Ok(matches!((count("entries-added"), count("length")), (Some(added), Some(length)) if added == length))
    }

    /// Keeps a demo sign-in code for `lifetime`: exchanged once, for `account_token`.
    pub async fn put_signin_code(&self, code: &str, account_token: &str, lifetime: Duration) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let seconds = lifetime.as_secs().max(1);
        let () = self.run(conn.set_ex(signin_key(&self.prefix, code), account_token, seconds)).await?;
        Ok(())
    }

    /// The account token a demo sign-in code was made for, once: the code is gone as it is read.
    pub async fn take_signin_code(&self, code: &str) -> Result<Option<String>, StoreError> {
        let mut conn = self.conn.clone();
        self.run(conn.get_del(signin_key(&self.prefix, code))).await
    }

    /// The account's place, if it has one.
    pub async fn place_of(&self, event: i64, account: &str) -> Result<Option<u64>, StoreError> {
        let mut conn = self.conn.clone();
        self.run(conn.hget(self.keys(event).key("places"), account)).await
    }

    /// The room's settings straight from Redis.
    pub async fn settings(&self, event: i64) -> Result<Option<Settings>, StoreError> {
        let mut conn = self.conn.clone();
        let hash: HashMap<String, String> = self.run(conn.hgetall(self.keys(event).key("settings"))).await?;
        Ok(Settings::from_hash(&hash))
    }

    /// Reads the queue in one MULTI/EXEC, fetching only steps after `last_to` and skips after `last_skipped`.
    pub async fn snapshot(
        &self,
        event: i64,
        last_to: u64,
        last_skipped: u64,
        left_since: u64,
    ) -> Result<Snapshot, StoreError> {
        let k = self.keys(event);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("TIME")
            .hgetall(k.key("settings"))
            .get(k.key("seq"))
            .get(k.key("head"))
            .hgetall(k.key("stats"))
            .zcard(k.key("active"))
            .scard(k.key("pre"))
            .lrange(k.key("waits"), 0, -1)
            .zrangebyscore(k.key("batches"), format!("({last_to}"), "+inf")
            .zrangebyscore(k.key("skipped"), format!("({last_skipped}"), "+inf")
            .zrangebyscore_withscores(k.key("left"), left_since, "+inf")
            .zrange(k.key("schedule"), 0, -1);
        type Reply = (
            (u64, u64),
            HashMap<String, String>,
            Option<u64>,
            Option<u64>,
            HashMap<String, String>,
            u64,
            u64,
            Vec<u64>,
            Vec<String>,
            Vec<u64>,
            Vec<(String, u64)>,
            Vec<String>,
        );
        let mut conn = self.conn.clone();
        let (time, settings, seq, head, stats, active, prequeue, waits_ms, batches, skipped, left, schedule): Reply =
            self.run(pipe.query_async(&mut conn)).await?;
        let stat = |name: &str| stats.get(name).and_then(|v| v.parse().ok()).unwrap_or(0);
        let new_batches = batches.iter().map(|m| Batch::parse(m).ok_or_else(|| StoreError::Reply(m.clone())));
        Ok(Snapshot {
            settings: Settings::from_hash(&settings),
            counts: Counts {
                seq: seq.unwrap_or(0),
                head: head.unwrap_or(0),
                active,
                admitted_total: stat("admitted_total"),
                abandoned_total: stat("abandoned_total"),
                prequeue,
                later_seq: stat("later_seq"),
                later_head: stat("later_head"),
                freed_total: stat("freed_total"),
                last_draw_ms: stat("last_draw_ms"),
                next_draw_ms: stat("next_draw_ms"),
                eta_counted: stat("eta_counted"),
            },
            waits_ms,
            new_batches: new_batches.collect::<Result<_, _>>()?,
            new_skipped: skipped,
            new_left: left,
            schedule: parse_all(&schedule),
            redis_ms: time.0 * 1000 + time.1 / 1000,
        })
    }

    /// Creates the room with defaults when it does not exist, then applies `patch` (the state last, through
    /// `set_state`). Returns the settings as stored.
    pub async fn configure(&self, event: i64, patch: &SettingsPatch, seed: u64) -> Result<Configured, StoreError> {
        let k = self.keys(event);
        let settings_key = k.key("settings");
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (field, value) in Settings::DEFAULT.fields() {
            pipe.hset_nx(&settings_key, field, value).ignore();
        }
        let mut fields: Vec<(&str, String)> = Vec::new();
        let numbers = [
            ("admit_per_minute", patch.admit_per_minute),
            ("max_active", patch.max_active),
            ("session_seconds", patch.session_seconds),
            ("abandon_after_seconds", patch.abandon_after_seconds),
            ("challenge_difficulty", patch.challenge_difficulty),
            ("challenge_min_difficulty", patch.challenge_min_difficulty),
            ("challenge_max_difficulty", patch.challenge_max_difficulty),
            ("challenge_window_seconds", patch.challenge_window_seconds),
            ("places_per_network", patch.places_per_network),
            ("rate_floor", patch.rate_floor),
            ("rate_ceiling", patch.rate_ceiling),
            ("target_p99_ms", patch.target_p99_ms),
            ("target_503_percent", patch.target_503_percent),
            ("draw_every_seconds", patch.draw_every_seconds),
        ];
        fields.extend(numbers.iter().filter_map(|(name, v)| v.map(|v| (*name, v.to_string()))));
        if let Some(at) = patch.opens_at {
            fields.push(("opens_at", (at * 1000).to_string()));
        }
        if let Some(mode) = patch.challenge {
            fields.push(("challenge", mode.as_str().to_owned()));
        }
        if let Some(held) = patch.infinite_queue_for_failed {
            fields.push(("infinite_queue_for_failed", u8::from(held).to_string()));
        }
        if let Some(access) = patch.access {
            fields.push(("access", access.as_str().to_owned()));
        }
        if let Some(queueing) = patch.queueing {
            fields.push(("queueing", queueing.as_str().to_owned()));
        }
        if let Some(all) = patch.queue_all {
            fields.push(("queue_all", u8::from(all).to_string()));
        }
        if let Some(mode) = patch.rate_mode {
            fields.push(("rate_mode", mode.as_str().to_owned()));
            // A new mode starts afresh: adaptive from the operators' rate within the bounds.
            pipe.hdel(&settings_key, &["rate_in_force", "rate_reason"]).ignore();
        }
        if !fields.is_empty() {
            pipe.hset_multiple(&settings_key, &fields).ignore();
            pipe.hincr(&settings_key, "version", 1).ignore();
        }
        let () = self.run(pipe.query_async(&mut conn)).await?;
        self.replicate(event, false).await?;
        self.list_room(event).await?;
        let change = match patch.state {
            Some(state) => Some(self.set_state(event, state, seed, None).await?),
            None => None,
        };
        let settings = self.settings(event).await?.ok_or_else(|| StoreError::Reply("settings vanished".into()))?;
        Ok(Configured { settings, change })
    }

    /// Writes back a room's settings that Redis lost (a flush, a failover to a replica that never had them), as a
    /// node last read them; a field written meanwhile (an operator's change) is kept. The queue's places and
    /// counters are not restored: they are gone with the data.
    pub async fn restore(&self, event: i64, settings: &Settings) -> Result<(), StoreError> {
        let settings_key = self.keys(event).key("settings");
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (field, value) in settings.fields() {
            pipe.hset_nx(&settings_key, field, value).ignore();
        }
        let () = self.run(pipe.query_async(&mut conn)).await?;
        self.replicate(event, false).await?;
        self.list_room(event).await
    }

    /// Adds the event to the set of rooms, after its settings are written. The set has no hash tag (it spans
    /// every event), so on a cluster it lives in another slot than the room and cannot share its transaction; a
    /// room written but not yet listed is listed by the next `configure` or `restore`.
    async fn list_room(&self, event: i64) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: i64 = self.run(conn.sadd(rooms_key(&self.prefix), event)).await?;
        Ok(())
    }

    /// Records whether every seat left is held or awaiting payment, and what may come back when (`all_held`
    /// and `held_*` in the room's settings): the admission step admits nobody while it is, and every node
    /// reads it with the room.
    /// `ending`: the last seats are selling.
    pub async fn set_all_held(
        &self,
        event: i64,
        held: Option<crate::room::HeldBack>,
        ending: bool,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let key = self.keys(event).key("settings");
        let mut fields = match held {
            Some(h) => {
                vec![("all_held", 1), ("held_seats", h.seats), ("held_next_release", h.next_release_ms.unwrap_or(0))]
            }
            None => vec![("all_held", 0)],
        };
        fields.push(("ending", u64::from(ending)));
        let () = self.run(conn.hset_multiple(key, &fields)).await?;
        Ok(())
    }

    /// Adds a batch of presale codes to `event`'s room (normalised, as the join script reads them). `Ok(false)`,
    /// and nothing written, when one of them is in the room already (an operator's own code chosen twice).
    pub async fn add_codes(
        &self,
        event: i64,
        batch: &crate::codes::Batch,
        codes: &[String],
    ) -> Result<bool, StoreError> {
        let k = self.keys(event);
        let mut conn = self.conn.clone();
        let taken: Vec<bool> = self
            .run(redis::cmd("HMGET").arg(k.key("codes")).arg(codes).query_async::<Vec<Option<String>>>(&mut conn))
            .await?
            .into_iter()
            .map(|v| v.is_some())
            .collect();
        if taken.iter().any(|t| *t) {
            return Ok(false);
        }
        let stored = batch.stored();
        let meta = serde_json::to_string(batch).map_err(|e| StoreError::Reply(e.to_string()))?;
        let mut pipe = redis::pipe();
        pipe.atomic();
        for chunk in codes.chunks(1000) {
            let fields: Vec<(&str, &str)> = chunk.iter().map(|c| (c.as_str(), stored.as_str())).collect();
            pipe.hset_multiple(k.key("codes"), &fields).ignore();
        }
        pipe.hset(k.key("codebatches"), &batch.batch, meta).ignore();
        let () = self.run(pipe.query_async(&mut conn)).await?;
        self.replicate(event, false).await?;
        let mut index = redis::pipe();
        for chunk in codes.chunks(1000) {
            let fields: Vec<(&str, i64)> = chunk.iter().map(|c| (c.as_str(), event)).collect();
            index.hset_multiple(codes_index_key(&self.prefix), &fields).ignore();
        }
        let () = self.run(index.query_async(&mut conn)).await?;
        Ok(true)
    }

    /// The room a presale code was made for, if any.
    pub async fn code_room(&self, code: &str) -> Result<Option<i64>, StoreError> {
        let mut conn = self.conn.clone();
        self.run(conn.hget(codes_index_key(&self.prefix), code)).await
    }

    /// `event`'s presale codes: each batch with its redemptions counted, and who redeemed what (newest first,
    /// at most `crate::codes::MAX_LISTED`).
    pub async fn codes_report(&self, event: i64) -> Result<crate::codes::Report, StoreError> {
        use crate::codes::{Batch as CodeBatch, BatchView, MAX_LISTED, Redemption, Report};
        let k = self.keys(event);
        let mut conn = self.conn.clone();
        let (batches, uses, holders): (HashMap<String, String>, HashMap<String, u64>, u64) = self
            .run(
                redis::pipe()
                    .atomic()
                    .hgetall(k.key("codebatches"))
                    .hgetall(k.key("uses"))
                    .hlen(k.key("holders"))
                    .query_async(&mut conn),
            )
            .await?;
        // Which batch each redeemed code is of.
        let redeemed_codes: Vec<&String> = uses.keys().collect();
        let metas: Vec<Option<String>> = if redeemed_codes.is_empty() {
            Vec::new()
        } else {
            self.run(redis::cmd("HMGET").arg(k.key("codes")).arg(&redeemed_codes).query_async(&mut conn)).await?
        };
        let mut by_batch: HashMap<String, u64> = HashMap::new();
        for (code, meta) in redeemed_codes.iter().zip(metas) {
            if let Some(batch) = meta.as_deref().and_then(|m| m.split(':').next()) {
                *by_batch.entry(batch.to_owned()).or_default() += uses[*code];
            }
        }
        let mut views: Vec<BatchView> = batches
            .values()
            .filter_map(|json| serde_json::from_str::<CodeBatch>(json).ok())
            .map(|batch| BatchView { redeemed: by_batch.get(&batch.batch).copied().unwrap_or(0), batch })
            .collect();
        views.sort_by(|a, b| (a.batch.created_at, &a.batch.batch).cmp(&(b.batch.created_at, &b.batch.batch)));
        let mut redemptions = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, page): (u64, Vec<(String, String)>) = self
                .run(
                    redis::cmd("HSCAN").arg(k.key("holders")).arg(cursor).arg("COUNT").arg(1000).query_async(&mut conn),
                )
                .await?;
            for (account, value) in page {
                if let Some((code, at_ms)) = value.rsplit_once(':') {
                    let at = at_ms.parse::<u64>().unwrap_or(0) / 1000;
                    redemptions.push(Redemption { account, code: code.to_owned(), at });
                }
            }
            cursor = next;
            if cursor == 0 || redemptions.len() >= MAX_LISTED {
                break;
            }
        }
        redemptions.sort_by(|a, b| b.at.cmp(&a.at).then_with(|| a.account.cmp(&b.account)));
        redemptions.truncate(MAX_LISTED);
        Ok(Report { event_id: event, batches: views, redeemed_total: holders, redemptions })
    }

    /// The recorded pre-queue draw, once the pre-queue has opened.
    pub async fn draw(&self, event: i64) -> Result<Option<Draw>, StoreError> {
        let k = self.keys(event);
        let mut conn = self.conn.clone();
        let (shuffle, join_order): (HashMap<String, u64>, Vec<String>) = self
            .run(
                redis::pipe().atomic().hgetall(k.key("shuffle")).lrange(k.key("prelist"), 0, -1).query_async(&mut conn),
            )
            .await?;
        // A lottery's pools follow the pre-queue's accounts in the list.
        let count = shuffle.get("count").map_or(join_order.len(), |&n| n as usize);
        Ok(shuffle.get("seed").map(|&seed| Draw {
            seed,
            base: shuffle.get("base").copied().unwrap_or(0),
            at_ms: shuffle.get("at_ms").copied().unwrap_or(0),
            join_order: join_order.into_iter().take(count).collect(),
        }))
    }

    /// A `lottery` room's draw step (`lua/queue_draw.lua`): how many places it drew now, if it drew.
    pub async fn draw_lottery(&self, event: i64, seed: u64) -> Result<Option<u64>, StoreError> {
        let mut inv = self.script(&self.scripts.draw, event);
        inv.arg(seed);
        let mut conn = self.conn.clone();
        let p = parts(self.run(inv.invoke_async(&mut conn)).await?)?;
        match p.first().map(String::as_str) {
            Some("idle" | "waiting") => Ok(None),
            Some("drawn") => Ok(Some(number(&p, 1)?)),
            _ => Err(StoreError::Reply(p.join(" "))),
        }
    }

    /// A `lottery` room's recorded draws, oldest first, each with the pool it drew in join order.
    pub async fn lottery_draws(&self, event: i64) -> Result<Vec<Draw>, StoreError> {
        let k = self.keys(event);
        let mut conn = self.conn.clone();
        let (records, join_order): (Vec<String>, Vec<String>) = self
            .run(
                redis::pipe()
                    .atomic()
                    .lrange(k.key("draws"), 0, -1)
                    .lrange(k.key("prelist"), 0, -1)
                    .query_async(&mut conn),
            )
            .await?;
        records
            .iter()
            .map(|r| {
                let n: Vec<u64> = r.split(':').filter_map(|p| p.parse().ok()).collect();
                let [seed, from, count, base, at_ms] = n[..] else { return Err(StoreError::Reply(r.clone())) };
                let pool = join_order.iter().skip(from as usize).take(count as usize).cloned().collect();
                Ok(Draw { seed, base, at_ms, join_order: pool })
            })
            .collect()
    }

    /// Whether `account` waits in `event`'s pool (a lottery's next draw, or the pre-queue).
    pub async fn in_pool(&self, event: i64, account: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        self.run(conn.sismember(self.keys(event).key("pre"), account)).await
    }

    /// The accounts at places `base + 1 ..= base + n`, in place order (from the place -> account record).
    pub async fn accounts_at(&self, event: i64, base: u64, n: u64) -> Result<Vec<Option<String>>, StoreError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let places: Vec<u64> = (base + 1..=base + n).collect();
        let mut conn = self.conn.clone();
        self.run(redis::cmd("HMGET").arg(self.keys(event).key("who")).arg(&places).query_async(&mut conn)).await
    }
}

/// The outcome of an operator's change.
#[derive(Debug, Clone)]
pub struct Configured {
    pub settings: Settings,
    pub change: Option<StateChange>,
}
