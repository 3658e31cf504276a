//! The public listener: pingora's HTTP proxy with the gateway's `ProxyHttp` phases. `request_filter` answers
//! what the gateway owns (the waiting room, its page, every refusal) and lets an admitted request through
//! with its body read whole; `upstream_peer` picks a booking node; `upstream_request_filter` says who the
//! client is; pingora parses, frames, pools and streams everything else.

pub mod connections;
pub mod fields;
pub mod framing;
pub mod queue;
pub mod reply;
pub mod routes;
pub mod stream;
#[cfg(test)]
mod tests;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::HeaderName;
use http::header::{ACCEPT, ACCEPT_ENCODING, AUTHORIZATION, CONTENT_LENGTH, COOKIE, EXPECT, TRANSFER_ENCODING};
use pingora::ErrorType::{ConnectionClosed, HTTPStatus, ReadError, WriteError};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::modules::http::HttpModules;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorSource};
use tokens::Keyring;

use self::connections::Watched;
use self::fields::Fields;
use self::queue::Queue;
use self::reply::Reply;
use self::routes::Route;
use crate::limits::{Limits, retry_after_seconds};
use crate::seatmap::Feeds;
use crate::upstreams::Upstreams;

/// The waiting-room page: a static shell (cacheable by a CDN); live numbers come from the status endpoint.
const PAGE: &str = include_str!("../queue.html");
/// The page's proof-of-work worker (a room whose challenge is on), static and cacheable like the page.
const SOLVER: &str = include_str!("../solver.js");

/// The page's Content-Security-Policy: its own inline script and style, by hash, and nothing else; requests to
/// this origin only; never framed (no clickjacking of "join").
static PAGE_POLICY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let hash = |open: &str, close: &str| {
        use base64::Engine;
        use sha2::Digest;
        let inner = PAGE.split_once(open).and_then(|(_, rest)| rest.split_once(close)).map_or("", |(inner, _)| inner);
        format!("'sha256-{}'", base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(inner)))
    };
    format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src 'self'; \
         worker-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hash("<script>", "</script>"),
        hash("<style>", "</style>")
    )
});
/// How long a client's idle connection is kept open between requests, in seconds.
pub const KEEPALIVE_SECONDS: u64 = 60;
/// What a seat map layout sent uncompressed costs of its address's per-IP budget, in requests.
pub const UNCOMPRESSED_LAYOUT_COST: u32 = 20;
/// How long a client may take to send a request's whole body.
const BODY_DEADLINE: Duration = Duration::from_secs(30);

/// The gateway's proxy logic.
pub struct Edge {
    pub keyring: Arc<Keyring>,
    pub upstreams: Arc<Upstreams>,
    pub queue: Queue,
    pub limits: Arc<Limits>,
    /// Largest request body forwarded, in bytes.
    pub max_body: usize,
    /// Longest a write to the client may make no progress.
    pub write_timeout: Duration,
    /// The live seat maps' feeds on this node.
    pub feeds: Arc<Feeds>,
    /// The bounds on the live seat map streams this node serves.
    pub stream_caps: Arc<stream::Caps>,
    /// Booking's answers for adaptive rooms, as this node sees them (the ticker reports them).
    pub health: Arc<crate::health::Health>,
}

/// What one request carries from phase to phase.
#[derive(Default)]
pub struct Ctx {
    /// The request goes (or went) to booking: its answer is counted as proxied.
    proxied: bool,
    /// The client IP the gateway decided on (trusted proxies considered), for `X-Forwarded-For`.
    client_ip: Option<IpAddr>,
    /// The node last tried: a retry after a failed connect goes to another.
    tried: Option<usize>,
    /// A failed connect was already retried once.
    retried: bool,
    /// The length of the body read whole (none read: no body).
    body_len: Option<usize>,
    /// The gateway answered with a stream, written already.
    streamed: bool,
    /// The request passed the admission check: booking is shown the proof checked and no other.
    admitted: bool,
    /// The proof checked, when the client's own `Authorization` does not already say exactly `Bearer <proof>`
    /// (it came in the cookie, or in a header written otherwise): booking is shown it in a new one.
    proof: Option<String>,
    /// The request carries a `Cookie` field (which may hold the admission cookie, not for booking).
    cookie: bool,
    /// The request carries its own `X-Request-Id`.
    request_id: bool,
    /// The request was counted in flight on its connection's head clock.
    watched: bool,
    /// The request goes to booking for an adaptive room: its answer is timed and counted.
    timed: Option<crate::health::Pending>,
}

