//! Reading one room from Redis into this node's view of it: the ticker does it for every room a few times a
//! second, and a join admitted at once does it for its room, so the fan's next poll here agrees with the answer.

use std::sync::{Arc, RwLock};
use std::time::Instant;

use crate::room::{EtaError, History, Left, Live, Outflow, Room, Rooms};
use crate::store::{QueueStore, StoreError};

/// Reads one room from Redis and replaces this node's view of it (steps and skips are fetched incrementally).
pub async fn refresh(store: &QueueStore, rooms: &Rooms, event: i64) -> Result<(), StoreError> {
    let previous = rooms.get(event);
    let history = previous.as_ref().map_or_else(|| Arc::new(RwLock::new(History::default())), |r| r.history.clone());
    let left = previous.as_ref().map_or_else(|| Arc::new(RwLock::new(Left::default())), |r| r.left.clone());
    let etas = previous.as_ref().map_or_else(Default::default, |r| r.etas.clone());
    let (last_to, last_skipped) = history.read().map(|h| (h.last_to(), h.last_skipped())).unwrap_or_default();
    let left_since = left.read().map(|l| l.last_ms).unwrap_or_default();
    let snap = store.snapshot(event, last_to, last_skipped, left_since).await?;
    let Some(settings) = snap.settings else { return Ok(()) };
    if let Ok(mut l) = left.write() {
        l.extend(snap.new_left, snap.redis_ms, settings.session_seconds);
    }
    let (admitted_last_minute, outflow) = match history.write() {
        Ok(mut h) => {
            for batch in snap.new_batches {
                h.batches.insert(batch.to, batch);
            }
            h.skipped.extend(snap.new_skipped);
            let outflow = h.outflow(snap.redis_ms, u64::from(settings.session_seconds) * 1000);
            (h.admitted_since(snap.redis_ms.saturating_sub(60_000)), outflow)
        }
        Err(_) => (0, Outflow::default()),
    };
    let mut waits = snap.waits_ms;
    waits.sort_unstable();
    // The samples are read again only when a node has counted a fan since.
    let eta_error = match previous.as_ref().map(|r| &r.live) {
        Some(last) if last.counts.eta_counted == snap.counts.eta_counted => last.eta_error,
        _ if snap.counts.eta_counted == 0 => None,
        _ => EtaError::of(&store.eta_samples(event).await?),
    };
    let live = Live {
        settings,
        counts: snap.counts,
        median_wait_ms: waits.get(waits.len() / 2).copied(),
        admitted_last_minute,
        outflow,
        schedule: snap.schedule,
        eta_error,
        redis_ms: snap.redis_ms,
        read_at: Instant::now(),
    };
    crate::metrics::record_room(event, &live);
    rooms.put(event, Room { live, history, left, etas });
    Ok(())
}
