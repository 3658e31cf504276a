//! Postgres: the event catalogue, the seats sold, idempotency keys and the checkout transaction.
//!
//! Invariant: at most one active order seat per (event, seat), enforced by the partial unique index
//! `order_seats_one_active_sale`; this module turns its violation into [`CheckoutError::SeatSold`].

use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};
use time::OffsetDateTime;
use tokens::times::rfc3339;
use uuid::Uuid;

use super::StoreError;
use crate::domain::{Catalogue, EventId, EventInfo, HoldToken, OrderId, SeatId, SeatInfo, TicketType};

/// Loads an event's catalogue; `None` if the event does not exist.
pub async fn load_catalogue(pool: &PgPool, event: EventId) -> Result<Option<Catalogue>, StoreError> {
    let Some(row) = sqlx::query(
        "SELECT e.name, v.name AS venue, e.starts_at, e.currency, e.catalogue_version
         FROM events e JOIN venues v ON v.id = e.venue_id WHERE e.id = $1",
    )
    .bind(event.0)
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    let starts_at: OffsetDateTime = row.try_get("starts_at")?;
    let version: i64 = row.try_get("catalogue_version")?;
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
    Ok(Some(Catalogue::new(info, ticket_types, seats, version)))
}

/// The event's catalogue version (grows with every change of its allocations or ticket types); `None` if the
/// event does not exist.
pub async fn catalogue_version(pool: &PgPool, event: EventId) -> Result<Option<i64>, StoreError> {
    Ok(sqlx::query_scalar("SELECT catalogue_version FROM events WHERE id = $1")
        .bind(event.0)
        .fetch_optional(pool)
        .await?)
}

/// The events on sale or about to be: not started, or started within the last day.
pub async fn current_events(pool: &PgPool) -> Result<Vec<EventId>, StoreError> {
    let ids: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM events WHERE starts_at > now() - interval '1 day' ORDER BY id")
            .fetch_all(pool)
            .await?;
    Ok(ids.into_iter().map(EventId).collect())
}

/// The condition on an `order_seats` row that takes its seat now: its order is paid, or reserved before its
/// deadline (a literal, for `concat!`).
macro_rules! live {
    () => {
        "active AND (expires_at IS NULL OR expires_at > now())"
    };
}

/// Seats of the event in a paid order or a reserved one before its deadline: sold, whatever Redis says.
pub async fn sold_seats(pool: &PgPool, event: EventId) -> Result<Vec<SeatId>, StoreError> {
    let ids: Vec<i64> =
        sqlx::query_scalar(concat!("SELECT seat_id FROM order_seats WHERE event_id = $1 AND ", live!()))
            .bind(event.0)
            .fetch_all(pool)
            .await?;
    Ok(ids.into_iter().map(SeatId).collect())
}

/// The event's sold seats split by whether they are paid: `(paid, awaiting payment)`. A seat awaiting payment
/// comes back if its order's payment window ends unpaid.
pub async fn sold_counts(pool: &PgPool, event: EventId) -> Result<(i64, i64), StoreError> {
    Ok(sqlx::query_as(concat!(
        "SELECT count(*) FILTER (WHERE expires_at IS NULL), count(*) FILTER (WHERE expires_at IS NOT NULL) ",
        "FROM order_seats WHERE event_id = $1 AND ",
        live!()
    ))
    .bind(event.0)
    .fetch_one(pool)
    .await?)
}

/// A round trip to Postgres, for readiness.
pub async fn ping(pool: &PgPool) -> Result<(), StoreError> {
    sqlx::query("SELECT 1").execute(pool).await?;
    Ok(())
}

/// What an idempotency key answered before.
#[derive(Debug, Clone)]
pub enum Answer {
    /// The order the key created.
    Order(Order),
    /// A refusal, as it was sent.
    Refusal { status: u16, body: serde_json::Value },
}

/// How Postgres settled a checkout that passed the Redis gate.
#[derive(Debug)]
pub enum Checkout {
    Created(Order),
    /// The key answered before: send this again.
    Replay(Answer),
    /// Another request with this key is running right now.
    InFlight,
    /// The key was used for a different request.
    Mismatch,
    /// The account already has `owned` seats for the event; the basket would pass the cap.
    AccountCap {
        owned: i64,
    },
    /// A seat is no longer allocated to the event.
    NotOnSale(SeatId),
}

