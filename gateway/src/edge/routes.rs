//! The admission check at the edge: which event a path is for, and whether the request carries a valid
//! admission proof for it. Pure: no I/O, so it is tested without a server.

use std::sync::Arc;

use tokens::{AdmissionClaims, AdmissionRefusal, Keyring};

/// Where a request is going, as far as the gateway cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/healthz`: answered by the gateway itself.
    Health,
    /// `/events/{id}` or below: booking, behind the admission check.
    Event(i64),
    /// `/events/{id}/seats/status` and `/events/{id}/seats/layout/...`: booking, public (availability is
    /// public), under the per-IP limit.
    PublicMap(i64),
    /// `/events/{id}/seats/stream`: the live seat map, answered by the gateway from the event's change log.
    MapStream(i64),
    /// `/queue/{id}`: the waiting-room page (or the status as JSON).
    QueuePage(i64),
    /// `/queue/{id}/join`.
    QueueJoin(i64),
    /// `/queue/{id}/status`.
    QueueStatus(i64),
    /// `/queue/{id}/leave`: an admitted (or waiting) fan is done.
    QueueLeave(i64),
    /// `/queue/{id}/signin`: the demo sign-in (`GATEWAY_DEV_SIGNIN` only).
    QueueSignin(i64),
    /// `/queue/{id}/solver.js`: the page's proof-of-work worker.
    QueueSolver(i64),
    /// `/events/{x}...` or `/queue/{x}...` where x is not a positive integer.
    BadEventId,
    /// Anything else.
    Unknown,
}

fn event_id(raw: &str) -> Option<i64> {
    raw.parse::<i64>().ok().filter(|id| *id > 0)
}

/// Classifies a request path.
pub fn route(path: &str) -> Route {
    if path == "/healthz" {
        return Route::Health;
    }
    if let Some(rest) = path.strip_prefix("/events/") {
        let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
        let Some(event) = event_id(id) else { return Route::BadEventId };
        return match tail {
            "seats/stream" => Route::MapStream(event),
            "seats/status" => Route::PublicMap(event),
            // Digits only: no path booking might read otherwise (a dot segment, an escape) passes unchecked.
            t if t
                .strip_prefix("seats/layout/")
                .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit())) =>
            {
                Route::PublicMap(event)
            }
            _ => Route::Event(event),
        };
    }
    let Some(rest) = path.strip_prefix("/queue/") else { return Route::Unknown };
    let (id, tail) = match rest.split_once('/') {
        Some((id, tail)) => (id, Some(tail)),
        None => (rest, None),
    };
    let Some(event) = event_id(id) else { return Route::BadEventId };
    match tail {
        None => Route::QueuePage(event),
        Some("join") => Route::QueueJoin(event),
        Some("status") => Route::QueueStatus(event),
        Some("leave") => Route::QueueLeave(event),
        Some("signin") => Route::QueueSignin(event),
        Some("solver.js") => Route::QueueSolver(event),
        Some(_) => Route::Unknown,
    }
}

/// Why a request was not let through, with its stable error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into() }
    }

    /// The JSON error body of the HTTP contract.
    pub fn body(&self) -> String {
        serde_json::json!({ "error": self.code, "message": self.message }).to_string()
    }
}

