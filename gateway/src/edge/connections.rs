//! A cap on the connections one client IP holds open at the public listener. Pingora times each read of a
//! request's head but not the whole head, so a client that sends a byte now and then keeps its connection; the
//! cap bounds how many of those one address (an IPv6 client's /64) can hold. Trusted proxies are not capped:
//! every fan behind a CDN arrives through a few of its addresses.
//!
//! It wraps pingora's HTTP app at its extension point, [`ServerApp`]: pingora calls `process_new` once per
//! request with the connection, and again with the same connection while it is kept alive, so a connection is
//! new when it is not among the open ones, and over when a call does not hand it back. A connection is known by
//! its file descriptor and its peer's address and port: a descriptor alone may already belong to a new
//! connection when the call that closed the old one returns. A connection over the cap is closed before
//! anything is read from it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::{Stream, UniqueIDType};
use pingora::server::ShutdownWatch;

use crate::limits::{Limits, limit_key};

/// `app` with at most `max_per_ip` open connections per client IP (0: no cap).
pub struct PerClientCap<A> {
    app: Arc<A>,
    limits: Arc<Limits>,
    max_per_ip: u32,
    open: Mutex<Open>,
}

/// A connection: its descriptor and its peer.
type Connection = (UniqueIDType, SocketAddr);

#[derive(Default)]
struct Open {
    /// Each open connection's key, by its descriptor and peer.
    by_id: HashMap<Connection, IpAddr>,
    /// Open connections per key.
    per_key: HashMap<IpAddr, u32>,
}

impl<A> PerClientCap<A> {
    pub fn new(app: A, limits: Arc<Limits>, max_per_ip: u32) -> Self {
        Self { app: Arc::new(app), limits, max_per_ip, open: Mutex::default() }
    }

    fn open(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a connection in, unless it is one already counted; false when its key is at the cap.
    fn enter(&self, id: Connection) -> bool {
        let key = limit_key(id.1.ip());
        let mut open = self.open();
        if open.by_id.contains_key(&id) {
            return true;
        }
        let count = open.per_key.entry(key).or_default();
        if *count >= self.max_per_ip {
            if *count == 0 {
                open.per_key.remove(&key);
            }
            return false;
        }
        *count += 1;
        open.by_id.insert(id, key);
        true
    }

    /// Counts a connection out.
    fn leave(&self, id: Connection) {
        let mut open = self.open();
        let Some(key) = open.by_id.remove(&id) else { return };
        if let Some(count) = open.per_key.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                open.per_key.remove(&key);
            }
        }
    }

    /// Open connections counted now (connections, keys).
    pub fn counted(&self) -> (usize, usize) {
        let open = self.open();
        (open.by_id.len(), open.per_key.len())
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for PerClientCap<A> {
    async fn process_new(self: &Arc<Self>, stream: Stream, shutdown: &ShutdownWatch) -> Option<Stream> {
        let peer = stream.get_socket_digest().and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).copied());
        let Some(peer) = peer.filter(|p| self.max_per_ip > 0 && !self.limits.is_trusted(p.ip())) else {
            return self.app.process_new(stream, shutdown).await;
        };
        let id = (stream.id(), peer);
        if !self.enter(id) {
            crate::metrics::record_connection_refused();
            return None;
        }
        let kept = self.app.process_new(stream, shutdown).await;
        if kept.is_none() {
            self.leave(id);
        }
        kept
    }

    async fn cleanup(&self) {
        self.app.cleanup().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;

    #[test]
    fn connections_are_counted_per_key_in_and_out() {
        let limits = Arc::new(Limits::new(1, 1, 1, 1, Vec::new()));
        let cap = PerClientCap::new(Nothing, limits, 2);
        let peer = |s: &str| s.parse::<SocketAddr>().expect("addr");
        let (a, a_other_64, b) = (peer("[2001:db8::1]:1000"), peer("[2001:db8::2]:1000"), peer("192.0.2.1:1000"));
        assert!(cap.enter((1, a)));
        assert!(cap.enter((1, a)), "the same connection again, kept alive");
        assert!(cap.enter((2, a_other_64)));
        assert!(!cap.enter((3, a)), "a third connection from the same /64");
        assert!(cap.enter((4, b)));
        assert_eq!(cap.counted(), (3, 2));
        // A new connection on a descriptor whose old connection is not yet counted out is another connection.
        assert!(cap.enter((4, peer("192.0.2.1:1001"))));
        assert_eq!(cap.counted(), (4, 2));
        cap.leave((1, a));
        cap.leave((1, a));
        assert!(cap.enter((5, a)), "room again once one closed");
        for id in [(2, a_other_64), (4, b), (4, peer("192.0.2.1:1001")), (5, a)] {
            cap.leave(id);
        }
        assert_eq!(cap.counted(), (0, 0), "nothing left behind");
    }
}
