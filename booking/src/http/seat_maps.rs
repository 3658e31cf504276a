//! A short-lived cache of each event's serialised seat map. Building the map reads every seat's Redis key and
//! serialises thousands of seats (about 20 ms for 20,000); when thousands of admitted fans open the map in the
//! same second, one build per `SEAT_MAP_CACHE_MS` serves them all. The map carries its `version`, so a client
//! can tell how fresh it is; holds and checkouts never trust the map, so a slightly stale one is harmless.
//!
//! A client that accepts gzip gets the same bytes gzipped: a 20,000-seat map is 4.2 MB of JSON and about
//! 370 KB gzipped. Each build is compressed at most once, by the first request that asks for it, off the
//! async workers.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::http::header::ACCEPT_ENCODING;
use bytes::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;

use crate::domain::EventId;

struct Built {
    at: Instant,
    body: Bytes,
    gzip: Option<Bytes>,
}

/// A seat map as it goes out: the JSON, gzipped when the client said it accepts that.
pub struct Encoded {
    pub body: Bytes,
    pub gzip: bool,
}

/// Serialised seat maps by event, each rebuilt at most once per `ttl` (single flight: concurrent requests for
/// a stale map wait for one build).
pub struct SeatMaps {
    ttl: Duration,
    maps: Mutex<HashMap<EventId, Arc<tokio::sync::Mutex<Option<Built>>>>>,
}

impl SeatMaps {
    /// `ttl` zero turns the cache off.
    pub fn new(ttl: Duration) -> Self {
        Self { ttl, maps: Mutex::new(HashMap::new()) }
    }

    /// The event's map, from the cache when it is younger than the ttl, else from `build`; gzipped if `gzip`.
    pub async fn get<E, F>(&self, event: EventId, gzip: bool, build: impl FnOnce() -> F) -> Result<Encoded, E>
    where
        F: Future<Output = Result<Bytes, E>>,
    {
        // The std lock is released before any await (a poisoned one just skips the cache).
        let slot = if self.ttl.is_zero() {
            None
        } else {
            self.maps.lock().ok().map(|mut maps| maps.entry(event).or_default().clone())
        };
        let Some(slot) = slot else {
            let body = build().await?;
            let zipped = if gzip { compress(&body).await } else { None };
            return Ok(Encoded::choose(body, zipped));
        };
        let mut slot = slot.lock().await;
        let built = match slot.take() {
            Some(built) if built.at.elapsed() < self.ttl => slot.insert(built),
            _ => slot.insert(Built { at: Instant::now(), body: build().await?, gzip: None }),
        };
        if gzip && built.gzip.is_none() {
            built.gzip = compress(&built.body).await;
        }
        let zipped = if gzip { built.gzip.clone() } else { None };
        Ok(Encoded::choose(built.body.clone(), zipped))
    }
}

impl Encoded {
    /// The gzipped bytes when there are some, else the plain ones.
    fn choose(body: Bytes, zipped: Option<Bytes>) -> Self {
        match zipped {
            Some(body) => Self { body, gzip: true },
            None => Self { body, gzip: false },
        }
    }
}

/// Gzips `body` on a blocking thread (about 20 ms for a 20,000-seat map); `None` if that thread failed, and
/// the plain map goes out instead.
async fn compress(body: &Bytes) -> Option<Bytes> {
    let body = body.clone();
    tokio::task::spawn_blocking(move || {
        let mut gz = GzEncoder::new(Vec::with_capacity(body.len() / 8), Compression::fast());
        gz.write_all(&body).ok()?;
        gz.finish().ok().map(Bytes::from)
    })
    .await
    .ok()
    .flatten()
}

/// Whether the request's `Accept-Encoding` accepts gzip: listed (or `*` when gzip is not listed) with a
/// quality above zero.
pub fn accepts_gzip(headers: &HeaderMap) -> bool {
    let (mut gzip, mut any) = (None, None);
    for value in headers.get_all(ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()) {
        for item in value.split(',') {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q=").or_else(|| p.trim().strip_prefix("Q=")))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
                gzip = Some(q > 0.0);
            } else if coding == "*" {
                any = Some(q > 0.0);
            }
        }
    }
    gzip.or(any).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts(value: &str) -> bool {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT_ENCODING, value.parse().expect("header"));
        accepts_gzip(&headers)
    }

    #[test]
    fn gzip_is_sent_only_where_the_client_accepts_it() {
        assert!(accepts("gzip"));
        assert!(accepts("gzip, deflate, br"));
        assert!(accepts("br;q=1.0, GZIP;q=0.5"));
        assert!(accepts("*"));
        assert!(accepts("x-gzip"));
        assert!(!accepts("gzip;q=0"));
        assert!(!accepts("gzip; q=0.0, *"));
        assert!(!accepts("identity"));
        assert!(!accepts("br, deflate"));
        assert!(!accepts("*;q=0"));
        assert!(!accepts(""));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[tokio::test]
    async fn each_build_is_gzipped_once_and_unzips_to_the_same_bytes() {
        use std::io::Read;
        let maps = SeatMaps::new(Duration::from_secs(60));
        let builds = std::sync::atomic::AtomicUsize::new(0);
        let build = || async {
            builds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, ()>(Bytes::from("{\"seats\":[".to_owned() + &"{\"seat_id\":1},".repeat(1000) + "]}"))
        };
        let plain = maps.get(EventId(1), false, build).await.expect("plain");
        let zipped = maps.get(EventId(1), true, build).await.expect("gzip");
        let again = maps.get(EventId(1), true, build).await.expect("gzip again");
        assert_eq!(builds.load(std::sync::atomic::Ordering::SeqCst), 1, "one build serves both encodings");
        assert!(!plain.gzip && zipped.gzip);
        assert!(zipped.body.len() * 10 < plain.body.len(), "{} vs {}", zipped.body.len(), plain.body.len());
        assert_eq!(zipped.body, again.body, "the gzip of a build is made once");
        let mut unzipped = Vec::new();
        flate2::read::GzDecoder::new(&zipped.body[..]).read_to_end(&mut unzipped).expect("gunzip");
        assert_eq!(unzipped, plain.body);
    }
}
