//! Postgres: an order's life after checkout. Every change runs in one transaction that locks the order row,
//! decides with [`crate::domain::order::decide`], and writes the change and its outbox row together
//! (`transition_order` in migrations/20261202000004_order_lifecycle.sql).
//!
//! Invariant: an order's seats are sold exactly while it is paid, or reserved before its deadline; a seat row is
//! `active` only then (or until a sweep or a new checkout notices the deadline passed, which the `expires_at`
//! condition already accounts for).

use sqlx::{PgPool, Postgres, Row, Transaction};
use time::OffsetDateTime;

use super::StoreError;
use crate::domain::order::{self, CancelReason, Command, Decision, Status};
use crate::domain::{EventId, HoldToken, OrderId, SeatId};

/// An order as stored, with what decisions need.
#[derive(Debug, Clone)]
pub struct OrderRow {
    pub id: OrderId,
    pub event: EventId,
    pub account: String,
    pub status: Status,
    pub reason: Option<CancelReason>,
    pub hold: HoldToken,
    /// (seat, price), by seat id.
    pub seats: Vec<(SeatId, i64)>,
    pub total_cents: i64,
    pub currency: String,
    pub payment_due_at: OffsetDateTime,
    pub payment_id: Option<String>,
    pub deadline_passed: bool,
    pub created_at: OffsetDateTime,
    pub paid_at: Option<OffsetDateTime>,
}

impl OrderRow {
    pub fn state(&self) -> order::Order {
        order::Order { status: self.status, reason: self.reason, deadline_passed: self.deadline_passed }
    }

    pub fn seat_ids(&self) -> Vec<SeatId> {
        self.seats.iter().map(|s| s.0).collect()
    }
}

/// What the change did to the order's seats, for the caller's follow-up in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeatsEffect {
    /// Nothing changed for the seats.
    None,
    /// The seats went back on sale.
    Released,
    /// The order is paid and its seats are its own for good.
    Paid,
    /// The payment deadline moved.
    Extended,
}

/// How a command ended.
#[derive(Debug)]
pub enum Outcome {
    /// The order changed; `order` is how it is now.
    Changed {
        order: OrderRow,
        from: Status,
        effect: SeatsEffect,
    },
    /// Nothing to do (a redelivery, a stale message); `order` as it is.
    Unchanged(OrderRow),
    /// This payment event was applied before; what it did then.
    Duplicate {
        order: OrderRow,
        outcome: String,
    },
    /// Not allowed in the order's state: the code of the 409.
    Refused {
        order: OrderRow,
        code: &'static str,
    },
    NotFound,
}

/// Who may touch the order: a fan only their own order of the event in the path; an operator or the payment
/// provider any order.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    Fan { event: EventId, account: &'a str },
    Any,
}

/// A payment webhook delivery, applied at most once by its id.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    pub id: &'a str,
    pub kind: &'a str,
}

/// Limits of a payment-window extension.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// A new deadline is now + this…
    pub seconds: u32,
    /// …but never later than the order's creation + this.
    pub max_seconds: u32,
}

const ORDER_COLUMNS: &str = "o.id, o.event_id, o.account_id, o.status, o.cancel_reason, o.hold_token, o.total_cents,
    o.currency::text AS currency, o.payment_due_at, o.payment_id, o.payment_due_at <= now() AS deadline_passed,
    o.created_at, o.paid_at,
    array(SELECT os.seat_id FROM order_seats os WHERE os.order_id = o.id ORDER BY os.seat_id) AS seat_ids,
    array(SELECT os.price_cents FROM order_seats os WHERE os.order_id = o.id ORDER BY os.seat_id) AS prices";

async fn load<'e>(exec: impl sqlx::PgExecutor<'e>, id: OrderId, lock: bool) -> Result<Option<OrderRow>, StoreError> {
    let sql = format!("SELECT {ORDER_COLUMNS} FROM orders o WHERE o.id = $1{}", if lock { " FOR UPDATE" } else { "" });
    let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id.0).fetch_optional(exec).await?;
    row.as_ref().map(order_from_row).transpose()
}

