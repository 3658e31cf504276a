//! Seat holds in Redis: typed wrappers around the scripts in `lua/`, and the one place keys are built.
//!
//! Every key of an event carries the hash tag `{ev<id>}`, so each script touches one slot and the same code
//! runs on a single Redis and on Redis Cluster. Scripts are sent with EVALSHA; the redis crate falls back to
//! loading the script when the server answers NOSCRIPT (after a restart or failover).

use std::time::Duration;

use redis::Script;
use redisconn::Conn;

use super::StoreError;
use crate::domain::order::Status;
use crate::domain::{EventId, HoldToken, MapVersion, SeatId, SeatStatus, split_seats};

/// The start of a seat's Redis value once it is in an order ("sold:<hold token>"; see `lua/reserve_seats.lua`).
const SOLD: &str = "sold:";

/// Builds every Redis key booking uses. `prefix` namespaces a deployment (or a test) and never contains a
/// brace, so the event's hash tag is always the first one in the key.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> anyhow::Result<Self> {
        anyhow::ensure!(!prefix.contains(['{', '}']), "the Redis key prefix must not contain braces");
        Ok(Self { prefix: prefix.to_owned() })
    }

    pub fn seat(&self, event: EventId, seat: SeatId) -> String {
        format!("{}{seat}", self.seat_prefix(event))
    }

    /// Every seat key of the event is this and the seat id (for `verify_hold.lua`, which reads the seats from
    /// the hold's record).
    pub fn seat_prefix(&self, event: EventId) -> String {
        format!("{}hold:{{ev{event}}}:seat:", self.prefix)
    }

    pub fn record(&self, event: EventId, token: HoldToken) -> String {
        format!("{}hold:{{ev{event}}}:token:{token}", self.prefix)
    }

    pub fn account(&self, event: EventId, account: &str) -> String {
        format!("{}hold:{{ev{event}}}:account:{account}", self.prefix)
    }

    /// A hold request's idempotency key, per account (the account's length first, so no two pairs of account
    /// and key name the same Redis key).
    pub fn hold_idempotency(&self, event: EventId, account: &str, key: &str) -> String {
        format!("{}hold:{{ev{event}}}:idem:{}:{account}:{key}", self.prefix, account.len())
    }

    pub fn version(&self, event: EventId) -> String {
        redisconn::keys::seatmap(&self.prefix, event, "version")
    }

    /// The event's change log, a stream whose entry ids are map versions (see `lua/lib/seatmap_log.lua`).
    pub fn log(&self, event: EventId) -> String {
        redisconn::keys::seatmap(&self.prefix, event, "log")
    }

    /// What lapses by time to live, by when (see `lua/lib/seatmap_log.lua`).
    pub fn lapses(&self, event: EventId) -> String {
        redisconn::keys::seatmap(&self.prefix, event, "lapses")
    }

    /// The seats the event's log last said were held or sold (see `lua/lib/seatmap_log.lua`).
    pub fn taken(&self, event: EventId) -> String {
        redisconn::keys::seatmap(&self.prefix, event, "taken")
    }

    /// The run id of the Redis server that last said it keeps the event's keys (see `lua/seatmap_server.lua`).
    pub fn server(&self, event: EventId) -> String {
        redisconn::keys::seatmap(&self.prefix, event, "server")
    }

    /// The event's seat map keys every state-changing script takes, in this order: version, log, lapses, taken.
    pub fn map(&self, event: EventId) -> [String; 4] {
        [self.version(event), self.log(event), self.lapses(event), self.taken(event)]
    }

    /// The stream the outbox relay publishes order events to (one for every event; no hash tag, as no script
    /// touches it together with an event's keys).
    pub fn outbox_stream(&self) -> String {
        redisconn::keys::order_stream(&self.prefix)
    }
}

