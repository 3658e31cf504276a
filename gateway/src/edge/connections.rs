//! What the public listener holds to per connection, wrapped around pingora's HTTP app at its extension point,
//! [`ServerApp`] (pingora calls `process_new` with each new connection and serves every request on it):
//!
//! - **A deadline for each request's head.** Pingora times each read of a head (60 s) but not the whole head,
//!   so a client that sends a byte now and then kept its connection for as long as it liked. A read with no
//!   request in flight past the deadline fails, and the connection closes: the deadline is the accept plus
//!   `head`, then the end of each request plus the keep-alive time and `head`. The proxy marks a request's
//!   start (its head read whole) and end on the connection's [`HeadClock`], which the stream carries
//!   ([`Watched`]). HTTP/2 connections are left to HTTP/2 (its streams are not this connection's reads).
//! - **A cap on the connections one client IP holds open.** Trusted proxies are not capped: every fan behind a
//!   CDN arrives through a few of their addresses. A connection is known by its file descriptor and its peer's
//!   address and port: a descriptor alone may already belong to a new connection when the call that closed the
//!   old one returns. A connection over the cap is closed before anything is read from it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::TlsRef;
use pingora::protocols::{
    ALPN, GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream, TimingDigest,
    UniqueID, UniqueIDType,
};
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::limits::{Limits, limit_key};

/// `app` with at most `max_per_ip` open connections per client IP (0: no cap), and a deadline for each head.
pub struct PerClientCap<A> {
    app: Arc<A>,
    limits: Arc<Limits>,
    max_per_ip: u32,
    open: Mutex<Open>,
    heads: HeadTimes,
}

/// How long a connection may go without a request in flight.
#[derive(Debug, Clone, Copy)]
pub struct HeadTimes {
    /// From the accept, or from the end of the connection's idle time, to a request's head read whole.
    pub head: Duration,
    /// After a request, how long the client may keep the connection idle before it starts the next.
    pub idle: Duration,
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
    pub fn new(app: A, limits: Arc<Limits>, max_per_ip: u32, heads: HeadTimes) -> Self {
        Self { app: Arc::new(app), limits, max_per_ip, open: Mutex::default(), heads }
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

impl<A: ServerApp + Send + Sync + 'static> PerClientCap<A> {
    /// Serves the connection, its reads held to its head deadline ([`Watched`]).
    async fn serve(self: &Arc<Self>, stream: Stream, shutdown: &ShutdownWatch) -> Option<Stream> {
        if matches!(stream.selected_alpn_proto(), Some(ALPN::H2)) || Watched::clock(&stream).is_some() {
            return self.app.process_new(stream, shutdown).await;
        }
        let watched = Watched { inner: stream, clock: HeadClock::new(self.heads) };
        self.app.process_new(Box::new(watched), shutdown).await
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for PerClientCap<A> {
    async fn process_new(self: &Arc<Self>, stream: Stream, shutdown: &ShutdownWatch) -> Option<Stream> {
        let peer = stream.get_socket_digest().and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).copied());
        let Some(peer) = peer.filter(|p| self.max_per_ip > 0 && !self.limits.is_trusted(p.ip())) else {
            return self.serve(stream, shutdown).await;
        };
        let id = (stream.id(), peer);
        if !self.enter(id) {
            crate::metrics::record_connection_refused();
            return None;
        }
        let kept = self.serve(stream, shutdown).await;
        if kept.is_none() {
            self.leave(id);
        }
        kept
    }

    async fn cleanup(&self) {
        self.app.cleanup().await;
    }
}

/// When a connection without a request in flight stops being read. The proxy marks each request's start and
/// end (two atomic operations and a clock read); a read of the connection while no request is in flight and
/// past the deadline fails, and pingora closes the connection. No timer runs for it: a client that trickles a
/// head is cut off at its first byte past the deadline, and one that sends nothing at all is closed by
/// pingora's own wait for a read (the keep-alive time).
#[derive(Debug)]
pub struct HeadClock {
    times: HeadTimes,
    start: Instant,
    /// Milliseconds after `start` past which a read with no request in flight fails.
    deadline_ms: AtomicU64,
    in_flight: AtomicU32,
}

impl HeadClock {
    fn new(times: HeadTimes) -> Self {
        Self {
            times,
            start: Instant::now(),
            deadline_ms: AtomicU64::new(times.head.as_millis() as u64),
            in_flight: AtomicU32::new(0),
        }
    }

    /// A request's head was read whole: no deadline while it is served.
    pub fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// A request was answered: the next must start within the idle time and have its head read within `head`.
    pub fn request_ended(&self) {
        let next = self.start.elapsed() + self.times.idle + self.times.head;
        self.deadline_ms.store(next.as_millis() as u64, Ordering::Release);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// No request is in flight and the deadline has passed.
    fn expired(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
            && self.start.elapsed().as_millis() as u64 > self.deadline_ms.load(Ordering::Acquire)
    }
}

/// A client connection with its [`HeadClock`]: every call goes to the connection itself, and a read past the
/// head deadline fails.
#[derive(Debug)]
pub struct Watched {
    inner: Stream,
    clock: HeadClock,
}

impl Watched {
    /// The head clock of the connection `stream` is, if the listener watches it.
    pub fn clock(stream: &Stream) -> Option<&HeadClock> {
        stream.as_any().downcast_ref::<Self>().map(|w| &w.clock)
    }
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if self.clock.expired() {
            crate::metrics::record_head_timeout();
            let late = std::io::Error::new(std::io::ErrorKind::TimedOut, "the request's head did not arrive in time");
            return Poll::Ready(Err(late));
        }
        Pin::new(&mut *self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for Watched {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await;
    }
}

impl UniqueID for Watched {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for Watched {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for Watched {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for Watched {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest);
    }
}

impl GetSocketDigest for Watched {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest);
    }
}

#[async_trait]
impl Peek for Watched {
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;

    #[test]
    fn connections_are_counted_per_key_in_and_out() {
        let limits = Arc::new(Limits::new(1, 1, 1, 1, Vec::new()));
        let heads = HeadTimes { head: Duration::from_secs(1), idle: Duration::from_secs(1) };
        let cap = PerClientCap::new(Nothing, limits, 2, heads);
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

    #[test]
    fn a_connection_expires_only_while_no_request_is_in_flight() {
        let times = HeadTimes { head: Duration::from_millis(50), idle: Duration::from_millis(50) };
        let clock = HeadClock::new(times);
        assert!(!clock.expired(), "a new connection has its head's time");
        clock.request_started();
        std::thread::sleep(Duration::from_millis(120));
        assert!(!clock.expired(), "a request in flight keeps its connection");
        clock.request_ended();
        assert!(!clock.expired(), "the idle time and a head's time from the request's end");
        std::thread::sleep(Duration::from_millis(120));
        assert!(clock.expired(), "idle and no head: the deadline has passed");
        // Two at once (the count allows more than one): the first ending does not expire it.
        let clock = HeadClock::new(times);
        clock.request_started();
        clock.request_started();
        clock.request_ended();
        std::thread::sleep(Duration::from_millis(120));
        assert!(!clock.expired(), "one request still in flight");
    }
}
