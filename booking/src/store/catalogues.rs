//! In-memory cache of event catalogues, so a hold is checked and priced without a Postgres round trip.
//! A catalogue older than the refresh interval is re-read; one reader per event does the reading while the
//! others wait for it (no stampede on a cold cache at the on-sale's first second).

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

    fn fresh(&self, event: EventId) -> Option<Option<Arc<Catalogue>>> {
        let cached = self.cached.read().unwrap_or_else(|p| p.into_inner());
        cached.get(&event).filter(|(at, _)| at.elapsed() < self.refresh).map(|(_, c)| c.clone())
    }

    /// The event's catalogue; `None` if the event does not exist.
    pub async fn get(&self, event: EventId) -> Result<Option<Arc<Catalogue>>, StoreError> {
        if let Some(c) = self.fresh(event) {
            return Ok(c);
        }
        let _guard = self.loading.lock().await;
        if let Some(c) = self.fresh(event) {
            return Ok(c);
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