fn order_from_row(r: &sqlx::postgres::PgRow) -> Result<OrderRow, StoreError> {
    let status: String = r.try_get("status")?;
    let reason: Option<String> = r.try_get("cancel_reason")?;
    let seat_ids: Vec<i64> = r.try_get("seat_ids")?;
    let prices: Vec<i64> = r.try_get("prices")?;
    Ok(OrderRow {
        id: OrderId(r.try_get("id")?),
        event: EventId(r.try_get("event_id")?),
        account: r.try_get("account_id")?,
        status: Status::parse(&status).ok_or_else(|| StoreError::Unexpected(format!("order status {status:?}")))?,
        reason: reason.as_deref().and_then(CancelReason::parse),
        hold: HoldToken(r.try_get("hold_token")?),
        seats: seat_ids.into_iter().map(SeatId).zip(prices).collect(),
        total_cents: r.try_get("total_cents")?,
        currency: r.try_get("currency")?,
        payment_due_at: r.try_get("payment_due_at")?,
        payment_id: r.try_get("payment_id")?,
        deadline_passed: r.try_get("deadline_passed")?,
        created_at: r.try_get("created_at")?,
        paid_at: r.try_get("paid_at")?,
    })
}

fn in_scope(order: &OrderRow, scope: Scope<'_>) -> bool {
    match scope {
        Scope::Fan { event, account } => order.event == event && order.account == account,
        Scope::Any => true,
    }
}

/// Reads an order (no lock); `None` if it does not exist or is not in `scope`.
pub async fn get(pool: &PgPool, id: OrderId, scope: Scope<'_>) -> Result<Option<OrderRow>, StoreError> {
    Ok(load(pool, id, false).await?.filter(|o| in_scope(o, scope)))
}

/// What a late payment may take back (`store::payments` decides it with Redis first).
#[derive(Debug, Clone, Copy)]
pub struct Reclaim {
    /// Redis gave the order every one of its seats back (none held or sold by another): Postgres may too.
    pub seats_claimed: bool,
    /// The account's cap on seats for the event, as a checkout applies it.
    pub max_seats_per_account: usize,
}

/// Applies `command` to the order in one transaction. A `delivery` is recorded with it, and a delivery seen
/// before changes nothing (`Outcome::Duplicate`). A payment for a cancelled order goes to `refund_due` here:
/// only [`apply_payment`] may give such an order its seats back.
pub async fn apply(
    pool: &PgPool,
    id: OrderId,
    scope: Scope<'_>,
    command: Command,
    delivery: Option<Delivery<'_>>,
    window: Window,
) -> Result<Outcome, StoreError> {
    apply_with(pool, id, scope, command, delivery, window, Late::RefundDue)
        .await?
        .ok_or_else(|| StoreError::Unexpected("a late payment asked for a claim it cannot have".into()))
}

/// A successful payment for the order, as [`apply`] applies it, except that a late one (the order is
/// cancelled) takes its seats back when `claimed` allows it: Redis claimed them (`Some` with
/// `seats_claimed`), and under the checkout's lock on the account, the account's cap and every seat's sale
/// still allow it. `None`: the caller claimed nothing, having read the order on time; if it is late under
/// the lock, nothing is written and the answer is `None` (claim, then call again).
pub async fn apply_payment(
    pool: &PgPool,
    id: OrderId,
    delivery: Delivery<'_>,
    window: Window,
    claimed: Option<Reclaim>,
) -> Result<Option<Outcome>, StoreError> {
    let late = claimed.map_or(Late::Unclaimed, Late::Claimed);
    apply_with(pool, id, Scope::Any, Command::PaymentSucceeded, Some(delivery), window, late).await
}