/// The scripts' sources. Each one that changes a seat's state starts with `lua/lib/seatmap_log.lua`, the
/// functions that write the event's change log.
pub mod sources {
    macro_rules! changes_seats {
        ($file:literal) => {
            concat!(include_str!("../../../lua/lib/seatmap_log.lua"), include_str!(concat!("../../../lua/", $file)))
        };
    }
    pub const ACQUIRE_HOLD: &str = changes_seats!("acquire_hold.lua");
    pub const RELEASE_HOLD: &str = changes_seats!("release_hold.lua");
    pub const EXTEND_HOLD: &str = include_str!("../../../lua/extend_hold.lua");
    pub const RESERVE_SEATS: &str = changes_seats!("reserve_seats.lua");
    pub const RELEASE_SEATS: &str = changes_seats!("release_seats.lua");
    pub const SEATMAP_LAPSE: &str = changes_seats!("seatmap_lapse.lua");
    pub const VERIFY_HOLD: &str = include_str!("../../../lua/verify_hold.lua");
    pub const SEATMAP_SERVER: &str = include_str!("../../../lua/seatmap_server.lua");
    /// Deletes a key if it still has the given value.
    pub const UNCLAIM_KEY: &str =
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
}

struct Scripts {
    acquire: Script,
    release: Script,
    extend: Script,
    reserve: Script,
    release_order: Script,
    lapse: Script,
    verify: Script,
    unclaim: Script,
    server: Script,
}

impl Scripts {
    fn load() -> Self {
        Self {
            acquire: Script::new(sources::ACQUIRE_HOLD),
            release: Script::new(sources::RELEASE_HOLD),
            extend: Script::new(sources::EXTEND_HOLD),
            reserve: Script::new(sources::RESERVE_SEATS),
            release_order: Script::new(sources::RELEASE_SEATS),
            lapse: Script::new(sources::SEATMAP_LAPSE),
            verify: Script::new(sources::VERIFY_HOLD),
            unclaim: Script::new(sources::UNCLAIM_KEY),
            server: Script::new(sources::SEATMAP_SERVER),
        }
    }
}

/// Hold timings, from configuration.
#[derive(Debug, Clone, Copy)]
pub struct HoldTimes {
    /// How long a new hold lasts, and how far an extension pushes it.
    pub ttl: Duration,
    /// No hold lives longer than this after it was made, however often it is extended.
    pub max_total: Duration,
    /// How long a hold's record outlives the hold, so a late caller hears "expired" rather than "unknown".
    pub record_retention: Duration,
}

/// The seats of an order, as Redis knows them: by the hold token they were checked out with.
#[derive(Debug, Clone, Copy)]
pub struct OrderSeats<'a> {
    pub token: HoldToken,
    pub account: &'a str,
    pub seats: &'a [SeatId],
}

/// Which of an order's seats `reserve_seats` marks (its ARGV[1]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marking {
    /// Only seats still carrying the hold's token or the order's marker.
    Ours = 0,
    /// Every seat, whatever Redis holds for it (Postgres just gave the seats to the order).
    Whatever = 1,
    /// Every seat if each is free or the order's own, else none.
    AllOrNone = 2,
}

/// How long an order's seats stay marked taken in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Until the payment deadline, unix ms (Postgres's clock).
    Deadline(i64),
    /// For good: the order is paid.
    Paid,
}

impl Until {
    /// Until a deadline given by Postgres.
    pub fn deadline(at: time::OffsetDateTime) -> Self {
        Until::Deadline(i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX))
    }
}

/// A request for one block of seats: a fan's basket (one block), or candidate blocks of the same size, best
/// first, of which the first wholly free one is granted.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
    pub account: &'a str,
    pub token: HoldToken,
    /// The seats the blocks are made of, each once.
    pub seats: &'a [SeatId],
    /// Where each block starts in `seats` (0-based), best first: a block is `block_size` seats from there.
    pub blocks: &'a [usize],
    pub block_size: usize,
    pub max_per_account: usize,
    /// The request's claimed idempotency key: granting also records the hold under it.
    pub idempotency: Option<&'a HoldKey>,
}

