//! `GET /events/{id}/seats/stream`: the live seat map as Server-Sent Events, answered where the fan's
//! connection ends, from this node's feed of the event's change log (`crate::seatmap`).
//!
//! A fresh stream opens with a `version` event: the map version it starts after, and where to read the
//! status (which shows some version at or past it, or earlier from a cache: then the client resumes from the
//! status's version). A stream resumed with `Last-Event-ID` (or `?since=`, for a client that starts from a
//! status) first replays the log from there. Then come `delta` events, each starting at the version after the
//! last one sent, and heartbeats. When the log no longer
//! reaches back far enough, or the subscriber falls behind, a `resync` event ends the stream: the client
//! reloads the status and subscribes again from its version.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use super::reply::Reply;
use crate::seatmap::{self, Feeds, Frame, Subscription};
use crate::store::{QueueStore, StoreError};

/// Log entries read in one catch-up call.
const CATCH_UP_COUNT: usize = 1_000;

/// Longest a stream waits for a feed that is just starting to read where the log ends (a Redis that does not
/// answer by then gets the client a 503 with Retry-After).
const FEED_START_WAIT: Duration = Duration::from_secs(2);

/// Waiting frames are written together up to this many bytes (a single frame may be larger).
const BATCH_BYTES: usize = 64 * 1024;

/// Longest a write to a subscriber may take before it is dropped (a client that stopped reading).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

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

/// The delta frames for the log's entries after `after` up to at least `upto`; `None` when the log does not
/// reach back that far (trimmed, or lost with Redis's data).
async fn catch_up(store: &QueueStore, event: i64, after: u64, upto: u64) -> Result<Option<Vec<Frame>>, StoreError> {
    metrics::counter!("gateway_seatmap_catch_ups_total").increment(1);
    let mut frames = Vec::new();
    let mut at = after;
    while at < upto {
        let entries = store.map_log(event, at, CATCH_UP_COUNT).await?;
        let Some(first) = entries.first().map(|e| e.version) else { return Ok(None) };
        // A log starts at Redis's clock, not at 1: a client that has seen nothing (0) takes it from its start,
        // as long as nothing was ever trimmed from it.
        let starts_the_log = at == 0 && store.map_log_whole(event).await?;
        if first != at + 1 && !starts_the_log {
            return Ok(None);
        }
        frames.extend(seatmap::delta(at, &entries));
        at = entries.last().map_or(at, |e| e.version);
        if entries.len() < CATCH_UP_COUNT && at < upto {
            return Ok(None);
        }
    }
    Ok(Some(frames))
}

/// Counts a subscriber while it is connected.
struct Subscribed;

impl Subscribed {
    fn new() -> Self {
        metrics::gauge!("gateway_seatmap_subscribers").increment(1.0);
        Self
    }
}

impl Drop for Subscribed {
    fn drop(&mut self) {
        metrics::gauge!("gateway_seatmap_subscribers").decrement(1.0);
    }
}

/// Serves one subscriber until it goes away, falls behind, or must resync. `Err` is a refusal written before
/// the stream began (Redis not answering).
pub async fn serve(
    session: &mut Session,
    feeds: &Arc<Feeds>,
    store: &QueueStore,
    event: i64,
    start: Start,
) -> Result<(), Reply> {
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
            Some(frames) => (frames.last().map_or(v, |f| f.to), frames.into_iter().map(|f| f.text).collect(), false),
            None => (v, vec![seatmap::resync(event, "log_too_short")], true),
        },
    };
    let _subscribed = Subscribed::new();
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
                        Ok(Some(frames)) => {
                            last = frames.last().map_or(last, |f| f.to);
                            frames.iter().for_each(|f| out.push(&f.text));
                        }
                        Ok(None) | Err(_) => {
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
    session.set_write_timeout(Some(WRITE_TIMEOUT));
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
    fn a_stream_starts_from_last_event_id_then_since_then_now() {
        assert_eq!(start(None, None), Ok(Start::Now));
        assert_eq!(start(None, Some("a=1")), Ok(Start::Now));
        assert_eq!(start(Some("42"), Some("since=7")), Ok(Start::After(42)));
        assert_eq!(start(Some(" "), Some("x=1&since=7")), Ok(Start::After(7)));
        assert!(start(Some("abc"), None).is_err());
        assert!(start(None, Some("since=-1")).is_err());
    }
}
