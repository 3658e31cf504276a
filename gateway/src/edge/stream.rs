//! `GET /events/{id}/seats/stream`: the live seat map as Server-Sent Events, answered where the fan's
//! connection ends, from this node's feed of the event's change log (`crate::seatmap`).
//!
//! A fresh stream opens with a `version` event: the map version it starts after, and where to read the
//! status (which shows some version at or past it, or earlier from a cache: then the client resumes from the
//! status's version). A stream resumed with `Last-Event-ID` (or `?since=`, for a client that starts from a
//! status) first replays the log from there, at most [`CATCH_UP_ENTRIES`] entries in one read. Then come
//! `delta` events, each starting at the version after the last one sent, and heartbeats. When the log no longer
//! reaches back far enough, the client is further behind than a replay goes, or it falls behind, a `resync`
//! event ends the stream: the client reloads the status and subscribes again from its version.
//!
//! Nothing anonymous holds a stream for ever: streams are capped per client address prefix, per event and per
//! node ([`Caps`]), and each ends cleanly after its lifetime, the client resuming with `Last-Event-ID`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use super::reply::Reply;
use crate::seatmap::{self, Feeds, Frame, Subscription};
use crate::store::{QueueStore, StoreError};

/// Most log entries a stream replays to catch up: one bounded read of the log, written as one frame. A client
/// further behind is told to resync (`too_far_behind`) and reloads the status, which a CDN caches: replaying a
/// long log costs the node, Redis and the client more than the status costs anyone, and an anonymous request
/// for version 0 of a sale's log must cost no more than this.
pub const CATCH_UP_ENTRIES: u64 = 512;

/// Most bytes a catch-up frame may hold (an entry may carry many changes: a lapse, a large basket); a longer
/// one is a resync too.
const CATCH_UP_BYTES: usize = 64 * 1024;

/// Longest a stream waits for a feed that is just starting to read where the log ends (a Redis that does not
/// answer by then gets the client a 503 with Retry-After).
const FEED_START_WAIT: Duration = Duration::from_secs(2);

/// Waiting frames are written together up to this many bytes (a single frame may be larger).
const BATCH_BYTES: usize = 64 * 1024;

/// Where a stream starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// At the current version, announced by a `version` event.
    Now,
    /// After this version: the log's entries since are sent first.
    After(u64),
}

/// The start a request asks for: `Last-Event-ID` (what a browser's `EventSource` sends when it reconnects),
/// else `?since=`, else now. `Err` names what is malformed.
pub fn start(last_event_id: Option<&str>, query: Option<&str>) -> Result<Start, &'static str> {
    if let Some(id) = last_event_id.map(str::trim).filter(|id| !id.is_empty()) {
        return id.parse().map(Start::After).map_err(|_| "Last-Event-ID must be a map version (a number)");
    }
    let since = query.into_iter().flat_map(|q| q.split('&')).find_map(|pair| pair.strip_prefix("since="));
    match since {
        Some(v) => v.parse().map(Start::After).map_err(|_| "since must be a map version (a number)"),
        None => Ok(Start::Now),
    }
}

/// Why a stream cannot be carried on from a version by replaying the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoCatchUp {
    /// The log does not reach back that far (trimmed, or lost with Redis's data).
    LogTooShort,
    /// More than [`CATCH_UP_ENTRIES`] entries (or [`CATCH_UP_BYTES`]) to replay.
    TooFarBehind,
}

impl NoCatchUp {
    /// Too far behind, counted.
    fn too_far() -> Self {
        metrics::counter!("gateway_seatmap_resyncs_total", "reason" => "too_far_behind").increment(1);
        Self::TooFarBehind
    }

    fn reason(self) -> &'static str {
        match self {
            Self::LogTooShort => "log_too_short",
            Self::TooFarBehind => "too_far_behind",
        }
    }
}

