//! A short-lived cache of each event's serialised seat map, in its three forms: the whole map (`/seats`), the
//! status of every seat, and the layout. Building a map reads every seat's Redis key and serialises thousands
//! of seats; when thousands of fans open the map in the same second, one build per `SEAT_MAP_CACHE_MS` serves
//! them all. Best available picks from the same cached statuses. The map carries its `version`, so a client can tell how fresh it is;
//! holds and checkouts never trust the map, so a slightly stale one is harmless. A layout never changes for
//! its catalogue version, so it is built once.
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

use crate::domain::{EventId, MapVersion, SeatStatus};

/// Which form of an event's map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    /// Every seat with its details and status (`/seats`).
    Whole,
    /// Every seat's status, packed.
    Status,
    /// The seats' places, labels and prices for one catalogue version: immutable.
    Layout(i64),
}

/// One cached build, locked while it is (re)built.
type Slot = Arc<tokio::sync::Mutex<Option<Built>>>;

struct Built {
    at: Instant,
    body: Bytes,
    gzip: Option<Bytes>,
    etag: String,
}

/// A seat map as it goes out: the JSON, gzipped when the client said it accepts that, and its entity tag (a
/// digest of the plain bytes, so every booking node tags the same map alike; empty for the whole map).
pub struct Encoded {
    pub body: Bytes,
    pub gzip: bool,
    pub etag: String,
}

/// Every seat's status at a map version, in the catalogue's order: what each form of the map and best
/// available are made from.
pub struct Snapshot {
    pub statuses: Vec<SeatStatus>,
    pub version: MapVersion,
    catalogue_version: i64,
    at: Instant,
}

impl Snapshot {
    /// Whether each seat, in catalogue order, is available.
    pub fn free(&self) -> Vec<bool> {
        self.statuses.iter().map(|s| *s == SeatStatus::Available).collect()
    }

    /// When the statuses were read.
    pub fn read_at(&self) -> Instant {
        self.at
    }
}

type SnapshotSlot = Arc<tokio::sync::Mutex<Option<Arc<Snapshot>>>>;

/// Serialised seat maps by event and form, each rebuilt at most once per `ttl` (single flight: concurrent
/// requests for a stale map wait for one build); a layout is never rebuilt. The statuses they are built from
/// are cached alike.
pub struct SeatMaps {
    ttl: Duration,
    maps: Mutex<HashMap<(EventId, Part), Slot>>,
    snapshots: Mutex<HashMap<EventId, SnapshotSlot>>,
}

impl SeatMaps {
    /// `ttl` zero turns the cache off.
    pub fn new(ttl: Duration) -> Self {
        Self { ttl, maps: Mutex::new(HashMap::new()), snapshots: Mutex::new(HashMap::new()) }
    }

    /// The event's seat statuses for `catalogue_version`: cached while younger than the ttl and read after
    /// `newer_than` (if given; a request that found its copy out of date asks for a newer one), else read by
    /// `read` (single flight, as for the maps).
    pub async fn snapshot<E, F>(
        &self,
        event: EventId,
        catalogue_version: i64,
        newer_than: Option<Instant>,
        read: impl FnOnce() -> F,
    ) -> Result<Arc<Snapshot>, E>
    where
        F: Future<Output = Result<(Vec<SeatStatus>, MapVersion), E>>,
    {
        let build = |(statuses, version)| Snapshot { statuses, version, catalogue_version, at: Instant::now() };
        let slot = if self.ttl.is_zero() {
            None
        } else {
            self.snapshots.lock().ok().map(|mut slots| slots.entry(event).or_default().clone())
        };
        let Some(slot) = slot else {
            return Ok(Arc::new(build(read().await?)));
        };
        let mut slot = slot.lock().await;
        if let Some(current) = slot.as_ref()
            && current.catalogue_version == catalogue_version
            && current.at.elapsed() < self.ttl
            && newer_than.is_none_or(|t| current.at > t)
        {
            return Ok(current.clone());
        }
        let fresh = Arc::new(build(read().await?));
        *slot = Some(fresh.clone());
        Ok(fresh)
    }

