//! The client's side of the public listener: requests read off pingora's stream with httparse (head and whole
//! body, which the gateway caps), and answers written in one buffer. pingora's own HTTP/1 session built two
//! header maps per request, checked the answer's framing again and moved a large session between tasks; this
//! keeps the head as the bytes that came and the fields as ranges of them.
//!
//! What a client gets (RFC 9112): HTTP/1.1 connections stay open unless the client says `Connection: close`,
//! HTTP/1.0 ones only when it says `Connection: keep-alive`; requests may be pipelined; a body comes framed by
//! `Content-Length` or chunked (never both, and no other coding: a request framed any other way is refused, as
//! a request smuggled past a proxy would be); `Expect: 100-continue` gets its interim answer before the body is
//! read; every answer carries `Date`, `Connection` and its length, and none carries a body to a HEAD.

use std::net::IpAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::Method;
use pingora::protocols::Stream;
use pingora::protocols::http::date::get_cached_date;

use crate::queue::Reply;
use crate::wire::{Conn, Fields, Framing, MAX_HEAD_BYTES, at, framing, write_all};

/// The most header fields a request may carry: browsers send about 20, and proxies in front add their own.
const MAX_FIELDS: usize = 100;

/// A request, read whole.
pub struct Request {
    pub method: Method,
    pub fields: Fields,
    pub body: Bytes,
    /// The request target as it came (path and query, or absolute form), and where its path ends.
    target: Bytes,
    path: Range<usize>,
    /// The client keeps the connection for another request.
    pub keepalive: bool,
    /// The client spoke HTTP/1.0 (no chunked answers).
    pub http10: bool,
    /// Whether the client framed a body at all (even an empty one).
    pub framed: bool,
}

impl Request {
    /// The path without the query (and without scheme and authority, for a request in absolute form).
    pub fn path(&self) -> &str {
        std::str::from_utf8(&self.target[self.path.clone()]).unwrap_or_default()
    }

    /// The request target as the client sent it.
    pub fn target(&self) -> &[u8] {
        &self.target
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.fields.text(name)
    }

    /// Every value of `name` that is text.
    pub fn headers<'a>(&'a self, name: &'a str) -> Vec<&'a str> {
        self.fields.all(name).filter_map(|v| std::str::from_utf8(v).ok()).collect()
    }
}

/// What reading the next request came to.
pub enum Next {
    Request(Box<Request>),
    /// The client closed the connection, or went quiet, or its connection failed: nothing to answer.
    Gone,
    /// The request cannot be served; the answer says why, and the connection closes after it.
    Refused(Reply),
}

/// One client's connection.
pub struct Client {
    conn: Conn,
    max_body: usize,
    digest: Option<Arc<pingora::protocols::SocketDigest>>,
}

impl Client {
    /// A new connection; `timeout` bounds the wait for the rest of a head once it has begun, each read of a
    /// body, and each write.
    pub fn new(stream: Stream, timeout: Duration, max_body: usize) -> Self {
        let digest = stream.get_socket_digest();
        Self { conn: Conn::new(stream, timeout, "the client"), max_body, digest }
    }

