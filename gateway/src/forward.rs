//! Forwarding one admitted request to booking over a kept-alive HTTP/1.1 connection, in the request's own task:
//! the request is read whole first (bodies are small and capped), written upstream in one write, and the
//! response streamed back. Idle connections wait in a small LIFO pool; one that booking closed is noticed when it
//! is taken (a read that does not block) and dropped. The request to booking is written here from the client's
//! parsed head (`client.rs`), straight into one buffer; booking's answer is read by `answer.rs` and framed again
//! here for the client, its fields passed on as booking wrote them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use http::Method;
use pingora::protocols::Stream;
use tokio::io::{AsyncRead, ReadBuf};

use crate::answer::{Answer, Head, Length};
use crate::client::{self, Client, Request};

/// Booking's answer is written to the client in pieces of about this size (a small answer in one write).
const WRITE_CHUNK: usize = 64 * 1024;
/// Idle connections kept at most; more are closed when returned.
const MAX_IDLE: usize = 128;
/// An idle connection older than this is closed rather than reused (booking's server closes idle connections
/// after 30 s of silence; this stays well inside that).
const MAX_IDLE_AGE: Duration = Duration::from_secs(20);
/// A body's framing headers: each side's framing is its own.
const FRAMING: [&str; 2] = ["content-length", "transfer-encoding"];
/// Hop-by-hop request headers, not forwarded (RFC 9110 7.6.1): the upstream connection is the gateway's;
/// `expect` too: the gateway answers a client's `100-continue` itself and sends booking the body at once.
const NOT_FORWARDED: [&str; 7] =
    ["connection", "keep-alive", "proxy-connection", "te", "upgrade", "proxy-authorization", "expect"];

/// Why a request could not be forwarded.
#[derive(Debug)]
pub enum ForwardError {
    /// Booking could not be reached, or failed before its answer began to reach the client: nothing was sent
    /// downstream.
    Upstream(Box<pingora::Error>),
    /// The answer could not be passed on whole (the client's side failed, or booking's broke off mid-body):
    /// nothing more can be said to the client.
    Downstream(Box<pingora::Error>),
}

/// Where booking answers.
#[derive(Debug, Clone)]
pub enum Target {
    Tcp(SocketAddr),
    /// A Unix socket: booking on the same machine.
    Unix(PathBuf),
}

/// Booking's address and the idle connections to it.
pub struct Upstream {
    target: Target,
    timeout: Duration,
    idle: Mutex<Vec<(Stream, Instant)>>,
}

impl Upstream {
    pub fn new(target: Target, timeout: Duration) -> Self {
        Self { target, timeout, idle: Mutex::new(Vec::new()) }
    }

    /// Forwards `req` and passes booking's answer back to `down`, saying the connection stays open if
    /// `keepalive` (and the answer can be framed for it); returns the answer's status and whether it did.
    pub async fn forward(
        &self,
        down: &mut Client,
        req: &Request,
        keepalive: bool,
    ) -> Result<(u16, bool), ForwardError> {
        let request = request_bytes(req);
        // A HEAD answer announces a body it does not carry.
        let head_request = req.method == Method::HEAD;
        // A reused connection may have been closed by booking just as it was taken: one more try on a fresh one
        // when it turned out closed (not when booking was slow: that request may be in hand).
        let (stream, reused) = self.connection().await?;
        let mut sent = self.exchange(stream, &request, head_request).await;
        if reused
            && let Err(e) = &sent
            && closed(e)
        {
            tracing::debug!(error = %e, "a reused connection to booking failed; trying a fresh one");
            sent = self.exchange(self.connect().await?, &request, head_request).await;
        }
        let (head, mut up) = sent.map_err(ForwardError::Upstream)?;
        // An answer of unknown length goes chunked to an HTTP/1.1 client, and to an HTTP/1.0 one until the close.
        let chunked = head.length == Length::Unknown && !req.http10;
        let keepalive = keepalive && (head.length != Length::Unknown || chunked);
        let mut out = answer_head(&head, keepalive, chunked);
        let mut written = false;
        loop {
            match up.next().await {
                Ok(Some(piece)) if chunked => {
                    out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                    out.extend_from_slice(&piece);
                    out.extend_from_slice(b"\r\n");
                }
                Ok(Some(piece)) => out.extend_from_slice(&piece),
                Ok(None) => break,
                // Booking broke off before the client got a byte: as if it had not answered.
                Err(e) if !written => return Err(ForwardError::Upstream(e)),
                // The answer is cut short: the client's connection cannot go on, and booking's is not reused.
                Err(e) => return Err(ForwardError::Downstream(e)),
            }
            if out.len() >= WRITE_CHUNK {
                down.write(&out).await.map_err(ForwardError::Downstream)?;
                out.clear();
                written = true;
            }
        }
        if chunked {
            out.extend_from_slice(b"0\r\n\r\n");
        }
        down.write(&out).await.map_err(ForwardError::Downstream)?;
        if let Some(stream) = up.reusable() {
            self.put(stream);
        }
        Ok((head.status, keepalive))
    }