    /// The event's map in the form `part`, from the cache when it is younger than the ttl (a layout: whatever
    /// its age), else from `build`; gzipped if `gzip`.
    pub async fn get<E, F>(
        &self,
        event: EventId,
        part: Part,
        gzip: bool,
        build: impl FnOnce() -> F,
    ) -> Result<Encoded, E>
    where
        F: Future<Output = Result<Bytes, E>>,
    {
        // The std lock is released before any await (a poisoned one just skips the cache).
        let slot = if self.ttl.is_zero() {
            None
        } else {
            self.maps.lock().ok().map(|mut maps| {
                // A catalogue change leaves its old layouts behind: keep only the newest per event.
                if let Part::Layout(version) = part {
                    maps.retain(|(e, p), _| *e != event || !matches!(p, Part::Layout(v) if *v < version));
                }
                maps.entry((event, part)).or_default().clone()
            })
        };
        let Some(slot) = slot else {
            let body = build().await?;
            let zipped = if gzip { compress(&body).await } else { None };
            let etag = etag(part, &body);
            return Ok(Encoded::choose(body, zipped, etag));
        };
        let mut slot = slot.lock().await;
        let built = match slot.take() {
            Some(built) if matches!(part, Part::Layout(_)) || built.at.elapsed() < self.ttl => slot.insert(built),
            _ => {
                let body = build().await?;
                slot.insert(Built { at: Instant::now(), etag: etag(part, &body), body, gzip: None })
            }
        };
        if gzip && built.gzip.is_none() {
            built.gzip = compress(&built.body).await;
        }
        let zipped = if gzip { built.gzip.clone() } else { None };
        Ok(Encoded::choose(built.body.clone(), zipped, built.etag.clone()))
    }
}

impl Encoded {
    /// The gzipped bytes when there are some, else the plain ones.
    fn choose(body: Bytes, zipped: Option<Bytes>, etag: String) -> Self {
        match zipped {
            Some(body) => Self { body, gzip: true, etag },
            None => Self { body, gzip: false, etag },
        }
    }
}

/// A strong entity tag: the first 16 bytes of the body's SHA-256, in hex and quotes. The whole map carries
/// none (it is rebuilt every `SEAT_MAP_CACHE_MS` and is megabytes long: hashing it would cost more than it
/// saves), so it gets an empty one.
fn etag(part: Part, body: &[u8]) -> String {
    if part == Part::Whole {
        return String::new();
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(body);
    format!("\"{}\"", hex::encode(&digest[..16]))
}

/// Whether the request's `If-None-Match` names `etag` (or is `*`): the client's copy is current.
pub fn not_modified(headers: &HeaderMap, etag: &str) -> bool {
    headers.get_all(axum::http::header::IF_NONE_MATCH).iter().filter_map(|v| v.to_str().ok()).any(|v| {
        v.split(',').map(str::trim).any(|tag| tag == "*" || tag == etag || tag.strip_prefix("W/") == Some(etag))
    })
}

/// Gzips `body` on a blocking thread (a whole map takes long enough to stall an async worker); `None` if that
/// thread failed, and the plain map goes out instead.
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
        let plain = maps.get(EventId(1), Part::Status, false, build).await.expect("plain");
        let zipped = maps.get(EventId(1), Part::Status, true, build).await.expect("gzip");
        let again = maps.get(EventId(1), Part::Status, true, build).await.expect("gzip again");
        assert_eq!(builds.load(std::sync::atomic::Ordering::SeqCst), 1, "one build serves both encodings");
        assert!(!plain.gzip && zipped.gzip);
        assert!(zipped.body.len() * 10 < plain.body.len(), "{} vs {}", zipped.body.len(), plain.body.len());
        assert_eq!(zipped.body, again.body, "the gzip of a build is made once");
        let mut unzipped = Vec::new();
        flate2::read::GzDecoder::new(&zipped.body[..]).read_to_end(&mut unzipped).expect("gunzip");
        assert_eq!(unzipped, plain.body);
        assert_eq!((plain.etag.len(), &plain.etag), (34, &zipped.etag), "one tag for both encodings");
    }

    #[test]
    fn if_none_match_matches_the_tag_in_a_list_weakly_or_as_a_star() {
        let check = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(axum::http::header::IF_NONE_MATCH, value.parse().expect("header"));
            not_modified(&headers, "\"abc\"")
        };
        assert!(check("\"abc\""));
        assert!(check("\"x\", \"abc\""));
        assert!(check("W/\"abc\""));
        assert!(check("*"));
        assert!(!check("\"abd\""));
        assert!(!check("abc"));
        assert!(!not_modified(&HeaderMap::new(), "\"abc\""));
    }
}