/// Postgres's clock now.
pub async fn db_now(pool: &PgPool) -> Result<OffsetDateTime, StoreError> {
    Ok(sqlx::query_scalar("SELECT now()").fetch_one(pool).await?)
}

/// What a payment for a cancelled order may do.
#[derive(Debug, Clone, Copy)]
enum Late {
    /// Go to `refund_due`.
    RefundDue,
    /// Nothing: the caller claimed no seats (it read the order on time), and is told to.
    Unclaimed,
    /// What the caller's claim allows.
    Claimed(Reclaim),
}

async fn apply_with(
    pool: &PgPool,
    id: OrderId,
    scope: Scope<'_>,
    command: Command,
    delivery: Option<Delivery<'_>>,
    window: Window,
    late: Late,
) -> Result<Option<Outcome>, StoreError> {
    let mut tx = pool.begin().await?;
    let Some(before) = load(&mut *tx, id, true).await?.filter(|o| in_scope(o, scope)) else {
        return Ok(Some(Outcome::NotFound));
    };
    if let Some(d) = delivery {
        let fresh = sqlx::query(
            "INSERT INTO payment_events (id, order_id, kind, outcome) VALUES ($1, $2, $3, 'pending')
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(d.id)
        .bind(id.0)
        .bind(d.kind)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if !fresh {
            let outcome: String = sqlx::query_scalar("SELECT outcome FROM payment_events WHERE id = $1")
                .bind(d.id)
                .fetch_one(&mut *tx)
                .await?;
            tx.rollback().await?;
            return Ok(Some(Outcome::Duplicate { order: before, outcome }));
        }
    }
    let from = before.status;
    let (to, effect) = match order::decide(before.state(), command) {
        Decision::Refuse(code) => {
            tx.rollback().await?;
            return Ok(Some(Outcome::Refused { order: before, code }));
        }
        Decision::Ignore => {
            record_delivery(&mut tx, delivery, "ignored").await?;
            tx.commit().await?;
            return Ok(Some(Outcome::Unchanged(before)));
        }
        Decision::Move { to, reason } => {
            transition(&mut tx, id, from, to, reason).await?;
            let effect = if to == Status::Paid {
                SeatsEffect::Paid
            } else if from.takes_seats() && !to.takes_seats() {
                SeatsEffect::Released
            } else {
                SeatsEffect::None
            };
            (to, effect)
        }
        Decision::Reclaim => {
            let allowed = match late {
                Late::Claimed(r) if r.seats_claimed => reclaim(&mut tx, &before, r.max_seats_per_account).await?,
                Late::Unclaimed => {
                    tx.rollback().await?;
                    return Ok(None);
                }
                _ => false,
            };
            if allowed {
                transition(&mut tx, id, from, Status::Paid, None).await?;
                (Status::Paid, SeatsEffect::Paid)
            } else {
                transition(&mut tx, id, from, Status::RefundDue, None).await?;
                (Status::RefundDue, SeatsEffect::None)
            }
        }
        Decision::Extend => {
            if !extend(&mut tx, id, window).await? {
                tx.rollback().await?;
                return Ok(Some(Outcome::Refused { order: before, code: "payment_window_at_cap" }));
            }
            (from, SeatsEffect::Extended)
        }
    };
    record_delivery(&mut tx, delivery, to.as_str()).await?;
    let order = load(&mut *tx, id, false).await?.ok_or_else(|| StoreError::Unexpected("order vanished".into()))?;
    tx.commit().await?;
    Ok(Some(Outcome::Changed { order, from, effect }))
}

async fn record_delivery(
    tx: &mut Transaction<'_, Postgres>,
    delivery: Option<Delivery<'_>>,
    outcome: &str,
) -> Result<(), StoreError> {
    if let Some(d) = delivery {
        sqlx::query("UPDATE payment_events SET outcome = $2 WHERE id = $1")
            .bind(d.id)
            .bind(outcome)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

async fn transition(
    tx: &mut Transaction<'_, Postgres>,
    id: OrderId,
    from: Status,
    to: Status,
    reason: Option<CancelReason>,
) -> Result<(), StoreError> {
    let moved: bool = sqlx::query_scalar("SELECT transition_order($1, $2, $3, $4, $5)")
        .bind(id.0)
        .bind(from.as_str())
        .bind(to.as_str())
        .bind(reason.map(CancelReason::as_str))
        .bind(format!("order.{}", to.as_str()))
        .fetch_one(&mut **tx)
        .await?;
    // The row is locked by this transaction, so it cannot have moved under us.
    if !moved {
        return Err(StoreError::Unexpected(format!("order {id} was not {from:?} under its own lock")));
    }
    Ok(())
}

/// A payment for a cancelled order: takes its seats back if the account's cap still has room for them and
/// every one is still free (freeing those held only by orders whose deadline passed). Returns false, writing
/// nothing, if the cap is full or any seat was sold meanwhile.
async fn reclaim(
    tx: &mut Transaction<'_, Postgres>,
    order: &OrderRow,
    max_seats_per_account: usize,
) -> Result<bool, StoreError> {
    // The lock a checkout of this account for this event takes (`checkout_order`): no checkout of the account
    // counts its seats while this does, and none commits between this count and this write.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2::bigint::text, 11))")
        .bind(&order.account)
        .bind(order.event.0)
        .execute(&mut **tx)
        .await?;
    let owned: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders o JOIN order_seats os ON os.order_id = o.id
         WHERE o.event_id = $1 AND o.account_id = $2 AND o.id <> $3
           AND os.active AND (os.expires_at IS NULL OR os.expires_at > now())",
    )
    .bind(order.event.0)
    .bind(&order.account)
    .bind(order.id.0)
    .fetch_one(&mut **tx)
    .await?;
    let cap = i64::try_from(max_seats_per_account).unwrap_or(i64::MAX);
    if owned.saturating_add(order.seats.len() as i64) > cap {
        return Ok(false);
    }
    let ids: Vec<i64> = order.seats.iter().map(|s| s.0.0).collect();
    // A savepoint: a unique violation (a seat sold to another order) undoes only this attempt.
    sqlx::query("SAVEPOINT reclaim").execute(&mut **tx).await?;
    let taken = async {
        // An order still stored as reserved keeps its rows active: nobody else can hold its seats, and freeing
        // stale orders would free this one too.
        if order.status != Status::Reserved {
            sqlx::query("SELECT expire_stale_orders_on($1, $2)")
                .bind(order.event.0)
                .bind(&ids)
                .execute(&mut **tx)
                .await?;
        }
        sqlx::query("UPDATE order_seats SET active = true, expires_at = NULL WHERE order_id = $1")
            .bind(order.id.0)
            .execute(&mut **tx)
            .await
    }
    .await;
    match taken {
        Ok(_) => {
            sqlx::query("RELEASE SAVEPOINT reclaim").execute(&mut **tx).await?;
            Ok(true)
        }
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23505") => {
            sqlx::query("ROLLBACK TO SAVEPOINT reclaim").execute(&mut **tx).await?;
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Pushes a reserved order's deadline to now + window, capped at creation + max. False when already at the cap.
async fn extend(tx: &mut Transaction<'_, Postgres>, id: OrderId, window: Window) -> Result<bool, StoreError> {
    let extended = sqlx::query(
        "WITH due AS (
             SELECT LEAST(now() + make_interval(secs => $2), created_at + make_interval(secs => $3)) AS at
             FROM orders WHERE id = $1)
         UPDATE orders o SET payment_due_at = due.at, updated_at = now()
         FROM due WHERE o.id = $1 AND due.at > o.payment_due_at",
    )
    .bind(id.0)
    .bind(f64::from(window.seconds))
    .bind(f64::from(window.max_seconds))
    .execute(&mut **tx)
    .await?
    .rows_affected()
        == 1;
    if extended {
        sqlx::query(
            "UPDATE order_seats os SET expires_at = o.payment_due_at FROM orders o
             WHERE o.id = $1 AND os.order_id = o.id",
        )
        .bind(id.0)
        .execute(&mut **tx)
        .await?;
        sqlx::query(
            "INSERT INTO order_events (order_id, event_id, kind, from_status, to_status, data)
             SELECT id, event_id, 'order.extended', status, status, order_snapshot(id) FROM orders WHERE id = $1",
        )
        .bind(id.0)
        .execute(&mut **tx)
        .await?;
    }
    Ok(extended)
}

/// Records the provider's payment for the order (one per order). Returns the payment id the order has now.
pub async fn attach_payment(pool: &PgPool, id: OrderId, payment_id: &str) -> Result<Option<String>, StoreError> {
    Ok(sqlx::query_scalar(
        "UPDATE orders SET payment_id = coalesce(payment_id, $2), updated_at = now() WHERE id = $1 RETURNING payment_id",
    )
    .bind(id.0)
    .bind(payment_id)
    .fetch_optional(pool)
    .await?)
}

/// Cancels up to `batch` reserved orders whose deadline passed, skipping rows another sweeper (or a payment)
/// has locked. An order whose fan started paying is cancelled only if it is in `asked`: the sweeper asked the
/// provider about it first (see [`due_with_payment`]); one whose deadline passed after that list was made waits
/// for the next list. Returns how many this call cancelled. Safe with any number of sweepers at once.
pub async fn sweep(pool: &PgPool, batch: i64, asked: &[OrderId]) -> Result<u64, StoreError> {
    let asked: Vec<uuid::Uuid> = asked.iter().map(|o| o.0).collect();
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE expire_order(id)) FROM (
             SELECT id FROM orders WHERE status = 'reserved' AND payment_due_at <= now()
                                     AND (payment_id IS NULL OR id = ANY ($2))
             ORDER BY payment_due_at LIMIT $1 FOR UPDATE SKIP LOCKED) due",
    )
    .bind(batch)
    .bind(&asked)
    .fetch_one(pool)
    .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Reserved orders past their deadline that have a payment at the provider: the sweeper asks the provider
/// about these before it cancels them, in case the payment went through and its webhook was lost.
pub async fn due_with_payment(pool: &PgPool, batch: i64) -> Result<Vec<(OrderId, String)>, StoreError> {
    let rows: Vec<(uuid::Uuid, String)> = sqlx::query_as(
        "SELECT id, payment_id FROM orders
         WHERE status = 'reserved' AND payment_due_at <= now() AND payment_id IS NOT NULL
         ORDER BY payment_due_at LIMIT $1",
    )
    .bind(batch)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|(id, payment)| (OrderId(id), payment)).collect())
}

