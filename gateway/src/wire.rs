//! HTTP/1.1 on one connection, as both of the gateway's sides read it: the client's requests (`client.rs`) and
//! booking's answers (`answer.rs`). A head's header fields stay where httparse found them, as ranges of its
//! bytes; a body is read piece by piece and unframed (RFC 9112 6: a `Content-Length`, or chunks with their
//! extensions and trailers, or, for an answer only, everything until the close).

use std::ops::Range;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use pingora::ErrorType::{ConnectionClosed, InvalidHTTPHeader, ReadError, ReadTimedout, WriteError, WriteTimedout};
use pingora::protocols::Stream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The most header fields an answer from booking may carry, the longest head, and the longest chunk-size or
/// trailer line.
pub const MAX_HEADERS: usize = 64;
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
const MAX_LINE_BYTES: usize = 4 * 1024;

/// A header field's name and value, as ranges of the head's bytes.
pub type Field = (Range<usize>, Range<usize>);

/// A parsed head's header fields, in order, sharing the head's bytes.
#[derive(Debug, Clone, Default)]
pub struct Fields {
    head: Bytes,
    list: Vec<Field>,
}

impl Fields {
    /// Where the fields httparse parsed out of `buf` sit in it.
    pub fn locate(buf: &[u8], parsed: &[httparse::Header<'_>]) -> Vec<Field> {
        parsed.iter().map(|h| (at(buf, h.name.as_bytes()), at(buf, h.value))).collect()
    }

    /// Splits the head, `buf`'s first `len` bytes, off `buf`, with its fields where [`Fields::locate`] found them.
    pub fn split(buf: &mut BytesMut, len: usize, list: Vec<Field>) -> Self {
        Self { head: buf.split_to(len).freeze(), list }
    }

    /// A part of the head's bytes, sharing them.
    pub fn slice(&self, range: Range<usize>) -> Bytes {
        self.head.slice(range)
    }

    /// Every field, name and value as sent.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.list.iter().map(|(n, v)| (&self.head[n.clone()], &self.head[v.clone()]))
    }

    /// The values of every field named `name` (ASCII case ignored).
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> {
        self.iter().filter(move |(n, _)| n.eq_ignore_ascii_case(name.as_bytes())).map(|(_, v)| v)
    }

    /// The first value of the field named `name`.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter().find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes())).map(|(_, v)| v)
    }

    /// The first value of `name`, if it is text (it is, unless a client sent bytes above ASCII).
    pub fn text(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Whether any `name` field lists `token` (comma-separated, case ignored), as `Connection: close` does.
    pub fn has_token(&self, name: &str, token: &str) -> bool {
        self.all(name).any(|v| v.split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes())))
    }

    /// Keeps only the fields whose name `keep` accepts, in order.
    pub fn retain(&mut self, mut keep: impl FnMut(&[u8]) -> bool) {
        let head = &self.head;
        self.list.retain(|(n, _)| keep(&head[n.clone()]));
    }
}

/// Where `part`, a slice of `buf`, sits in it.
pub fn at(buf: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    start..start + part.len()
}

/// How a body is framed, and how much of it is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
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
    /// Until the peer closes the connection (answers only).
    UntilClose,
    Done,
}

/// A body's framing from its head's fields, for a message that may have a body at all (RFC 9112 6.3):
/// `Transfer-Encoding` ending in `chunked` (any other coding: until the close, or `None` for a request, which
/// cannot be framed that way); else `Content-Length` (several must agree; `None` if they do not or one is not
/// a number); else, for an answer, until the close, and for a request, no body.
pub fn framing(fields: &Fields, request: bool) -> Option<Framing> {
    let (mut coded, mut chunked, mut length) = (false, false, None);
    for (name, value) in fields.iter() {
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            coded = true;
            let last = value.rsplit(|&b| b == b',').next().unwrap_or_default();
            chunked = last.trim_ascii().eq_ignore_ascii_case(b"chunked");
        } else if name.eq_ignore_ascii_case(b"content-length") {
            let digits = value.trim_ascii();
            if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let n = std::str::from_utf8(digits).ok()?.parse::<u64>().ok()?;
            match length {
                None => length = Some(n),
                Some(seen) if seen == n => {}
                Some(_) => return None,
            }
        }
    }
    match (coded, chunked, request) {
        (true, true, _) => Some(Framing::ChunkSize),
        (true, false, false) => Some(Framing::UntilClose),
        (true, false, true) => None,
        (false, _, true) => Some(Framing::Length(length.unwrap_or(0))),
        (false, _, false) => Some(length.map_or(Framing::UntilClose, Framing::Length)),
    }
}

/// Writes `bytes` on `stream` and flushes them within `timeout`; `peer` names the other end in errors.
pub async fn write_all(stream: &mut Stream, bytes: &[u8], timeout: Duration, peer: &str) -> pingora::Result<()> {
    let write = async {
        stream.write_all(bytes).await?;
        stream.flush().await
    };
    match tokio::time::timeout(timeout, write).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => pingora::Error::e_because(WriteError, format!("writing to {peer}"), e),
        Err(_) => pingora::Error::e_explain(WriteTimedout, format!("{peer} is not reading")),
    }
}

