//! The pingora proxy: each request phase is small; a refusal, a queue answer or the waiting-room page is a
//! response the phase writes before returning `Ok(true)`, not an error.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::FailToProxy;
use tokens::Keyring;

use crate::admission::{self, Route};
use crate::limits::{Limits, retry_after_seconds};
use crate::queue::{Queue, Reply};

/// The waiting-room page: a static shell (cacheable by a CDN); live numbers come from the status endpoint.
const PAGE: &str = include_str!("queue.html");

/// The gateway's proxy logic.
pub struct Gateway {
    keyring: Arc<Keyring>,
    upstream: SocketAddr,
    queue: Queue,
    limits: Arc<Limits>,
}

impl Gateway {
    pub fn new(keyring: Arc<Keyring>, upstream: SocketAddr, queue: Queue, limits: Arc<Limits>) -> Self {
        Self { keyring, upstream, queue, limits }
    }
}

/// Per-request state.
#[derive(Default)]
pub struct Ctx {
    /// Whether the request went to booking (for the metrics' `kind` label).
    pub proxied: bool,
}

/// Writes a whole response.
async fn respond(session: &mut Session, reply: Reply) -> Result<()> {
    let mut resp = ResponseHeader::build(reply.status, Some(reply.headers.len() + 1))?;
    for (name, value) in reply.headers {
        resp.append_header(name, value)?;
    }
    resp.insert_header("content-length", reply.body.len().to_string())?;
    let empty = reply.body.is_empty();
    session.write_response_header(Box::new(resp), empty).await?;
    if !empty {
        session.write_response_body(Some(reply.body), true).await?;
    }
    Ok(())
}

fn header<'a>(session: &'a Session, name: &str) -> Option<&'a str> {
    session.req_header().headers.get(name).and_then(|v| v.to_str().ok())
}

fn wants_html(session: &Session) -> bool {
    header(session, "authorization").is_none() && header(session, "accept").is_some_and(|a| a.contains("text/html"))
}

fn too_many(wait: std::time::Duration) -> Reply {
    Reply::error(429, "rate_limited", "too many requests; slow down")
        .header("retry-after", retry_after_seconds(wait).to_string())
}

impl Gateway {
    fn client_ip(&self, session: &Session) -> IpAddr {
        let peer = session.client_addr().and_then(|a| a.as_inet()).map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |a| a.ip());
        let forwarded: Vec<&str> =
            session.req_header().headers.get_all("x-forwarded-for").iter().filter_map(|v| v.to_str().ok()).collect();
        self.limits.client_ip(peer, header(session, "cf-connecting-ip"), &forwarded)
    }

    /// The waiting room's own endpoints.
    async fn queue(&self, session: &Session, route: &Route) -> Reply {
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
    fn admit(&self, session: &Session, event: i64) -> Option<Reply> {
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
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let route = admission::route(session.req_header().uri.path());
        let reply = match route {
            Route::Health => Reply::json(200, &serde_json::json!({ "status": "ok" })),
            Route::Unknown => Reply::error(404, "not_found", "no such route"),
            Route::BadEventId => Reply::error(400, "invalid_path", "event_id must be a positive integer"),
            Route::Event(event) => match self.admit(session, event) {
                Some(refusal) => refusal,
                None => {
                    ctx.proxied = true;
                    return Ok(false);
                }
            },
            Route::QueuePage(_) | Route::QueueJoin(_) | Route::QueueStatus(_) => self.queue(session, &route).await,
        };
        respond(session, reply).await?;
        Ok(true)
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, _ctx: &mut Ctx) -> FailToProxy {
        // Booking unreachable is "dependency down": 503 with Retry-After and a JSON body, never a bare 502.
        let code = match e.esource() {
            ErrorSource::Upstream => 503,
            ErrorSource::Downstream => 0,
            _ => 500,
        };
        if code == 503 {
            tracing::warn!(error = %e, "booking unreachable");
            let reply = Reply::error(503, "booking_unavailable", "booking is not answering; retry shortly")
                .header("retry-after", "1".into());
            let _ = respond(session, reply).await;
        } else if code > 0 {
            let _ = session.respond_error(code).await;
        }
        FailToProxy { error_code: code, can_reuse_downstream: false }
    }

    async fn logging(&self, session: &mut Session, _e: Option<&Error>, ctx: &mut Ctx) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        crate::metrics::record_response(ctx.proxied, status);
    }
}