/// Why Postgres refused a checkout with an error rather than an outcome.
#[derive(Debug, thiserror::Error)]
pub enum CheckoutError {
    #[error("seat {0} is already in an active order")]
    SeatSold(SeatId),
    #[error("this hold was already checked out")]
    HoldUsed,
    #[error("seat {0} was withdrawn from sale during the checkout")]
    Withdrawn(SeatId),
    /// The idempotency key got its answer from another request while this checkout ran (a writer of the key
    /// that did not hold the key's lock committed between the checkout's look at the key and its insert). A
    /// retry is answered from the key.
    #[error("another request answered this idempotency key during the checkout")]
    KeyAnswered,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A checkout to write.
#[derive(Debug, Clone)]
pub struct NewOrder {
    pub event: EventId,
    pub account: String,
    pub hold: HoldToken,
    pub seats: Vec<SeatId>,
    pub currency: String,
    pub payment_window_seconds: u32,
    pub max_seats_per_account: usize,
    pub idempotency_key: String,
    pub fingerprint: String,
}

impl NewOrder {
    fn cap(&self) -> i32 {
        i32::try_from(self.max_seats_per_account).unwrap_or(i32::MAX)
    }

    /// Whether two checkouts can go in one `checkout_batch` (which takes these once for the whole batch).
    pub fn batches_with(&self, other: &NewOrder) -> bool {
        self.event == other.event
            && self.currency == other.currency
            && self.payment_window_seconds == other.payment_window_seconds
            && self.max_seats_per_account == other.max_seats_per_account
    }
}

/// A written order.
#[derive(Debug, Clone)]
pub struct Order {
    pub id: OrderId,
    pub event: EventId,
    pub status: String,
    pub hold: HoldToken,
    /// (seat, ticket type, price), by seat id.
    pub seats: Vec<(SeatId, i64, i64)>,
    pub total_cents: i64,
    pub currency: String,
    pub payment_due_at: OffsetDateTime,
    pub created_at: OffsetDateTime,
}

/// Runs `checkout_order` (migrations/20261202000002_checkout_fn.sql, now 20261202000006): idempotency, the
/// account cap, and the order with its seats priced from their allocations, in one statement and one commit.
/// Nothing is written unless the whole basket is.
pub async fn checkout(pool: &PgPool, new: &NewOrder) -> Result<Checkout, CheckoutError> {
    let seat_ids: Vec<i64> = new.seats.iter().map(|s| s.0).collect();
    let query = sqlx::query("SELECT * FROM checkout_order($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)")
        .bind(OrderId::generate().0)
        .bind(new.event.0)
        .bind(&new.account)
        .bind(new.hold.0)
        .bind(&seat_ids)
        .bind(&new.currency)
        .bind(f64::from(new.payment_window_seconds))
        .bind(new.cap())
        .bind(&new.idempotency_key)
        .bind(&new.fingerprint);
    match fetch_settled(pool, query).await {
        Ok(rows) => outcome(new.event, &rows),
        Err(sqlx::Error::Database(db)) if db.code().is_some() => {
            let (code, constraint) = (db.code().unwrap_or_default().into_owned(), db.constraint().map(str::to_owned));
            match refusal(pool, new, &code, constraint.as_deref()).await {
                Some(refused) => Err(refused),
                None => Err(StoreError::Postgres(sqlx::Error::Database(db)).into()),
            }
        }
        Err(e) => Err(StoreError::Postgres(e).into()),
    }
}

/// Runs `checkout_batch` (migrations/20261202000007_checkout_batch.sql): several checkouts that
/// [`NewOrder::batches_with`] one another, in one statement and one commit, each settled exactly as
/// [`checkout`] would settle it alone. An `Err` means the whole statement failed and wrote nothing (a race
/// only the database saw, a deadlock, a lost connection): run the checkouts one by one.
pub async fn checkout_batch(
    pool: &PgPool,
    batch: &[NewOrder],
) -> Result<Vec<Result<Checkout, CheckoutError>>, StoreError> {
    let Some(first) = batch.first() else { return Ok(Vec::new()) };
    debug_assert!(batch.iter().all(|n| n.batches_with(first)));
    let (mut accounts, mut holds, mut keys, mut fingerprints) = (vec![], vec![], vec![], vec![]);
    let (mut seat_items, mut seat_ids) = (vec![], vec![]);
    for (item, new) in (1_i32..).zip(batch) {
        accounts.push(new.account.as_str());
        holds.push(new.hold.0);
        keys.push(new.idempotency_key.as_str());
        fingerprints.push(new.fingerprint.as_str());
        for seat in &new.seats {
            seat_items.push(item);
            seat_ids.push(seat.0);
        }
    }
    let orders: Vec<Uuid> = batch.iter().map(|_| OrderId::generate().0).collect();
    let query = sqlx::query("SELECT * FROM checkout_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)")
        .bind(first.event.0)
        .bind(&first.currency)
        .bind(f64::from(first.payment_window_seconds))
        .bind(first.cap())
        .bind(&orders)
        .bind(&accounts)
        .bind(&holds)
        .bind(&keys)
        .bind(&fingerprints)
        .bind(&seat_items)
        .bind(&seat_ids);
    let rows = fetch_settled(pool, query).await?;
    let mut per_item: Vec<Vec<PgRow>> = batch.iter().map(|_| Vec::new()).collect();
    for row in rows {
        let item: i32 = row.try_get("item")?;
        let slot = usize::try_from(item - 1).ok().and_then(|i| per_item.get_mut(i));
        slot.ok_or_else(|| StoreError::Unexpected(format!("checkout_batch answered for item {item}")))?.push(row);
    }
    let mut settled = Vec::with_capacity(batch.len());
    for (new, rows) in batch.iter().zip(per_item) {
        let error: Option<(String, Option<String>)> = match rows.first() {
            Some(row) => row
                .try_get::<Option<String>, _>("error_state")?
                .map(|code| Ok::<_, sqlx::Error>((code, row.try_get("error_constraint")?)))
                .transpose()?,
            None => None,
        };
        settled.push(match error {
            None => outcome(new.event, &rows),
            Some((code, constraint)) => {
                Err(refusal(pool, new, &code, constraint.as_deref()).await.unwrap_or_else(|| {
                    StoreError::Unexpected(format!("checkout_batch item failed with {code} on {constraint:?}")).into()
                }))
            }
        });
    }
    Ok(settled)
}

/// Runs a checkout statement on a connection of its own and, when it fails, returns only once Postgres has rolled
/// it back. Postgres reports a statement's error before it aborts the transaction, and until then the transaction
/// still holds its locks, the idempotency keys' among them: a retry sent at once on another connection (a failed
/// batch's checkouts run one by one, a client's immediate retry) could find its own key "in flight". The
/// ReadyForQuery that the ping waits for comes after the rollback.
async fn fetch_settled(
    pool: &PgPool,
    query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> Result<Vec<PgRow>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let rows = query.fetch_all(&mut *conn).await;
    if rows.is_err() {
        // A failed ping is a lost connection: Postgres rolls its transaction back on its own.
        let _ = sqlx::Connection::ping(&mut *conn).await;
    }
    rows
}

/// What `checkout_order` answered, from its rows.
fn outcome(event: EventId, rows: &[PgRow]) -> Result<Checkout, CheckoutError> {
    let Some(first) = rows.first() else {
        return Err(StoreError::Unexpected("checkout_order returned no row".into()).into());
    };
    let outcome: String = first.try_get("outcome").map_err(StoreError::from)?;
    let detail: Option<i64> = first.try_get("detail").map_err(StoreError::from)?;
    Ok(match outcome.as_str() {
        "created" => Checkout::Created(order_from_rows(event, rows)?),
        "replay" => Checkout::Replay(answer_from_rows(event, rows)?),
        "in_flight" => Checkout::InFlight,
        "mismatch" => Checkout::Mismatch,
        "account_cap" => Checkout::AccountCap { owned: detail.unwrap_or(0) },
        "not_on_sale" => Checkout::NotOnSale(SeatId(detail.unwrap_or(0))),
        other => return Err(StoreError::Unexpected(format!("checkout_order outcome {other:?}")).into()),
    })
}

/// The refusal a constraint violation during a checkout means, naming the seat where one is at fault; `None`
/// for a violation a checkout should never meet.
async fn refusal(pool: &PgPool, new: &NewOrder, code: &str, constraint: Option<&str>) -> Option<CheckoutError> {
    let seat_where = |query, listed| first_seat_where(pool, query, new.event, &new.seats, listed);
    Some(match (code, constraint?) {
        ("23505", "orders_hold_token_key") => CheckoutError::HoldUsed,
        ("23505", "idempotency_keys_pkey") => CheckoutError::KeyAnswered,
        ("23505", "order_seats_one_active_sale") => match seat_where(SOLD_AMONG, true).await {
            Ok(seat) => CheckoutError::SeatSold(seat),
            Err(e) => e.into(),
        },
        // An operator withdrew an allocation between the function's check and its insert.
        ("23503", "order_seats_event_id_seat_id_fkey") => match seat_where(ALLOCATED_AMONG, false).await {
            Ok(seat) => CheckoutError::Withdrawn(seat),
            Err(e) => e.into(),
        },
        _ => return None,
    })
}

fn order_from_rows(event: EventId, rows: &[PgRow]) -> Result<Order, StoreError> {
    let first = rows.first().ok_or_else(|| StoreError::Unexpected("order without seats".into()))?;
    let mut seats = rows
        .iter()
        .map(|r| Ok((SeatId(r.try_get("seat_id")?), r.try_get("ticket_type_id")?, r.try_get("price_cents")?)))
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    seats.sort_by_key(|s| s.0);
    Ok(Order {
        id: OrderId(first.try_get("order_id")?),
        event,
        status: first.try_get("status")?,
        hold: HoldToken(first.try_get("hold_token")?),
        seats,
        total_cents: first.try_get("total_cents")?,
        currency: first.try_get("currency")?,
        payment_due_at: first.try_get("payment_due_at")?,
        created_at: first.try_get("created_at")?,
    })
}

fn answer_from_rows(event: EventId, rows: &[PgRow]) -> Result<Answer, StoreError> {
    let first = rows.first().ok_or_else(|| StoreError::Unexpected("empty answer".into()))?;
    let order: Option<Uuid> = first.try_get("order_id")?;
    if order.is_some() {
        return Ok(Answer::Order(order_from_rows(event, rows)?));
    }
    let status: Option<i64> = first.try_get("detail")?;
    Ok(Answer::Refusal { status: status.unwrap_or(409) as u16, body: first.try_get("response_body")? })
}

/// What a key says when recording a refusal under it.
#[derive(Debug)]
pub enum Recorded {
    /// The refusal is now the key's answer.
    Stored,
    /// The key already had an answer for this same request: send it instead.
    Existing(Answer),
    /// The key already answered a different request.
    Mismatch,
    /// Another request with this key is running right now (it holds the key's lock): nothing was recorded.
    InFlight,
}

/// Records a refusal as the key's answer, unless the key already has one. It takes the key's lock first, as a
/// checkout does, so a refusal is never written under a key while a checkout with that key runs.
pub async fn record_refusal(
    pool: &PgPool,
    event: EventId,
    account: &str,
    key: &str,
    fingerprint: &str,
    status: u16,
    body: &serde_json::Value,
) -> Result<Recorded, StoreError> {
    let mut tx = pool.begin().await?;
    if !lock_key(&mut tx, account, key).await? {
        return Ok(Recorded::InFlight);
    }
    let inserted = sqlx::query(
        "INSERT INTO idempotency_keys (account_id, key, fingerprint, response_status, response_body)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
    )
    .bind(account)
    .bind(key)
    .bind(fingerprint)
    .bind(status as i16)
    .bind(body)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if inserted == 1 {
        tx.commit().await?;
        return Ok(Recorded::Stored);
    }
    let found = existing(&mut tx, event, account, key, fingerprint).await?;
    tx.commit().await?;
    Ok(found.unwrap_or(Recorded::Stored))
}

/// What a key already answered, recording nothing: for a refusal not worth keeping (a hold that does not exist,
/// which anyone can make up in any number), yet a retry of a checkout that succeeded must still get its order.
pub async fn answered(
    pool: &PgPool,
    event: EventId,
    account: &str,
    key: &str,
    fingerprint: &str,
) -> Result<Option<Recorded>, StoreError> {
    let mut tx = pool.begin().await?;
    if !lock_key(&mut tx, account, key).await? {
        return Ok(Some(Recorded::InFlight));
    }
    let found = existing(&mut tx, event, account, key, fingerprint).await?;
    tx.commit().await?;
    Ok(found)
}

/// Takes the key's lock for the transaction, as a checkout does; false while another request holds it.
async fn lock_key(tx: &mut sqlx::PgConnection, account: &str, key: &str) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtextextended($1 || '/' || $2, 7))")
        .bind(account)
        .bind(key)
        .fetch_one(tx)
        .await?)
}

