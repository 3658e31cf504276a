//! The live seat map's feed on this node: one reader of an event's change log in Redis (booking's scripts write
//! it) per event that has subscribers, broadcast to all of them as ready-made Server-Sent Events frames. A
//! fan's stream costs a task and a channel receiver here, and no connection to booking or Redis.
//!
//! The reader takes every entry the log has when it reads, so changes that come close together travel as one
//! `delta` (its `from` and `version` are the first and last version it covers); between two frames it waits at
//! least [`FeedOptions::coalesce`], which bounds the frames per second every subscriber is written. A
//! subscriber that falls `capacity` frames behind is told to resync and dropped, so memory stays bounded
//! whatever the clients do.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{broadcast, watch};

use crate::store::{LazyStore, LogEntry, LogReader, StoreError};

/// How the feeds run.
#[derive(Debug, Clone, Copy)]
pub struct FeedOptions {
    /// Least time between two frames of one event.
    pub coalesce: Duration,
    /// A comment line goes out after this long without a frame, so proxies keep the stream open and a
    /// subscriber whose connection died is found.
    pub heartbeat: Duration,
    /// Frames a subscriber may fall behind before it is told to resync.
    pub capacity: usize,
    /// Longest a reader waits in one blocking read of the log.
    pub block: Duration,
    /// How long a feed outlives its last subscriber: subscribers that drop and come back together (a
    /// network blip, a deploy) find it still reading, and its version saves each of them a Redis call.
    pub linger: Duration,
}

impl Default for FeedOptions {
    fn default() -> Self {
        Self {
            coalesce: Duration::from_millis(10),
            heartbeat: Duration::from_secs(15),
            capacity: 256,
            block: Duration::from_secs(1),
            linger: Duration::from_secs(30),
        }
    }
}

/// One frame of an event's stream, shared by every subscriber.
#[derive(Debug)]
pub struct Frame {
    /// The versions it covers (`from` 0: a heartbeat or a resync, which cover none).
    pub from: u64,
    pub to: u64,
    /// The version its entries were read after: it holds every entry of the log after `follows` up to `to`.
    /// That is `from - 1`, except at a log's start, whose first version is Redis's clock: a frame read after
    /// 0 holds the log from its first entry.
    pub follows: u64,
    /// The SSE text.
    pub text: Bytes,
    /// A `resync` that ends every stream.
    pub ends: bool,
}

/// Log entries read in one go, at most this many (a frame's size is bounded by it).
const READ_COUNT: usize = 5_000;

/// One event's feed: the channel its reader broadcasts on, and how far the reader has read.
struct Feed {
    tx: broadcast::Sender<Arc<Frame>>,
    /// Where the reader started: the log's last version when it first read it (`None` until then).
    start: watch::Sender<Option<u64>>,
    /// The last version the reader read (or found at the log's end), once it has.
    version: AtomicU64,
    known: AtomicBool,
    /// When the reader last heard from Redis.
    heard_at: Mutex<Option<Instant>>,
}

impl Feed {
    /// The version the reader last read, if it heard from Redis within `within`.
    fn version(&self, within: Duration) -> Option<u64> {
        let heard = self.heard_at.lock().ok().and_then(|at| *at)?;
        (self.known.load(Ordering::Acquire) && heard.elapsed() <= within).then(|| self.version.load(Ordering::Acquire))
    }

    fn heard(&self, version: Option<u64>) {
        if let Some(v) = version {
            self.version.store(v, Ordering::Release);
            self.known.store(true, Ordering::Release);
        }
        if let Ok(mut at) = self.heard_at.lock() {
            *at = Some(Instant::now());
        }
    }
}

/// A subscriber's place on an event's feed.
pub struct Subscription {
    /// The frames the reader broadcasts from now on.
    pub frames: broadcast::Receiver<Arc<Frame>>,
    /// The version the feed has read up to, when it is following the log now (the stream starts from there
    /// without asking Redis).
    pub followed: Option<u64>,
    /// While the reader has not yet read where the log ends: its start, once it has. A stream must start from
    /// there, not from a version it read itself: an entry logged between the two would be in no frame.
    pub starting: Option<watch::Receiver<Option<u64>>>,
}

/// Every event's feed on this node.
pub struct Feeds {
    store: LazyStore,
    options: FeedOptions,
    feeds: Mutex<HashMap<i64, Arc<Feed>>>,
}

impl Feeds {
    pub fn new(store: LazyStore, options: FeedOptions) -> Arc<Self> {
        Arc::new(Self { store, options, feeds: Mutex::new(HashMap::new()) })
    }