/// The one delta frame for the log's entries after `after` up to at least `upto`, read in one bounded call (none
/// when `after` already reaches `upto`).
async fn catch_up(
    store: &QueueStore,
    event: i64,
    after: u64,
    upto: u64,
) -> Result<Result<Option<Frame>, NoCatchUp>, StoreError> {
    // Versions have no gaps, so the distance says how many entries a replay takes, before anything is read. A
    // client at 0 has seen nothing: the log starts at Redis's clock, and only the read can tell its length.
    if after >= upto {
        return Ok(Ok(None));
    }
    if after != 0 && upto - after > CATCH_UP_ENTRIES {
        return Ok(Err(NoCatchUp::too_far()));
    }
    metrics::counter!("gateway_seatmap_catch_ups_total").increment(1);
    let mut entries = store.map_log(event, after, CATCH_UP_ENTRIES as usize + 1).await?;
    // One more than a replay may take tells whether more remain before `upto`.
    let more = entries.len() as u64 > CATCH_UP_ENTRIES;
    entries.truncate(CATCH_UP_ENTRIES as usize);
    let (Some(first), Some(last)) = (entries.first(), entries.last()) else { return Ok(Err(NoCatchUp::LogTooShort)) };
    // A log starts at Redis's clock, not at 1: a client that has seen nothing (0) takes it from its start, as
    // long as nothing was ever trimmed from it.
    if first.version != after + 1 && !(after == 0 && store.map_log_whole(event).await?) {
        return Ok(Err(NoCatchUp::LogTooShort));
    }
    if last.version < upto {
        if more {
            return Ok(Err(NoCatchUp::too_far()));
        }
        return Ok(Err(NoCatchUp::LogTooShort));
    }
    let frame = seatmap::delta(after, &entries);
    if frame.as_ref().is_some_and(|f| f.text.len() > CATCH_UP_BYTES) {
        return Ok(Err(NoCatchUp::too_far()));
    }
    Ok(Ok(frame))
}

/// The bounds on the live streams one node serves. Each stream holds a connection (a file descriptor of the
/// node's 20,000 or so) for as long as its client likes, and costs nothing to ask for: without a cap, a few dozen
/// addresses fill the node.
#[derive(Debug, Clone, Copy)]
pub struct CapOptions {
    /// Streams open at once from one client address prefix (0: no cap).
    pub per_prefix: u32,
    /// The prefix lengths streams are counted by: IPv4, IPv6.
    pub prefix_v4: u8,
    pub prefix_v6: u8,
    /// Streams open at once for one event on this node (0: no cap).
    pub per_event: u32,
    /// Streams open at once on this node (0: no cap).
    pub total: u32,
    /// How long a stream lasts before it ends cleanly and its client comes back with `Last-Event-ID` (less a
    /// random tenth, so streams opened together do not all come back together).
    pub lifetime: Duration,
}

/// Which cap a stream is refused by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The client's address prefix holds its share already.
    Prefix,
    /// The event's streams on this node are at their cap.
    Event,
    /// The node's streams are at their cap.
    Node,
}

impl Full {
    /// The refusal: 429 for the client's own share, 503 for the node's, each with `Retry-After`.
    pub fn reply(self) -> Reply {
        let (status, code, message, retry) = match self {
            Self::Prefix => (429, "too_many_streams", "this address has as many live seat maps open as it may", 10),
            Self::Event => (503, "streams_full", "this event's live seat map is full here; retry shortly", 5),
            Self::Node => (503, "streams_full", "this node serves as many live seat maps as it can; retry shortly", 5),
        };
        metrics::counter!("gateway_seatmap_streams_refused_total", "cap" => self.label()).increment(1);
        Reply::error(status, code, message).header("retry-after", retry.to_string())
    }

    fn label(self) -> &'static str {
        match self {
            Self::Prefix => "prefix",
            Self::Event => "event",
            Self::Node => "node",
        }
    }
}

/// The streams open on this node, counted against [`CapOptions`].
pub struct Caps {
    options: CapOptions,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    total: u32,
    per_prefix: HashMap<IpAddr, u32>,
    per_event: HashMap<i64, u32>,
}

impl Caps {
    pub fn new(options: CapOptions) -> Arc<Self> {
        Arc::new(Self { options, open: Mutex::default() })
    }