/// How long a claimed idempotency key waits for its request to end before another may claim it (a request
/// takes milliseconds; this only frees the key of a request whose server died mid-way).
const IDEMPOTENCY_PENDING: Duration = Duration::from_secs(10);

/// An idempotency key claimed for one hold request: its Redis key and the request's fingerprint. Its value is
/// `p:<fingerprint>` while the request runs, then `h:<fingerprint>:<hold token>` (written by the grant itself,
/// kept as long as the hold's record).
#[derive(Debug, Clone)]
pub struct HoldKey {
    key: String,
    fingerprint: String,
}

impl HoldKey {
    fn granted(&self, token: HoldToken) -> String {
        format!("h:{}:{token}", self.fingerprint)
    }
}

/// What an idempotency key said when a hold request claimed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Unused: the request goes ahead.
    New,
    /// The same request is still running.
    InFlight,
    /// The key was used for another request.
    Reused,
    /// The same request made this hold.
    Granted(HoldToken),
}

/// Outcome of asking for seats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// `block` (0-based) of the ask is held; `version` is the map version whose log entry shows it.
    Granted { expires_at_ms: i64, version: MapVersion, block: usize },
    /// One block asked for: the seat at this index of it (0-based) is held or sold.
    SeatTaken { index: usize },
    /// Several blocks asked for: every one has a seat held or sold.
    NoneFree,
    /// The account already holds or bought `counted` seats; the basket would take it over the cap.
    AccountCap { counted: i64 },
}

/// A hold's record, as read before release, extend or checkout.
#[derive(Debug, Clone)]
pub struct HoldRecord {
    pub account: String,
    pub seats: Vec<SeatId>,
    seats_raw: String,
}

/// Outcome of a compare-and-* script on an existing hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldCheck {
    /// The hold is this caller's and alive; `expires_at_ms` is its (possibly new) expiry.
    Live {
        expires_at_ms: i64,
    },
    /// Released: how many seats still carried the token.
    Released {
        seats: i64,
    },
    /// The hold's time ran out (`index` None) or a seat (0-based index) is no longer its own.
    Lost {
        index: Option<usize>,
    },
    NotYours,
    NotFound,
}

/// What one lapse step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lapsed {
    /// Lapsed holds and orders taken off the index.
    pub taken: usize,
    /// Seats logged as available (the others were held or sold again meanwhile).
    pub seats: usize,
    /// The version of the log entry, if one was written.
    pub version: Option<MapVersion>,
    /// How long until the earliest lapse left is due, by Redis's clock (`None`: none waits).
    pub next_due: Option<Duration>,
}

/// The Redis side of holds. Cheap to clone: the connection manager multiplexes one connection.
#[derive(Clone)]
pub struct Holds {
    conn: Conn,
    keys: Keys,
    timeout: Duration,
    times: HoldTimes,
    scripts: std::sync::Arc<Scripts>,
}

impl Holds {
    /// How long a new hold lasts.
    pub fn ttl(&self) -> Duration {
        self.times.ttl
    }

    pub fn new(conn: Conn, keys: Keys, timeout: Duration, times: HoldTimes) -> Self {
        Self { conn, keys, timeout, times, scripts: std::sync::Arc::new(Scripts::load()) }
    }

    /// The Redis connection (shared, multiplexed) and the key builder, for the outbox relay.
    pub fn connection(&self) -> (Conn, &Keys) {
        (self.conn.clone(), &self.keys)
    }

