//! Reading booking's answer on a kept connection: the head, parsed by httparse and kept as its bytes (the client
//! gets its fields as booking wrote them, less the hop-by-hop ones), then the body as it arrives, unframed
//! (`client.rs` frames it again for the client). Framing follows RFC 9112 6.3: no body to a HEAD or for 1xx,
//! 204 and 304; `Transfer-Encoding` ending in `chunked` (any other ends at the close); else `Content-Length`;
//! else the body runs until booking closes the connection.
//!
//! Every read waits at most the upstream timeout. A connection is worth keeping only when booking spoke
//! HTTP/1.1 without `Connection: close` and the body ended exactly where the bytes read did.

use std::time::Duration;

use bytes::Bytes;
use pingora::ErrorType::{InvalidHTTPHeader, ReadError};
use pingora::protocols::Stream;

use crate::wire::{Conn, Fields, Framing, MAX_HEAD_BYTES, MAX_HEADERS, framing};

/// Response headers that belong to booking's connection, not the client's.
const HOP_BY_HOP: [&[u8]; 2] = [b"connection", b"keep-alive"];

/// What the client is told of the body's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Length {
    /// No body follows whatever the fields say (a HEAD's answer, 204, 304): they go to the client as they are.
    NoBody,
    /// So many bytes follow.
    Known(u64),
    /// Chunked, or until booking's close: the client's side frames it as it can.
    Unknown,
}

/// The head of booking's answer: its status and its fields, less the hop-by-hop ones.
#[derive(Debug)]
pub struct Head {
    pub status: u16,
    pub fields: Fields,
    pub length: Length,
}

/// Booking's answer on one connection: the head once read, then the body piece by piece.
pub struct Answer {
    conn: Conn,
    framing: Framing,
    keepalive: bool,
}

impl Answer {
    /// Reads the head of booking's answer (skipping informational ones) to a request whose method was HEAD or
    /// not: the head for the client, and the reader of the body that follows.
    pub async fn read(stream: Stream, timeout: Duration, head_request: bool) -> pingora::Result<(Head, Self)> {
        let mut answer = Self { conn: Conn::new(stream, timeout, "booking"), framing: Framing::Done, keepalive: false };
        loop {
            let (head, framing, keepalive) = answer.read_head(head_request).await?;
            if (100..200).contains(&head.status) {
                continue;
            }
            answer.framing = framing;
            answer.keepalive = keepalive;
            return Ok((head, answer));
        }
    }

    async fn read_head(&mut self, head_request: bool) -> pingora::Result<(Head, Framing, bool)> {
        loop {
            if !self.conn.buf.is_empty() {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut resp = httparse::Response::new(&mut headers);
                match resp.parse(&self.conn.buf) {
                    Ok(httparse::Status::Complete(len)) => {
                        let (status, version) = (resp.code.unwrap_or(0), resp.version);
                        let list = Fields::locate(&self.conn.buf, resp.headers);
                        let fields = Fields::split(&mut self.conn.buf, len, list);
                        return parsed(status, version, fields, head_request);
                    }
                    Ok(httparse::Status::Partial) => {}
                    Err(e) => return pingora::Error::e_explain(InvalidHTTPHeader, format!("booking's answer: {e}")),
                }
                if self.conn.buf.len() >= MAX_HEAD_BYTES {
                    return pingora::Error::e_explain(InvalidHTTPHeader, "booking's answer head is too long");
                }
            }
            let read = match self.conn.fill().await {
                // Half an answer means booking had the request: whatever the read met, not a reason to send it again.
                Err(e) if !self.conn.buf.is_empty() && e.etype() == &ReadError => {
                    return pingora::Error::e_because(InvalidHTTPHeader, "booking's answer broke off mid-head", e);
                }
                read => read?,
            };
            if read == 0 {
                // Nothing at all on a kept connection is booking having closed it: the caller may try another. Half
                // an answer is not that: booking had the request.
                return if self.conn.buf.is_empty() {
                    self.conn.closed("before answering")
                } else {
                    pingora::Error::e_explain(InvalidHTTPHeader, "booking closed the connection mid-head")
                };
            }
        }
    }

    /// The next piece of the body, unframed, or `None` once it is whole.
    pub async fn next(&mut self) -> pingora::Result<Option<Bytes>> {
        self.conn.next(&mut self.framing).await
    }

    /// The connection, when the answer ended exactly where the bytes read did and booking keeps it open.
    pub fn reusable(self) -> Option<Stream> {
        let (stream, buf) = self.conn.into_parts();
        (self.keepalive && self.framing == Framing::Done && buf.is_empty()).then_some(stream)
    }
}

/// The client's head, the body's framing and whether booking keeps the connection, from a parsed head.
fn parsed(
    status: u16,
    version: Option<u8>,
    mut fields: Fields,
    head_request: bool,
) -> pingora::Result<(Head, Framing, bool)> {
    if !(100..=999).contains(&status) {
        return pingora::Error::e_explain(InvalidHTTPHeader, "booking sent a bad status");
    }
    let mut keepalive = version == Some(1) && !fields.has_token("connection", "close");
    let (framing, length) = if head_request || matches!(status, 100..=199 | 204 | 304) {
        (Framing::Length(0), Length::NoBody)
    } else {
        match framing(&fields, false) {
            Some(Framing::Length(n)) => (Framing::Length(n), Length::Known(n)),
            Some(other) => (other, Length::Unknown),
            None => return pingora::Error::e_explain(InvalidHTTPHeader, "booking sent a bad Content-Length"),
        }
    };
    keepalive &= framing != Framing::UntilClose;
    fields.retain(|name| !HOP_BY_HOP.iter().any(|hop| name.eq_ignore_ascii_case(hop)));
    Ok((Head { status, fields, length }, framing, keepalive))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pingora::ErrorType::ConnectionClosed;
    use tokio::io::AsyncWriteExt;

    const WAIT: Duration = Duration::from_secs(5);

    /// Booking's side writes `pieces` one by one (each its own write, so the reader meets every boundary), then
    /// closes its end if `close`, else keeps it open until the test ends.
    async fn booking_says(pieces: &[&[u8]], close: bool, head_request: bool) -> pingora::Result<(Head, Answer)> {
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
        assert_eq!(header.status, 200);
        assert_eq!(header.fields.get("content-type"), Some(&b"application/json"[..]));
        assert_eq!(header.fields.get("content-length"), Some(&b"11"[..]));
        assert_eq!(header.length, Length::Known(11));
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
        assert_eq!(header.fields.get("transfer-encoding"), Some(&b"chunked"[..]));
        assert_eq!(header.length, Length::Unknown);
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
        assert!(header.fields.get("connection").is_none() && header.fields.get("keep-alive").is_none());
        assert_eq!(body(&mut answer).await.expect("body"), b"ok");
        assert!(answer.reusable().is_none(), "booking said close");
        let (_, mut answer) =
            booking_says(&[b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"], false, false).await.expect("answer");
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
        assert_eq!(header.status, 201);
        assert_eq!(body(&mut answer).await.expect("body"), b"new");
        let (header, mut answer) =
            booking_says(&[b"HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n"], false, true).await.expect("HEAD");
        assert_eq!(header.length, Length::NoBody, "the client gets the length a GET would have");
        assert_eq!(header.fields.get("content-length"), Some(&b"42"[..]));
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
