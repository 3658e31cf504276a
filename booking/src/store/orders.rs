//! Postgres: the event catalogue, the seats sold, idempotency keys and the checkout transaction.
//!
//! Invariant: at most one active order seat per (event, seat), enforced by the partial unique index
//! `order_seats_one_active_sale`; this module turns its violation into [`CheckoutError::SeatSold`].

use sqlx::{PgPool, Row};
use time::OffsetDateTime;
use uuid::Uuid;

use super::StoreError;
use crate::domain::{Catalogue, EventId, EventInfo, HoldToken, OrderId, SeatId, SeatInfo, TicketType};

/// Loads an event's catalogue; `None` if the event does not exist.
pub async fn load_catalogue(pool: &PgPool, event: EventId) -> Result<Option<Catalogue>, StoreError> {
    let Some(row) = sqlx::query(
        "SELECT e.name, v.name AS venue, e.starts_at, e.currency
         FROM events e JOIN venues v ON v.id = e.venue_id WHERE e.id = $1",
    )
    .bind(event.0)
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    let starts_at: OffsetDateTime = row.try_get("starts_at")?;
    let info = EventInfo {
        id: event,
        name: row.try_get("name")?,
        venue: row.try_get("venue")?,
        starts_at: rfc3339(starts_at),
        currency: row.try_get::<String, _>("currency")?,
    };
    let ticket_types = sqlx::query("SELECT id, name, price_cents FROM ticket_types WHERE event_id = $1 ORDER BY id")
        .bind(event.0)
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|r| {
            Ok(TicketType { id: r.try_get("id")?, name: r.try_get("name")?, price_cents: r.try_get("price_cents")? })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    let seats = sqlx::query(
        "SELECT s.id, s.label, sec.name AS section, s.row_label, s.number, s.x, s.y, s.accessible,
                a.ticket_type_id, t.price_cents
         FROM seat_allocations a
         JOIN seats s ON s.id = a.seat_id
         JOIN sections sec ON sec.id = s.section_id
         JOIN ticket_types t ON t.id = a.ticket_type_id
         WHERE a.event_id = $1
         ORDER BY sec.id, s.row_label, s.number",
    )
    .bind(event.0)
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| {
        Ok(SeatInfo {
            id: SeatId(r.try_get("id")?),
            label: r.try_get("label")?,
            section: r.try_get("section")?,
            row: r.try_get("row_label")?,
            number: r.try_get("number")?,
            x: r.try_get("x")?,
            y: r.try_get("y")?,
            accessible: r.try_get("accessible")?,
            ticket_type_id: r.try_get("ticket_type_id")?,
            price_cents: r.try_get("price_cents")?,
        })
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(Some(Catalogue::new(info, ticket_types, seats)))
}

/// Seats of the event in an active (reserved or paid) order: sold, whatever Redis says.
pub async fn sold_seats(pool: &PgPool, event: EventId) -> Result<Vec<SeatId>, StoreError> {
    let ids: Vec<i64> = sqlx::query_scalar("SELECT seat_id FROM order_seats WHERE event_id = $1 AND active")
        .bind(event.0)
        .fetch_all(pool)
        .await?;
    Ok(ids.into_iter().map(SeatId).collect())
}

/// A round trip to Postgres, for readiness.
pub async fn ping(pool: &PgPool) -> Result<(), StoreError> {
    sqlx::query("SELECT 1").execute(pool).await?;
    Ok(())
}

/// What an idempotency key already says about a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Idempotency {
    /// First use of the key: this request owns it now and must finish or abandon it.
    Fresh,
    /// The key answered before: replay this.
    Replay { status: u16, body: serde_json::Value },
    /// The first request with this key is still running.
    InFlight,
    /// The key was used for a different request.
    Mismatch,
}

/// How long an in-flight key may stay claimed before another request may take it over (the first request's
/// process died between claiming and finishing).
const IN_FLIGHT_TAKEOVER_SECONDS: f64 = 30.0;

/// Claims `key` for `account`'s request `fingerprint`, or says what the key already holds.
pub async fn claim_idempotency_key(
    pool: &PgPool,
    account: &str,
    key: &str,
    fingerprint: &str,
) -> Result<Idempotency, StoreError> {
    let claimed = sqlx::query(
        "INSERT INTO idempotency_keys (account_id, key, fingerprint, state)
         VALUES ($1, $2, $3, 'in_flight') ON CONFLICT DO NOTHING",
    )
    .bind(account)
    .bind(key)
    .bind(fingerprint)
    .execute(pool)
    .await?
    .rows_affected();
    if claimed == 1 {
        return Ok(Idempotency::Fresh);
    }
    let row = sqlx::query(
        "SELECT fingerprint, state, response_status, response_body, locked_at,
                locked_at < now() - make_interval(secs => $3) AS stale
         FROM idempotency_keys WHERE account_id = $1 AND key = $2",
    )
    .bind(account)
    .bind(key)
    .bind(IN_FLIGHT_TAKEOVER_SECONDS)
    .fetch_optional(pool)
    .await?;
    // Abandoned between our insert and this read: the key is free again.
    let Some(row) = row else { return Box::pin(claim_idempotency_key(pool, account, key, fingerprint)).await };
    if row.try_get::<String, _>("fingerprint")? != fingerprint {
        return Ok(Idempotency::Mismatch);
    }
    if row.try_get::<String, _>("state")? == "done" {
        let status: i16 = row.try_get("response_status")?;
        return Ok(Idempotency::Replay { status: status as u16, body: row.try_get("response_body")? });
    }
    if row.try_get::<bool, _>("stale")? {
        let locked_at: OffsetDateTime = row.try_get("locked_at")?;
        let taken = sqlx::query(
            "UPDATE idempotency_keys SET locked_at = now()
             WHERE account_id = $1 AND key = $2 AND state = 'in_flight' AND locked_at = $3",
        )
        .bind(account)
        .bind(key)
        .bind(locked_at)
        .execute(pool)
        .await?
        .rows_affected();
        if taken == 1 {
            return Ok(Idempotency::Fresh);
        }
    }
    Ok(Idempotency::InFlight)
}

/// Records the final answer for a claimed key (for answers that are not an order: those are recorded inside
/// the checkout transaction).
pub async fn finish_idempotency_key(
    pool: &PgPool,
    account: &str,
    key: &str,
    status: u16,
    body: &serde_json::Value,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE idempotency_keys SET state = 'done', response_status = $3, response_body = $4
         WHERE account_id = $1 AND key = $2",
    )
    .bind(account)
    .bind(key)
    .bind(status as i16)
    .bind(body)
    .execute(pool)
    .await?;
    Ok(())
}