/// One side's connection: the stream, what was read from it and not yet used, and how long a read may wait.
pub struct Conn {
    pub stream: Stream,
    pub buf: BytesMut,
    pub timeout: Duration,
    /// Who is on the other end, for error messages: "booking", "the client".
    pub peer: &'static str,
}

impl Conn {
    pub fn new(stream: Stream, timeout: Duration, peer: &'static str) -> Self {
        Self { stream, buf: BytesMut::with_capacity(4096), timeout, peer }
    }

    /// Gives the stream back, with whatever was read and not yet used.
    pub fn into_parts(self) -> (Stream, BytesMut) {
        (self.stream, self.buf)
    }

    /// One read into the buffer, within the timeout; 0 when the peer closed the connection.
    pub async fn fill(&mut self) -> pingora::Result<usize> {
        self.fill_within(self.timeout).await
    }

    /// One read into the buffer, within `wait`.
    pub async fn fill_within(&mut self, wait: Duration) -> pingora::Result<usize> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(4096);
        }
        match tokio::time::timeout(wait, self.stream.read_buf(&mut self.buf)).await {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(e)) => pingora::Error::e_because(ReadError, format!("reading from {}", self.peer), e),
            Err(_) => pingora::Error::e_explain(ReadTimedout, format!("{} sent nothing in time", self.peer)),
        }
    }

    /// The next piece of a body framed as `framing` says (which it advances), or `None` once it is whole.
    pub async fn next(&mut self, framing: &mut Framing) -> pingora::Result<Option<Bytes>> {
        loop {
            match *framing {
                Framing::Done | Framing::Length(0) => {
                    *framing = Framing::Done;
                    return Ok(None);
                }
                Framing::Length(left) => {
                    let piece = self.take(left).await?;
                    *framing = Framing::Length(left - piece.len() as u64);
                    return Ok(Some(piece));
                }
                Framing::ChunkData(left) => {
                    let piece = self.take(left).await?;
                    let left = left - piece.len() as u64;
                    *framing = if left == 0 { Framing::ChunkEnd } else { Framing::ChunkData(left) };
                    return Ok(Some(piece));
                }
                Framing::UntilClose => {
                    if self.buf.is_empty() && self.fill().await? == 0 {
                        *framing = Framing::Done;
                        return Ok(None);
                    }
                    return Ok(Some(self.buf.split().freeze()));
                }
                Framing::ChunkSize => match httparse::parse_chunk_size(&self.buf) {
                    Ok(httparse::Status::Complete((len, size))) => {
                        self.buf.advance(len);
                        *framing = if size == 0 { Framing::Trailers } else { Framing::ChunkData(size) };
                    }
                    Ok(httparse::Status::Partial) => self.more_line().await?,
                    Err(_) => return self.bad("a bad chunk size"),
                },
                Framing::ChunkEnd => {
                    if self.buf.len() < 2 {
                        self.more_line().await?;
                        continue;
                    }
                    if &self.buf[..2] != b"\r\n" {
                        return self.bad("a chunk that did not end in CRLF");
                    }
                    self.buf.advance(2);
                    *framing = Framing::ChunkSize;
                }
                Framing::Trailers => match self.buf.windows(2).position(|w| w == b"\r\n") {
                    // Trailers belong to the connection they came on: dropped; the empty line ends the body.
                    Some(0) => {
                        self.buf.advance(2);
                        *framing = Framing::Done;
                    }
                    Some(end) => self.buf.advance(end + 2),
                    None => self.more_line().await?,
                },
            }
        }
    }

    /// Up to `left` bytes of body: what is buffered, else what the next read brings.
    async fn take(&mut self, left: u64) -> pingora::Result<Bytes> {
        if self.buf.is_empty() && self.fill().await? == 0 {
            return self.closed("mid-body");
        }
        let n = usize::try_from(left).unwrap_or(usize::MAX).min(self.buf.len());
        Ok(self.buf.split_to(n).freeze())
    }

    /// Reads more of a framing line, which must come whole within a few KiB.
    async fn more_line(&mut self) -> pingora::Result<()> {
        if self.buf.len() >= MAX_LINE_BYTES {
            return self.bad("a chunk framing line that is too long");
        }
        if self.fill().await? == 0 {
            return self.closed("mid-body");
        }
        Ok(())
    }

    /// An error for a peer that broke HTTP/1.1.
    pub fn bad<T>(&self, what: &str) -> pingora::Result<T> {
        pingora::Error::e_explain(InvalidHTTPHeader, format!("{} sent {what}", self.peer))
    }

    /// An error for a peer that closed the connection `when`.
    pub fn closed<T>(&self, when: &str) -> pingora::Result<T> {
        pingora::Error::e_explain(ConnectionClosed, format!("{} closed the connection {when}", self.peer))
    }
}
