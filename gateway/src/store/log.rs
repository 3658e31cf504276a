//! Booking's seat-map change log and order event stream, as the gateway reads them (booking writes both).

use std::collections::HashMap;
use std::time::Duration;

use redis::{AsyncCommands, Value};

use super::*;

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
    pub(super) conn: Conn,
    pub(super) keys: SeatMapKeys,
    pub(super) timeout: Duration,
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

/// An order paid, as booking's order event stream says: the entry's stream id, and whose order in which event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paid {
    pub event: i64,
    pub account: String,
}

impl QueueStore {
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
}