    fn prefix(&self, ip: IpAddr) -> IpAddr {
        crate::limits::address_prefix(ip, self.options.prefix_v4, self.options.prefix_v6)
    }

    /// A place for one more stream of `event` from `ip`, held until the place is dropped, or the cap it is
    /// refused by.
    pub fn enter(self: &Arc<Self>, ip: IpAddr, event: i64) -> Result<Place, Full> {
        let prefix = self.prefix(ip);
        let o = &self.options;
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let at = |count: Option<&u32>, cap: u32| cap > 0 && count.copied().unwrap_or(0) >= cap;
        if at(Some(&open.total), o.total) {
            return Err(Full::Node);
        }
        if at(open.per_event.get(&event), o.per_event) {
            return Err(Full::Event);
        }
        if at(open.per_prefix.get(&prefix), o.per_prefix) {
            return Err(Full::Prefix);
        }
        open.total += 1;
        *open.per_event.entry(event).or_default() += 1;
        *open.per_prefix.entry(prefix).or_default() += 1;
        metrics::gauge!("gateway_seatmap_subscribers").increment(1.0);
        Ok(Place { caps: self.clone(), prefix, event })
    }

    fn leave(&self, prefix: IpAddr, event: i64) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.total = open.total.saturating_sub(1);
        count_out(&mut open.per_event, event);
        count_out(&mut open.per_prefix, prefix);
        metrics::gauge!("gateway_seatmap_subscribers").decrement(1.0);
    }

    /// A stream's lifetime: [`CapOptions::lifetime`] less up to a random tenth.
    fn lifetime(&self) -> Duration {
        let whole = self.options.lifetime;
        whole.saturating_sub(whole.mul_f64(rand::random::<f64>() / 10.0))
    }
}

/// One fewer under `key`; a key that reaches none is forgotten, so the maps hold only what is open.
fn count_out<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, u32>, key: K) {
    if let Some(count) = counts.get_mut(&key) {
        *count = count.saturating_sub(1);
        if *count == 0 {
            counts.remove(&key);
        }
    }
}

/// One stream counted in: counted out when dropped.
pub struct Place {
    caps: Arc<Caps>,
    prefix: IpAddr,
    event: i64,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.caps.leave(self.prefix, self.event);
    }
}