    /// Writes the request on `stream` and reads booking's answer up to its body.
    async fn exchange(
        &self,
        mut stream: Stream,
        request: &[u8],
        head_request: bool,
    ) -> pingora::Result<(Head, Answer)> {
        crate::wire::write_all(&mut stream, request, self.timeout, "booking").await?;
        Answer::read(stream, self.timeout, head_request).await
    }

    /// An idle connection still open, or a new one; and whether it was reused.
    async fn connection(&self) -> Result<(Stream, bool), ForwardError> {
        while let Some(mut stream) = self.take() {
            if still_open(&mut stream) {
                return Ok((stream, true));
            }
        }
        Ok((self.connect().await?, false))
    }

    async fn connect(&self) -> Result<Stream, ForwardError> {
        use pingora::protocols::l4::stream::Stream as L4;
        let connect = async {
            match &self.target {
                Target::Tcp(addr) => {
                    let tcp = tokio::net::TcpStream::connect(addr).await?;
                    let _ = tcp.set_nodelay(true);
                    Ok::<_, std::io::Error>(L4::from(tcp))
                }
                Target::Unix(path) => Ok(L4::from(tokio::net::UnixStream::connect(path).await?)),
            }
        };
        let stream = tokio::time::timeout(self.timeout, connect)
            .await
            .map_err(|_| upstream_error(pingora::ErrorType::ConnectTimedout, "connecting to booking timed out"))?
            .map_err(|e| upstream_error(pingora::ErrorType::ConnectRefused, &format!("connecting to booking: {e}")))?;
        Ok(Box::new(stream))
    }

    fn take(&self) -> Option<Stream> {
        let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while let Some((stream, since)) = idle.pop() {
            if since.elapsed() < MAX_IDLE_AGE {
                return Some(stream);
            }
        }
        None
    }

    fn put(&self, stream: Stream) {
        let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push((stream, Instant::now()));
        }
    }
}

/// The request as booking gets it, in one buffer: the client's method and target as they came, HTTP/1.1, the
/// client's fields less the hop-by-hop ones and its body framing, a `content-length` when the client framed a
/// body (or sent one), and the body. httparse checked every name and value: none can carry a CR or LF.
fn request_bytes(req: &Request) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(256 + req.fields.iter().map(|(n, v)| n.len() + v.len() + 4).sum::<usize>() + req.body.len());
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(req.target());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in req.fields.iter() {
        let hop = |h: &&str| name.eq_ignore_ascii_case(h.as_bytes());
        if NOT_FORWARDED.iter().any(hop) || FRAMING.iter().any(hop) {
            continue;
        }
        client::field(&mut out, name, value);
    }
    if req.framed || !req.body.is_empty() {
        client::field(&mut out, b"content-length", req.body.len().to_string().as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&req.body);
    out
}

/// The head of booking's answer as the client gets it: its fields as booking wrote them, framed for the client
/// (the length it will get, or chunks), or as they are when no body follows whatever they say.
fn answer_head(head: &Head, keepalive: bool, chunked: bool) -> Vec<u8> {
    let mut out = client::head(head.status, keepalive, head.fields.get("date").is_some(), 512);
    for (name, value) in head.fields.iter() {
        if head.length != Length::NoBody && FRAMING.iter().any(|h| name.eq_ignore_ascii_case(h.as_bytes())) {
            continue;
        }
        client::field(&mut out, name, value);
    }
    match head.length {
        Length::Known(n) => client::field(&mut out, b"content-length", n.to_string().as_bytes()),
        Length::Unknown if chunked => client::field(&mut out, b"transfer-encoding", b"chunked"),
        _ => {}
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Whether an idle connection is still open: reading from it must not be ready (booking sends nothing
/// unasked, so anything ready is its close, an error, or garbage). Costs nothing while the socket is quiet.
fn still_open(stream: &mut Stream) -> bool {
    let mut byte = [0u8; 1];
    let mut buf = ReadBuf::new(&mut byte);
    let mut cx = Context::from_waker(Waker::noop());
    matches!(std::pin::Pin::new(stream).poll_read(&mut cx, &mut buf), Poll::Pending)
}

/// Whether a failed exchange met a closed or reset connection, rather than a timeout or a bad answer.
fn closed(e: &pingora::Error) -> bool {
    use pingora::ErrorType::{ConnectionClosed, ReadError, WriteError};
    matches!(e.etype(), ConnectionClosed | ReadError | WriteError)
}

fn upstream_error(kind: pingora::ErrorType, why: &str) -> ForwardError {
    ForwardError::Upstream(pingora::Error::explain(kind, why.to_owned()))
}