/// The key's answer: [`Recorded::Existing`] for this request, [`Recorded::Mismatch`] for another, or none.
async fn existing(
    conn: &mut sqlx::PgConnection,
    event: EventId,
    account: &str,
    key: &str,
    fingerprint: &str,
) -> Result<Option<Recorded>, StoreError> {
    let rows = sqlx::query(
        "SELECT k.fingerprint, k.order_id, k.response_status::bigint AS detail, k.response_body,
                os.seat_id, os.ticket_type_id, os.price_cents, o.status, o.hold_token, o.total_cents,
                o.currency::text AS currency, o.payment_due_at, o.created_at
         FROM idempotency_keys k
         LEFT JOIN orders o ON o.id = k.order_id
         LEFT JOIN order_seats os ON os.order_id = o.id
         WHERE k.account_id = $1 AND k.key = $2",
    )
    .bind(account)
    .bind(key)
    .fetch_all(&mut *conn)
    .await?;
    let Some(first) = rows.first() else { return Ok(None) };
    if first.try_get::<String, _>("fingerprint")? != fingerprint {
        return Ok(Some(Recorded::Mismatch));
    }
    Ok(Some(Recorded::Existing(answer_from_rows(event, &rows)?)))
}

/// How long a key keeps its answer, as pretix keeps them: a client retries within minutes, not days.
pub const KEY_LIFETIME: time::Duration = time::Duration::hours(24);

