//! The ticker: a pingora background service that, a few times a second and for every event with a waiting
//! room, flushes the polls this node served (one call), runs one admission step (any node may: the step is
//! correct however many run it), opens a pre-queue whose time has come, and refreshes this node's view. A quiet
//! room (nobody waiting, nothing polled: a past event's, say) is only read, twice a second, and rooms are
//! stepped a few at once, so the rooms that accumulate over months cost the live ones little. It also applies
//! schedules, draws lotteries, decides adaptive rates and frees the slots of paid orders.
//!
//! The sell-out watch, a service of its own (so a booking that does not answer never stalls the ticker), asks
//! booking every second or so what each room's event has left: it sets the room's state to `sold_out`
//! (or back to `open` when seats return), and marks the room `all_held` while every seat left is held (the
//! admission step admits nobody then; the seat map's lapse step brings seats back as holds run out), and
//! `ending` while the last seats sell (fans poll more often, to hear of the sell-out soon).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use pingora::connectors::http::Connector;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use tokens::{AccountId, AdmissionClaims, Keyring};

use crate::limits::{Limits, NODE_ALIVE};
use crate::room::{Applied, ChallengeMode, HeldBack, QueueState, Queueing, RateMode, Rooms};
use crate::store::{Configured, Freed, FreedBy, LazyStore, QueueStore, StateChange, Stepped, StoreError};
use crate::upstreams::Upstreams;

/// The background service.
pub struct Ticker {
    pub rooms: Arc<Rooms>,
    pub limits: Arc<Limits>,
    pub store: LazyStore,
    pub every: Duration,
    pub admit_burst: Duration,
    pub max_walk: u64,
    /// How often a quiet room (nothing for a step to do: see [`Rooms::quiet`]) is read again, instead of
    /// stepped and read every tick: well within the time after which its view is stale, and soon enough that a
    /// setting changed on another node applies here within a second.
    pub quiet_every: Duration,
    /// This node's id among the gateway nodes that share each account's budget.
    pub node: String,
    /// Whether a paid order frees its fan's slot (booking's order event stream is read).
    pub free_on_paid: bool,
    /// Booking's answers as this node's proxy saw them, for adaptive rooms.
    pub health: Arc<crate::health::Health>,
    /// A pass (registration, freed slots, every room's step and read) longer than this is logged.
    pub slow_pass: Duration,
    /// How long a room stays over (see [`over`]) before this node retires it; `None`: never on its own.
    pub retire_after: Option<Duration>,
}

/// Whether a room is over: sold out, or closed after admitting fans (a room closed while it is prepared has
/// admitted nobody), with nobody inside and no change scheduled.
pub fn over(live: &crate::room::Live) -> bool {
    let ended = match live.settings.state {
        QueueState::SoldOut => true,
        QueueState::Closed => live.counts.admitted_total > 0,
        _ => false,
    };
    ended && live.counts.active == 0 && live.schedule.is_empty()
}

/// Rooms stepped at once: their Redis calls share one multiplexed connection, so a node with hundreds of
/// rooms (past events stay listed) does not take hundreds of round trips in a row each tick.
const ROOMS_AT_ONCE: usize = 16;

/// Paid fans' slots freed at once, in flight together on the multiplexed connection.
const FREES_AT_ONCE: usize = 64;

/// Entries of booking's order event stream read per tick: a tick reads on from where the last one stopped.
const PAID_PER_TICK: usize = 500;

#[async_trait]
impl BackgroundService for Ticker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut interval = tokio::time::interval(self.every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        let mut last_eviction = Instant::now();
        let mut last_registration: Option<Instant> = None;
        let mut stepped = HashMap::new();
        // Since when (by this node's clock) each room has been over.
        let mut over_since = HashMap::new();
        // Where this node reads booking's order event stream from: its end when the node starts.
        let mut orders: Option<String> = None;
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                _ = shutdown.changed() => {
                    // The other nodes take this one's share back at their next registration.
                    if let Ok(store) = self.store.get() {
                        let _ = store.register_node(&self.node, NODE_ALIVE, true).await;
                    }
                    return;
                }
            }
            let began = Instant::now();
            if last_registration.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                last_registration = Some(Instant::now());
                self.register().await;
                self.retire_over(&mut over_since).await;
            }
            if self.free_on_paid {
                self.free_paid(&mut orders).await;
            }
            let freed = began.elapsed();
            let ticked = self.tick(&mut stepped).await;
            let pass = began.elapsed();
            metrics::histogram!("gateway_ticker_pass_seconds").record(pass.as_secs_f64());
            if pass > self.slow_pass {
                // Views age while a pass runs: a pass this long brings status polls near their 503.
                tracing::warn!(
                    pass_ms = pass.as_millis() as u64,
                    before_step_ms = freed.as_millis() as u64,
                    "the ticker's pass was slow"
                );
            }
            match ticked {
                Ok(()) if failing => {
                    tracing::info!("queue store answering again");
                    failing = false;
                }
                Ok(()) => {}
                // Logged once per outage, not every tick.
                Err(e) if !failing => {
                    tracing::warn!(error = %e, "queue refresh failed; status polls answer 503 once the view is stale");
                    failing = true;
                }
                Err(_) => {}
            }
            if last_eviction.elapsed() > Duration::from_secs(10) {
                self.limits.evict_idle();
                last_eviction = Instant::now();
            }
        }
    }
}