/// Serves one subscriber until it goes away, falls behind, or must resync. `Err` is a refusal written before
/// the stream began (Redis not answering).
pub async fn serve(
    session: &mut Session,
    feeds: &Arc<Feeds>,
    store: &QueueStore,
    place: Place,
    start: Start,
) -> Result<(), Reply> {
    let event = place.event;
    // Ends cleanly at the end of its lifetime: an `EventSource` comes back with `Last-Event-ID` a second later
    // (the `retry` of the first event) and goes on from there, so no connection is held for ever.
    let expiry = tokio::time::sleep(place.caps.lifetime());
    tokio::pin!(expiry);
    // Subscribed before the version is read: nothing logged after it can be missed.
    let Subscription { frames: mut rx, mut followed, starting } = feeds.subscribe(event);
    let unavailable = |e: StoreError| {
        tracing::warn!(error = %e, event, "seat map stream: Redis did not answer");
        Reply::unavailable()
    };
    if let Some(mut starting) = starting {
        // The reader is just starting: its frames begin after the version it reads first, so the stream starts
        // from that one too.
        let started = tokio::time::timeout(FEED_START_WAIT, starting.wait_for(Option::is_some)).await;
        match started.ok().and_then(|v| v.ok().and_then(|v| *v)) {
            Some(v) => followed = Some(v),
            None => {
                tracing::warn!(event, "seat map stream: the feed could not read the log's end in time");
                return Err(Reply::unavailable());
            }
        }
    }
    // The feed's version, when it is following the log, saves a Redis call (many subscribers come back at
    // once after a blip); a client that has seen a later version than the feed asks Redis.
    let current = match (followed, start) {
        (Some(v), Start::Now) => v,
        (Some(v), Start::After(since)) if since <= v => v,
        _ => store.map_version(event).await.map_err(unavailable)?,
    };
    // Where the stream stands, what it sends first, and whether that ends it (a resync).
    let (mut last, first, ends): (u64, Vec<Bytes>, bool) = match start {
        Start::Now => (current, vec![seatmap::hello(event, current)], false),
        Start::After(v) if v == current => (v, Vec::new(), false),
        Start::After(v) if v > current => (v, vec![seatmap::resync(event, "unknown_version")], true),
        Start::After(v) => match catch_up(store, event, v, current).await.map_err(unavailable)? {
            Ok(frame) => (frame.as_ref().map_or(v, |f| f.to), frame.into_iter().map(|f| f.text).collect(), false),
            Err(no) => (v, vec![seatmap::resync(event, no.reason())], true),
        },
    };
    if write_head(session).await.is_err() {
        return Ok(());
    }
    for text in first {
        if session.write_response_body(Some(text), false).await.is_err() {
            return Ok(());
        }
    }
    if ends {
        let _ = session.write_response_body(None, true).await;
        return Ok(());
    }
    loop {
        let received = tokio::select! {
            // A frame first: a wake-up for a frame then polls nothing else.
            biased;
            received = rx.recv() => received,
            // A client sends nothing on a stream: a read that ends means it went away (or broke the protocol),
            // and its connection and task go now rather than at the next write (up to a heartbeat away). A
            // storm of reconnects would otherwise find the old connections still open and the process out of
            // file descriptors.
            _ = session.read_body_or_idle(true) => return Ok(()),
            () = &mut expiry => {
                metrics::counter!("gateway_seatmap_streams_expired_total").increment(1);
                let _ = session.write_response_body(None, true).await;
                return Ok(());
            }
        };
        let mut frame = match received {
            Ok(frame) => frame,
            Err(e) => return end(session, event, e).await,
        };
        // Frames already waiting go out in the same write: a subscriber that fell behind (a slow client, a busy
        // node) catches up in fewer, larger writes, so it costs the node less the further behind it is.
        let mut out = Batch::default();
        loop {
            if frame.ends {
                metrics::counter!("gateway_seatmap_resyncs_total", "reason" => "log_lost").increment(1);
                out.push(&frame.text);
                let _ = session.write_response_body(out.take(), true).await;
                return Ok(());
            }
            if frame.from == 0 {
                out.push(&frame.text);
            } else if frame.to > last {
                if frame.follows == last {
                    out.push(&frame.text);
                    last = frame.to;
                } else {
                    // The frame starts past this stream's last version (the feed began reading after this stream
                    // started) or before it (it covers versions the replay already sent): the log has exactly
                    // the versions after `last`, so every delta a client gets starts at its version plus one.
                    match catch_up(store, event, last, frame.to).await {
                        Ok(Ok(caught)) => {
                            if let Some(caught) = caught {
                                last = caught.to;
                                out.push(&caught.text);
                            }
                        }
                        Ok(Err(_)) | Err(_) => {
                            out.push(&seatmap::resync(event, "gap"));
                            let _ = session.write_response_body(out.take(), true).await;
                            return Ok(());
                        }
                    }
                }
            }
            if out.len() >= BATCH_BYTES {
                break;
            }
            frame = match rx.try_recv() {
                Ok(next) => next,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Lagged(_)) => return end(session, event, RecvError::Lagged(0)).await,
                Err(TryRecvError::Closed) => break,
            };
        }
        if let Some(text) = out.take()
            && session.write_response_body(Some(text), false).await.is_err()
        {
            return Ok(());
        }
    }
}

/// The frames of one write. A lone frame (the usual case: a subscriber that keeps up) goes out as the feed's
/// own bytes, shared by every subscriber; only several are copied into one buffer.
#[derive(Default)]
struct Batch {
    one: Option<Bytes>,
    more: BytesMut,
}

impl Batch {
    fn push(&mut self, text: &Bytes) {
        match self.one.take() {
            None if self.more.is_empty() => self.one = Some(text.clone()),
            first => {
                if let Some(first) = first {
                    self.more.extend_from_slice(&first);
                }
                self.more.extend_from_slice(text);
            }
        }
    }