/// Frees a claimed key after a failure the client may retry (a store was down).
pub async fn abandon_idempotency_key(pool: &PgPool, account: &str, key: &str) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM idempotency_keys WHERE account_id = $1 AND key = $2 AND state = 'in_flight'")
        .bind(account)
        .bind(key)
        .execute(pool)
        .await?;
    Ok(())
}

/// A checkout to write.
#[derive(Debug, Clone)]
pub struct NewOrder<'a> {
    pub event: EventId,
    pub account: &'a str,
    pub hold: HoldToken,
    pub seats: &'a [SeatId],
    pub currency: &'a str,
    pub payment_window_seconds: u32,
    pub max_seats_per_account: usize,
    pub idempotency_key: &'a str,
}

/// A written order.
#[derive(Debug, Clone)]
pub struct Order {
    pub id: OrderId,
    pub event: EventId,
    pub status: String,
    pub hold: HoldToken,
    /// (seat, ticket type, price) in basket order.
    pub seats: Vec<(SeatId, i64, i64)>,
    pub total_cents: i64,
    pub currency: String,
    pub payment_due_at: OffsetDateTime,
    pub created_at: OffsetDateTime,
}

/// Why Postgres refused a checkout.
#[derive(Debug, thiserror::Error)]
pub enum CheckoutError {
    #[error("seat {0} is already in an active order")]
    SeatSold(SeatId),
    #[error("this hold was already checked out")]
    HoldUsed,
    #[error("seat {0} is no longer on sale for this event")]
    NotOnSale(SeatId),
    #[error("the account already has {owned} seats for this event")]
    AccountCap { owned: i64 },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for CheckoutError {
    fn from(e: sqlx::Error) -> Self {
        CheckoutError::Store(StoreError::Postgres(e))
    }
}

/// Writes the order and its seats in one transaction, pricing every seat from its allocation, and records
/// `render(&order)` as the idempotency key's answer in the same transaction. Nothing is written unless the
/// whole basket is.
pub async fn checkout(
    pool: &PgPool,
    new: &NewOrder<'_>,
    render: impl FnOnce(&Order) -> serde_json::Value,
) -> Result<Order, CheckoutError> {
    let mut tx = pool.begin().await?;
    // Serialise checkouts of one account for one event, so the per-account cap cannot be raced.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, $2))")
        .bind(new.account)
        .bind(new.event.0)
        .execute(&mut *tx)
        .await?;
    let owned: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM order_seats os JOIN orders o ON o.id = os.order_id
         WHERE o.event_id = $1 AND o.account_id = $2 AND os.active",
    )
    .bind(new.event.0)
    .bind(new.account)
    .fetch_one(&mut *tx)
    .await?;
    if owned as usize + new.seats.len() > new.max_seats_per_account {
        return Err(CheckoutError::AccountCap { owned });
    }

