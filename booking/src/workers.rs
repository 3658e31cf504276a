//! Background work of booking: the sweeper (tidies unpaid orders past their deadline), the outbox relay
//! (publishes order events to the Redis Stream) and the lapse step (logs the seats whose hold or unpaid order
//! ran out). Each is safe to run in any number of processes at once.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use redisconn::Conn;
use sqlx::PgPool;

use crate::domain::{EventId, OrderId};
use crate::provider;
use crate::store::holds::Holds;
use crate::store::lifecycle::{self, Changed, Delivery, Outcome, Window};
use crate::store::{orders, outbox, payments};

/// Orders one sweep transaction cancels at most.
const SWEEP_BATCH: i64 = 500;

/// Longest a relay batch may take (Redis and Postgres together) before it is abandoned and retried.
const RELAY_TIMEOUT: Duration = Duration::from_secs(10);

/// What the sweeper needs to ask the payment provider before it cancels an order with a payment.
#[derive(Clone)]
pub struct PaymentCheck {
    pub provider: provider::Client,
    pub window: Window,
    /// To claim a late payment's seats, and mark a confirmed order's seats sold for good, in Redis.
    pub holds: Holds,
    /// The account's cap a late payment is held to, as a checkout is.
    pub max_seats_per_account: usize,
}

