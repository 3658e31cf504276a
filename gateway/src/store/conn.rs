//! Connections made on first use inside the caller's runtime, and which writes wait for replicas.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redisconn::{Options, Target};

use super::*;

/// A connection made on first use, inside the runtime of the caller.
pub struct LazyStore {
    target: Target,
    prefix: String,
    timeout: Duration,
    replication: Replication,
    scripts: Arc<Scripts>,
    store: OnceLock<QueueStore>,
}

impl LazyStore {
    pub fn new(url: &str, prefix: &str, timeout: Duration) -> anyhow::Result<Self> {
        anyhow::ensure!(!prefix.contains(['{', '}']), "the Redis key prefix must not contain braces");
        Ok(Self {
            target: Target::parse(url)?,
            prefix: prefix.to_owned(),
            timeout,
            replication: Replication::default(),
            scripts: Arc::new(Scripts::load()),
            store: OnceLock::new(),
        })
    }

    /// Makes the writes that must survive a failover wait for replicas (see [`Replication`]).
    pub fn with_replication(mut self, replication: Replication) -> anyhow::Result<Self> {
        anyhow::ensure!(
            replication.replicas == 0 || replication.timeout < self.timeout,
            "the wait for replicas must be shorter than the Redis timeout"
        );
        self.replication = replication;
        Ok(self)
    }

    /// A copy for another runtime: same settings, its own connection.
    pub fn fork(&self) -> Self {
        Self {
            target: self.target.clone(),
            prefix: self.prefix.clone(),
            timeout: self.timeout,
            replication: self.replication,
            scripts: self.scripts.clone(),
            store: OnceLock::new(),
        }
    }

    /// A connection of its own for reading `event`'s change log as it grows; made inside the caller's runtime.
    pub async fn log_reader(&self, event: i64, block: Duration) -> Result<LogReader, StoreError> {
        let options = Options {
            connection_timeout: self.timeout,
            response_timeout: Some(block + self.timeout),
            ..Default::default()
        };
        let fut = self.target.dedicated(options);
        let conn = match tokio::time::timeout(self.timeout, fut).await {
            Ok(conn) => conn?,
            Err(_) => return Err(StoreError::Timeout(self.timeout)),
        };
        Ok(LogReader { conn, keys: SeatMapKeys::new(&self.prefix, event), timeout: self.timeout })
    }

    /// The store; must be called from inside the runtime that will use it.
    pub fn get(&self) -> Result<&QueueStore, StoreError> {
        if let Some(store) = self.store.get() {
            return Ok(store);
        }
        let options = Options {
            connection_timeout: self.timeout,
            response_timeout: Some(self.timeout),
            max_delay: Duration::from_millis(200),
            retries: 1,
        };
        let conn = self.target.lazy(options)?;
        let store = QueueStore {
            conn,
            prefix: self.prefix.clone(),
            timeout: self.timeout,
            replication: self.replication,
            epoch: Instant::now(),
            unreplicated_until: AtomicU64::new(0),
            scripts: self.scripts.clone(),
        };
        Ok(self.store.get_or_init(|| store))
    }
}

/// Which writes wait for replicas, and how long: a queue place is answered only once `replicas` replicas of the
/// room's master hold it (`WAIT`), so a failover to one of them keeps it; an admission step and a room's
/// settings wait too, best effort. `replicas` 0: nothing waits (a single Redis has no replica to wait for).
#[derive(Debug, Clone, Copy, Default)]
pub struct Replication {
    pub replicas: u32,
    pub timeout: Duration,
}