/// Forgets up to `batch` keys older than [`KEY_LIFETIME`]; returns how many.
pub async fn forget_old_keys(pool: &PgPool, batch: i64) -> Result<u64, StoreError> {
    let done = sqlx::query(
        "DELETE FROM idempotency_keys WHERE ctid = ANY(ARRAY(
             SELECT ctid FROM idempotency_keys WHERE created_at < now() - make_interval(secs => $1) LIMIT $2))",
    )
    .bind(KEY_LIFETIME.as_seconds_f64())
    .bind(batch)
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// Seats of the basket in an active order.
const SOLD_AMONG: &str = "SELECT seat_id FROM order_seats WHERE event_id = $1 AND seat_id = ANY($2) AND active";
/// Seats of the basket still allocated to the event.
const ALLOCATED_AMONG: &str = "SELECT seat_id FROM seat_allocations WHERE event_id = $1 AND seat_id = ANY($2)";

/// The first seat of the basket, in the fan's order, that `query` lists (`listed`) or does not list: the seat
/// to name after a constraint refused the checkout without saying which.
async fn first_seat_where(
    pool: &PgPool,
    query: &'static str,
    event: EventId,
    seats: &[SeatId],
    listed: bool,
) -> Result<SeatId, StoreError> {
    let ids: Vec<i64> = seats.iter().map(|s| s.0).collect();
    let found: Vec<i64> = sqlx::query_scalar(query).bind(event.0).bind(&ids).fetch_all(pool).await?;
    Ok(seats.iter().copied().find(|s| found.contains(&s.0) == listed).unwrap_or(seats[0]))
}
