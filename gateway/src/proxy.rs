//! The public listener, as a pingora `HttpServerApp`: each request is routed, then answered here (a refusal, a
//! queue answer, the waiting-room page) or admitted and forwarded to booking (`forward`), and counted.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::Result;
use pingora::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream};
use pingora::http::ResponseHeader;
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;
use tokens::Keyring;

use crate::admission::{self, Route};
use crate::forward::{ForwardError, Upstream};
use crate::limits::{Limits, retry_after_seconds};
use crate::queue::{Queue, Reply};

/// The waiting-room page: a static shell (cacheable by a CDN); live numbers come from the status endpoint.
const PAGE: &str = include_str!("queue.html");
/// How long a client's idle connection is kept open between requests.
const KEEPALIVE_SECONDS: u64 = 60;

/// The gateway's proxy logic.
pub struct Gateway {
    keyring: Arc<Keyring>,
    upstream: Upstream,
    queue: Queue,
    limits: Arc<Limits>,
}

impl Gateway {
    pub fn new(keyring: Arc<Keyring>, upstream: Upstream, queue: Queue, limits: Arc<Limits>) -> Self {
        Self { keyring, upstream, queue, limits }
    }
}

/// Writes a whole response and counts it (`proxied`: in front of booking); returns whether it was written.
async fn answer(session: &mut ServerSession, reply: Reply, proxied: bool) -> bool {
    let status = reply.status;
    let written = respond(session, reply).await.is_ok();
    crate::metrics::record_response(proxied, status);
    written
}

/// Writes a whole response.
async fn respond(session: &mut ServerSession, reply: Reply) -> Result<()> {
    let mut resp = ResponseHeader::build(reply.status, Some(reply.headers.len() + 1))?;
    for (name, value) in reply.headers {
        resp.append_header(name, value)?;
    }
    resp.insert_header("content-length", reply.body.len().to_string())?;
    let empty = reply.body.is_empty();
    session.write_response_header(Box::new(resp)).await?;
    if !empty {
        session.write_response_body(reply.body, true).await?;
    }
    Ok(())
}

fn header<'a>(session: &'a ServerSession, name: &str) -> Option<&'a str> {
    session.req_header().headers.get(name).and_then(|v| v.to_str().ok())
}

fn wants_html(session: &ServerSession) -> bool {
    header(session, "authorization").is_none() && header(session, "accept").is_some_and(|a| a.contains("text/html"))
}

fn too_many(wait: std::time::Duration) -> Reply {
    Reply::error(429, "rate_limited", "too many requests; slow down")
        .header("retry-after", retry_after_seconds(wait).to_string())
}

impl Gateway {
    fn client_ip(&self, session: &ServerSession) -> IpAddr {
        let peer = session.client_addr().and_then(|a| a.as_inet()).map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |a| a.ip());
        let forwarded: Vec<&str> =
            session.req_header().headers.get_all("x-forwarded-for").iter().filter_map(|v| v.to_str().ok()).collect();
        self.limits.client_ip(peer, header(session, "cf-connecting-ip"), &forwarded)
    }

    /// The waiting room's own endpoints.
    async fn queue(&self, session: &ServerSession, route: &Route) -> Reply {
        let method = session.req_header().method.as_str();
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
            && !header(session, "accept").is_some_and(|a| a.contains("application/json"))
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
        if let Err(wait) = self.limits.check_ip(self.client_ip(session)) {
            crate::metrics::record_rate_limited("ip");
            return too_many(wait);
        }
        let authorization = header(session, "authorization");
        let cookies: Vec<&str> =
            session.req_header().headers.get_all("cookie").iter().filter_map(|v| v.to_str().ok()).collect();
        match route {
            Route::QueueJoin(_) => self.queue.join(event, authorization, &cookies).await,
            _ => self.queue.status(event, authorization, &cookies).await,
        }
    }

    /// The admission check and per-account limit in front of booking; `None` lets the request through.
    fn admit(&self, session: &ServerSession, event: i64) -> Option<Reply> {
        let authorization = header(session, "authorization");
        let cookies: Vec<&str> =
            session.req_header().headers.get_all("cookie").iter().filter_map(|v| v.to_str().ok()).collect();
        let claims = match admission::check(&self.keyring, authorization, &cookies, event) {
            Ok(claims) => claims,
            Err(refusal) if refusal.status == 401 && wants_html(session) => {
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
    async fn serve(&self, session: &mut ServerSession) -> bool {
        let route = admission::route(session.req_header().uri.path());
        let reply = match route {
            Route::Health => Reply::json(200, &serde_json::json!({ "status": "ok" })),
            Route::Unknown => Reply::error(404, "not_found", "no such route"),
            Route::BadEventId => Reply::error(400, "invalid_path", "event_id must be a positive integer"),
            Route::Event(event) => match self.admit(session, event) {
                Some(refusal) => refusal,
                None => return self.forward(session).await,
            },
            Route::QueuePage(_) | Route::QueueJoin(_) | Route::QueueStatus(_) => self.queue(session, &route).await,
        };
        answer(session, reply, false).await
    }

    async fn forward(&self, session: &mut ServerSession) -> bool {
        let (failed, reusable) = match self.upstream.forward(session).await {
            Ok(status) => {
                crate::metrics::record_response(true, status);
                return true;
            }
            Err(ForwardError::Downstream(_)) => return false,
            Err(ForwardError::TooLarge) => {
                // The rest of the body is still on its way: the answer says the connection closes, so the client
                // neither reuses it nor loses the answer to a reset.
                session.set_keepalive(None);
                let reply = Reply::error(413, "body_too_large", "the request body is larger than the gateway forwards");
                (reply, false)
            }
            Err(ForwardError::Upstream(e)) => {
                // Booking unreachable is "dependency down": 503 with Retry-After and a JSON body, never a bare 502.
                // The request was read whole before booking was asked, so the client's connection stays usable.
                tracing::warn!(error = %e, "booking unreachable");
                let reply = Reply::error(503, "booking_unavailable", "booking is not answering; retry shortly")
                    .header("retry-after", "1".into());
                (reply, true)
            }
        };
        answer(session, failed, true).await && reusable
    }
}

#[async_trait]
impl HttpServerApp for Gateway {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        match session.read_request().await {
            Ok(true) => {}
            // The client closed its idle connection.
            Ok(false) => return None,
            Err(e) => {
                if matches!(e.etype(), pingora::ErrorType::InvalidHTTPHeader) {
                    let reply = Reply::error(400, "invalid_request", "the request is not valid HTTP/1.1");
                    answer(&mut session, reply, false).await;
                }
                session.shutdown().await;
                return None;
            }
        }
        session.set_keepalive(if *shutdown.borrow() { None } else { Some(KEEPALIVE_SECONDS) });
        if !self.serve(&mut session).await {
            return None;
        }
        let settings = HttpPersistentSettings::for_session(&session);
        match session.finish().await {
            Ok(stream) => stream.map(|s| ReusedHttpStream::from_reusable_stream(s, settings)),
            Err(_) => None,
        }
    }
}
