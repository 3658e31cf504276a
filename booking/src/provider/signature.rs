//! Webhook signatures, shared by the fake provider (signs) and booking (verifies): the header
//! `Payment-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`, as Stripe does it. The timestamp
//! is signed too, so a captured delivery cannot be replayed outside the tolerance.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The header carrying the signature.
pub const HEADER: &str = "payment-signature";

/// How far a signature's timestamp may be from our clock, in seconds.
pub const TOLERANCE_SECONDS: i64 = 300;

/// Longest header read: a timestamp and a few signatures fit in a tenth of it. Anything longer is refused
/// before any MAC is computed.
pub const MAX_HEADER_BYTES: usize = 1024;

/// Most `v1` values compared: a provider rotating its secret sends two.
pub const MAX_SIGNATURES: usize = 4;

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
    #[error(
        "the Payment-Signature header is not `t=<unix seconds>,v1=<64 hex digits>` with at most {MAX_SIGNATURES} \
         signatures in {MAX_HEADER_BYTES} bytes"
    )]
    Malformed,
    #[error("the signature's timestamp is more than {TOLERANCE_SECONDS} s from now")]
    Stale,
    #[error("the signature does not match the body")]
    Mismatch,
}

/// Checks `header` against `body` at unix time `now`. The MAC is computed once, whatever the header holds,
/// and compared in constant time with each signature.
pub fn verify(secret: &[u8], header: Option<&str>, body: &[u8], now: i64) -> Result<(), Refusal> {
    let header = header.ok_or(Refusal::Missing)?;
    if header.len() > MAX_HEADER_BYTES {
        return Err(Refusal::Malformed);
    }
    let mut t = None;
    let mut v1: Vec<[u8; 32]> = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) if t.is_none() => t = Some(v.parse::<i64>().map_err(|_| Refusal::Malformed)?),
            Some(("t", _)) => return Err(Refusal::Malformed),
            Some(("v1", v)) => {
                let mut sig = [0u8; 32];
                hex::decode_to_slice(v, &mut sig).map_err(|_| Refusal::Malformed)?;
                v1.push(sig);
            }
            _ => {}
        }
    }
    let t = t.ok_or(Refusal::Malformed)?;
    if v1.is_empty() || v1.len() > MAX_SIGNATURES {
        return Err(Refusal::Malformed);
    }
    // In i128, so a timestamp at either end of i64 is simply far from now (in i64 the difference wraps).
    if (i128::from(now) - i128::from(t)).abs() > i128::from(TOLERANCE_SECONDS) {
        return Err(Refusal::Stale);
    }
    let expected = mac(secret, t, body).finalize();
    // Several v1 values may be sent while the secret rotates; one match is enough.
    let matches = v1
        .iter()
        .fold(false, |found, sig| found | (hmac::digest::CtOutput::<HmacSha256>::new((*sig).into()) == expected));
    if matches { Ok(()) } else { Err(Refusal::Mismatch) }
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
        let sig = h.split_once("v1=").map(|(_, v)| v).unwrap_or_default();
        let five = format!("t=1000{}", format!(",v1={sig}").repeat(MAX_SIGNATURES + 1));
        let long = format!("{h},{}", "x".repeat(MAX_HEADER_BYTES));
        let twice = format!("t=1000,{h}");
        for bad in ["", "t=x,v1=00", "v1=00", "t=1000", "t=1000,v1=zz", "t=1000,v1=00", &five, &long, &twice] {
            assert_eq!(verify(SECRET, Some(bad), body, 1_000), Err(Refusal::Malformed), "{bad:?}");
        }
        // A timestamp at either end of i64 is stale, not a wrapped difference that happens to look recent.
        for t in [i64::MIN, i64::MIN + 1, i64::MAX] {
            assert_eq!(verify(SECRET, Some(&sign(SECRET, t, body)), body, 1_000), Err(Refusal::Stale), "t={t}");
        }
        // A rotating provider's two signatures: the current one may come second.
        let other = sign(b"old-secret", 1_000, body);
        let other = other.split_once("v1=").map(|(_, v)| v).unwrap_or_default();
        assert_eq!(verify(SECRET, Some(&format!("t=1000,v1={other},v1={sig}")), body, 1_000), Ok(()));
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn any_header_is_refused_unless_it_carries_the_body_s_signature(
            header in prop_oneof![
                any::<String>(),
                "t=[0-9-]{0,12}(,v[0-9]=[0-9a-f]{0,70}){0,6}",
                "[tv1=,0-9a-f ]{0,200}",
            ],
            body in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let secret = b"whsec-property";
            // Whatever the header holds, verifying it never panics; only the body's own signature passes.
            let verdict = verify(secret, Some(&header), &body, 1_000);
            if verdict.is_ok() {
                let sig = sign(secret, 1_000, &body);
                let v1 = sig.split_once("v1=").map(|(_, v)| v).unwrap_or_default();
                prop_assert!(header.contains(v1), "{:?} passed", header);
            }
            // The body's signature, with any junk beside it within the limits, passes.
            let good = format!("{},{}", sign(secret, 1_000, &body), "x=1");
            prop_assert_eq!(verify(secret, Some(&good), &body, 1_000), Ok(()));
        }
    }
}
