//! The outbox relay's store side: claim unpublished `order_events` rows, publish them to a Redis Stream, mark
//! them published, in that order and in one Postgres transaction.
//!
//! At least once: a relay that dies after XADD and before its commit leaves the rows unpublished, so they are
//! published again, under the same `id` field (the row's id), which consumers dedupe on. Rows are claimed with
//! `FOR UPDATE SKIP LOCKED`, so several relays may run; each row's stream entries carry its id, and an
//! order's entries are in `id` order within one relay's batch.

use redis::aio::ConnectionManager;
use sqlx::{PgPool, Row};

use super::StoreError;

/// Where and how the relay publishes.
#[derive(Debug, Clone)]
pub struct Stream {
    /// The stream key (`<prefix>outbox:orders`).
    pub key: String,
    /// Approximate cap on the stream's length (`XADD MAXLEN ~`); 0 keeps everything.
    pub max_len: usize,
}

/// Publishes up to `batch` unpublished rows. `published` runs after the stream has them and before they are
/// marked (the crash window the relay tests aim at). Returns how many rows were published.
pub async fn relay_batch(
    pool: &PgPool,
    conn: &mut ConnectionManager,
    stream: &Stream,
    batch: i64,
    published: impl FnOnce(usize),
) -> Result<usize, StoreError> {
    let mut tx = pool.begin().await?;
    // Index lookups whatever the statistics say (as the order functions have since migration 008): a plan made
    // while order_events looked empty scanned the whole table on every tick, and the table only grows.
    sqlx::raw_sql("SET LOCAL enable_seqscan = off").execute(&mut *tx).await?;
    let rows = sqlx::query(
        "SELECT id, order_id, event_id, kind, from_status, to_status, data::text AS data,
                to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS at
         FROM order_events WHERE published_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(batch)
    .fetch_all(&mut *tx)
    .await?;
    if rows.is_empty() {
        tx.rollback().await?;
        return Ok(0);
    }
    let mut pipe = redis::pipe();
    let mut ids = Vec::with_capacity(rows.len());
    for r in &rows {
        let id: i64 = r.try_get("id")?;
        let order: uuid::Uuid = r.try_get("order_id")?;
        let event: i64 = r.try_get("event_id")?;
        let from: Option<String> = r.try_get("from_status")?;
        let fields: [(&str, String); 7] = [
            ("id", id.to_string()),
            ("kind", r.try_get("kind")?),
            ("order_id", order.to_string()),
            ("event_id", event.to_string()),
            ("from", from.unwrap_or_default()),
            ("to", r.try_get("to_status")?),
            ("data", r.try_get("data")?),
        ];
        let cmd = pipe.cmd("XADD").arg(&stream.key);
        if stream.max_len > 0 {
            cmd.arg("MAXLEN").arg("~").arg(stream.max_len);
        }
        cmd.arg("*").arg(&fields[..]).arg("at").arg(r.try_get::<String, _>("at")?).ignore();
        ids.push(id);
    }
    let _: () = pipe.query_async(conn).await?;
    published(ids.len());
    sqlx::query("UPDATE order_events SET published_at = now() WHERE id = ANY($1)").bind(&ids).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(ids.len())
}

/// Rows not yet published (for metrics and tests).
pub async fn backlog(pool: &PgPool) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM order_events WHERE published_at IS NULL").fetch_one(pool).await?)
}