/// Cancels unpaid orders past their deadline every `every`, forever. Correctness never waits for it: a passed
/// deadline frees the seats by itself; this writes the cancellation and its outbox row down. Before it cancels
/// an order whose fan started paying, it asks the provider: a payment that went through while its webhook was
/// lost is applied as the webhook would have been (then the order is paid, not cancelled).
///
/// It also repairs Redis for orders paid lately, whose markers never lapse: it marks their seats sold again, or
/// releases them again (a compare-and-delete on the order's own markers) if the order was then refunded or
/// cancelled, in case booking died between a commit and its follow-up; and after Redis was gone, or booking
/// started, for every order that changed shortly before (see [`repair_markers`]). After a start the paid
/// orders' repair looks back a day.
pub async fn sweeper(pool: PgPool, every: Duration, check: PaymentCheck) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut repair = Repair::new();
    loop {
        tick.tick().await;
        let asked = confirm_lost_payments(&pool, &check).await;
        repair_markers(&pool, &check.holds, &mut repair).await;
        match orders::forget_old_keys(&pool, SWEEP_BATCH).await {
            Ok(n) => metrics::counter!("booking_idempotency_keys_forgotten_total").increment(n),
            Err(e) => tracing::warn!(error = %e, "could not forget old idempotency keys"),
        }
        // Drain a backlog in batches, then wait for the next tick.
        loop {
            match lifecycle::sweep(&pool, SWEEP_BATCH, &asked).await {
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

/// Asks the provider about every due reserved order with a payment (up to a batch), and applies the succeeded
/// ones. Returns the orders the sweep may cancel: those the provider says are not paid, and, if it stopped
/// answering, the rest of the list (the deadline decides, and a webhook that comes later is still applied as a
/// late payment). Any other order with a payment is not cancelled this tick: its deadline passed after the list
/// was made, the list was full, or its confirmed payment could not be applied yet.
async fn confirm_lost_payments(pool: &PgPool, check: &PaymentCheck) -> Vec<OrderId> {
    let due = match lifecycle::due_with_payment(pool, SWEEP_BATCH).await {
        Ok(due) => due,
        Err(e) => {
            tracing::warn!(error = %e, "could not list due orders with a payment");
            return Vec::new();
        }
    };
    let mut cancellable = Vec::with_capacity(due.len());
    for (i, (order, payment_id)) in due.iter().enumerate() {
        let order = *order;
        let outcome = match check.provider.payment(payment_id).await {
            Ok(p) if p.status == "succeeded" && p.order_id == order.0 => "succeeded",
            Ok(_) => "not_paid",
            Err(e) => {
                // Asking the rest now would only wait out the same timeout.
                tracing::warn!(error = %e, %order, %payment_id, "the provider did not answer; not asking more this tick");
                metrics::counter!("booking_payment_checks_total", "outcome" => "unreachable").increment(1);
                cancellable.extend(due[i..].iter().map(|(order, _)| *order));
                return cancellable;
            }
        };
        metrics::counter!("booking_payment_checks_total", "outcome" => outcome).increment(1);
        if outcome != "succeeded" {
            cancellable.push(order);
            continue;
        }
        let id = format!("reconcile:{payment_id}");
        let delivery = Delivery { id: &id, kind: "payment.succeeded" };
        let cap = check.max_seats_per_account;
        match payments::succeeded(pool, &check.holds, order, delivery, check.window, cap).await {
            Ok(Outcome::Changed { order, effect, .. }) => {
                tracing::info!(order = %order.id, status = order.status.as_str(), "a lost payment was confirmed");
                if let Err(e) = check.holds.after_change(&order, effect).await {
                    tracing::warn!(error = %e, order = %order.id, "order committed but Redis was not updated");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, %order, "could not apply a confirmed payment"),
        }
    }
    cancellable
}

/// How far back before the last calm pass a repair after a disruption reaches: further than the writes Redis
/// may lose (the last second of its append-only file; what a failed-over master had not yet passed on).
const LOST_WRITES_REACH: time::Duration = time::Duration::seconds(10);

/// Orders one pass writes again at most.
const REPAIR_BATCH: i64 = 1_000;

/// Changes commit a little after their `updated_at`: each pass looks back this far past the last one.
const COMMIT_LAG: time::Duration = time::Duration::seconds(2);

/// Where the sweeper's repair of Redis markers stands: two cursors, so that the repair owed after a fault
/// (seconds of orders) never waits behind the paid orders' catch-up (a day of them after a start).
struct Repair {
    /// How far the paid orders have been written again: the database's time of the pass that wrote the last of
    /// them, or the `updated_at` the last full batch reached.
    until: time::OffsetDateTime,
    /// The database's time at the last pass that found every event's Redis server the same as before.
    calm: time::OffsetDateTime,
    /// Set while a repair of every live order changed since then is owed (a Redis server changed): it goes
    /// first.
    live_from: Option<time::OffsetDateTime>,
}

impl Repair {
    /// The first passes after a start write again every live order changed in the 10 s before it (a booking
    /// killed between a commit and its follow-up left their markers unwritten, reserved orders' too), then look
    /// back a day for paid orders (what a crash of booking and Redis together lost longer before is not found).
    fn new() -> Self {
        let now = time::OffsetDateTime::now_utc();
        Self { until: now - time::Duration::days(1), calm: now, live_from: Some(now - LOST_WRITES_REACH) }
    }
}

/// Applies again, in Redis, what happened to orders lately: paid orders' seats marked sold for good, or released
/// again if the order was then refunded or cancelled. When the Redis server that keeps the keys of an event with
/// recent orders changed since the last pass (a restart, a failover, a flush: `Holds::server_changed`), it also
/// marks again the seats of every reserved order changed since shortly before: Redis may have lost those markers,
/// and Postgres, which sold the seats, would show them sold while the seat map's log says free. That repair comes
/// before the paid orders' catch-up. Each cursor moves on to the database's time of its pass when every order
/// listed was written.
async fn repair_markers(pool: &PgPool, holds: &Holds, r: &mut Repair) {
    // Only events with orders a loss could touch are asked about (usually none, or the few on sale now).
    let events = match lifecycle::events_changed_since(pool, r.calm - LOST_WRITES_REACH).await {
        Ok(events) => events,
        Err(e) => {
            tracing::warn!(error = %e, "could not list the events whose markers to check");
            return;
        }
    };
    // One call per event, all at once on the multiplexed connection (on a cluster, the events' slots may sit
    // on different masters).
    let answers = futures::future::join_all(events.iter().map(|&event| holds.server_changed(event))).await;
    let mut changed = false;
    for (event, answer) in events.iter().zip(answers) {
        match answer {
            Ok(same_or_not) => changed |= same_or_not,
            Err(e) => {
                // Redis is gone now: it may come back without its last writes.
                tracing::warn!(error = %e, event = event.0, "could not ask Redis which server keeps the event");
                changed = true;
                break;
            }
        }
    }
    if changed {
        let from = r.calm - LOST_WRITES_REACH;
        r.live_from = Some(r.live_from.map_or(from, |f| f.min(from)));
    }
    let (from, which) = match r.live_from {
        Some(from) => (from, Changed::Live),
        None => (r.until - COMMIT_LAG, Changed::Paid),
    };
    let (orders, now) = match lifecycle::changed_since(pool, from, which, REPAIR_BATCH).await {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(error = %e, "could not list the orders whose markers to write again");
            return;
        }
    };
    if !changed {
        r.calm = now;
    }
    for (order, _) in &orders {
        if let Err(e) = holds.restore(order).await {
            tracing::warn!(error = %e, order = %order.id, "could not repair the Redis markers; retrying next tick");
            return;
        }
    }
    if let Some((_, last)) = orders.last().filter(|_| orders.len() as i64 == REPAIR_BATCH) {
        // More to write: the next pass goes on from the last one written (a start after a day of sales has
        // tens of thousands of paid orders to write again; a batch a pass leaves Redis to the fans meanwhile).
        match which {
            Changed::Live => r.live_from = Some(*last),
            Changed::Paid => r.until = *last + COMMIT_LAG,
        }
        return;
    }
    match which {
        Changed::Live => {
            tracing::info!(
                orders = orders.len(),
                "a Redis server changed: the markers of recent orders were written again"
            );
            metrics::counter!("booking_markers_restored_total").increment(orders.len() as u64);
            // The paid orders' catch-up goes on from where it stood.
            r.live_from = None;
        }
        Changed::Paid => r.until = now,
    }
}

/// Lapses one step takes per event at most; a longer backlog drains over the next steps.
const LAPSE_BATCH: usize = 1_000;

/// Events whose lapses are stepped at once.
const LAPSE_EVENTS_AT_ONCE: usize = 16;

/// How often the list of events whose lapses are logged is read again from Postgres.
const LAPSE_EVENTS_EVERY: Duration = Duration::from_secs(5);

/// Longest an event with no lapse waiting goes unstepped: any node may make a hold or an order meanwhile, and the
/// step learns of it at its next look. It looks again within half a hold's life and half a payment window, so
/// it learns of each before it is due.
const LAPSE_IDLE_LOOK: Duration = Duration::from_secs(5);

/// Every `every`, logs in each event's seat map the holds and unpaid orders whose time ran out
/// (`Holds::lapse`), forever: a time to live makes no sound, and fans watching the map learn of a lapse from
/// this step. It covers events that have not started (or started within the last day), re-read from Postgres
/// every few seconds. Each event is stepped again when its next lapse is due, and one with none waiting only
/// every few seconds, so the work of a step follows the events being sold, not every event on the books.
pub async fn lapses(pool: PgPool, holds: Holds, every: Duration, payment_window: Duration) {
    let idle_look = LAPSE_IDLE_LOOK.min(holds.ttl() / 2).min(payment_window / 2).max(every);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut events: Vec<EventId> = Vec::new();
    let mut listed: Option<std::time::Instant> = None;
    // When each event is stepped next (not there: at once).
    let mut next: HashMap<EventId, tokio::time::Instant> = HashMap::new();
    loop {
        tick.tick().await;
        if listed.is_none_or(|at| at.elapsed() >= LAPSE_EVENTS_EVERY) {
            match orders::current_events(&pool).await {
                Ok(found) => {
                    events = found;
                    listed = Some(std::time::Instant::now());
                    next.retain(|event, _| events.contains(event));
                }
                Err(e) => tracing::warn!(error = %e, "could not list the events whose lapses are logged"),
            }
        }
        let now = tokio::time::Instant::now();
        let due = events.iter().copied().filter(|event| next.get(event).is_none_or(|at| *at <= now));
        // A few events at once, over the one multiplexed connection: a step's time does not grow with every
        // event due one round trip at a time, and one event's failure does not hold up the others.
        let stepped: Vec<_> = futures::stream::iter(due)
            .map(|event| {
                let holds = &holds;
                async move { (event, holds.lapse(event, LAPSE_BATCH).await) }
            })
            .buffer_unordered(LAPSE_EVENTS_AT_ONCE)
            .collect()
            .await;
        let mut failed = false;
        for (event, result) in stepped {
            let wait = match result {
                Ok(lapsed) => {
                    if lapsed.seats > 0 {
                        metrics::counter!("booking_seats_lapsed_total").increment(lapsed.seats as u64);
                    }
                    if lapsed.taken >= LAPSE_BATCH { Duration::ZERO } else { lapsed.next_due.unwrap_or(idle_look) }
                }
                Err(e) => {
                    if !failed {
                        tracing::warn!(error = %e, event = event.0, "lapse step failed; retrying at the next tick");
                    }
                    failed = true;
                    Duration::ZERO
                }
            };
            next.insert(event, tokio::time::Instant::now() + wait.min(idle_look));
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
pub async fn relay(pool: PgPool, mut conn: Conn, relay: Relay) {
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