/// Which orders [`changed_since`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Changed {
    /// Those that were paid (then maybe refunded or cancelled): their Redis markers never lapse by themselves.
    Paid,
    /// Those, and the reserved orders whose deadline has not passed: every order whose markers Redis must still
    /// show. (An unpaid order cancelled before its deadline is not listed: its markers lapse at the deadline.)
    Live,
}

impl Changed {
    /// The condition on an order `o` changed since `$1`. Each branch matches a partial index
    /// (orders_paid_updated, orders_reserved_due).
    fn condition(self) -> &'static str {
        match self {
            Changed::Paid => "(o.paid_at IS NOT NULL AND o.updated_at >= $1)",
            Changed::Live => {
                "((o.paid_at IS NOT NULL AND o.updated_at >= $1)
                  OR (o.status = 'reserved' AND o.payment_due_at > now() AND o.updated_at >= $1))"
            }
        }
    }
}

/// The events with a live order (paid, or reserved before its deadline) changed since `since`: those whose
/// Redis markers a loss of Redis's last writes could have taken.
pub async fn events_changed_since(pool: &PgPool, since: OffsetDateTime) -> Result<Vec<EventId>, StoreError> {
    let sql = format!("SELECT DISTINCT o.event_id FROM orders o WHERE {}", Changed::Live.condition());
    let ids: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(since).fetch_all(pool).await?;
    Ok(ids.into_iter().map(EventId).collect())
}

