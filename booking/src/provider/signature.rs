//! Webhook signatures, shared by the fake provider (signs) and booking (verifies): the header
//! `Payment-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`, as Stripe does it. The timestamp
//! is signed too, so a captured delivery cannot be replayed outside the tolerance.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The header carrying the signature.
pub const HEADER: &str = "payment-signature";

/// How far a signature's timestamp may be from our clock, in seconds.
pub const TOLERANCE_SECONDS: i64 = 300;

type HmacSha256 = Hmac<Sha256>;

fn mac(secret: &[u8], t: i64, body: &[u8]) -> HmacSha256 {
    // HMAC takes a key of any length.
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The header value for `body` signed at unix time `t`.
pub fn sign(secret: &[u8], t: i64, body: &[u8]) -> String {
    format!("t={t},v1={}", hex::encode(mac(secret, t, body).finalize().into_bytes()))
}

/// Why a signature was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the Payment-Signature header is missing")]
    Missing,
    #[error("the Payment-Signature header is not `t=<unix seconds>,v1=<hex>`")]
    Malformed,
    #[error("the signature's timestamp is more than {TOLERANCE_SECONDS} s from now")]
    Stale,
    #[error("the signature does not match the body")]
    Mismatch,
}

/// Checks `header` against `body` at unix time `now`, in constant time.
pub fn verify(secret: &[u8], header: Option<&str>, body: &[u8], now: i64) -> Result<(), Refusal> {
    let header = header.ok_or(Refusal::Missing)?;
    let mut t = None;
    let mut v1 = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) => t = Some(v.parse::<i64>().map_err(|_| Refusal::Malformed)?),
            Some(("v1", v)) => v1.push(hex::decode(v).map_err(|_| Refusal::Malformed)?),
            _ => {}
        }
    }
    let t = t.ok_or(Refusal::Malformed)?;
    if v1.is_empty() {
        return Err(Refusal::Malformed);
    }
    if (now - t).abs() > TOLERANCE_SECONDS {
        return Err(Refusal::Stale);
    }
    // Several v1 values may be sent while the secret rotates; one match is enough.
    if v1.iter().any(|sig| mac(secret, t, body).verify_slice(sig).is_ok()) { Ok(()) } else { Err(Refusal::Mismatch) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"whsec-test";

    #[test]
    fn a_signed_body_verifies_and_any_change_is_refused() {
        let body = br#"{"id":"evt_1"}"#;
        let h = sign(SECRET, 1_000, body);
        assert_eq!(verify(SECRET, Some(&h), body, 1_010), Ok(()));
        assert_eq!(verify(SECRET, Some(&h), br#"{"id":"evt_2"}"#, 1_010), Err(Refusal::Mismatch));
        assert_eq!(verify(b"other", Some(&h), body, 1_010), Err(Refusal::Mismatch));
        assert_eq!(verify(SECRET, Some(&h), body, 1_000 + TOLERANCE_SECONDS + 1), Err(Refusal::Stale));
        let moved = h.replace("t=1000", "t=1001");
        assert_eq!(verify(SECRET, Some(&moved), body, 1_001), Err(Refusal::Mismatch));
        assert_eq!(verify(SECRET, None, body, 1_000), Err(Refusal::Missing));
        for bad in ["", "t=x,v1=00", "v1=00", "t=1000", "t=1000,v1=zz"] {
            assert_eq!(verify(SECRET, Some(bad), body, 1_000), Err(Refusal::Malformed), "{bad:?}");
        }
    }
}
