//! A short-lived cache of each event's serialised seat map. Building the map reads every seat's Redis key and
//! serialises thousands of seats (about 20 ms for 20,000); when thousands of admitted fans open the map in the
//! same second, one build per `SEAT_MAP_CACHE_MS` serves them all. The map carries its `version`, so a client
//! can tell how fresh it is; holds and checkouts never trust the map, so a slightly stale one is harmless.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::domain::EventId;

struct Built {
    at: Instant,
    body: Bytes,
}

/// Serialised seat maps by event, each rebuilt at most once per `ttl` (single flight: concurrent requests for
/// a stale map wait for one build).
pub struct SeatMaps {
    ttl: Duration,
    maps: Mutex<HashMap<EventId, Arc<tokio::sync::Mutex<Option<Built>>>>>,
}

impl SeatMaps {
    /// `ttl` zero turns the cache off.
    pub fn new(ttl: Duration) -> Self {
        Self { ttl, maps: Mutex::new(HashMap::new()) }
    }

    /// The event's map, from the cache when it is younger than the ttl, else from `build`.
    pub async fn get<E, F>(&self, event: EventId, build: impl FnOnce() -> F) -> Result<Bytes, E>
    where
        F: Future<Output = Result<Bytes, E>>,
    {
        if self.ttl.is_zero() {
            return build().await;
        }
        // The std lock is released before any await (a poisoned one just skips the cache).
        let slot = self.maps.lock().ok().map(|mut maps| maps.entry(event).or_default().clone());
        let Some(slot) = slot else { return build().await };
        let mut slot = slot.lock().await;
        if let Some(built) = slot.as_ref()
            && built.at.elapsed() < self.ttl
        {
            return Ok(built.body.clone());
        }
        let body = build().await?;
        *slot = Some(Built { at: Instant::now(), body: body.clone() });
        Ok(body)
    }
}