    let id = OrderId(Uuid::new_v4());
    let inserted = sqlx::query(
        "INSERT INTO orders (id, event_id, account_id, status, hold_token, total_cents, currency, payment_due_at)
         VALUES ($1, $2, $3, 'reserved', $4, 0, $5, now() + make_interval(secs => $6))
         RETURNING payment_due_at, created_at",
    )
    .bind(id.0)
    .bind(new.event.0)
    .bind(new.account)
    .bind(new.hold.0)
    .bind(new.currency)
    .bind(f64::from(new.payment_window_seconds))
    .fetch_one(&mut *tx)
    .await;
    let row = match inserted {
        Ok(row) => row,
        Err(e) if is_unique_violation(&e, "orders_hold_token_key") => return Err(CheckoutError::HoldUsed),
        Err(e) => return Err(e.into()),
    };
    let payment_due_at: OffsetDateTime = row.try_get("payment_due_at")?;
    let created_at: OffsetDateTime = row.try_get("created_at")?;

    let seat_ids: Vec<i64> = new.seats.iter().map(|s| s.0).collect();
    let priced = sqlx::query(
        "INSERT INTO order_seats (order_id, event_id, seat_id, ticket_type_id, price_cents)
         SELECT $1, a.event_id, a.seat_id, a.ticket_type_id, t.price_cents
         FROM seat_allocations a JOIN ticket_types t ON t.id = a.ticket_type_id
         WHERE a.event_id = $2 AND a.seat_id = ANY($3)
         RETURNING seat_id, ticket_type_id, price_cents",
    )
    .bind(id.0)
    .bind(new.event.0)
    .bind(&seat_ids)
    .fetch_all(&mut *tx)
    .await;
    let priced = match priced {
        Ok(rows) => rows,
        Err(e) if is_unique_violation(&e, "order_seats_one_active_sale") => {
            drop(tx);
            return Err(CheckoutError::SeatSold(first_sold_seat(pool, new.event, new.seats).await?));
        }
        Err(e) => return Err(e.into()),
    };
    let mut seats = Vec::with_capacity(new.seats.len());
    for &seat in new.seats {
        let Some(row) = priced.iter().find(|r| r.try_get::<i64, _>("seat_id").ok() == Some(seat.0)) else {
            return Err(CheckoutError::NotOnSale(seat));
        };
        seats.push((seat, row.try_get("ticket_type_id")?, row.try_get("price_cents")?));
    }
    let total_cents: i64 = seats.iter().map(|s| s.2).sum();
    sqlx::query("UPDATE orders SET total_cents = $2 WHERE id = $1")
        .bind(id.0)
        .bind(total_cents)
        .execute(&mut *tx)
        .await?;

    let order = Order {
        id,
        event: new.event,
        status: "reserved".into(),
        hold: new.hold,
        seats,
        total_cents,
        currency: new.currency.to_owned(),
        payment_due_at,
        created_at,
    };
    sqlx::query(
        "UPDATE idempotency_keys SET state = 'done', response_status = 201, response_body = $3
         WHERE account_id = $1 AND key = $2",
    )
    .bind(new.account)
    .bind(new.idempotency_key)
    .bind(render(&order))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(order)
}

/// Which seat of the basket is already in an active order (after a unique violation named none).
async fn first_sold_seat(pool: &PgPool, event: EventId, seats: &[SeatId]) -> Result<SeatId, StoreError> {
    let ids: Vec<i64> = seats.iter().map(|s| s.0).collect();
    let sold: Vec<i64> =
        sqlx::query_scalar("SELECT seat_id FROM order_seats WHERE event_id = $1 AND seat_id = ANY($2) AND active")
            .bind(event.0)
            .bind(&ids)
            .fetch_all(pool)
            .await?;
    // Keep the fan's order: name the first seat they listed that went.
    Ok(seats.iter().copied().find(|s| sold.contains(&s.0)).unwrap_or(seats[0]))
}

fn is_unique_violation(e: &sqlx::Error, constraint: &str) -> bool {
    match e {
        sqlx::Error::Database(db) => db.code().as_deref() == Some("23505") && db.constraint() == Some(constraint),
        _ => false,
    }
}

/// RFC 3339 with the offset the database gave (UTC).
pub fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}