// Fields are looked up by `HeaderName` constants: a name given as text is parsed and hashed again on each call.
fn header<'a>(req: &'a RequestHeader, name: &HeaderName) -> Option<&'a str> {
    req.headers.get(name).and_then(|v| v.to_str().ok())
}

fn headers<'a>(req: &'a RequestHeader, name: &HeaderName) -> Vec<&'a str> {
    req.headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).collect()
}

/// The body's length as `Content-Length` gives it (pingora has checked it is one number), if it does.
fn declared_length(req: &RequestHeader) -> Option<u64> {
    header(req, &CONTENT_LENGTH).and_then(|v| v.parse().ok())
}

fn wants_html(fields: &Fields) -> bool {
    fields.authorization.is_none() && fields.accepts("text/html")
}

pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
// The fields added to every request forwarded, named as they go on the wire: pingora keeps a `&'static str`
// name as it is, where it makes a titled copy of a `HeaderName`'s on each insert.
const X_FORWARDED_FOR_WIRE: &str = "X-Forwarded-For";
const X_REQUEST_ID_WIRE: &str = "X-Request-Id";
const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");

/// A new request id: 32 hex digits of a fast thread-local random number (unique enough to find a request in
/// logs; not a secret).
fn request_id() -> http::HeaderValue {
    hex_id(rand::random())
}

/// `n` as 32 lowercase hex digits, written two a byte: shifting a 128-bit number costs two instructions a digit.
fn hex_id(n: u128) -> http::HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (digits, byte) in out.chunks_exact_mut(2).zip(n.to_be_bytes()) {
        digits[0] = HEX[usize::from(byte >> 4)];
        digits[1] = HEX[usize::from(byte & 0xf)];
    }
    http::HeaderValue::from_bytes(&out).unwrap_or(http::HeaderValue::from_static("0"))
}

/// The client's address as `X-Forwarded-For` carries it. An IPv4 address is written digit by digit: the
/// formatting machinery costs several times more, on every request forwarded.
fn forwarded_for(ip: IpAddr) -> http::HeaderValue {
    let IpAddr::V4(v4) = ip else {
        return http::HeaderValue::from_str(&ip.to_string()).unwrap_or(http::HeaderValue::from_static("unknown"));
    };
    let mut text = [0u8; 15];
    let mut n = 0;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            text[n] = b'.';
            n += 1;
        }
        if octet >= 100 {
            text[n] = b'0' + octet / 100;
            n += 1;
        }
        if octet >= 10 {
            text[n] = b'0' + octet / 10 % 10;
            n += 1;
        }
        text[n] = b'0' + octet % 10;
        n += 1;
    }
    http::HeaderValue::from_bytes(&text[..n]).unwrap_or(http::HeaderValue::from_static("unknown"))
}

/// Removes the admission cookie from the request's `Cookie` fields, keeping every other cookie.
fn without_admission_cookie(req: &mut RequestHeader) -> pingora::Result<()> {
    let cookie = http::header::COOKIE;
    if !req.headers.get_all(&cookie).iter().any(|v| v.as_bytes().windows(12).any(|w| w == b"wr_admission")) {
        return Ok(());
    }
    let kept: Vec<String> = req
        .headers
        .get_all(&cookie)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or_default().split(';'))
        .map(str::trim)
        .filter(|pair| !pair.is_empty() && pair.split_once('=').is_none_or(|(k, _)| k != tokens::ADMISSION_COOKIE))
        .map(str::to_owned)
        .collect();
    req.remove_header(&cookie);
    if !kept.is_empty() {
        req.insert_header(cookie, kept.join("; "))?;
    }
    Ok(())
}

fn too_many(wait: Duration) -> Reply {
    Reply::error(429, "rate_limited", "too many requests; slow down")
        .header("retry-after", retry_after_seconds(wait).to_string())
}

fn booking_unavailable() -> Reply {
    Reply::error(503, "booking_unavailable", "booking is not answering; retry shortly")
        .header("retry-after", "1".into())
}

fn invalid(why: &str) -> Reply {
    Reply::error(400, "invalid_request", why)
}