    async fn run<T>(&self, fut: impl Future<Output = redis::RedisResult<T>>) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(reply) => Ok(reply?),
            Err(_) => Err(StoreError::RedisTimeout(self.timeout)),
        }
    }

    /// Grants one block of `ask` to its token: the first whose seats are all free, or none.
    pub async fn acquire(&self, event: EventId, ask: &Ask<'_>) -> Result<Acquired, StoreError> {
        let n = ask.block_size;
        if n == 0 || ask.blocks.is_empty() || ask.blocks.iter().any(|&b| b + n > ask.seats.len()) {
            return Err(StoreError::Unexpected(format!("blocks of {n} of {} seats", ask.seats.len())));
        }
        let mut inv = self.scripts.acquire.prepare_invoke();
        inv.key(self.keys.record(event, ask.token)).key(self.keys.account(event, ask.account));
        for key in self.keys.map(event) {
            inv.key(key);
        }
        if let Some(claim) = ask.idempotency {
            inv.key(&claim.key);
        }
        for &seat in ask.seats {
            inv.key(self.keys.seat(event, seat));
        }
        inv.arg(ask.token.to_string())
            .arg(ask.account)
            .arg(ms(self.times.ttl))
            .arg(ask.max_per_account)
            .arg(ms(self.times.record_retention))
            .arg(n)
            .arg(ask.idempotency.map_or_else(String::new, |c| c.granted(ask.token)));
        for &start in ask.blocks {
            inv.arg(start + 1);
        }
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = self.run(inv.invoke_async(&mut conn)).await?;
        let blocks = ask.blocks.len();
        match reply.as_slice() {
            [1, expires, version, block] if *version > 0 && *block >= 1 && (*block as usize) <= blocks => {
                Ok(Acquired::Granted { expires_at_ms: *expires, version: *version as u64, block: *block as usize - 1 })
            }
            [0, 0] if blocks > 1 => Ok(Acquired::NoneFree),
            [0, i] if blocks == 1 && *i >= 1 && (*i as usize) <= n => {
                Ok(Acquired::SeatTaken { index: *i as usize - 1 })
            }
            [-1, counted] => Ok(Acquired::AccountCap { counted: *counted }),
            other => Err(StoreError::Unexpected(format!("acquire_hold: {other:?}"))),
        }
    }

    /// Claims an idempotency key for a hold request whose fingerprint is `fingerprint`; unless the answer is
    /// `Claim::New`, the key was claimed before and the request must not make a hold.
    pub async fn claim_key(
        &self,
        event: EventId,
        account: &str,
        key: &str,
        fingerprint: &str,
    ) -> Result<(Claim, HoldKey), StoreError> {
        let claim =
            HoldKey { key: self.keys.hold_idempotency(event, account, key), fingerprint: fingerprint.to_owned() };
        let mut conn = self.conn.clone();
        let pending = format!("p:{fingerprint}");
        // SET NX GET: the earlier value if there was one (and nothing set), else nil (and the claim is ours).
        let before: Option<String> = self
            .run(
                redis::cmd("SET")
                    .arg(&claim.key)
                    .arg(&pending)
                    .arg("NX")
                    .arg("GET")
                    .arg("PX")
                    .arg(ms(IDEMPOTENCY_PENDING))
                    .query_async(&mut conn),
            )
            .await?;
        let Some(before) = before else {
            return Ok((Claim::New, claim));
        };
        // A request in flight with the key answers first, whatever it asked (as checkout does): what it makes is
        // not known yet.
        let answer = match before.split_once(':') {
            Some(("p", _)) => Claim::InFlight,
            Some(("h", rest)) => match rest.rsplit_once(':') {
                Some((fp, _)) if fp != fingerprint => Claim::Reused,
                Some((_, token)) => match uuid::Uuid::parse_str(token) {
                    Ok(token) => Claim::Granted(HoldToken(token)),
                    Err(_) => return Err(StoreError::Unexpected(format!("idempotency key value {before:?}"))),
                },
                None => return Err(StoreError::Unexpected(format!("idempotency key value {before:?}"))),
            },
            _ => return Err(StoreError::Unexpected(format!("idempotency key value {before:?}"))),
        };
        Ok((answer, claim))
    }

    /// Gives back a claimed key whose request made no hold, so a retry is served anew; a key that made a hold
    /// (or was claimed again since) is left as it is.
    pub async fn unclaim(&self, claim: &HoldKey) -> Result<(), StoreError> {
        let mut inv = self.scripts.unclaim.prepare_invoke();
        inv.key(&claim.key).arg(format!("p:{}", claim.fingerprint));
        let mut conn = self.conn.clone();
        let _: i64 = self.run(inv.invoke_async(&mut conn)).await?;
        Ok(())
    }

    /// The expiry of a hold's record (unix ms), if it has one.
    pub async fn expiry(&self, event: EventId, token: HoldToken) -> Result<Option<i64>, StoreError> {
        let mut conn = self.conn.clone();
        self.run(redis::cmd("HGET").arg(self.keys.record(event, token)).arg("expires").query_async(&mut conn)).await
    }

    /// Reads a hold's record; `None` if it does not exist (never did, released, or long expired).
    pub async fn record(&self, event: EventId, token: HoldToken) -> Result<Option<HoldRecord>, StoreError> {
        let mut conn = self.conn.clone();
        let key = self.keys.record(event, token);
        let (account, seats): (Option<String>, Option<String>) =
            self.run(redis::cmd("HMGET").arg(&key).arg("account").arg("seats").query_async(&mut conn)).await?;
        match (account, seats) {
            (Some(account), Some(raw)) => {
                let seats = split_seats(&raw).ok_or_else(|| StoreError::Unexpected(format!("seat list {raw:?}")))?;
                Ok(Some(HoldRecord { account, seats, seats_raw: raw }))
            }
            _ => Ok(None),
        }
    }

    /// Compare-and-delete: frees the seats that still carry `token`, if the hold is `account`'s.
    pub async fn release(
        &self,
        event: EventId,
        account: &str,
        token: HoldToken,
        rec: &HoldRecord,
    ) -> Result<HoldCheck, StoreError> {
        let mut inv = self.on_hold(&self.scripts.release, event, token, rec);
        inv.arg(account).arg(&rec.seats_raw);
        decode_check("release_hold", &self.call(inv).await?, |n| HoldCheck::Released { seats: n })
    }

    /// Compare-and-set: pushes a live hold's expiry by the hold time, capped at its absolute maximum.
    pub async fn extend(
        &self,
        event: EventId,
        account: &str,
        token: HoldToken,
        rec: &HoldRecord,
    ) -> Result<HoldCheck, StoreError> {
        let mut inv = self.on_hold(&self.scripts.extend, event, token, rec);
        inv.arg(account)
            .arg(&rec.seats_raw)
            .arg(ms(self.times.ttl))
            .arg(ms(self.times.max_total))
            .arg(ms(self.times.record_retention));
        decode_check("extend_hold", &self.call(inv).await?, |e| HoldCheck::Live { expires_at_ms: e })
    }

    /// A checkout's first gate, read-only and one round trip (`verify_hold.lua`): the hold's record if it is
    /// `account`'s, has not run out by Redis's clock, and every seat still carries its token; otherwise why not
    /// (`NotFound`, `NotYours` or `Lost`).
    pub async fn verify(
        &self,
        event: EventId,
        account: &str,
        token: HoldToken,
    ) -> Result<Result<HoldRecord, HoldCheck>, StoreError> {
        let mut inv = self.scripts.verify.prepare_invoke();
        inv.key(self.keys.record(event, token)).arg(token.to_string()).arg(account).arg(self.keys.seat_prefix(event));
        let mut conn = self.conn.clone();
        let reply: Vec<redis::Value> = self.run(inv.invoke_async(&mut conn)).await?;
        let unexpected = || StoreError::Unexpected(format!("verify_hold: {reply:?}"));
        if let [redis::Value::Int(1), seats] = reply.as_slice() {
            let raw: String = redis::from_redis_value(seats.clone()).map_err(|_| unexpected())?;
            let seats = split_seats(&raw).ok_or_else(unexpected)?;
            return Ok(Ok(HoldRecord { account: account.to_owned(), seats, seats_raw: raw }));
        }
        let codes: Vec<i64> = reply
            .iter()
            .map(|v| if let redis::Value::Int(i) = v { Ok(*i) } else { Err(unexpected()) })
            .collect::<Result<_, _>>()?;
        // The live answer carries the seat list, so a numeric [1, n] is as unexpected as anything else.
        match decode_check("verify_hold", &codes, |n| HoldCheck::Live { expires_at_ms: n })? {
            HoldCheck::Live { .. } | HoldCheck::Released { .. } => Err(unexpected()),
            refused => Ok(Err(refused)),
        }
    }

    /// After Postgres gave the seats to an order: marks them taken until `until` (the payment deadline, or
    /// for good once paid) and counts them against the account's cap as long. `force` marks every seat whatever
    /// Redis holds for it (a late payment took the seats back); otherwise only seats still carrying the hold's
    /// token or this order's marker. Returns how many seats were marked.
    pub async fn reserve(
        &self,
        event: EventId,
        order: &OrderSeats<'_>,
        until: Until,
        force: bool,
    ) -> Result<i64, StoreError> {
        let marked = self.reserve_all(event, &[(*order, until)], force).await?;
        Ok(marked.first().copied().unwrap_or(0))
    }

    /// Before a late payment asks Postgres for its order's seats back: marks them all taken until `until`, as a
    /// checkout's hold would have them, if every one is free or already the order's; else writes nothing and
    /// returns false (a seat another fan holds now, or another order has, is never taken from them).
    pub async fn claim(&self, event: EventId, order: &OrderSeats<'_>, until: Until) -> Result<bool, StoreError> {
        let marked = self.mark(event, &[(*order, until)], Marking::AllOrNone).await?;
        Ok(marked.first().is_some_and(|n| *n >= 0))
    }

    /// [`Holds::reserve`] for several orders of one event in one script call (a batch of checkouts): one
    /// round trip and one bump of the seat map's version. Returns how many seats were marked, order by order.
    pub async fn reserve_all(
        &self,
        event: EventId,
        orders: &[(OrderSeats<'_>, Until)],
        force: bool,
    ) -> Result<Vec<i64>, StoreError> {
        self.mark(event, orders, if force { Marking::Whatever } else { Marking::Ours }).await
    }

    async fn mark(
        &self,
        event: EventId,
        orders: &[(OrderSeats<'_>, Until)],
        marking: Marking,
    ) -> Result<Vec<i64>, StoreError> {
        if orders.is_empty() {
            return Ok(vec![]);
        }
        let mut inv = self.scripts.reserve.prepare_invoke();
        for key in self.keys.map(event) {
            inv.key(key);
        }
        inv.arg(marking as u8).arg(ms(self.times.record_retention));
        for (order, until) in orders {
            inv.key(self.keys.record(event, order.token)).key(self.keys.account(event, order.account));
            for &seat in order.seats {
                inv.key(self.keys.seat(event, seat));
            }
            let due_ms = match until {
                Until::Deadline(ms) => (*ms).max(1),
                Until::Paid => 0,
            };
            inv.arg(order.token.to_string()).arg(order.seats.len()).arg(due_ms);
        }
        let mut conn = self.conn.clone();
        let marked: Vec<i64> = self.run(inv.invoke_async(&mut conn)).await?;
        if marked.len() != orders.len() {
            return Err(StoreError::Unexpected(format!("reserve_seats: {marked:?} for {} orders", orders.len())));
        }
        Ok(marked)
    }

    /// After Postgres took an order's seats off it: deletes the order's own markers (never a later sale's) and
    /// its count on the account. Returns how many seats went back on sale.
    pub async fn release_order(&self, event: EventId, order: &OrderSeats<'_>) -> Result<i64, StoreError> {
        let mut inv = self.scripts.release_order.prepare_invoke();
        inv.key(self.keys.account(event, order.account));
        for key in self.keys.map(event) {
            inv.key(key);
        }
        for &seat in order.seats {
            inv.key(self.keys.seat(event, seat));
        }
        inv.arg(order.token.to_string()).arg(order.seats.len());
        let mut conn = self.conn.clone();
        self.run(inv.invoke_async(&mut conn)).await
    }

    /// An invocation of a script on an existing hold: KEYS are the record, the account, the map's three keys
    /// and the hold's seat keys, and ARGV starts with the token.
    fn on_hold<'s>(
        &self,
        script: &'s Script,
        event: EventId,
        token: HoldToken,
        rec: &HoldRecord,
    ) -> redis::ScriptInvocation<'s> {
        let mut inv = script.prepare_invoke();
        inv.key(self.keys.record(event, token));
        inv.key(self.keys.account(event, &rec.account));
        for key in self.keys.map(event) {
            inv.key(key);
        }
        for &seat in &rec.seats {
            inv.key(self.keys.seat(event, seat));
        }
        inv.arg(token.to_string());
        inv
    }

    async fn call(&self, inv: redis::ScriptInvocation<'_>) -> Result<Vec<i64>, StoreError> {
        let mut conn = self.conn.clone();
        self.run(inv.invoke_async(&mut conn)).await
    }

    /// After Postgres committed a change to an order: brings Redis's markers in line (`reserve_seats` for paid
    /// or extended, `release_seats` for released seats).
    pub async fn after_change(
        &self,
        order: &super::lifecycle::OrderRow,
        effect: super::lifecycle::SeatsEffect,
    ) -> Result<(), StoreError> {
        use super::lifecycle::SeatsEffect;
        let seats = order.seat_ids();
        let on = OrderSeats { token: order.hold, account: &order.account, seats: &seats };
        match effect {
            SeatsEffect::None => return Ok(()),
            SeatsEffect::Paid => self.reserve(order.event, &on, Until::Paid, true).await?,
            SeatsEffect::Extended => {
                self.reserve(order.event, &on, Until::deadline(order.payment_due_at), false).await?
            }
            SeatsEffect::Released => self.release_order(order.event, &on).await?,
        };
        Ok(())
    }

    /// Writes an order's markers again as Postgres has the order now, whatever Redis holds for its seats (it
    /// may have lost them, or a hold made after the loss may sit on them): sold for good if paid, taken until
    /// the deadline if reserved and not past it, released otherwise.
    pub async fn restore(&self, order: &super::lifecycle::OrderRow) -> Result<(), StoreError> {
        let seats = order.seat_ids();
        let on = OrderSeats { token: order.hold, account: &order.account, seats: &seats };
        match order.status {
            Status::Paid => self.reserve(order.event, &on, Until::Paid, true).await?,
            Status::Reserved if !order.deadline_passed => {
                self.reserve(order.event, &on, Until::deadline(order.payment_due_at), true).await?
            }
            _ => self.release_order(order.event, &on).await?,
        };
        Ok(())
    }

    /// Whether the Redis server that keeps the event's keys is another than at the last call, or lost them:
    /// restarted, failed over or flushed (`lua/seatmap_server.lua`). Then it may have lost its last writes.
    pub async fn server_changed(&self, event: EventId) -> Result<bool, StoreError> {
        let mut inv = self.scripts.server.prepare_invoke();
        inv.key(self.keys.server(event));
        let mut conn = self.conn.clone();
        let same: i64 = self.run(inv.invoke_async(&mut conn)).await?;
        Ok(same == 0)
    }

    /// How many seats the event's log says are held or sold now (a lapse counts once the lapse step logged it).
    pub async fn taken_count(&self, event: EventId) -> Result<u64, StoreError> {
        let mut conn = self.conn.clone();
        self.run(redis::cmd("SCARD").arg(self.keys.taken(event)).query_async(&mut conn)).await
    }

    /// When the earliest hold or unpaid order of the event runs out (Unix ms), by the seat map's lapse index:
    /// a paid order leaves it, so every entry is a seat that may come back. `None` when nothing can lapse.
    pub async fn next_lapse_ms(&self, event: EventId) -> Result<Option<u64>, StoreError> {
        let mut conn = self.conn.clone();
        let first: Vec<(String, f64)> = self
            .run(
                redis::cmd("ZRANGE")
                    .arg(self.keys.lapses(event))
                    .arg(0)
                    .arg(0)
                    .arg("WITHSCORES")
                    .query_async(&mut conn),
            )
            .await?;
        // Scores are whole milliseconds, well inside f64's exact range.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Ok(first.first().map(|(_, at)| at.max(0.0) as u64))
    }

    /// The event's map version: how far its change log goes.
    pub async fn map_version(&self, event: EventId) -> Result<MapVersion, StoreError> {
        let mut conn = self.conn.clone();
        let version: Option<u64> =
            self.run(redis::cmd("GET").arg(self.keys.version(event)).query_async(&mut conn)).await?;
        Ok(version.unwrap_or(0))
    }

    /// The Redis view of every listed seat (available, held or sold), read in one round trip.
    pub async fn seat_states(&self, event: EventId, seats: &[SeatId]) -> Result<Vec<SeatStatus>, StoreError> {
        if seats.is_empty() {
            // An empty pipeline is no command at all: Redis is not asked.
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for chunk in seats.chunks(1000) {
            let keys: Vec<String> = chunk.iter().map(|&s| self.keys.seat(event, s)).collect();
            pipe.cmd("MGET").arg(keys);
        }
        let mut conn = self.conn.clone();
        let chunks: Vec<Vec<Option<String>>> = self.run(pipe.query_async(&mut conn)).await?;
        Ok(chunks
            .into_iter()
            .flatten()
            .map(|v| match v.as_deref() {
                None => SeatStatus::Available,
                Some(v) if v.starts_with(SOLD) => SeatStatus::Sold,
                Some(_) => SeatStatus::Held,
            })
            .collect())
    }

    /// Logs as available every seat of the event's holds and unpaid orders whose time ran out, at most
    /// `limit` of them per call (`lua/seatmap_lapse.lua`). Returns how many lapses were taken, and when the
    /// next is due.
    pub async fn lapse(&self, event: EventId, limit: usize) -> Result<Lapsed, StoreError> {
        let mut inv = self.scripts.lapse.prepare_invoke();
        for key in self.keys.map(event) {
            inv.key(key);
        }
        inv.arg(self.keys.seat_prefix(event)).arg(limit);
        let reply: Vec<i64> = self.call(inv).await?;
        match reply.as_slice() {
            &[taken, seats, version, next_due] if taken >= 0 && seats >= 0 => Ok(Lapsed {
                taken: taken as usize,
                seats: seats as usize,
                version: (version > 0).then_some(version as u64),
                next_due: u64::try_from(next_due).ok().map(Duration::from_millis),
            }),
            other => Err(StoreError::Unexpected(format!("seatmap_lapse: {other:?}"))),
        }
    }

    /// Round trip to Redis, for readiness.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: String = self.run(redis::cmd("PING").query_async(&mut conn)).await?;
        Ok(())
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// Decodes the shared reply shape of release, extend and verify.
fn decode_check(script: &str, reply: &[i64], ok: impl Fn(i64) -> HoldCheck) -> Result<HoldCheck, StoreError> {
    match reply {
        [1, v] => Ok(ok(*v)),
        [0, 0] => Ok(HoldCheck::Lost { index: None }),
        [0, i] if *i > 0 => Ok(HoldCheck::Lost { index: Some(*i as usize - 1) }),
        [-1] => Ok(HoldCheck::NotYours),
        [-2] => Ok(HoldCheck::NotFound),
        // The record's seat list never changes after it is written, so -3 means a token collision or
        // tampering: report it rather than guess.
        other => Err(StoreError::Unexpected(format!("{script}: {other:?}"))),
    }
}