/// Asks booking, every `availability.every`, what each room's event has left, in a service of its own: an
/// answer that does not come (booking stopped) holds up this loop only, never the ticker's admission steps and
/// adaptive rate.
pub struct SellOut {
    pub rooms: Arc<Rooms>,
    pub store: LazyStore,
    pub availability: Availability,
}

#[async_trait]
impl BackgroundService for SellOut {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut interval = tokio::time::interval(self.availability.every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Made here, inside this service's runtime, like the Redis connection.
        let connector = Connector::new(None);
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                _ = shutdown.changed() => return,
            }
            self.check_sold_out(&connector).await;
        }
    }
}

impl SellOut {
    /// Moves open or paused rooms whose event booking reports sold out to `sold_out`, and back to `open` when
    /// seats return; marks a room `all_held` while every seat left is held, and clears it when one comes back.
    /// Failures are logged and retried at the next check.
    async fn check_sold_out(&self, connector: &Connector) {
        let (Ok(store), Ok(account)) = (self.store.get(), AccountId::parse("waiting-room")) else { return };
        // A few rooms at once: one slow answer from booking does not hold up the rest, nor the next tick.
        futures::stream::iter(self.rooms.events())
            .for_each_concurrent(ROOMS_AT_ONCE, |event| self.check_room(connector, store, &account, event))
            .await;
    }

    async fn check_room(&self, connector: &Connector, store: &QueueStore, account: &AccountId, event: i64) {
        let Some(room) = self.rooms.get(event) else { return };
        let state = room.live.settings.state;
        if !matches!(state, QueueState::Open | QueueState::Paused | QueueState::SoldOut) {
            return;
        }
        let availability = &self.availability;
        let proof = availability.keyring.sign(&AdmissionClaims::new(account.clone(), event, tokens::unix_now(), 60));
        let path = format!("/events/{event}/availability");
        let answer = match availability.upstreams.get(connector, &path, &proof).await {
            Some((200, body)) => match serde_json::from_slice::<BookingAvailability>(&body) {
                Ok(answer) => answer,
                Err(e) => return tracing::debug!(event, error = %e, "booking's availability unreadable"),
            },
            Some((status, _)) => return tracing::debug!(event, status, "booking's availability refused"),
            None => return,
        };
        let (held, ending) = (answer.held_back(), answer.ending());
        let settings = &room.live.settings;
        if held != settings.all_held || ending != settings.ending {
            match store.set_all_held(event, held, ending).await {
                Ok(()) => tracing::info!(event, ?held, ending, "booking reported what is left to hold"),
                Err(e) => tracing::warn!(event, error = %e, "could not record that every seat left is held"),
            }
        }
        let target = match (answer.sold_out(), state) {
            (true, QueueState::Open | QueueState::Paused) => QueueState::SoldOut,
            (false, QueueState::SoldOut) => QueueState::Open,
            _ => return,
        };
        match store.set_state(event, target, 1, Some(state)).await {
            Ok(change) => tracing::info!(event, from = %state, to = %target, ?change, "booking reported availability"),
            Err(e) => tracing::warn!(event, error = %e, "could not record the sell-out"),
        }
    }
}

/// Where and how often to ask booking about sell-outs.
pub struct Availability {
    /// Booking's nodes, as the proxy reaches them.
    pub upstreams: Arc<Upstreams>,
    /// Signs the gateway's own admission proof for the question.
    pub keyring: Arc<Keyring>,
    pub every: Duration,
}

/// The part of booking's `GET /events/{id}/availability` answer the gateway reads.
#[derive(Debug, serde::Deserialize)]
struct BookingAvailability {
    sold_out: bool,
    /// Seats neither sold nor held (absent from a booking that does not count them: never all held).
    #[serde(default)]
    seats_available: Option<u64>,
    #[serde(default)]
    seats_on_sale: u64,
    /// Sold seats whose order is still inside its payment window.
    #[serde(default)]
    seats_awaiting_payment: u64,
    /// Seats held without an order.
    #[serde(default)]
    seats_held: u64,
    /// When the earliest hold or payment window ends (RFC 3339).
    #[serde(default, with = "time::serde::rfc3339::option")]
    next_release_at: Option<time::OffsetDateTime>,
}