impl Edge {
    /// The client's IP (trusted proxies considered), or the refusal of a trusted proxy's unreadable header.
    /// `named`: the request may carry the header trusted proxies name the client in (false once a pass over
    /// its fields found none).
    fn client_ip(&self, session: &Session, named: bool) -> Result<IpAddr, Reply> {
        let peer = session.client_addr().and_then(|a| a.as_inet()).map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |a| a.ip());
        if !named || !self.limits.is_trusted(peer) {
            return Ok(peer);
        }
        let values = headers(session.req_header(), self.limits.client_header().name());
        self.limits.client_ip(peer, &values).map_err(|_| {
            let why = format!("the proxy's {} header names no client address", self.limits.client_header().name());
            Reply::error(400, "client_ip_unreadable", &why)
        })
    }

    /// The per-IP limit on what the gateway answers itself and on public reads.
    fn check_ip(&self, session: &Session) -> Result<IpAddr, Reply> {
        self.check_ip_n(session, 1)
    }

    /// The per-IP limit, for a request that costs `n` of the address's budget.
    fn check_ip_n(&self, session: &Session, n: u32) -> Result<IpAddr, Reply> {
        let ip = self.client_ip(session, true)?;
        self.limits.check_ip_n(ip, n).map_err(|wait| {
            crate::metrics::record_rate_limited("ip");
            too_many(wait)
        })?;
        Ok(ip)
    }

    /// What a public read costs of its address's budget: a layout sent uncompressed (a megabyte for a stadium,
    /// twenty times its gzip) costs [`UNCOMPRESSED_LAYOUT_COST`], so an address without a CDN in front cannot
    /// draw the bandwidth of fifty a second; everything else one.
    fn public_read_cost(req: &RequestHeader) -> u32 {
        let layout = req.uri.path().contains("/seats/layout/");
        let gzip = || header(req, &ACCEPT_ENCODING).is_some_and(|v| v.to_ascii_lowercase().contains("gzip"));
        if layout && !gzip() { UNCOMPRESSED_LAYOUT_COST } else { 1 }
    }

    /// The framing checks pingora leaves to the application (HTTP/1 only: HTTP/2 frames bodies itself).
    fn framing(session: &Session, fields: &Fields) -> Option<Reply> {
        let h1 = session.as_downstream().as_http1()?;
        match framing::check(session.req_header(), fields, || h1.get_headers_raw_bytes()) {
            Ok(()) => None,
            Err(framing::Refusal::BadRequest(why)) => Some(invalid(why)),
            Err(framing::Refusal::UnknownCoding) => {
                Some(Reply::error(501, "unsupported_transfer_coding", "only the chunked transfer coding is supported"))
            }
        }
    }

    /// The waiting room's own endpoints.
    async fn queue(&self, session: &Session, route: &Route) -> Reply {
        let req = session.req_header();
        let method = req.method.as_str();
        let (event, allowed) = match *route {
            Route::QueueJoin(e) | Route::QueueLeave(e) => (e, "POST"),
            Route::QueueStatus(e) | Route::QueuePage(e) | Route::QueueSignin(e) | Route::QueueSolver(e) => (e, "GET"),
            _ => return Reply::error(404, "not_found", "no such route"),
        };
        if method != allowed && !(allowed == "GET" && method == "HEAD") {
            return Reply::error(405, "method_not_allowed", &format!("use {allowed} here"))
                .header("allow", allowed.into());
        }
        if let Route::QueuePage(_) = route
            && !header(req, &ACCEPT).is_some_and(|a| a.contains("application/json"))
        {
            return Reply {
                status: 200,
                headers: vec![
                    ("content-type", "text/html; charset=utf-8".into()),
                    ("cache-control", "public, max-age=300".into()),
                    ("content-security-policy", PAGE_POLICY.clone()),
                    ("x-frame-options", "DENY".into()),
                    ("x-content-type-options", "nosniff".into()),
                    ("referrer-policy", "no-referrer".into()),
                    ("vary", "Accept".into()),
                ],
                body: Bytes::from_static(PAGE.as_bytes()),
            };
        }
        if let Route::QueueSolver(_) = route {
            return Reply {
                status: 200,
                headers: vec![
                    ("content-type", "text/javascript; charset=utf-8".into()),
                    ("cache-control", "public, max-age=300".into()),
                    ("content-security-policy", "default-src 'none'".into()),
                    ("x-content-type-options", "nosniff".into()),
                ],
                body: Bytes::from_static(SOLVER.as_bytes()),
            };
        }
        let client = match self.check_ip(session) {
            Ok(ip) => ip,
            Err(refusal) => return refusal,
        };
        let authorization = header(req, &AUTHORIZATION);
        let cookies = headers(req, &COOKIE);
        match route {
            Route::QueueJoin(_) => {
                let field = |name: &str| req.headers.get(name).and_then(|v| v.to_str().ok());
                let ask = queue::JoinAsk {
                    authorization,
                    cookies: &cookies,
                    altcha: field(crate::gate::HEADER),
                    pass: field(queue::PASS_HEADER),
                    code: field(crate::codes::HEADER),
                    client: Some(client),
                };
                self.queue.join(event, &ask).await
            }
            Route::QueueSignin(_) => self.queue.signin(event, req.uri.query()).await,
            Route::QueueLeave(_) => self.queue.leave(event, authorization, &cookies).await,
            // The page's URL answers JSON to a client that asks for it: caches key on Accept.
            Route::QueuePage(_) => {
                self.queue.status(event, authorization, &cookies).await.header("vary", "Accept".into())
            }
            _ => self.queue.status(event, authorization, &cookies).await,
        }
    }

    /// The live seat map's stream; `None` once it was served (it ends when the client goes away).
    async fn map_stream(&self, session: &mut Session, event: i64) -> Option<Reply> {
        let req = session.req_header();
        if !matches!(req.method.as_str(), "GET") {
            return Some(Reply::error(405, "method_not_allowed", "use GET here").header("allow", "GET".into()));
        }
        if self.queue.rooms.get(event).is_none() {
            return Some(Reply::error(404, "event_not_found", "this event has no live seat map here"));
        }
        let start = match stream::start(header(req, &LAST_EVENT_ID), req.uri.query()) {
            Ok(start) => start,
            Err(why) => return Some(invalid(why)),
        };
        let ip = match self.check_ip(session) {
            Ok(ip) => ip,
            Err(refusal) => return Some(refusal),
        };
        let place = match self.stream_caps.enter(ip, event) {
            Ok(place) => place,
            Err(full) => return Some(full.reply()),
        };
        let store = match self.queue.store.get() {
            Ok(store) => store,
            Err(_) => return Some(Reply::unavailable()),
        };
        stream::serve(session, &self.feeds, store, place, start).await.err()
    }

    /// The admission check and per-account limit in front of booking, or the refusal. Booking is shown the
    /// proof checked alone: the answer is that proof, unless the request's one `Authorization` field already
    /// says exactly `Bearer <proof>` (`None`: the field goes on as it came).
    fn admit(&self, req: &RequestHeader, fields: &Fields, event: i64) -> Result<Option<String>, Reply> {
        let cookies = if fields.cookie { headers(req, &COOKIE) } else { Vec::new() };
        let authorization = fields.authorization.map(|v| v.as_bytes());
        let checked = routes::check(&self.keyring, authorization, cookies.iter().copied(), event)
            .and_then(|(claims, proof)| self.within_session(&claims, event).map(|()| (claims, proof)));
        let (claims, proof) = match checked {
            Ok(checked) => checked,
            Err(refusal) if refusal.status == 401 && wants_html(fields) => {
                // A browser without a valid proof goes to the waiting room, not to an error page.
                let reply = Reply { status: 302, headers: Vec::new(), body: Bytes::new() };
                return Err(reply.header("location", format!("/queue/{event}")));
            }
            Err(refusal) => return Err(Reply::error(refusal.status, refusal.code, &refusal.message)),
        };
        if let Err(wait) = self.limits.check_account(&claims.sub) {
            crate::metrics::record_rate_limited("account");
            return Err(too_many(wait));
        }
        let as_sent = fields.authorizations == 1
            && authorization.is_some_and(|v| v.strip_prefix(b"Bearer ") == Some(proof.as_bytes()));
        Ok((!as_sent).then(|| proof.to_owned()))
    }

    /// A proof lasts at most one session of its event's room (and a minute's leeway): one signed to last longer
    /// (a leaked key, a mistaken mint, an `exp` in the year 3000) is refused, whatever its expiry says; one
    /// issued before its fan left the room is over. An event this node knows no room for has no session to hold
    /// it to.
    fn within_session(&self, claims: &tokens::AdmissionClaims, event: i64) -> Result<(), routes::Refusal> {
        const LEEWAY_SECONDS: u64 = 60;
        let Some((session, left)) = self.queue.rooms.session_and_left(event, claims.sub.as_str()) else {
            return Ok(());
        };
        if left.is_some_and(|at_ms| claims.iat * 1000 <= at_ms) {
            return Err(routes::Refusal::new(
                401,
                "admission_ended",
                "you left this event's waiting room; join it again for a new place",
            ));
        }
        let session = u64::from(session) + LEEWAY_SECONDS;
        if claims.exp.saturating_sub(claims.iat) > session {
            return Err(routes::Refusal::new(
                401,
                "admission_invalid",
                "the admission proof lasts longer than its room's session",
            ));
        }
        Ok(())
    }

    /// Reads an admitted request's body whole, into the session's retry buffer, which pingora sends booking
    /// (and sends again if the first node could not be reached). A body that is too large, badly framed or
    /// too slow is refused here and never reaches booking.
    async fn read_body(&self, session: &mut Session) -> Result<Option<usize>, Reply> {
        if session.is_body_empty() {
            return Ok(None);
        }
        let declared = declared_length(session.req_header());
        let too_large = || Reply::error(413, "body_too_large", "the request body is larger than the gateway forwards");
        if declared.is_some_and(|n| n > self.max_body as u64) {
            return Err(too_large());
        }
        let expects_continue =
            header(session.req_header(), &EXPECT).is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
        if expects_continue && session.write_continue_response().await.is_err() {
            return Err(invalid("the connection failed"));
        }
        let chunked = session.req_header().headers.contains_key(TRANSFER_ENCODING);
        if chunked {
            // The chunk parser under pingora (httparse) reads an empty chunk-size line as the last chunk, and
            // takes a bare LF inside a chunk extension: a proxy in front may end such a body elsewhere. Nothing
            // after a chunked body is read as another request, so no such difference can smuggle one.
            session.set_keepalive(None);
        }
        session.enable_retry_buffering();
        let mut read = 0;
        let whole = tokio::time::timeout(BODY_DEADLINE, async {
            while let Some(piece) = session.read_request_body().await.map_err(|e| {
                tracing::debug!(error = %e, "request body refused");
                // A chunk so large its size overflows (2^64-1 bytes, say) is a body too large, said at once.
                if e.to_string().contains("chunk size overflows") {
                    return too_large();
                }
                invalid("the request body is not validly framed")
            })? {
                read += piece.len();
                if read > self.max_body {
                    return Err(too_large());
                }
            }
            if chunked && read == 0 {
                // What an empty chunk-size line also looks like; no booking endpoint takes an empty chunked body.
                return Err(invalid("a chunked request body must carry data"));
            }
            Ok(Some(read))
        });
        whole
            .await
            .unwrap_or_else(|_| Err(Reply::error(408, "request_timeout", "the request body did not arrive in time")))
    }

    /// Reads past the body of a request the gateway answers without it, so the connection can carry the next
    /// request (pingora closes a connection whose request was answered before it was read); a body larger
    /// than the gateway forwards, or one that does not arrive in time, closes the connection instead.
    async fn skip_body(&self, session: &mut Session) {
        if session.is_body_empty() {
            return;
        }
        let declared = declared_length(session.req_header());
        let skipped = match declared {
            Some(n) if n <= self.max_body as u64 => {
                matches!(tokio::time::timeout(BODY_DEADLINE, session.drain_request_body()).await, Ok(Ok(())))
            }
            _ => false,
        };
        if !skipped {
            session.set_keepalive(None);
        }
    }

    /// Answers the request here, or leaves it to go to booking (`Ok(false)`).
    ///
    /// A live map's stream runs inside this future for as long as the fan follows it, so everything that
    /// runs only for other requests (the queue, a body read, an answer's write) is boxed: this future stays
    /// small, and so does every stream's share of memory.
    async fn filter(&self, session: &mut Session, ctx: &mut Ctx) -> pingora::Result<bool> {
        let Some(reply) = self.answer(session, ctx).await else { return Ok(ctx.streamed) };
        Box::pin(async move {
            if matches!(reply.status, 400 | 408 | 413 | 501) {
                // The rest of the request was not read, or cannot be trusted: nothing more on this connection.
                session.set_keepalive(None);
            } else {
                self.skip_body(session).await;
            }
            reply.write(session).await?;
            Ok(true)
        })
        .await
    }

    /// Starts timing a request that goes to booking, when its event's room adapts its rate to booking's answers
    /// (only configured rooms: a client cannot grow the figures with made-up event ids). A live stream's answer
    /// lasts as long as the fan watches, so it says nothing of booking's latency.
    fn time_answer(&self, route: Route) -> Option<crate::health::Pending> {
        let (Route::Event(event) | Route::PublicMap(event)) = route else { return None };
        let room = self.queue.rooms.get(event)?;
        let settings = &room.live.settings;
        (settings.rate_mode == crate::room::RateMode::Adaptive)
            .then(|| self.health.start(event, Duration::from_millis(u64::from(settings.target_p99_ms))))
    }

    /// The answer to a request the gateway answers itself, or `None` for one that goes to booking.
    async fn answer(&self, session: &mut Session, ctx: &mut Ctx) -> Option<Reply> {
        let req = session.req_header();
        let fields = Fields::read(req, self.limits.client_header().name());
        if let Some(refusal) = Self::framing(session, &fields) {
            return Some(refusal);
        }
        let route = routes::route(session.req_header().uri.path());
        match route {
            Route::Health => Some(Reply::json(200, &serde_json::json!({ "status": "ok" }))),
            Route::Unknown => Some(Reply::error(404, "not_found", "no such route")),
            Route::BadEventId => Some(Reply::error(400, "invalid_path", "event_id must be a positive integer")),
            Route::QueuePage(_)
            | Route::QueueJoin(_)
            | Route::QueueStatus(_)
            | Route::QueueLeave(_)
            | Route::QueueSignin(_)
            | Route::QueueSolver(_) => Some(Box::pin(self.queue(session, &route)).await),
            Route::MapStream(event) => {
                let refusal = Box::pin(self.map_stream(session, event)).await;
                ctx.streamed = refusal.is_none();
                refusal
            }
            Route::PublicMap(_) | Route::Event(_) => {
                let checked = match route {
                    Route::Event(event) => self
                        .admit(req, &fields, event)
                        .and_then(|proof| Ok((self.client_ip(session, fields.client_ip)?, Some(proof)))),
                    _ => self.check_ip_n(session, Self::public_read_cost(req)).map(|ip| (ip, None)),
                };
                ctx.cookie = fields.cookie;
                ctx.request_id = fields.request_id;
                let (ip, proof) = match checked {
                    Ok(checked) => checked,
                    Err(refusal) => return Some(refusal),
                };
                ctx.admitted = proof.is_some();
                ctx.proof = proof.flatten();
                ctx.client_ip = Some(ip);
                let read = if session.is_body_empty() { Ok(None) } else { Box::pin(self.read_body(session)).await };
                match read {
                    Ok(length) => {
                        ctx.proxied = true;
                        ctx.body_len = length;
                        ctx.timed = self.time_answer(route);
                        None
                    }
                    Err(refusal) => Some(refusal),
                }
            }
        }
    }
}

