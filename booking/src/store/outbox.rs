//! The outbox relay's store side: take the cursor, read the `order_events` rows past it whose transactions have
//! all ended, publish them to a Redis Stream, move the cursor past them, in that order and in one Postgres
//! transaction (migration 012 says why a cursor and why it cannot skip a row).
//!
//! At least once: a relay that dies after XADD and before its commit leaves the cursor where it was, so the rows
//! are published again, under the same `id` field (the row's id), which consumers dedupe on. The cursor row is
//! taken with `FOR UPDATE SKIP LOCKED`, so several relays may run and take turns; entries are in (transaction,
//! id) order, so an order's events reach the stream in the order they happened.

use redisconn::Conn;
use sqlx::{PgPool, Row};

use super::StoreError;

/// The condition on an `order_events` row `e` that it is past the cursor: not published yet (a literal, for
/// `concat!`). The cursor's two values are InitPlans, so the row comparison starts the key's index scan rather
/// than filtering it.
macro_rules! past_cursor {
    () => {
        "(e.txid, e.id) > ((SELECT c.txid FROM outbox_cursor c), (SELECT c.id FROM outbox_cursor c))"
    };
}

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
    conn: &mut Conn,
    stream: &Stream,
    batch: i64,
    published: impl FnOnce(usize),
) -> Result<usize, StoreError> {
    let mut tx = pool.begin().await?;
    let ours: Option<i32> =
        sqlx::query_scalar("SELECT 1 FROM outbox_cursor FOR UPDATE SKIP LOCKED").fetch_optional(&mut *tx).await?;
    if ours.is_none() {
        // Another relay has the cursor; it publishes these rows.
        tx.rollback().await?;
        return Ok(0);
    }
    match_stream(&mut tx, conn, stream).await?;
    // Index lookups whatever the statistics say (as the order functions have since migration 008): a plan made
    // while order_events looked empty scanned the whole table on every tick, and the table only grows. And no
    // JIT, which the disabled scan's cost on the one-row cursor would otherwise set off on every tick.
    sqlx::raw_sql("SET LOCAL enable_seqscan = off; SET LOCAL jit = off").execute(&mut *tx).await?;
    let rows = sqlx::query(concat!(
        "SELECT e.txid::text AS txid, e.id, e.order_id, e.event_id, e.kind, e.from_status, e.to_status,
                e.data::text AS data,
                to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS at
         FROM order_events e WHERE ",
        past_cursor!(),
        " AND e.txid < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY e.txid, e.id LIMIT $1"
    ))
    .bind(batch)
    .fetch_all(&mut *tx)
    .await?;
    if rows.is_empty() {
        // Committed, not rolled back: the cursor may have just moved to where the stream ends (a relay died
        // after publishing the last rows), and it must stay there.
        tx.commit().await?;
        return Ok(0);
    }
    let mut pipe = redis::pipe();
    let mut last = (String::new(), 0i64);
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
        last = (r.try_get("txid")?, id);
    }
    let _: () = pipe.query_async(conn).await?;
    published(rows.len());
    sqlx::query("UPDATE outbox_cursor SET (txid, id) = ($1::xid8, $2)")
        .bind(last.0)
        .bind(last.1)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(rows.len())
}

/// How far back a stream lost whole is published again. Its readers follow it live (the gateways free slots on
/// `order.paid` as it comes), so what they missed is the last moments; a million rows of history published first
/// would hold those back for minutes.
pub const REPUBLISH_WINDOW: std::time::Duration = std::time::Duration::from_secs(600);

/// Puts the cursor where the stream's last entry says it is, when the two disagree: Redis lost entries (a flush,
/// a restart that lost the last second of its append-only file, a failover to a replica that lagged), and the
/// rows after the last one it has are published again; or a relay died after its `XADD` and before its commit,
/// and the rows the stream has already are not published twice. With no stream at all, the latest rows are
/// published again, as many as the stream keeps and none older than [`REPUBLISH_WINDOW`]. Consumers dedupe on `id`
/// either way. Runs under the cursor's lock.
async fn match_stream(tx: &mut sqlx::PgConnection, conn: &mut Conn, stream: &Stream) -> Result<(), StoreError> {
    let cursor: i64 = sqlx::query_scalar("SELECT id FROM outbox_cursor").fetch_one(&mut *tx).await?;
    // [[entry id, [field, value, field, value, ...]]]: the `id` field of the last entry, if any.
    let last: Vec<(String, Vec<String>)> =
        redis::cmd("XREVRANGE").arg(&stream.key).arg("+").arg("-").arg("COUNT").arg(1).query_async(conn).await?;
    let on_stream = last
        .first()
        .map(|(_, fields)| fields.chunks(2).find(|kv| kv[0] == "id").and_then(|kv| kv.get(1)?.parse::<i64>().ok()));
    let moved = match on_stream {
        Some(Some(id)) if id == cursor => return Ok(()),
        // The row the stream ends with, if this database wrote it (another database's stream is left alone).
        Some(Some(id)) => {
            sqlx::query("UPDATE outbox_cursor c SET (txid, id) = (e.txid, e.id) FROM order_events e WHERE e.id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected()
        }
        Some(None) => 0,
        None if cursor == 0 => return Ok(()),
        None => {
            // The stream keeps at most `max_len` entries anyway: only that many of the latest rows again, and
            // none older than the window (the later of the two bounds; the cursor stays on the last row left out).
            let keep = match stream.max_len {
                0 => i64::MAX,
                keep => i64::try_from(keep).unwrap_or(i64::MAX),
            };
            let from: Option<(String, i64)> = sqlx::query_as(
                "SELECT txid::text, id FROM (
                     (SELECT e.txid, e.id FROM order_events e ORDER BY e.txid DESC, e.id DESC OFFSET $1 LIMIT 1)
                     UNION ALL
                     (SELECT e.txid, e.id FROM order_events e WHERE e.created_at < now() - make_interval(secs => $2)
                      ORDER BY e.txid DESC, e.id DESC LIMIT 1)
                 ) bounds ORDER BY bounds.txid DESC, bounds.id DESC LIMIT 1",
            )
            .bind(keep)
            .bind(REPUBLISH_WINDOW.as_secs_f64())
            .fetch_optional(&mut *tx)
            .await?;
            let (txid, id) = from.unwrap_or_else(|| ("0".to_owned(), 0));
            sqlx::query("UPDATE outbox_cursor SET (txid, id) = ($1::xid8, $2)")
                .bind(txid)
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected()
        }
    };
    if moved > 0 {
        tracing::warn!(cursor, stream_ends_at = ?on_stream.flatten(), "the order stream did not end where the cursor stood; the cursor follows the stream");
        metrics::counter!("booking_outbox_cursor_moves_total").increment(1);
    }
    Ok(())
}

/// Rows not yet published (for metrics and tests).
pub async fn backlog(pool: &PgPool) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(concat!("SELECT count(*) FROM order_events e WHERE ", past_cursor!()))
        .fetch_one(pool)
        .await?)
}
