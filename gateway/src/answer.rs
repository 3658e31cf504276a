//! Reading booking's answer on a kept connection: the head, parsed by httparse straight into the header the
//! client gets, then the body as it arrives, unframed (pingora frames it again for the client). Framing follows
//! RFC 9112 6.3: no body to a HEAD or for 1xx, 204 and 304; `Transfer-Encoding` ending in `chunked` (any other
//! ends at the close); else `Content-Length`; else the body runs until booking closes the connection.
//!
//! Every read waits at most the upstream timeout. A connection is worth keeping only when booking spoke
//! HTTP/1.1 without `Connection: close` and the body ended exactly where the bytes read did.

use std::ops::Range;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use pingora::ErrorType::{ConnectionClosed, InvalidHTTPHeader, ReadError, ReadTimedout};
use pingora::OrErr;
use pingora::http::ResponseHeader;
use pingora::protocols::Stream;
use tokio::io::AsyncReadExt;

/// The most headers an answer may carry, and the longest head or chunk-size line.
const MAX_HEADERS: usize = 64;
const MAX_HEAD_BYTES: usize = 64 * 1024;
const MAX_LINE_BYTES: usize = 4 * 1024;
/// Response headers that belong to booking's connection, not the client's.
const HOP_BY_HOP: [&str; 2] = ["connection", "keep-alive"];

/// How the body after the head is framed, and how much of it is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Bytes left of a `Content-Length` body (0: done, or no body at all).
    Length(u64),
    /// Expecting a chunk-size line.
    ChunkSize,
    /// Bytes left of the current chunk's data.
    ChunkData(u64),
    /// Expecting the CRLF after a chunk's data.
    ChunkEnd,
    /// After the last chunk: trailer lines until an empty one.
    Trailers,
    /// Until booking closes the connection.
    UntilClose,
    Done,
}

/// Booking's answer on one connection: the head once read, then the body piece by piece.
pub struct Answer {
    stream: Stream,
    buf: BytesMut,
    timeout: Duration,
    framing: Framing,
    keepalive: bool,
}

impl Answer {
    /// Reads the head of booking's answer (skipping informational ones) to a request whose method was HEAD or
    /// not: the header for the client, and the reader of the body that follows.
    pub async fn read(
        stream: Stream,
        timeout: Duration,
        head_request: bool,
    ) -> pingora::Result<(Box<ResponseHeader>, Self)> {
        let mut answer =
            Self { stream, buf: BytesMut::with_capacity(4096), timeout, framing: Framing::Done, keepalive: false };
        loop {
            let (header, framing, keepalive) = answer.read_head(head_request).await?;
            if header.status.is_informational() {
                continue;
            }
            answer.framing = framing;
            answer.keepalive = keepalive;
            return Ok((header, answer));
        }
    }

    async fn read_head(&mut self, head_request: bool) -> pingora::Result<(Box<ResponseHeader>, Framing, bool)> {
        loop {
            if !self.buf.is_empty() {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut resp = httparse::Response::new(&mut headers);
                match resp.parse(&self.buf) {
                    Ok(httparse::Status::Complete(len)) => {
                        // Where each name and value sits in the head, so they can share its bytes once split off.
                        let base = self.buf.as_ptr() as usize;
                        let at = |part: &[u8]| {
                            let start = part.as_ptr() as usize - base;
                            start..start + part.len()
                        };
                        let fields: Vec<Field> =
                            resp.headers.iter().map(|h| (at(h.name.as_bytes()), at(h.value))).collect();
                        let (code, version) = (resp.code.unwrap_or(0), resp.version);
                        let head = self.buf.split_to(len).freeze();
                        return parsed(code, version, &fields, &head, head_request);
                    }
                    Ok(httparse::Status::Partial) => {}
                    Err(e) => return pingora::Error::e_explain(InvalidHTTPHeader, format!("booking's answer: {e}")),
                }
                if self.buf.len() >= MAX_HEAD_BYTES {
                    return pingora::Error::e_explain(InvalidHTTPHeader, "booking's answer head is too long");
                }
            }
            let read = match self.fill().await {
                // Half an answer means booking had the request: whatever the read met, not a reason to send it again.
                Err(e) if !self.buf.is_empty() && e.etype() == &ReadError => {
                    return pingora::Error::e_because(InvalidHTTPHeader, "booking's answer broke off mid-head", e);
                }
                read => read?,
            };
            if read == 0 {
                // Nothing at all on a kept connection is booking having closed it: the caller may try another. Half
                // an answer is not that: booking had the request.
                return if self.buf.is_empty() {
                    pingora::Error::e_explain(ConnectionClosed, "booking closed the connection")
                } else {
                    pingora::Error::e_explain(InvalidHTTPHeader, "booking closed the connection mid-head")
                };
            }
        }
    }

