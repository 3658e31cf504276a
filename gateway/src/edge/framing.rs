//! The checks of a request's framing that pingora leaves to the application, made as nginx makes them, before
//! anything else reads the request: a proxy in front that reads such a request otherwise than the gateway
//! does is how request smuggling starts.
//!
//! Pingora already refuses a `Transfer-Encoding` on HTTP/1.0, a final coding other than `chunked`, and
//! `Content-Length` values that disagree or are not numbers. It does not refuse `chunked` applied twice, an
//! unknown coding before `chunked`, a missing or repeated `Host`, nor `Content-Length` beside
//! `Transfer-Encoding` (it drops the length and reads chunks), nor a line of the head that ends in a bare LF
//! (httparse reads it as a line end, where a proxy in front may not: RFC 9112 §2.2 lets a server refuse it);
//! this module does.

use http::Version;
use pingora::http::RequestHeader;

use super::fields::Fields;

/// Why a request's framing is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 400: the request is ambiguous or malformed.
    BadRequest(&'static str),
    /// 501: a transfer coding the gateway does not implement.
    UnknownCoding,
}

/// Checks an HTTP/1 request's head, whose fields `fields` has read; `raw` gives the head as it came (pingora's
/// parse drops a `Content-Length` that came with `Transfer-Encoding`, and every line end, so only the raw head
/// still shows them).
pub fn check<R: AsRef<[u8]>>(req: &RequestHeader, fields: &Fields, raw: impl FnOnce() -> R) -> Result<(), Refusal> {
    let raw = raw();
    let raw = raw.as_ref();
    if memchr::memchr_iter(b'\n', raw).any(|at| at == 0 || raw[at - 1] != b'\r') {
        return Err(Refusal::BadRequest("a line of the request's head ends in a bare LF, not CRLF"));
    }
    if fields.hosts > 1 {
        return Err(Refusal::BadRequest("the request carries more than one Host"));
    }
    if fields.hosts == 0 && req.version == Version::HTTP_11 {
        return Err(Refusal::BadRequest("an HTTP/1.1 request must carry Host"));
    }
    if !fields.transfer_encoding {
        return Ok(());
    }
    let codings: Vec<&[u8]> = req
        .headers
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(|c| c.trim_ascii())
        .collect();
    if codings.iter().any(|c| !c.eq_ignore_ascii_case(b"chunked")) {
        return Err(if codings.iter().any(|c| c.is_empty()) {
            Refusal::BadRequest("Transfer-Encoding has an empty coding")
        } else {
            Refusal::UnknownCoding
        });
    }
    if codings.len() > 1 {
        return Err(Refusal::BadRequest("Transfer-Encoding applies chunked more than once"));
    }
    let content_length = raw
        .split(|b| *b == b'\n')
        .skip(1)
        .filter_map(|line| line.split(|b| *b == b':').next())
        .any(|name| name.trim_ascii().eq_ignore_ascii_case(b"content-length"));
    if content_length {
        return Err(Refusal::BadRequest("the body is framed by both Content-Length and Transfer-Encoding"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(version: Version, fields: &[(&str, &str)]) -> (RequestHeader, Vec<u8>) {
        let mut req = RequestHeader::build("POST", b"/events/1/holds", None).expect("head");
        req.set_version(version);
        let mut raw = b"POST /events/1/holds HTTP/1.1\r\n".to_vec();
        for (name, value) in fields {
            req.append_header(name.to_string(), *value).expect("field");
            raw.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        raw.extend_from_slice(b"\r\n");
        (req, raw)
    }

    fn check_head(req: &RequestHeader, raw: Vec<u8>) -> Result<(), Refusal> {
        check(req, &Fields::read(req, &http::HeaderName::from_static("x-forwarded-for")), || raw)
    }

    fn checked(version: Version, fields: &[(&str, &str)]) -> Result<(), Refusal> {
        let (req, raw) = head(version, fields);
        check_head(&req, raw)
    }

    #[test]
    fn plain_requests_pass() {
        assert_eq!(checked(Version::HTTP_11, &[("host", "x")]), Ok(()));
        assert_eq!(checked(Version::HTTP_11, &[("host", "x"), ("transfer-encoding", "Chunked")]), Ok(()));
        assert_eq!(checked(Version::HTTP_11, &[("host", "x"), ("content-length", "5")]), Ok(()));
        assert_eq!(checked(Version::HTTP_10, &[]), Ok(()), "HTTP/1.0 needs no Host");
    }

    #[test]
    fn ambiguous_framing_and_hosts_are_refused() {
        let bad = |fields: &[(&str, &str)]| checked(Version::HTTP_11, fields);
        assert!(matches!(bad(&[]), Err(Refusal::BadRequest(_))), "no Host");
        assert!(matches!(bad(&[("host", "a"), ("host", "b")]), Err(Refusal::BadRequest(_))));
        assert!(matches!(checked(Version::HTTP_10, &[("host", "a"), ("host", "a")]), Err(Refusal::BadRequest(_))));
        let te = |value| bad(&[("host", "x"), ("transfer-encoding", value)]);
        assert!(matches!(te("chunked, chunked"), Err(Refusal::BadRequest(_))));
        assert!(matches!(te("chunked,"), Err(Refusal::BadRequest(_))));
        assert_eq!(te("gzip, chunked"), Err(Refusal::UnknownCoding));
        assert!(matches!(
            bad(&[("host", "x"), ("transfer-encoding", "chunked"), ("transfer-encoding", "chunked")]),
            Err(Refusal::BadRequest(_))
        ));
        // As pingora hands it over: the length dropped from the parsed head, still in the raw one.
        let (mut req, raw) =
            head(Version::HTTP_11, &[("host", "x"), ("Content-Length", "5"), ("transfer-encoding", "chunked")]);
        req.remove_header("content-length");
        assert!(matches!(check_head(&req, raw), Err(Refusal::BadRequest(_))));
    }

    #[test]
    fn a_head_line_ending_in_a_bare_lf_is_refused() {
        let (req, raw) = head(Version::HTTP_11, &[("host", "x"), ("accept", "*/*")]);
        assert_eq!(check_head(&req, raw.clone()), Ok(()));
        let text = String::from_utf8(raw).expect("text");
        for bare in [text.replacen("\r\naccept", "\naccept", 1), text.replacen("HTTP/1.1\r\n", "HTTP/1.1\n", 1)] {
            assert!(matches!(check_head(&req, bare.clone().into_bytes()), Err(Refusal::BadRequest(_))), "{bare:?}");
        }
        let last = text.strip_suffix("\r\n\r\n").map(|t| format!("{t}\r\n\n")).expect("the blank line");
        assert!(matches!(check_head(&req, last.into_bytes()), Err(Refusal::BadRequest(_))), "the blank line");
    }
}