    /// A receiver of `event`'s frames from now on, with where the feed stands (see [`Subscription`]); starts
    /// the event's reader if it has none. Must be called from inside the runtime the reader is to run on.
    pub fn subscribe(self: &Arc<Self>, event: i64) -> Subscription {
        let mut feeds = self.feeds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(feed) = feeds.get(&event) {
            let starting = feed.start.borrow().is_none().then(|| feed.start.subscribe());
            // Heard from within one blocking read (and a margin): the reader is following the log.
            return Subscription {
                frames: feed.tx.subscribe(),
                followed: feed.version(self.options.block * 2),
                starting,
            };
        }
        let (tx, frames) = broadcast::channel(self.options.capacity.max(1));
        let (start, starting) = watch::channel(None);
        let feed = Arc::new(Feed {
            tx,
            start,
            version: AtomicU64::new(0),
            known: AtomicBool::new(false),
            heard_at: Mutex::new(None),
        });
        feeds.insert(event, feed.clone());
        metrics::gauge!("gateway_seatmap_feeds").increment(1.0);
        tokio::spawn(self.clone().read(event, feed));
        Subscription { frames, followed: None, starting: Some(starting) }
    }

    /// Whether the feed may stop: it has had no subscriber for `linger` (then it is gone from the map, under
    /// the lock `subscribe` takes, so no subscriber is left behind on a feed nobody reads).
    fn retire(&self, event: i64, feed: &Feed, alone_since: &mut Option<Instant>) -> bool {
        let mut feeds = self.feeds.lock().unwrap_or_else(|p| p.into_inner());
        if feed.tx.receiver_count() > 0 {
            *alone_since = None;
            return false;
        }
        if alone_since.get_or_insert_with(Instant::now).elapsed() < self.options.linger {
            return false;
        }
        feeds.remove(&event);
        metrics::gauge!("gateway_seatmap_feeds").decrement(1.0);
        true
    }