impl BookingAvailability {
    /// Sold out for the waiting room: every seat paid. Seats awaiting payment may still come back.
    fn sold_out(&self) -> bool {
        self.sold_out && self.seats_awaiting_payment == 0
    }

    /// The last seats are selling: at most a twentieth of the seats on sale (and at least 50) are free.
    fn ending(&self) -> bool {
        !self.sold_out() && self.seats_available.is_some_and(|free| free <= (self.seats_on_sale / 20).max(50))
    }

    /// What may come back, while nothing is free and the event is not sold out.
    fn held_back(&self) -> Option<HeldBack> {
        (!self.sold_out() && self.seats_available == Some(0)).then(|| HeldBack {
            seats: self.seats_held + self.seats_awaiting_payment,
            next_release_ms: self
                .next_release_at
                .and_then(|t| u64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()),
        })
    }
}

impl Ticker {
    /// Says this node is alive and sets each account's share from the count of live nodes; on a Redis failure the
    /// share stays as it was.
    async fn register(&self) {
        let Ok(store) = self.store.get() else { return };
        match store.register_node(&self.node, NODE_ALIVE, false).await {
            Ok(nodes) => {
                self.limits.set_nodes(nodes);
                metrics::gauge!("gateway_nodes").set(f64::from(nodes));
            }
            Err(e) => tracing::debug!(error = %e, "could not register this gateway node; the limits' share stays"),
        }
    }