    /// The TCP peer's address.
    pub fn peer_ip(&self) -> Option<IpAddr> {
        let digest = self.digest.as_ref()?;
        digest.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip())
    }

    /// Reads the next request, waiting at most `idle` for it to begin.
    pub async fn read(&mut self, idle: Duration) -> Next {
        if self.conn.buf.is_empty() && !matches!(self.conn.fill_within(idle).await, Ok(1..)) {
            return Next::Gone;
        }
        // A head that does not come whole in the first read must come whole within the timeout, however slowly
        // its bytes trickle in.
        let mut deadline = None;
        loop {
            match self.parse() {
                Ok(Some(request)) => return self.read_body(request).await,
                Ok(None) => {}
                Err(why) => return Next::Refused(Reply::error(400, "invalid_request", why)),
            }
            if self.conn.buf.len() >= MAX_HEAD_BYTES {
                return Next::Refused(Reply::error(400, "invalid_request", "the request head is over 64 KiB"));
            }
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + self.conn.timeout);
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !matches!(self.conn.fill_within(left).await, Ok(1..)) {
                return Next::Gone;
            }
        }
    }

    /// The head, if the buffer holds all of it; its body still to come.
    fn parse(&mut self) -> Result<Option<Request>, &'static str> {
        // Left uninitialised: httparse writes the fields it finds, and a hundred empty ones cost more to set up
        // than a typical request's twenty cost to parse.
        let mut headers = [const { std::mem::MaybeUninit::uninit() }; MAX_FIELDS];
        let mut req = httparse::Request::new(&mut []);
        let len = match req.parse_with_uninit_headers(&self.conn.buf, &mut headers) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err("the request has too many header fields"),
            Err(_) => return Err("the request is not valid HTTP/1.1"),
        };
        let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes())
            .map_err(|_| "the request method is not valid")?;
        let http10 = req.version == Some(0);
        let target_bytes = req.path.unwrap_or_default().as_bytes();
        let target_range = at(&self.conn.buf, target_bytes);
        let path = path_of(target_bytes).ok_or("the request target is not a path")?;
        let list = Fields::locate(&self.conn.buf, req.headers);
        let fields = Fields::split(&mut self.conn.buf, len, list);
        let target = fields.slice(target_range);
        let keepalive = if http10 {
            fields.has_token("connection", "keep-alive")
        } else {
            !fields.has_token("connection", "close")
        };
        Ok(Some(Request { method, fields, body: Bytes::new(), target, path, keepalive, http10, framed: false }))
    }

    async fn read_body(&mut self, mut request: Request) -> Next {
        let fields = &request.fields;
        if fields.get("content-length").is_some() && fields.get("transfer-encoding").is_some() {
            let why = "a request framed by both Content-Length and Transfer-Encoding is refused";
            return Next::Refused(Reply::error(400, "invalid_request", why));
        }
        let Some(mut framing) = framing(fields, true) else {
            let why = "the request body's framing is not valid (Content-Length, or Transfer-Encoding: chunked)";
            return Next::Refused(Reply::error(400, "invalid_request", why));
        };
        request.framed = framing != Framing::Length(0) || fields.get("content-length").is_some();
        if let Framing::Length(n) = framing
            && n > self.max_body as u64
        {
            return Next::Refused(too_large());
        }
        if framing != Framing::Length(0)
            && !request.http10
            && fields.has_token("expect", "100-continue")
            && self.write(b"HTTP/1.1 100 Continue\r\n\r\n").await.is_err()
        {
            return Next::Gone;
        }
        let whole = match framing {
            Framing::Length(n) => Some(n),
            _ => None,
        };
        let mut body = BytesMut::new();
        loop {
            match self.conn.next(&mut framing).await {
                Ok(Some(piece)) if body.is_empty() && Some(piece.len() as u64) == whole => {
                    // The whole body in one piece, as a small one comes: no copy.
                    request.body = piece;
                    return Next::Request(Box::new(request));
                }
                Ok(Some(piece)) => {
                    if body.len() + piece.len() > self.max_body {
                        return Next::Refused(too_large());
                    }
                    body.extend_from_slice(&piece);
                }
                Ok(None) => break,
                Err(e) if e.etype() == &pingora::ErrorType::InvalidHTTPHeader => {
                    return Next::Refused(Reply::error(
                        400,
                        "invalid_request",
                        "the request body's chunks are not valid",
                    ));
                }
                Err(_) => return Next::Gone,
            }
        }
        request.body = body.freeze();
        Next::Request(Box::new(request))
    }

    /// Writes `bytes` and flushes them, within the timeout.
    pub async fn write(&mut self, bytes: &[u8]) -> pingora::Result<()> {
        write_all(&mut self.conn.stream, bytes, self.conn.timeout, self.conn.peer).await
    }

    /// Writes one of the gateway's own answers whole; `request` is `None` when there is none to answer (it
    /// was not valid), and the connection then closes.
    pub async fn respond(&mut self, request: Option<&Request>, reply: &Reply, keepalive: bool) -> pingora::Result<()> {
        let mut out = head(reply.status, keepalive && request.is_some(), false, reply.body.len() + 256);
        for (name, value) in &reply.headers {
            field(&mut out, name.as_bytes(), value.as_bytes());
        }
        field(&mut out, b"content-length", reply.body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
        if request.is_none_or(|r| r.method != Method::HEAD) {
            out.extend_from_slice(&reply.body);
        }
        self.write(&out).await
    }
}

/// The status line, `Date` (unless `dated`: the fields that follow carry one) and `Connection`, in a buffer
/// with room for `more` bytes.
pub fn head(status: u16, keepalive: bool, dated: bool, more: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(128 + more);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.to_string().as_bytes());
    out.push(b' ');
    let reason = http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Unknown");
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\r\n");
    if !dated {
        field(&mut out, b"date", get_cached_date().as_bytes());
    }
    field(&mut out, b"connection", if keepalive { b"keep-alive" } else { b"close" });
    out
}

/// One header field line.
pub fn field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

fn too_large() -> Reply {
    Reply::error(413, "body_too_large", "the request body is larger than the gateway forwards")
}

/// Where the path sits in a request target: origin form (`/events/1?x`), absolute form
/// (`http://host/events/1`) or `*`; `None` for anything else.
fn path_of(target: &[u8]) -> Option<Range<usize>> {
    let start = if target.first() == Some(&b'/') {
        0
    } else if target == b"*" {
        return Some(0..1);
    } else {
        let scheme = target.windows(3).position(|w| w == b"://")?;
        let after = scheme + 3;
        after + target[after..].iter().position(|&b| b == b'/').unwrap_or(target.len() - after)
    };
    let end = start + target[start..].iter().position(|&b| b == b'?' || b == b'#').unwrap_or(target.len() - start);
    std::str::from_utf8(&target[start..end]).ok()?;
    Some(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_head_trickled_in_byte_by_byte_is_dropped_at_the_timeout() {
        let (ours, mut theirs) = tokio::net::UnixStream::pair().expect("a socket pair");
        let stream: Stream = Box::new(pingora::protocols::l4::stream::Stream::from(ours));
        let mut client = Client::new(stream, Duration::from_millis(300), 1024);
        let trickle = tokio::spawn(async move {
            // A byte every 20 ms: each read is quick, the head never ends; bounded at 5 s.
            let head = b"GET /events/1 HTTP/1.1\r\nx-pad: ".iter().chain(std::iter::repeat_n(&b'a', 250));
            for byte in head {
                if theirs.write_all(&[*byte]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let started = Instant::now();
        assert!(matches!(client.read(Duration::from_secs(5)).await, Next::Gone));
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(2), "dropped after {took:?}");
        trickle.abort();
    }

    #[test]
    fn the_path_is_found_in_every_request_target_form() {
        let path = |t: &str| path_of(t.as_bytes()).map(|r| t[r].to_owned());
        assert_eq!(path("/events/1?x=2").as_deref(), Some("/events/1"));
        assert_eq!(path("/").as_deref(), Some("/"));
        assert_eq!(path("http://example.com/events/1?q").as_deref(), Some("/events/1"));
        assert_eq!(path("http://example.com").as_deref(), Some(""));
        assert_eq!(path("*").as_deref(), Some("*"));
        assert_eq!(path("example.com:443"), None);
    }
}