/// Checks the admission proof (from `Authorization: Bearer` or the `wr_admission` cookie) for `event`, and
/// returns its claims (the admitted account is `sub`) and the proof itself. `authorization` is the header's raw
/// value: one that is not plain ASCII is refused, not skipped for the cookie.
pub fn check<'a>(
    keyring: &Keyring,
    authorization: Option<&'a [u8]>,
    cookies: impl IntoIterator<Item = &'a str>,
    event: i64,
) -> Result<(Arc<AdmissionClaims>, &'a str), Refusal> {
    let refused = |r: AdmissionRefusal| Refusal::new(r.status(), r.code(), r.to_string());
    let authorization = tokens::authorization_text(authorization).map_err(refused)?;
    let proof =
        tokens::find_admission_proof(authorization, cookies).ok_or(AdmissionRefusal::Missing).map_err(refused)?;
    let claims = keyring.check_admission_proof(proof).map_err(refused)?;
    claims.account_for(event).map_err(refused)?;
    Ok((claims, proof))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokens::{ADMISSION_COOKIE, AccountId, unix_now};

    const KEYS: &str = "k1:a-very-long-development-secret-number-one";

    fn proof(ring: &Keyring, event: i64) -> String {
        ring.sign(&AdmissionClaims::new(AccountId::parse("fan-1").expect("id"), event, unix_now(), 60))
    }

    #[test]
    fn routes_are_classified() {
        assert_eq!(route("/healthz"), Route::Health);
        assert_eq!(route("/events/42"), Route::Event(42));
        assert_eq!(route("/events/42/holds/abc"), Route::Event(42));
        assert_eq!(route("/events/x/holds"), Route::BadEventId);
        assert_eq!(route("/events/42/seats"), Route::Event(42));
        assert_eq!(route("/events/42/seats/status"), Route::PublicMap(42));
        assert_eq!(route("/events/42/seats/layout/7"), Route::PublicMap(42));
        assert_eq!(route("/events/42/seats/layout/"), Route::Event(42));
        assert_eq!(route("/events/42/seats/layout/7/x"), Route::Event(42));
        assert_eq!(route("/events/42/seats/layout/.."), Route::Event(42));
        assert_eq!(route("/events/42/seats/layout/%2e%2e"), Route::Event(42));
        assert_eq!(route("/events/42/seats/status/x"), Route::Event(42));
        assert_eq!(route("/events/42/seats/stream"), Route::MapStream(42));
        assert_eq!(route("/events/x/seats/stream"), Route::BadEventId);
        assert_eq!(route("/events/-1"), Route::BadEventId);
        assert_eq!(route("/events/"), Route::BadEventId);
        assert_eq!(route("/admin"), Route::Unknown);
        assert_eq!(route("/queue/3"), Route::QueuePage(3));
        assert_eq!(route("/queue/3/"), Route::Unknown);
        assert_eq!(route("/queue/3/join"), Route::QueueJoin(3));
        assert_eq!(route("/queue/3/solver.js"), Route::QueueSolver(3));
        assert_eq!(route("/queue/3/status"), Route::QueueStatus(3));
        assert_eq!(route("/queue/3/leave"), Route::QueueLeave(3));
        assert_eq!(route("/queue/3/signin"), Route::QueueSignin(3));
        assert_eq!(route("/queue/3/other"), Route::Unknown);
        assert_eq!(route("/queue/0/join"), Route::BadEventId);
        assert_eq!(route("/queue/abc"), Route::BadEventId);
    }

    #[test]
    fn a_proof_is_read_from_the_header_or_the_cookie() {
        let ring = Keyring::parse(KEYS).expect("keys");
        let token = proof(&ring, 7);
        let header = format!("Bearer {token}");
        assert_eq!(check(&ring, Some(header.as_bytes()), [], 7).map(|(_, p)| p), Ok(token.as_str()));
        let cookie = format!("theme=dark; {ADMISSION_COOKIE}={token}");
        assert_eq!(check(&ring, None, [cookie.as_str()], 7).map(|(_, p)| p), Ok(token.as_str()));
        assert_eq!(check(&ring, None, [], 7).map_err(|r| r.code), Err("admission_required"));
        assert_eq!(check(&ring, Some(header.as_bytes()), [], 8).map_err(|r| r.status), Err(403));
        assert_eq!(check(&ring, Some(b"Bearer nope"), [], 7).map_err(|r| r.code), Err("admission_invalid"));
        // A header that is not plain ASCII is refused, even with a valid proof in the cookie.
        let odd = format!("Bearer {token}\u{a0}");
        assert_eq!(
            check(&ring, Some(odd.as_bytes()), [cookie.as_str()], 7).map_err(|r| r.code),
            Err("admission_invalid")
        );
    }
}