    /// Frees the slots of fans whose orders were paid since the last call, as booking's order event stream
    /// says (every node reads it; a slot is freed and counted once whichever node frees it first).
    async fn free_paid(&self, cursor: &mut Option<String>) {
        let Ok(store) = self.store.get() else { return };
        let after = match cursor.clone() {
            Some(after) => after,
            None => match store.outbox_end().await {
                Ok(end) => {
                    *cursor = Some(end);
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "could not find the end of the order event stream");
                    return;
                }
            },
        };
        let (paid, last) = match store.paid_after(&after, PAID_PER_TICK).await {
            Ok(read) => read,
            Err(e) => {
                tracing::debug!(error = %e, "could not read the order event stream");
                return;
            }
        };
        // Freed together, so their calls share round trips: a burst of payments (booking catching up after a
        // stall) frees hundreds at once, and the pass that also keeps the rooms' views fresh must not wait on
        // them one by one.
        let ours: Vec<_> = paid.into_iter().filter(|p| self.rooms.get(p.event).is_some()).collect();
        let results: Vec<_> =
            futures::stream::iter(ours.into_iter().map(|order| async move {
                (order.event, store.free(order.event, &order.account, FreedBy::Paid).await)
            }))
            .buffer_unordered(FREES_AT_ONCE)
            .collect()
            .await;
        for (event, result) in results {
            match result {
                Ok(Freed::Now { .. }) => tracing::debug!(event, "a paid fan's slot freed"),
                Ok(_) => {}
                Err(e) => {
                    // Read again from here next time: freeing is idempotent.
                    tracing::debug!(error = %e, event, "could not free a paid fan's slot");
                    return;
                }
            }
        }
        *cursor = Some(last);
    }

    /// Retires the rooms this node has seen over for `retire_after`. Any node may; retiring twice is harmless.
    async fn retire_over(&self, over_since: &mut HashMap<i64, Instant>) {
        let Some(after) = self.retire_after else { return };
        let Ok(store) = self.store.get() else { return };
        let events = self.rooms.events();
        over_since.retain(|event, _| events.contains(event));
        for event in events {
            if !self.rooms.get(event).is_some_and(|room| over(&room.live)) {
                over_since.remove(&event);
                continue;
            }
            if over_since.entry(event).or_insert_with(Instant::now).elapsed() < after {
                continue;
            }
            match store.retire(event).await {
                Ok(_) => {
                    tracing::info!(event, after_seconds = after.as_secs(), "the room was over; it is retired");
                    crate::metrics::record_room_retired();
                    over_since.remove(&event);
                }
                Err(e) => tracing::debug!(event, error = %e, "could not retire a room; trying again later"),
            }
        }
    }

    /// Steps and reads every room that is due (`stepped`: when each room last was), a few at once. A room
    /// that fails does not hold the others back: they stay fresh, and the first error is returned.
    async fn tick(&self, stepped: &mut HashMap<i64, Instant>) -> Result<(), StoreError> {
        let store = self.store.get()?;
        let mut events = store.rooms().await?;
        // A room this node knows that Redis no longer lists lost its data: its settings come back from this
        // node's view (every node may do it; the writes only fill what is missing), so the room takes fans again.
        // A retired one is forgotten instead.
        let missing: Vec<i64> = self.rooms.events().into_iter().filter(|event| !events.contains(event)).collect();
        let retired = store.retired_among(&missing).await?;
        for (event, _) in missing.into_iter().zip(retired).filter(|(_, retired)| !retired) {
            if let Some(room) = self.rooms.get(event) {
                store.restore(event, &room.live.settings).await?;
                tracing::warn!(event, "the room was gone from Redis; its settings were restored from this node's view");
                crate::metrics::record_room_restored();
                events.push(event);
            }
        }
        let due = events.iter().copied().filter_map(|event| {
            let quiet = self.rooms.quiet(event);
            (!quiet || stepped.get(&event).is_none_or(|at| at.elapsed() >= self.quiet_every)).then_some((event, quiet))
        });
        let results: Vec<(i64, Result<(), StoreError>)> = futures::stream::iter(
            due.map(|(event, quiet)| async move { (event, self.tick_event(store, event, quiet).await) }),
        )
        .buffer_unordered(ROOMS_AT_ONCE)
        .collect()
        .await;
        let mut failed = None;
        for (event, result) in results {
            match result {
                Ok(()) => {
                    stepped.insert(event, Instant::now());
                }
                Err(e) => {
                    tracing::debug!(event, error = %e, "room step failed");
                    failed.get_or_insert(e);
                }
            }
        }
        stepped.retain(|event, _| events.contains(event));
        self.rooms.listed(&events);
        failed.map_or(Ok(()), Err)
    }

    /// One room's step and read; a quiet room is only read (its settings may have changed on another node).
    async fn tick_event(&self, store: &QueueStore, event: i64, quiet: bool) -> Result<(), StoreError> {
        // Quiet or not: a room before its sale has nobody in it, and its schedule opens it.
        let due = self
            .rooms
            .get(event)
            .is_some_and(|r| r.live.schedule.first().is_some_and(|c| c.at * 1000 <= r.live.now_ms()));
        if due {
            self.apply_schedule(store, event).await?;
        }
        // A lottery draws on its own clock, and a room that stopped being one draws the pool it left.
        let drawing = self.rooms.get(event).is_some_and(|r| {
            let live = &r.live;
            live.settings.state == QueueState::Open
                && (live.settings.queueing == Queueing::Lottery || live.counts.prequeue > 0)
        });
        if drawing {
            let seed = crate::room::shuffle::seed_from(rand::random());
            if let Some(drawn) = store.draw_lottery(event, seed).await? {
                tracing::info!(event, drawn, "lottery drawn");
                if quiet {
                    return crate::view::refresh(store, &self.rooms, event).await;
                }
            }
        }
        // A quiet room's difficulty comes down too.
        if self.rooms.get(event).is_some_and(|r| r.live.settings.challenge == ChallengeMode::Auto) {
            store.tune_challenge(event).await?;
        }
        if quiet {
            return crate::view::refresh(store, &self.rooms, event).await;
        }
        let seen = self.rooms.take_seen(event);
        if let Err(e) = store.touch(event, &seen).await {
            // Put them back so a slow Redis does not make polling fans look gone.
            for account in &seen {
                self.rooms.seen(event, account);
            }
            return Err(e);
        }
        if let Some(room) = self.rooms.get(event)
            && room.live.settings.rate_mode == RateMode::Adaptive
        {
            let target = Duration::from_millis(u64::from(room.live.settings.target_p99_ms));
            let seen = self.health.take(event, target);
            if let Some((rate, reason)) = store.adapt(event, &seen).await? {
                tracing::debug!(event, rate, reason, "adaptive rate decided");
            }
        }
        if store.admit(event, self.max_walk, self.admit_burst).await? == Stepped::Opening {
            let seed = crate::room::shuffle::seed_from(rand::random());
            let change = store.set_state(event, QueueState::Open, seed, Some(QueueState::Prequeue)).await?;
            tracing::info!(event, ?change, "pre-queue opening time reached");
        }
        crate::view::refresh(store, &self.rooms, event).await
    }
}

impl Ticker {
    /// Applies the changes of `event`'s schedule whose time has come, earliest first, as an operator's `PUT`
    /// would. One this node could not apply goes back in the schedule for the next tick.
    async fn apply_schedule(&self, store: &QueueStore, event: i64) -> Result<(), StoreError> {
        for change in store.schedule_take_due(event).await? {
            let seed = crate::room::shuffle::seed_from(rand::random());
            let outcome = match store.configure(event, &change.set, seed).await {
                Ok(Configured { change: Some(StateChange::Refused(_)), .. }) => "state_change_refused",
                Ok(_) => "applied",
                Err(e) => {
                    store.schedule_add(event, &change).await?;
                    return Err(e);
                }
            };
            tracing::info!(event, id = change.id, at = change.at, outcome, "scheduled change applied");
            let applied = Applied { change, applied_at: tokens::unix_now(), outcome: outcome.to_owned() };
            store.schedule_applied(event, &applied).await?;
        }
        crate::view::refresh(store, &self.rooms, event).await
    }
}
