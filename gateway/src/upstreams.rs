//! Booking's nodes: pingora's round-robin `LoadBalancer` over them, kept current by an active health check of
//! booking's `/readyz` (a pingora background service), one prepared `HttpPeer` per node, and the gateway's own
//! questions to booking (the availability poll) asked through pingora's HTTP connector to the same nodes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::lb::discovery::Static;
use pingora::lb::health_check::HttpHealthCheck;
use pingora::lb::selection::RoundRobin;
use pingora::lb::{Backend, Backends, LoadBalancer};
use pingora::protocols::l4::socket::SocketAddr;
use pingora::services::background::{GenBackgroundService, background_service};
use pingora::upstreams::peer::{HttpPeer, Peer};

use crate::config::Upstream;

/// How long one health check may take (connect, then the answer).
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// The booking nodes and how to reach each.
pub struct Upstreams {
    lb: Arc<LoadBalancer<RoundRobin>>,
    peers: Vec<(Backend, HttpPeer)>,
}

/// Tunables of the connections to booking.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// To connect, and for each read or write.
    pub io: Duration,
    /// How often each node's `/readyz` is asked.
    pub health_every: Duration,
}

fn backend(upstream: &Upstream) -> anyhow::Result<Backend> {
    let addr = match upstream {
        Upstream::Tcp(addr) => SocketAddr::Inet(*addr),
        Upstream::Unix(path) => SocketAddr::Unix(
            std::os::unix::net::SocketAddr::from_pathname(path)
                .map_err(|e| anyhow::anyhow!("booking's socket {}: {e}", path.display()))?,
        ),
    };
    Ok(Backend { addr, weight: 1, ext: Default::default() })
}

fn peer(upstream: &Upstream, timeouts: Timeouts) -> anyhow::Result<HttpPeer> {
    let mut peer = match upstream {
        Upstream::Tcp(addr) => HttpPeer::new(*addr, false, String::new()),
        Upstream::Unix(path) => {
            let path = path.to_str().ok_or_else(|| anyhow::anyhow!("booking's socket path is not UTF-8"))?;
            HttpPeer::new_uds(path, false, String::new()).map_err(|e| anyhow::anyhow!("{e}"))?
        }
    };
    let options = &mut peer.options;
    options.connection_timeout = Some(timeouts.io);
    options.read_timeout = Some(timeouts.io);
    // No write timeout: a request (at most the body cap, 64 KiB) fits in the socket's buffer whether or not
    // booking reads it, and a booking that does not answer meets the read timeout. A timer per write would
    // cost every request a little. No idle limit on pooled connections either: pingora's pool watches each
    // idle connection and drops it as soon as booking closes it, and a limit would add a timer per request.
    Ok(peer)
}

impl Upstreams {
    /// The nodes, and the background service that health-checks them (add it to the server).
    pub fn new(
        upstreams: &[Upstream],
        timeouts: Timeouts,
    ) -> anyhow::Result<(Self, GenBackgroundService<LoadBalancer<RoundRobin>>)> {
        anyhow::ensure!(!upstreams.is_empty(), "BOOKING_UPSTREAMS names no node");
        let mut peers = Vec::with_capacity(upstreams.len());
        for upstream in upstreams {
            peers.push((backend(upstream)?, peer(upstream, timeouts)?));
        }
        let set: BTreeSet<Backend> = peers.iter().map(|(b, _)| b.clone()).collect();
        let mut lb = LoadBalancer::<RoundRobin>::from_backends(Backends::new(Static::new(set)));
        let mut check = HttpHealthCheck::new("booking", false);
        check.req.set_uri(http::Uri::from_static("/readyz"));
        check.peer_template.options.connection_timeout = Some(CHECK_TIMEOUT);
        check.peer_template.options.read_timeout = Some(CHECK_TIMEOUT);
        check.reuse_connection = true;
        lb.set_health_check(Box::new(check));
        lb.health_check_frequency = Some(timeouts.health_every);
        lb.parallel_health_check = true;
        // Static discovery answers at once; this builds the selector before the first request.
        futures::FutureExt::now_or_never(lb.update())
            .ok_or_else(|| anyhow::anyhow!("static discovery blocked"))?
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let service = background_service("booking health check", lb);
        Ok((Self { lb: service.task(), peers }, service))
    }

    /// How many nodes there are.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// Whether there is no node (never: `new` refuses that).
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// The next node in the rotation that passed its last health check, other than node `not`; when none did,
    /// the next one at all (a failing check may be stale: trying costs one connect, and its failure is a 503).
    /// The node's index comes with its peer.
    pub fn select(&self, not: Option<usize>) -> Option<(usize, &HttpPeer)> {
        if let [(_, peer)] = &self.peers[..] {
            // One node: the rotation has nothing to choose, and the node is tried whatever its last check said.
            return (not != Some(0)).then_some((0, peer));
        }
        let n = self.peers.len() * 2;
        let index = |b: &Backend| self.peers.iter().position(|(node, _)| node == b);
        let other = |b: &Backend| not.is_none() || index(b) != not;
        let chosen = self
            .lb
            .select_with(b"", n, |b, healthy| healthy && other(b))
            .or_else(|| self.lb.select_with(b"", n, |b, _| other(b)))?;
        let at = index(&chosen)?;
        Some((at, &self.peers[at].1))
    }

    /// `GET path` on a healthy node with `Authorization: Bearer token`: the status and body, or `None` when no
    /// node answered within the timeout.
    pub async fn get(&self, connector: &Connector, path: &str, token: &str) -> Option<(u16, Bytes)> {
        let (_, peer) = self.select(None)?;
        let ask = async {
            let mut req = RequestHeader::build("GET", path.as_bytes(), Some(2))?;
            req.insert_header("host", "booking")?;
            req.insert_header("authorization", format!("Bearer {token}"))?;
            let (mut session, _) = connector.get_http_session(peer).await?;
            session.write_request_header(Box::new(req)).await?;
            session.finish_request_body().await?;
            session.read_response_header().await?;
            let status = session.response_header().map_or(0, |h| h.status.as_u16());
            let mut body = Vec::new();
            while let Some(piece) = session.read_response_body().await? {
                body.extend_from_slice(&piece);
            }
            connector.release_http_session(session, peer, peer.idle_timeout()).await;
            Ok::<_, Box<pingora::Error>>((status, Bytes::from(body)))
        };
        match tokio::time::timeout(CHECK_TIMEOUT * 2, ask).await {
            Ok(Ok(answer)) => Some(answer),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "booking did not answer the gateway's question");
                None
            }
            Err(_) => None,
        }
    }
}
