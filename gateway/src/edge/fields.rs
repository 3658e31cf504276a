//! What the gateway reads of a forwarded request's fields, found in one pass over them. Each lookup by name
//! hashes the name and probes the map, and the forwarding path asks about seven names; one walk over a
//! request's few fields costs less, and a field that is absent (the usual case for most of them) costs
//! nothing more. A present field whose every value matters (cookies, a proxy's client address) is read in
//! full by name where it is used.

use http::header::{ACCEPT, AUTHORIZATION, COOKIE, HOST, TRANSFER_ENCODING};
use http::{HeaderName, HeaderValue};
use pingora::http::RequestHeader;

use super::X_REQUEST_ID;

/// The facts of one request's fields that the forwarding path acts on.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fields<'a> {
    /// How many `Host` fields.
    pub hosts: usize,
    /// Any `Transfer-Encoding` field.
    pub transfer_encoding: bool,
    /// The first `Authorization` field.
    pub authorization: Option<&'a HeaderValue>,
    /// How many `Authorization` fields.
    pub authorizations: usize,
    /// Any `Cookie` field.
    pub cookie: bool,
    /// The first `Accept` field.
    pub accept: Option<&'a HeaderValue>,
    /// Any `X-Request-Id` field.
    pub request_id: bool,
    /// Any field named as the header trusted proxies name the client in.
    pub client_ip: bool,
}

impl<'a> Fields<'a> {
    /// Reads them off `req`; `client_header` is the field trusted proxies name the client in.
    pub fn read(req: &'a RequestHeader, client_header: &HeaderName) -> Self {
        let mut f = Fields::default();
        for (name, value) in &req.headers {
            if *name == HOST {
                f.hosts += 1;
            } else if *name == AUTHORIZATION {
                f.authorizations += 1;
                f.authorization.get_or_insert(value);
            } else if *name == ACCEPT {
                f.accept.get_or_insert(value);
            } else if *name == COOKIE {
                f.cookie = true;
            } else if *name == TRANSFER_ENCODING {
                f.transfer_encoding = true;
            } else if *name == X_REQUEST_ID {
                f.request_id = true;
            }
            if name == client_header {
                f.client_ip = true;
            }
        }
        f
    }

    /// Whether the first `Accept` field mentions `media_type`.
    pub fn accepts(&self, media_type: &str) -> bool {
        self.accept.and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains(media_type))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request(fields: &[(&str, &str)]) -> RequestHeader {
        let mut req = RequestHeader::build("GET", b"/events/1", None).expect("head");
        for (name, value) in fields {
            req.append_header(name.to_string(), *value).expect("field");
        }
        req
    }

    const XFF: HeaderName = HeaderName::from_static("x-forwarded-for");

    #[test]
    fn a_request_without_fields_has_none() {
        let req = request(&[]);
        let f = Fields::read(&req, &XFF);
        assert_eq!(
            (f.hosts, f.authorizations, f.transfer_encoding, f.cookie, f.request_id, f.client_ip),
            (0, 0, false, false, false, false)
        );
        assert!(f.authorization.is_none() && f.accept.is_none());
    }

    #[test]
    fn the_first_of_repeated_fields_is_kept_and_all_are_counted() {
        let req = request(&[
            ("Host", "a"),
            ("authorization", "Bearer one"),
            ("ACCEPT", "text/event-stream"),
            ("Authorization", "Bearer two"),
            ("host", "b"),
            ("Accept", "text/html"),
        ]);
        let f = Fields::read(&req, &XFF);
        assert_eq!((f.hosts, f.authorizations), (2, 2));
        assert_eq!(f.authorization.map(HeaderValue::as_bytes), Some(&b"Bearer one"[..]));
        assert!(f.accepts("text/event-stream") && !f.accepts("text/html"));
    }

    #[test]
    fn the_client_header_is_the_configured_one() {
        let req = request(&[("X-Real-IP", "203.0.113.9"), ("x-request-id", "r1"), ("cookie", "a=b")]);
        let real_ip = HeaderName::from_static("x-real-ip");
        assert!(Fields::read(&req, &real_ip).client_ip);
        let f = Fields::read(&req, &XFF);
        assert!(!f.client_ip && f.request_id && f.cookie);
    }

    proptest! {
        /// Whatever the fields, one pass finds what a lookup by each name finds.
        #[test]
        fn one_pass_agrees_with_lookups_by_name(
            fields in proptest::collection::vec(
                (prop::sample::select(vec![
                    "Host", "host", "Authorization", "ACCEPT", "accept", "Cookie", "Transfer-Encoding",
                    "X-Request-Id", "X-Forwarded-For", "User-Agent", "Accept-Language", "x-custom",
                ]), "[ -~]{0,12}"),
                0..12,
            )
        ) {
            let pairs: Vec<(&str, &str)> = fields.iter().map(|(n, v)| (*n, v.as_str())).collect();
            let req = request(&pairs);
            let f = Fields::read(&req, &XFF);
            let h = &req.headers;
            prop_assert_eq!(f.hosts, h.get_all(HOST).iter().count());
            prop_assert_eq!(f.authorizations, h.get_all(AUTHORIZATION).iter().count());
            prop_assert_eq!(f.authorization, h.get(AUTHORIZATION));
            prop_assert_eq!(f.accept, h.get(ACCEPT));
            prop_assert_eq!(f.cookie, h.contains_key(COOKIE));
            prop_assert_eq!(f.transfer_encoding, h.contains_key(TRANSFER_ENCODING));
            prop_assert_eq!(f.request_id, h.contains_key(X_REQUEST_ID));
            prop_assert_eq!(f.client_ip, h.contains_key(XFF));
        }
    }
}