    /// The event's reader: follows the log and broadcasts what it finds, until nobody listens.
    async fn read(self: Arc<Self>, event: i64, feed: Arc<Feed>) {
        let o = self.options;
        let tx = &feed.tx;
        let mut reader = None;
        let mut after: Option<u64> = None;
        // The last entry read: the log must still hold it, as it was. A log that lost its last entries (a
        // failover to a replica that had not received them, a restart from an append-only file a moment old)
        // gives their versions out again, for other changes, and a read after them would never see those.
        let mut read_last: Option<LogEntry> = None;
        // Whether to check, before the next blocking read, that the log still holds that entry: after
        // connecting again, and after a quiet read (a client may reach a new master without an error).
        let mut check = false;
        let mut last_frame = Instant::now();
        let mut alone_since = None;
        loop {
            if self.retire(event, &feed, &mut alone_since) {
                return;
            }
            let r = match reader.as_mut() {
                Some(r) => r,
                None => match self.store.log_reader(event, o.block).await {
                    Ok(r) => {
                        check = true;
                        reader.insert(r)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, event, "seat map feed cannot reach Redis; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                },
            };
            let from = match after {
                Some(v) if !check => v,
                known => match resume(event, r, &feed, known, &mut read_last).await {
                    Ok(v) => {
                        check = false;
                        *after.insert(v)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, event, "seat map feed cannot read the log; retrying");
                        reader = None;
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                },
            };
            match r.next(from, o.block, READ_COUNT).await {
                Ok(entries) if entries.is_empty() => {
                    feed.heard(None);
                    check = true;
                    if last_frame.elapsed() >= o.heartbeat {
                        let _ = tx.send(Arc::new(heartbeat()));
                        last_frame = Instant::now();
                    }
                }
                Ok(entries) => {
                    after = entries.last().map(|e| e.version);
                    read_last = entries.last().cloned();
                    feed.heard(after);
                    if let Some(frame) = delta(from, &entries) {
                        let _ = tx.send(Arc::new(frame));
                        metrics::counter!("gateway_seatmap_frames_total").increment(1);
                    }
                    last_frame = Instant::now();
                    tokio::time::sleep(o.coalesce).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, event, "seat map feed read failed; reconnecting");
                    reader = None;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}

/// Where a reader goes on from: at its start, where the log ends (and the feed's streams start there too);
/// later, `known`, the version it read last, if the log still holds `read_last` as it was read. A log that
/// does not went back: every stream is told to resync, and the reader goes on from the log's end.
async fn resume(
    event: i64,
    r: &mut LogReader,
    feed: &Feed,
    known: Option<u64>,
    read_last: &mut Option<LogEntry>,
) -> Result<u64, StoreError> {
    if let Some(v) = known
        && (v == 0 || r.entry(v).await? == *read_last)
    {
        return Ok(v);
    }
    let newest = r.last().await?;
    let to = newest.as_ref().map_or(0, |e| e.version);
    match known {
        None => {
            feed.start.send_replace(Some(to));
        }
        Some(from) => {
            tracing::warn!(event, from, to, "the seat map log went back; its streams resync");
            metrics::counter!("gateway_seatmap_log_went_back_total").increment(1);
            let _ = feed.tx.send(Arc::new(went_back(event)));
        }
    }
    *read_last = newest;
    feed.heard(Some(to));
    Ok(to)
}

/// A comment line: keeps the connection alive, and tells nothing.
pub fn heartbeat() -> Frame {
    Frame { from: 0, to: 0, follows: 0, text: Bytes::from_static(b": heartbeat\n\n"), ends: false }
}

/// One `delta` event for consecutive log entries (none for no entries): `id` is the last version, `data` is
/// `{"from", "version", "at", "changes": [[seat_id, "a" | "h" | "s"], ...]}`, the changes in the order they
/// were made (a seat may appear more than once; the last says where it stands); `at` is when the first of
/// them was made (unix ms, Redis's clock), so a client can tell how fresh its map is.
pub fn delta(follows: u64, entries: &[LogEntry]) -> Option<Frame> {
    let (first, last) = (entries.first()?, entries.last()?);
    let mut text = String::with_capacity(64 + entries.iter().map(|e| e.changes.len() + 8).sum::<usize>());
    let _ = write!(
        text,
        "id: {}\nevent: delta\ndata: {{\"from\":{},\"version\":{},\"at\":{},\"changes\":[",
        last.version, first.version, last.version, first.at_ms
    );
    let mut any = false;
    for entry in entries {
        for change in entry.changes.split(',') {
            let Some((seat, status)) = change.split_once(':') else { continue };
            if seat.is_empty() || !seat.bytes().all(|b| b.is_ascii_digit()) || !matches!(status, "a" | "h" | "s") {
                continue;
            }
            if any {
                text.push(',');
            }
            any = true;
            let _ = write!(text, "[{seat},\"{status}\"]");
        }
    }
    text.push_str("]}\n\n");
    Some(Frame { from: first.version, to: last.version, follows, text: Bytes::from(text), ends: false })
}

/// The log went back: Redis lost its last entries (a failover to a replica that had not received them, a
/// restart from an append-only file a moment old) and gives their versions out again, for other changes. Every
/// stream is told to reload the status.
pub fn went_back(event: i64) -> Frame {
    Frame { from: 0, to: 0, follows: 0, text: resync(event, "log_lost"), ends: true }
}

/// The first event of a fresh stream: the version the stream starts after, and where the status for it is.
pub fn hello(event: i64, version: u64) -> Bytes {
    Bytes::from(format!(
        "retry: 1000\nid: {version}\nevent: version\ndata: {{\"version\":{version},\"status\":\"/events/{event}/seats/status\"}}\n\n"
    ))
}

/// The last event of a stream whose subscriber cannot be carried on from where it is: reload the status, then
/// subscribe again.
pub fn resync(event: i64, reason: &str) -> Bytes {
    Bytes::from(format!(
        "event: resync\ndata: {{\"reason\":\"{reason}\",\"status\":\"/events/{event}/seats/status\"}}\n\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(version: u64, changes: &str) -> LogEntry {
        LogEntry { version, changes: changes.to_owned(), at_ms: 1_000 + version }
    }

    #[test]
    fn entries_coalesce_into_one_delta_in_order() {
        let frame = delta(6, &[entry(7, "12:h,13:h"), entry(8, "12:a")]).expect("frame");
        assert_eq!((frame.from, frame.to), (7, 8));
        assert_eq!(
            std::str::from_utf8(&frame.text).expect("utf-8"),
            "id: 8\nevent: delta\ndata: {\"from\":7,\"version\":8,\"at\":1007,\"changes\":[[12,\"h\"],[13,\"h\"],[12,\"a\"]]}\n\n"
        );
        assert!(delta(0, &[]).is_none());
    }

    #[test]
    fn a_malformed_change_is_left_out_never_passed_on() {
        let frame = delta(2, &[entry(3, "1:h,x:a,2:z,:s,3\"]:a,4:s")]).expect("frame");
        let text = std::str::from_utf8(&frame.text).expect("utf-8");
        assert!(text.contains("\"changes\":[[1,\"h\"],[4,\"s\"]]"), "{text}");
    }
}
