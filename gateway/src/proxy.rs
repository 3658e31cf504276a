//! The pingora proxy: each request phase is small; a refusal is a response the phase writes before returning
//! `Ok(true)`, not an error.

use std::net::SocketAddr;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora::proxy::FailToProxy;
use tokens::{AccountId, Keyring};

use crate::admission::{self, Refusal, Route};

/// The gateway's proxy logic.
pub struct Gateway {
    keyring: Keyring,
    upstream: SocketAddr,
}

impl Gateway {
    pub fn new(keyring: Keyring, upstream: SocketAddr) -> Self {
        Self { keyring, upstream }
    }
}

/// Per-request state.
#[derive(Default)]
pub struct Ctx {
    /// The admitted account, once the proof checked out.
    pub account: Option<AccountId>,
}

/// Writes a whole response: status, headers, body.
async fn respond(session: &mut Session, status: u16, headers: &[(&str, &str)], body: Bytes) -> Result<()> {
    let mut resp = ResponseHeader::build(status, Some(headers.len() + 2))?;
    for (name, value) in headers {
        resp.insert_header(name.to_string(), value.to_string())?;
    }
    resp.insert_header("content-length", body.len().to_string())?;
    session.write_response_header(Box::new(resp), body.is_empty()).await?;
    if !body.is_empty() {
        session.write_response_body(Some(body), true).await?;
    }
    Ok(())
}

async fn respond_json(session: &mut Session, status: u16, code: &'static str, message: &str) -> Result<()> {
    let refusal = Refusal { status, code, message: message.to_owned() };
    respond(session, status, &[("content-type", "application/json")], Bytes::from(refusal.body())).await
}

fn wants_html(session: &Session) -> bool {
    let header = |name: &str| session.req_header().headers.get(name).and_then(|v| v.to_str().ok());
    header("authorization").is_none() && header("accept").is_some_and(|a| a.contains("text/html"))
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let event = match admission::route(session.req_header().uri.path()) {
            Route::Health => {
                let body = Bytes::from_static(br#"{"status":"ok"}"#);
                respond(session, 200, &[("content-type", "application/json")], body).await?;
                return Ok(true);
            }
            Route::Unknown => {
                respond_json(session, 404, "not_found", "no such route").await?;
                return Ok(true);
            }
            Route::BadEventId => {
                respond_json(session, 400, "invalid_path", "event_id must be a positive integer").await?;
                return Ok(true);
            }
            Route::Event(event) => event,
        };
        let headers = &session.req_header().headers;
        let authorization = headers.get("authorization").and_then(|v| v.to_str().ok());
        let cookies: Vec<&str> = headers.get_all("cookie").iter().filter_map(|v| v.to_str().ok()).collect();
        match admission::check(&self.keyring, authorization, &cookies, event) {
            Ok(account) => {
                ctx.account = Some(account);
                Ok(false)
            }
            Err(refusal) if refusal.status == 401 && wants_html(session) => {
                // A browser without a valid proof goes to the waiting room, not to an error page.
                let location = format!("/queue/{event}");
                respond(session, 302, &[("location", location.as_str())], Bytes::new()).await?;
                Ok(true)
            }
            Err(refusal) => {
                respond_json(session, refusal.status, refusal.code, &refusal.message).await?;
                Ok(true)
            }
        }
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
            let refusal = Refusal {
                status: 503,
                code: "booking_unavailable",
                message: "booking is not answering; retry shortly".into(),
            };
            let headers = [("content-type", "application/json"), ("retry-after", "1")];
            let _ = respond(session, 503, &headers, Bytes::from(refusal.body())).await;
        } else if code > 0 {
            let _ = session.respond_error(code).await;
        }
        FailToProxy { error_code: code, can_reuse_downstream: false }
    }
}