    fn len(&self) -> usize {
        self.one.as_ref().map_or(self.more.len(), Bytes::len)
    }

    /// What to write, if anything.
    fn take(&mut self) -> Option<Bytes> {
        self.one.take().or_else(|| (!self.more.is_empty()).then(|| std::mem::take(&mut self.more).freeze()))
    }
}

/// Ends a stream whose feed's channel said `e`: fallen behind (told to resync), or closed.
async fn end(session: &mut Session, event: i64, e: RecvError) -> Result<(), Reply> {
    if let RecvError::Lagged(_) = e {
        metrics::counter!("gateway_seatmap_resyncs_total", "reason" => "behind").increment(1);
        let _ = session.write_response_body(Some(seatmap::resync(event, "behind")), true).await;
    }
    Ok(())
}

async fn write_head(session: &mut Session) -> pingora::Result<()> {
    let mut head = ResponseHeader::build(200, Some(4))?;
    head.insert_header("content-type", "text/event-stream")?;
    head.insert_header("cache-control", "no-store")?;
    // Tells a buffering proxy in front (nginx) to pass each event at once.
    head.insert_header("x-accel-buffering", "no")?;
    session.set_keepalive(None);
    session.write_response_header(Box::new(head), false).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_frame_is_written_as_is_and_several_in_order() {
        let (a, b, c) = (Bytes::from_static(b"a"), Bytes::from_static(b"bb"), Bytes::from_static(b"ccc"));
        let mut batch = Batch::default();
        assert_eq!(batch.take(), None);
        batch.push(&a);
        assert_eq!(batch.len(), 1);
        let lone = batch.take().expect("one frame");
        assert_eq!(lone.as_ptr(), a.as_ptr(), "the feed's bytes, not a copy");
        assert_eq!(batch.take(), None);
        for text in [&a, &b, &c] {
            batch.push(text);
        }
        assert_eq!(batch.len(), 6);
        assert_eq!(batch.take().as_deref(), Some(&b"abbccc"[..]));
        assert_eq!(batch.take(), None);
    }

    #[test]
    fn caps_count_by_prefix_event_and_node_and_a_dropped_place_frees_its_share() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        let options = CapOptions {
            per_prefix: 2,
            prefix_v4: 24,
            prefix_v6: 56,
            per_event: 3,
            total: 4,
            lifetime: Duration::from_secs(100),
        };
        let caps = Caps::new(options);
        let a = caps.enter(ip("192.0.2.1"), 1).expect("first");
        let _b = caps.enter(ip("192.0.2.200"), 1).expect("the same /24");
        assert_eq!(caps.enter(ip("192.0.2.7"), 2).err(), Some(Full::Prefix));
        assert_eq!(caps.enter(ip("::ffff:192.0.2.9"), 2).err(), Some(Full::Prefix), "IPv4 mapped in IPv6");
        let _c = caps.enter(ip("2001:db8:0:1::1"), 1).expect("an IPv6 /56");
        assert_eq!(caps.enter(ip("198.51.100.1"), 1).err(), Some(Full::Event));
        let _d = caps.enter(ip("2001:db8:0:ff::1"), 2).expect("the same /56, another event");
        assert_eq!(caps.enter(ip("2001:db8:0:100::1"), 2).err(), Some(Full::Node), "another /56 but the node is full");
        drop(a);
        let _e = caps.enter(ip("192.0.2.3"), 1).expect("a's share is free again");
        let lifetime = caps.lifetime();
        assert!(lifetime <= Duration::from_secs(100) && lifetime >= Duration::from_secs(90), "{lifetime:?}");
    }

    #[test]
    fn a_stream_starts_from_last_event_id_then_since_then_now() {
        assert_eq!(start(None, None), Ok(Start::Now));
        assert_eq!(start(None, Some("a=1")), Ok(Start::Now));
        assert_eq!(start(Some("42"), Some("since=7")), Ok(Start::After(42)));
        assert_eq!(start(Some(" "), Some("x=1&since=7")), Ok(Start::After(7)));
        assert!(start(Some("abc"), None).is_err());
        assert!(start(None, Some("since=-1")).is_err());
    }
}