/// Orders changed since `since`, as `which` says, the earliest `limit` of them, each with when it changed, and
/// the database's time now (the next call's `since`, if fewer than `limit` came back). The sweeper applies their
/// markers again in case the follow-up after the commit never ran, or Redis lost it.
pub async fn changed_since(
    pool: &PgPool,
    since: OffsetDateTime,
    which: Changed,
    limit: i64,
) -> Result<(Vec<(OrderRow, OffsetDateTime)>, OffsetDateTime), StoreError> {
    let now: OffsetDateTime = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    let sql = format!(
        "SELECT {ORDER_COLUMNS}, o.updated_at FROM orders o WHERE {} ORDER BY o.updated_at LIMIT $2",
        which.condition()
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(since).bind(limit).fetch_all(pool).await?;
    let orders =
        rows.iter().map(|r| Ok((order_from_row(r)?, r.try_get("updated_at")?))).collect::<Result<_, StoreError>>()?;
    Ok((orders, now))
}

/// One entry of an order's history (its outbox rows).
#[derive(Debug, Clone)]
pub struct HistoryEntry {
    pub id: i64,
    pub kind: String,
    pub from: Option<String>,
    pub to: String,
    pub at: OffsetDateTime,
    pub published: bool,
}

/// An order's history, oldest first.
pub async fn history(pool: &PgPool, id: OrderId) -> Result<Vec<HistoryEntry>, StoreError> {
    let rows = sqlx::query(
        "SELECT e.id, e.kind, e.from_status, e.to_status, e.created_at, (e.txid, e.id) <= (c.txid, c.id) AS published
         FROM order_events e CROSS JOIN outbox_cursor c WHERE e.order_id = $1 ORDER BY e.id",
    )
    .bind(id.0)
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(HistoryEntry {
                id: r.try_get("id")?,
                kind: r.try_get("kind")?,
                from: r.try_get("from_status")?,
                to: r.try_get("to_status")?,
                at: r.try_get("created_at")?,
                published: r.try_get("published")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(Into::into)
}

/// Orders of an event in one effective status.
#[derive(Debug, Clone)]
pub struct StatusCount {
    pub status: Status,
    pub orders: i64,
    pub seats: i64,
    pub total_cents: i64,
}

/// Per-status counts of the event's orders, by effective status (a reserved order past its deadline counts as
/// cancelled).
pub async fn counts(pool: &PgPool, event: EventId) -> Result<Vec<StatusCount>, StoreError> {
    let rows = sqlx::query(
        "SELECT CASE WHEN o.status = 'reserved' AND o.payment_due_at <= now() THEN 'cancelled' ELSE o.status END
                    AS status,
                count(*) AS orders, coalesce(sum(s.n), 0)::bigint AS seats,
                coalesce(sum(o.total_cents), 0)::bigint AS total_cents
         FROM orders o CROSS JOIN LATERAL (SELECT count(*) AS n FROM order_seats os WHERE os.order_id = o.id) s
         WHERE o.event_id = $1 GROUP BY 1 ORDER BY 1",
    )
    .bind(event.0)
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            let status: String = r.try_get("status")?;
            Ok(StatusCount {
                status: Status::parse(&status)
                    .ok_or_else(|| StoreError::Unexpected(format!("order status {status:?}")))?,
                orders: r.try_get("orders")?,
                seats: r.try_get("seats")?,
                total_cents: r.try_get("total_cents")?,
            })
        })
        .collect()
}
