//! The only code that touches Postgres or Redis: one typed function per query or Lua script.

pub mod batcher;
pub mod catalogues;
pub mod holds;
pub mod lifecycle;
pub mod orders;
pub mod outbox;
pub mod payments;

use std::time::Duration;

/// A store did not answer, or answered with an error.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer within {0:?}")]
    RedisTimeout(Duration),
    #[error("a store returned an unexpected reply: {0}")]
    Unexpected(String),
    #[error("postgres: {0}")]
    Postgres(#[from] sqlx::Error),
}

/// A Redis connection (one server or a cluster, by the URL) that reconnects by itself. After Redis goes away it
/// tries again at least every 200 ms (the client's default backoff doubles up to seconds), so service is back
/// within moments of Redis. Connected before it is returned (`redisconn::Target::connected`).
pub async fn redis_connection(url: &str) -> redis::RedisResult<redisconn::Conn> {
    let options = redisconn::Options { max_delay: Duration::from_millis(200), ..Default::default() };
    redisconn::Target::parse(url)?.connected(options).await
}

impl StoreError {
    /// True when the store is down or overloaded (the client may retry), rather than a bug of ours.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Redis(e) => redisconn::is_unavailable(e),
            StoreError::RedisTimeout(_) => true,
            StoreError::Unexpected(_) => false,
            StoreError::Postgres(sqlx::Error::Database(e)) => {
                // Class 08, the connection failed; class 57, an operator or a restart ended it (57P01 when an
                // administrator terminates the backend, 57P02/57P03 while the server shuts down or starts).
                e.code().is_some_and(|code| code.starts_with("08") || code.starts_with("57"))
            }
            StoreError::Postgres(e) => matches!(
                e,
                sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) | sqlx::Error::Tls(_)
            ),
        }
    }

    /// Which store failed, for error codes and logs.
    pub fn store(&self) -> &'static str {
        match self {
            StoreError::Postgres(_) => "postgres",
            _ => "redis",
        }
    }
}