    /// The next piece of the body, unframed, or `None` once it is whole.
    pub async fn next(&mut self) -> pingora::Result<Option<Bytes>> {
        loop {
            match self.framing {
                Framing::Done | Framing::Length(0) => {
                    self.framing = Framing::Done;
                    return Ok(None);
                }
                Framing::Length(left) => {
                    let piece = self.take(left).await?;
                    self.framing = Framing::Length(left - piece.len() as u64);
                    return Ok(Some(piece));
                }
                Framing::ChunkData(left) => {
                    let piece = self.take(left).await?;
                    let left = left - piece.len() as u64;
                    self.framing = if left == 0 { Framing::ChunkEnd } else { Framing::ChunkData(left) };
                    return Ok(Some(piece));
                }
                Framing::UntilClose => {
                    if self.buf.is_empty() && self.fill().await? == 0 {
                        self.framing = Framing::Done;
                        return Ok(None);
                    }
                    return Ok(Some(self.buf.split().freeze()));
                }
                Framing::ChunkSize => match httparse::parse_chunk_size(&self.buf) {
                    Ok(httparse::Status::Complete((len, size))) => {
                        self.buf.advance(len);
                        self.framing = if size == 0 { Framing::Trailers } else { Framing::ChunkData(size) };
                    }
                    Ok(httparse::Status::Partial) => self.more_line().await?,
                    Err(_) => return pingora::Error::e_explain(InvalidHTTPHeader, "booking sent a bad chunk size"),
                },
                Framing::ChunkEnd => {
                    if self.buf.len() < 2 {
                        self.more_line().await?;
                        continue;
                    }
                    if &self.buf[..2] != b"\r\n" {
                        return pingora::Error::e_explain(InvalidHTTPHeader, "booking's chunk did not end in CRLF");
                    }
                    self.buf.advance(2);
                    self.framing = Framing::ChunkSize;
                }
                Framing::Trailers => match self.buf.windows(2).position(|w| w == b"\r\n") {
                    // Trailers are booking's to its own connection here: dropped; the empty line ends the body.
                    Some(0) => {
                        self.buf.advance(2);
                        self.framing = Framing::Done;
                    }
                    Some(end) => self.buf.advance(end + 2),
                    None => self.more_line().await?,
                },
            }
        }
    }

    /// The connection, when the answer ended exactly where the bytes read did and booking keeps it open.
    pub fn reusable(self) -> Option<Stream> {
        (self.keepalive && self.framing == Framing::Done && self.buf.is_empty()).then_some(self.stream)
    }

    /// Up to `left` bytes of body: what is buffered, else what the next read brings.
    async fn take(&mut self, left: u64) -> pingora::Result<Bytes> {
        if self.buf.is_empty() && self.fill().await? == 0 {
            return pingora::Error::e_explain(ConnectionClosed, "booking closed the connection mid-body");
        }
        let n = usize::try_from(left).unwrap_or(usize::MAX).min(self.buf.len());
        Ok(self.buf.split_to(n).freeze())
    }

    /// Reads more of a framing line, which must come whole within a few KiB.
    async fn more_line(&mut self) -> pingora::Result<()> {
        if self.buf.len() >= MAX_LINE_BYTES {
            return pingora::Error::e_explain(InvalidHTTPHeader, "booking's chunk framing line is too long");
        }
        if self.fill().await? == 0 {
            return pingora::Error::e_explain(ConnectionClosed, "booking closed the connection mid-body");
        }
        Ok(())
    }

    /// One read into the buffer, within the timeout; 0 when booking closed the connection.
    async fn fill(&mut self) -> pingora::Result<usize> {
        self.buf.reserve(4096);
        match tokio::time::timeout(self.timeout, self.stream.read_buf(&mut self.buf)).await {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(e)) => pingora::Error::e_because(ReadError, "reading booking's answer", e),
            Err(_) => pingora::Error::e_explain(ReadTimedout, "booking did not answer in time"),
        }
    }
}

/// A header's name and value, as ranges of the head's bytes.
type Field = (Range<usize>, Range<usize>);