#[async_trait]
impl ProxyHttp for Edge {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx::default()
    }

    // Pingora adds a response compression module by default, switched off, whose filters still run on every
    // request and every piece of every body (each frame of each live map stream). Booking compresses what is
    // worth it, and the gateway's own answers are small: no module runs.
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    async fn early_request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> pingora::Result<()> {
        // The head is read whole: its connection's deadline waits until the request is answered.
        if let Some(clock) = session.as_downstream().stream().and_then(Watched::clock) {
            clock.request_started();
            ctx.watched = true;
        }
        // Requests a client sends before reading the answers are answered in order on the same connection.
        session.set_pipelining_enabled(true);
        // Pingora keeps an HTTP/1.1 connection open for as long as the client likes; bound the idle time.
        if session.get_keepalive() == Some(0) {
            session.set_keepalive(Some(KEEPALIVE_SECONDS));
        }
        // Pingora waits on a client's window for ever by default: a client that never reads would hold its
        // connection, and a forwarded answer's connection to booking, as long as it likes.
        session.set_write_timeout(Some(self.write_timeout));
        Ok(())
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> pingora::Result<bool> {
        self.filter(session, ctx).await
    }

    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut Ctx) -> pingora::Result<Box<HttpPeer>> {
        let not = if ctx.retried { ctx.tried } else { None };
        let Some((node, peer)) = self.upstreams.select(not) else {
            return Error::e_explain(HTTPStatus(503), "no booking node to try");
        };
        // Cloned straight into its box: a peer is a few hundred bytes, copied once more when built elsewhere.
        let peer = Box::new(peer.clone());
        ctx.tried = Some(node);
        Ok(peer)
    }

    fn fail_to_connect(&self, _session: &mut Session, peer: &HttpPeer, ctx: &mut Ctx, mut e: Box<Error>) -> Box<Error> {
        // Nothing reached booking: another node may have it, once.
        let again = !ctx.retried && self.upstreams.len() > 1;
        ctx.retried = true;
        tracing::warn!(peer = %peer, error = %e, retry = again, "could not connect to booking");
        e.set_retry(again);
        e
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> pingora::Result<()> {
        if let Some(length) = ctx.body_len {
            // The gateway answered the client's expectation itself and sends the body at once, whole, with its
            // length: however the client framed it, booking reads one framing, the simplest.
            upstream.remove_header(&EXPECT);
            upstream.remove_header(&TRANSFER_ENCODING);
            upstream.insert_header(CONTENT_LENGTH, length)?;
        }
        if let Some(ip) = ctx.client_ip {
            upstream.insert_header(X_FORWARDED_FOR_WIRE, forwarded_for(ip))?;
        }
        if ctx.admitted {
            // Booking acts on exactly the proof checked here, however the client sent it.
            if let Some(proof) = ctx.proof.take() {
                upstream.insert_header(AUTHORIZATION, format!("Bearer {proof}"))?;
            }
            if ctx.cookie {
                without_admission_cookie(upstream)?;
            }
        }
        if !ctx.request_id {
            upstream.insert_header(X_REQUEST_ID_WIRE, request_id())?;
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        answer: &mut ResponseHeader,
        _ctx: &mut Ctx,
    ) -> pingora::Result<()> {
        // HTTP/1.0 has no chunks: an answer of unknown length runs until the connection closes.
        if session.req_header().version == http::Version::HTTP_10 && answer.headers.contains_key(TRANSFER_ENCODING) {
            answer.remove_header(&TRANSFER_ENCODING);
            session.set_keepalive(None);
        }
        Ok(())
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, _ctx: &mut Ctx) -> FailToProxy {
        let reply = match (e.etype(), e.esource()) {
            (HTTPStatus(503), _) | (_, ErrorSource::Upstream) => booking_unavailable(),
            (ReadError | WriteError | ConnectionClosed, ErrorSource::Downstream) => {
                return FailToProxy { error_code: 0, can_reuse_downstream: false };
            }
            (_, ErrorSource::Downstream) => invalid("the request is not valid HTTP"),
            _ => Reply::error(500, "internal", "the gateway failed to answer"),
        };
        let status = reply.status;
        // Once booking's answer has begun, the client's connection cannot carry an error as well.
        if session.response_written().is_none() {
            session.set_keepalive(None);
            if let Err(e) = reply.write(session).await {
                tracing::debug!(error = %e, "could not tell the client");
            }
        }
        FailToProxy { error_code: status, can_reuse_downstream: false }
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &Ctx, e: &Error) -> bool {
        // A client that went away is not the gateway's error; booking unreachable is logged once, above.
        matches!(e.esource(), ErrorSource::Downstream) || matches!(e.etype(), HTTPStatus(_))
    }

    async fn logging(&self, session: &mut Session, _e: Option<&Error>, ctx: &mut Ctx) {
        if ctx.watched
            && let Some(clock) = session.as_downstream().stream().and_then(Watched::clock)
        {
            clock.request_ended();
        }
        if let Some(status) = session.response_written().map(|r| r.status.as_u16()) {
            crate::metrics::record_response(ctx.proxied, status);
            if let Some(timed) = ctx.timed.take() {
                timed.finish(status);
            }
        }
    }
}
