//! The public listener, as a pingora `ServerApp`: on each client connection (`client.rs`), each request is routed,
//! then answered here (a refusal, a queue answer, the waiting-room page) or admitted and forwarded to booking
//! (`forward`), and counted.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::apps::ServerApp;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use tokens::Keyring;

use crate::admission::{self, Route};
use crate::client::{Client, Next, Request};
use crate::forward::{ForwardError, Upstream};
use crate::limits::{Limits, retry_after_seconds};
use crate::queue::{Queue, Reply};

/// The waiting-room page: a static shell (cacheable by a CDN); live numbers come from the status endpoint.
const PAGE: &str = include_str!("queue.html");
/// How long a client's idle connection is kept open between requests.
const KEEPALIVE: Duration = Duration::from_secs(60);
/// How long a client may take over each read of a request it has begun, and over each write of an answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The gateway's proxy logic.
pub struct Gateway {
    keyring: Arc<Keyring>,
    upstream: Upstream,
    queue: Queue,
    limits: Arc<Limits>,
    max_body: usize,
}

impl Gateway {
    pub fn new(keyring: Arc<Keyring>, upstream: Upstream, queue: Queue, limits: Arc<Limits>, max_body: usize) -> Self {
        Self { keyring, upstream, queue, limits, max_body }
    }
}

/// Writes a whole answer (to `req`, or to a request that could not be read) and counts it (`proxied`: in
/// front of booking); returns whether the connection goes on.
async fn answer(client: &mut Client, req: Option<&Request>, reply: Reply, proxied: bool, keepalive: bool) -> bool {
    let status = reply.status;
    let written = client.respond(req, &reply, keepalive).await.is_ok();
    crate::metrics::record_response(proxied, status);
    written && keepalive
}

fn wants_html(req: &Request) -> bool {
    req.header("authorization").is_none() && req.header("accept").is_some_and(|a| a.contains("text/html"))
}

fn too_many(wait: std::time::Duration) -> Reply {
    Reply::error(429, "rate_limited", "too many requests; slow down")
        .header("retry-after", retry_after_seconds(wait).to_string())
}

impl Gateway {
    fn client_ip(&self, client: &Client, req: &Request) -> IpAddr {
        let peer = client.peer_ip().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        self.limits.client_ip(peer, req.header("cf-connecting-ip"), &req.headers("x-forwarded-for"))
    }

    /// The waiting room's own endpoints.
    async fn queue(&self, client: &Client, req: &Request, route: &Route) -> Reply {
        let method = req.method.as_str();
        let (event, allowed) = match *route {
            Route::QueueJoin(e) => (e, "POST"),
            Route::QueueStatus(e) | Route::QueuePage(e) => (e, "GET"),
            _ => return Reply::error(404, "not_found", "no such route"),
        };
        if method != allowed && !(allowed == "GET" && method == "HEAD") {
            return Reply::error(405, "method_not_allowed", &format!("use {allowed} here"))
                .header("allow", allowed.into());
        }
        if let Route::QueuePage(_) = route
            && !req.header("accept").is_some_and(|a| a.contains("application/json"))
        {
            return Reply {
                status: 200,
                headers: vec![
                    ("content-type", "text/html; charset=utf-8".into()),
                    ("cache-control", "public, max-age=300".into()),
                ],
                body: Bytes::from_static(PAGE.as_bytes()),
            };
        }
        if let Err(wait) = self.limits.check_ip(self.client_ip(client, req)) {
            crate::metrics::record_rate_limited("ip");
            return too_many(wait);
        }
        let authorization = req.header("authorization");
        let cookies = req.headers("cookie");
        match route {
            Route::QueueJoin(_) => self.queue.join(event, authorization, &cookies).await,
            _ => self.queue.status(event, authorization, &cookies).await,
        }
    }

    /// The admission check and per-account limit in front of booking; `None` lets the request through.
    fn admit(&self, req: &Request, event: i64) -> Option<Reply> {
        let authorization = req.header("authorization");
        let cookies = req.headers("cookie");
        let claims = match admission::check(&self.keyring, authorization, &cookies, event) {
            Ok(claims) => claims,
            Err(refusal) if refusal.status == 401 && wants_html(req) => {
                // A browser without a valid proof goes to the waiting room, not to an error page.
                let reply = Reply { status: 302, headers: Vec::new(), body: Bytes::new() };
                return Some(reply.header("location", format!("/queue/{event}")));
            }
            Err(refusal) => return Some(Reply::error(refusal.status, refusal.code, &refusal.message)),
        };
        if let Err(wait) = self.limits.check_account(&claims.sub) {
            crate::metrics::record_rate_limited("account");
            return Some(too_many(wait));
        }
        None
    }

    /// Answers one request: a refusal, a queue answer or the page, or booking's answer to the forwarded request.
    /// Returns whether the client's connection may serve another request.
    async fn serve(&self, client: &mut Client, req: &Request, keepalive: bool) -> bool {
        let route = admission::route(req.path());
        let reply = match route {
            Route::Health => Reply::json(200, &serde_json::json!({ "status": "ok" })),
            Route::Unknown => Reply::error(404, "not_found", "no such route"),
            Route::BadEventId => Reply::error(400, "invalid_path", "event_id must be a positive integer"),
            Route::Event(event) => match self.admit(req, event) {
                Some(refusal) => refusal,
                None => return self.forward(client, req, keepalive).await,
            },
            Route::QueuePage(_) | Route::QueueJoin(_) | Route::QueueStatus(_) => self.queue(client, req, &route).await,
        };
        answer(client, Some(req), reply, false, keepalive).await
    }

    async fn forward(&self, client: &mut Client, req: &Request, keepalive: bool) -> bool {
        match self.upstream.forward(client, req, keepalive).await {
            Ok((status, keepalive)) => {
                crate::metrics::record_response(true, status);
                keepalive
            }
            Err(ForwardError::Downstream(_)) => false,
            Err(ForwardError::Upstream(e)) => {
                // Booking unreachable is "dependency down": 503 with Retry-After and a JSON body, never a bare 502.
                // The request was read whole before booking was asked, so the client's connection stays usable.
                tracing::warn!(error = %e, "booking unreachable");
                let reply = Reply::error(503, "booking_unavailable", "booking is not answering; retry shortly")
                    .header("retry-after", "1".into());
                answer(client, Some(req), reply, true, keepalive).await
            }
        }
    }
}

#[async_trait]
impl ServerApp for Gateway {
    /// Serves one client's connection, request after request, until it closes, goes quiet, asks to close, or
    /// the gateway shuts down.
    async fn process_new(self: &Arc<Self>, stream: Stream, shutdown: &ShutdownWatch) -> Option<Stream> {
        let mut client = Client::new(stream, CLIENT_TIMEOUT, self.max_body);
        loop {
            let req = match client.read(KEEPALIVE).await {
                Next::Request(req) => req,
                Next::Gone => return None,
                Next::Refused(reply) => {
                    answer(&mut client, None, reply, false, false).await;
                    return None;
                }
            };
            let keepalive = req.keepalive && !*shutdown.borrow();
            if !self.serve(&mut client, &req, keepalive).await {
                return None;
            }
        }
    }
}