/// The client's header, the body's framing and whether booking keeps the connection, from a parsed head.
fn parsed(
    status: u16,
    version: Option<u8>,
    fields: &[Field],
    head: &Bytes,
    head_request: bool,
) -> pingora::Result<(Box<ResponseHeader>, Framing, bool)> {
    let mut header = Box::new(ResponseHeader::build_no_case(status, Some(fields.len()))?);
    if version == Some(0) {
        header.set_version(pingora::http::Version::HTTP_10);
    }
    let mut keepalive = version == Some(1);
    let (mut chunked, mut coded, mut length): (bool, bool, Option<u64>) = (false, false, None);
    for (name, value) in fields {
        let (name, value) = (&head[name.clone()], head.slice(value.clone()));
        if name.eq_ignore_ascii_case(b"connection") {
            let close = value.split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
            keepalive &= !close;
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            coded = true;
            let last = value.rsplit(|&b| b == b',').next().unwrap_or_default();
            chunked = last.trim_ascii().eq_ignore_ascii_case(b"chunked");
        } else if name.eq_ignore_ascii_case(b"content-length") {
            let n = std::str::from_utf8(&value).ok().and_then(|v| v.trim().parse::<u64>().ok());
            match (n, length) {
                (Some(n), None) => length = Some(n),
                (Some(n), Some(seen)) if n == seen => {}
                _ => return pingora::Error::e_explain(InvalidHTTPHeader, "booking sent a bad Content-Length"),
            }
        }
        if HOP_BY_HOP.iter().any(|hop| name.eq_ignore_ascii_case(hop.as_bytes())) {
            continue;
        }
        let name = http::HeaderName::from_bytes(name).or_err(InvalidHTTPHeader, "booking sent a bad header name")?;
        let value =
            http::HeaderValue::from_maybe_shared(value).or_err(InvalidHTTPHeader, "booking sent a bad header value")?;
        header.append_header(name, value)?;
    }
    let framing = if head_request || matches!(status, 100..=199 | 204 | 304) {
        Framing::Length(0)
    } else if coded {
        if chunked { Framing::ChunkSize } else { Framing::UntilClose }
    } else {
        length.map_or(Framing::UntilClose, Framing::Length)
    };
    keepalive &= framing != Framing::UntilClose;
    Ok((header, framing, keepalive))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    const WAIT: Duration = Duration::from_secs(5);

    /// Booking's side writes `pieces` one by one (each its own write, so the reader meets every boundary), then
    /// closes its end if `close`, else keeps it open until the test ends.
    async fn booking_says(
        pieces: &[&[u8]],
        close: bool,
        head_request: bool,
    ) -> pingora::Result<(Box<ResponseHeader>, Answer)> {
        let (ours, mut booking) = tokio::net::UnixStream::pair().expect("a socket pair");
        let pieces: Vec<Vec<u8>> = pieces.iter().map(|p| p.to_vec()).collect();
        tokio::spawn(async move {
            for piece in pieces {
                booking.write_all(&piece).await.expect("write");
                booking.flush().await.expect("flush");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if !close {
                tokio::time::sleep(WAIT).await;
            }
        });
        let stream: Stream = Box::new(pingora::protocols::l4::stream::Stream::from(ours));
        Answer::read(stream, WAIT, head_request).await
    }

    async fn body(answer: &mut Answer) -> pingora::Result<Vec<u8>> {
        let mut body = Vec::new();
        while let Some(piece) = answer.next().await? {
            body.extend_from_slice(&piece);
        }
        Ok(body)
    }

    #[tokio::test]
    async fn a_length_framed_body_split_across_reads_and_a_kept_connection() {
        let (header, mut answer) = booking_says(
            &[
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nconte",
                b"nt-length: 11\r\n\r\n{\"a\":",
                b"[1,2]}",
            ],
            false,
            false,
        )
        .await
        .expect("answer");
        assert_eq!(header.status.as_u16(), 200);
        assert_eq!(header.headers.get("content-type").map(|v| v.as_bytes()), Some(&b"application/json"[..]));
        assert_eq!(header.headers.get("content-length").map(|v| v.as_bytes()), Some(&b"11"[..]));
        assert_eq!(body(&mut answer).await.expect("body"), br#"{"a":[1,2]}"#);
        assert!(answer.reusable().is_some(), "HTTP/1.1, whole body, nothing more: the connection is kept");
    }

    #[tokio::test]
    async fn a_chunked_body_with_extensions_and_trailers_is_unframed() {
        let (header, mut answer) = booking_says(
            &[
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhel",
                b"lo\r\n6\r",
                b"\n world\r\n0\r\nX-Trailer: t\r\n",
                b"\r\n",
            ],
            false,
            false,
        )
        .await
        .expect("answer");
        assert_eq!(header.headers.get("transfer-encoding").map(|v| v.as_bytes()), Some(&b"chunked"[..]));
        assert_eq!(body(&mut answer).await.expect("body"), b"hello world");
        assert!(answer.reusable().is_some());
    }

    #[tokio::test]
    async fn a_body_without_framing_runs_until_the_close_and_the_connection_is_not_kept() {
        let (_, mut answer) =
            booking_says(&[b"HTTP/1.1 200 OK\r\n\r\nall of", b" it"], true, false).await.expect("answer");
        assert_eq!(body(&mut answer).await.expect("body"), b"all of it");
        assert!(answer.reusable().is_none());
    }

    #[tokio::test]
    async fn connection_close_and_http_1_0_are_not_kept_and_hop_by_hop_headers_stay_behind() {
        let (header, mut answer) = booking_says(&[b"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\nok"],
            false,
            false,
        )
        .await
        .expect("answer");
        assert!(header.headers.get("connection").is_none() && header.headers.get("keep-alive").is_none());
        assert_eq!(body(&mut answer).await.expect("body"), b"ok");
        assert!(answer.reusable().is_none(), "booking said close");
        let (header, mut answer) =
            booking_says(&[b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"], false, false).await.expect("answer");
        assert_eq!(header.version, pingora::http::Version::HTTP_10);
        assert_eq!(body(&mut answer).await.expect("body"), b"ok");
        assert!(answer.reusable().is_none(), "HTTP/1.0 closes by default");
    }

    #[tokio::test]
    async fn informational_answers_are_skipped_and_head_204_and_304_carry_no_body() {
        let (header, mut answer) = booking_says(
            &[b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 201 Created\r\nContent-Length: 3\r\n\r\nnew"],
            false,
            false,
        )
        .await
        .expect("answer");
        assert_eq!(header.status.as_u16(), 201);
        assert_eq!(body(&mut answer).await.expect("body"), b"new");
        let (_, mut answer) =
            booking_says(&[b"HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n"], false, true).await.expect("HEAD");
        assert_eq!(body(&mut answer).await.expect("no body"), b"");
        assert!(answer.reusable().is_some(), "a HEAD answer ends with its head");
        for status in ["204 No Content", "304 Not Modified"] {
            let head = format!("HTTP/1.1 {status}\r\nContent-Length: 7\r\n\r\n");
            let (_, mut answer) = booking_says(&[head.as_bytes()], false, false).await.expect("answer");
            assert_eq!(body(&mut answer).await.expect("no body"), b"", "{status}");
        }
    }

    #[tokio::test]
    async fn bytes_past_the_body_mean_the_connection_is_not_kept() {
        let (_, mut answer) =
            booking_says(&[b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200"], false, false)
                .await
                .expect("answer");
        assert_eq!(body(&mut answer).await.expect("body"), b"ok");
        assert!(answer.reusable().is_none());
    }

    #[tokio::test]
    async fn bad_answers_are_errors_and_only_a_silent_close_may_be_retried() {
        let closed = booking_says(&[], true, false).await.err().expect("nothing at all");
        assert_eq!(closed.etype(), &ConnectionClosed, "booking closed a kept connection: another may be tried");
        let half = booking_says(&[b"HTTP/1.1 200 OK\r\nContent-"], true, false).await.err().expect("half a head");
        assert_eq!(half.etype(), &InvalidHTTPHeader, "booking had the request: not to be sent again");
        let lengths =
            booking_says(&[b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok"], false, false);
        assert_eq!(lengths.await.err().expect("two lengths").etype(), &InvalidHTTPHeader);
        let garbage = booking_says(&[b"SMTP ready\r\n\r\n"], false, false).await.err().expect("not HTTP");
        assert_eq!(garbage.etype(), &InvalidHTTPHeader);
        let (_, mut answer) =
            booking_says(&[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"], false, false)
                .await
                .expect("head");
        assert_eq!(answer.next().await.expect_err("bad chunk size").etype(), &InvalidHTTPHeader);
        let (_, mut answer) =
            booking_says(&[b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"], true, false).await.expect("head");
        assert_eq!(answer.next().await.expect("first piece"), Some(Bytes::from_static(b"short")));
        assert_eq!(answer.next().await.expect_err("closed mid-body").etype(), &ConnectionClosed);
    }

    #[tokio::test]
    async fn a_head_longer_than_the_limit_is_refused() {
        let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
        while head.len() <= MAX_HEAD_BYTES {
            head.extend_from_slice(
                b"X-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
            );
        }
        let refused = booking_says(&[&head], false, false).await.err().expect("too long");
        assert_eq!(refused.etype(), &InvalidHTTPHeader);
    }
}
