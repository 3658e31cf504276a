//! Forwarding one admitted request to booking over a kept-alive HTTP/1.1 connection, in the request's own task:
//! the request is read whole first (bodies are small and capped), written upstream in one write, and the
//! response streamed back. Idle connections wait in a small LIFO pool; one that booking closed is noticed when it
//! is taken (a read that does not block) and dropped. pingora parses the client's request and frames the answer
//! to the client; the request to booking is written here, from pingora's parsed header, straight into one buffer,
//! and booking's answer read by `answer.rs` (pingora's client would clone the request header, build and serialise
//! another, and build booking's answer into a header that the gateway then had to clone).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use pingora::http::{Method, RequestHeader, ResponseHeader};
use pingora::protocols::Stream;
use pingora::protocols::http::ServerSession;
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};

use crate::answer::Answer;

/// Idle connections kept at most; more are closed when returned.
const MAX_IDLE: usize = 128;
/// An idle connection older than this is closed rather than reused (booking's server closes idle connections
/// after 30 s of silence; this stays well inside that).
const MAX_IDLE_AGE: Duration = Duration::from_secs(20);
/// Hop-by-hop request headers, not forwarded (RFC 9110 7.6.1): the upstream connection is the gateway's;
/// `expect` too: the gateway answers a client's `100-continue` itself and sends booking the body at once.
const NOT_FORWARDED: [&str; 7] =
    ["connection", "keep-alive", "proxy-connection", "te", "upgrade", "proxy-authorization", "expect"];

/// Why a request could not be forwarded.
#[derive(Debug)]
pub enum ForwardError {
    /// Booking could not be reached or failed before answering: nothing was sent downstream.
    Upstream(Box<pingora::Error>),
    /// The client's side failed (its body or the write of the answer): nothing more can be said to it.
    Downstream(Box<pingora::Error>),
    /// The request body is larger than the gateway forwards.
    TooLarge,
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
    max_body: usize,
    timeout: Duration,
    idle: Mutex<Vec<(Stream, Instant)>>,
}

impl Upstream {
    pub fn new(target: Target, max_body: usize, timeout: Duration) -> Self {
        Self { target, max_body, timeout, idle: Mutex::new(Vec::new()) }
    }

    /// Forwards the request `down` carries and streams booking's answer back; returns the answer's status.
    pub async fn forward(&self, down: &mut ServerSession) -> Result<u16, ForwardError> {
        let body = self.read_body(down).await?;
        let request = request_bytes(down.req_header(), &body);
        // A HEAD answer announces a body it does not carry.
        let head_request = down.req_header().method == Method::HEAD;
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
        let (resp, mut up) = sent.map_err(ForwardError::Upstream)?;
        let status = resp.status.as_u16();
        down.write_response_header(resp).await.map_err(ForwardError::Downstream)?;
        loop {
            match up.next().await {
                Ok(Some(chunk)) => down.write_response_body(chunk, false).await.map_err(ForwardError::Downstream)?,
                Ok(None) => break,
                // The answer is half sent: the client's connection cannot be reused, and neither can booking's.
                Err(e) => return Err(ForwardError::Downstream(e)),
            }
        }
        if let Some(stream) = up.reusable() {
            self.put(stream);
        }
        Ok(status)
    }

    /// Writes the request on `stream` and reads booking's answer up to its body.
    async fn exchange(
        &self,
        mut stream: Stream,
        request: &[u8],
        head_request: bool,
    ) -> pingora::Result<(Box<ResponseHeader>, Answer)> {
        let write = async {
            stream.write_all(request).await?;
            stream.flush().await
        };
        match tokio::time::timeout(self.timeout, write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return pingora::Error::e_because(pingora::ErrorType::WriteError, "writing to booking", e),
            Err(_) => return pingora::Error::e_explain(pingora::ErrorType::WriteTimedout, "writing to booking"),
        }
        Answer::read(stream, self.timeout, head_request).await
    }

    async fn read_body(&self, down: &mut ServerSession) -> Result<Bytes, ForwardError> {
        let expects = down.get_header("expect").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        if expects {
            down.write_continue_response().await.map_err(ForwardError::Downstream)?;
        }
        let mut body = BytesMut::new();
        while let Some(chunk) = down.read_request_body().await.map_err(ForwardError::Downstream)? {
            if body.len() + chunk.len() > self.max_body {
                return Err(ForwardError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
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

/// The request as booking gets it, in one buffer: the client's method and path as they came, HTTP/1.1, the
/// client's headers less the hop-by-hop ones and its body framing, a `content-length` when the client framed a
/// body (or sent one), and the body. pingora parsed and validated the request: nothing here can carry a CR or LF.
fn request_bytes(req: &RequestHeader, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + req.headers.len() * 64 + body.len());
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(req.raw_path());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut framed = !body.is_empty();
    for (name, value) in &req.headers {
        if matches!(name.as_str(), "content-length" | "transfer-encoding") {
            framed = true;
            continue;
        }
        if NOT_FORWARDED.contains(&name.as_str()) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if framed {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
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
