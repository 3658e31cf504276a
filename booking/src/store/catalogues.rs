//! In-memory cache of event catalogues, so a hold is checked and priced without a Postgres round trip.
//!
//! A catalogue older than the refresh interval is checked against the event's `catalogue_version` and, only
//! if that moved, re-read in the background while requests go on with the
//! copy they have (a 20,000-seat catalogue takes a noticeable moment to read). Only a cold cache makes
//! requests wait, and then one of them reads while the others wait for it (no stampede at the first second
//! of an on-sale).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::{StoreError, orders};
use crate::domain::{Catalogue, EventId};

/// When a catalogue was read, and what was found (`None`: no such event).
type Entry = (Instant, Option<Arc<Catalogue>>);

#[derive(Clone)]
pub struct Catalogues {
    pool: PgPool,
    refresh: Duration,
    cached: Arc<RwLock<HashMap<EventId, Entry>>>,
    loading: Arc<tokio::sync::Mutex<()>>,
}

impl Catalogues {
    pub fn new(pool: PgPool, refresh: Duration) -> Self {
        Self { pool, refresh, cached: Arc::default(), loading: Arc::default() }
    }

    /// The cached entry and whether it is still fresh.
    fn cached(&self, event: EventId) -> Option<(bool, Option<Arc<Catalogue>>)> {
        let cached = self.cached.read().unwrap_or_else(|p| p.into_inner());
        cached.get(&event).map(|(at, c)| (at.elapsed() < self.refresh, c.clone()))
    }

    /// The event's catalogue; `None` if the event does not exist.
    pub async fn get(&self, event: EventId) -> Result<Option<Arc<Catalogue>>, StoreError> {
        match self.cached(event) {
            Some((true, c)) => return Ok(c),
            Some((false, c)) => {
                // Stale: refresh in the background (unless a refresh is already running) and answer from the
                // copy at hand.
                if let Ok(guard) = self.loading.clone().try_lock_owned() {
                    let this = self.clone();
                    tokio::spawn(async move {
                        if let Err(e) = this.load(event).await {
                            tracing::warn!(error = %e, event = event.0, "catalogue refresh failed; serving the old copy");
                        }
                        drop(guard);
                    });
                }
                return Ok(c);
            }
            None => {}
        }
        let _guard = self.loading.lock().await;
        if let Some((_, c)) = self.cached(event) {
            return Ok(c);
        }
        self.load(event).await
    }

    async fn load(&self, event: EventId) -> Result<Option<Arc<Catalogue>>, StoreError> {
        // Unchanged since the copy at hand (the usual case): keep it and only restart its clock.
        if let Some((_, Some(current))) = self.cached(event)
            && orders::catalogue_version(&self.pool, event).await? == Some(current.version)
        {
            let mut cached = self.cached.write().unwrap_or_else(|p| p.into_inner());
            cached.insert(event, (Instant::now(), Some(current.clone())));
            return Ok(Some(current));
        }
        let loaded = orders::load_catalogue(&self.pool, event).await?.map(Arc::new);
        let mut cached = self.cached.write().unwrap_or_else(|p| p.into_inner());
        // Bound the cache: unknown event ids probed by clients must not grow it without limit.
        if cached.len() >= 1024 {
            cached.retain(|_, (_, c)| c.is_some());
        }
        cached.insert(event, (Instant::now(), loaded.clone()));
        Ok(loaded)
    }
}
