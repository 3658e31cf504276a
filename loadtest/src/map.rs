//! The live seat map as fans' pages keep it: the layout read once (a CDN or the browser caches it), and
//! `--map-streams` followers of the gateway's stream, each keeping its own copy of every seat's status (the
//! status it started from, then every delta) the way a page does. Fans pick from the copy of the follower
//! they are given. Each follower records how late every delta arrived: from `at` (when the first change in
//! it was made, by Redis's clock) to its receipt, on the same machine.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use serde::Deserialize;

use crate::picker::{Available, Layout};

/// Booking's status answer, as read here.
#[derive(Debug, Deserialize)]
struct StatusIn {
    version: u64,
    layout: String,
    seats: usize,
    statuses: String,
}

/// A status decoded: the version it shows, and one status byte per seat in the layout's order (0 available,
/// 1 held, 2 sold).
pub struct Status {
    pub version: u64,
    pub layout: String,
    pub statuses: Vec<u8>,
}

impl Status {
    /// Decodes booking's status answer (two bits a seat, base64).
    pub fn parse(body: &[u8]) -> anyhow::Result<Status> {
        let raw: StatusIn = serde_json::from_slice(body).context("the status is not what booking answers")?;
        let packed = base64::engine::general_purpose::STANDARD.decode(&raw.statuses).context("statuses")?;
        anyhow::ensure!(packed.len() * 4 >= raw.seats, "the statuses are shorter than the seats they count");
        let statuses = (0..raw.seats).map(|i| (packed[i / 4] >> ((i % 4) * 2)) & 3).collect();
        Ok(Status { version: raw.version, layout: raw.layout, statuses })
    }
}

/// One page's copy of the map.
struct Mirror {
    statuses: RwLock<Vec<u8>>,
    version: AtomicU64,
}

/// What the followers measured.
#[derive(Default)]
pub struct MapStats {
    /// How late each delta arrived, in microseconds.
    latencies_us: Mutex<Vec<u64>>,
    pub stream_bytes: AtomicU64,
    pub deltas: AtomicU64,
    pub resyncs: AtomicU64,
    pub reconnects: AtomicU64,
}

impl MapStats {
    pub fn take_latencies(&self) -> Vec<u64> {
        self.latencies_us.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Every latency recorded from index `from` on, and the index after the last.
    pub fn latencies_since(&self, from: usize) -> (Vec<u64>, usize) {
        self.latencies_us.lock().map(|l| (l.get(from..).unwrap_or_default().to_vec(), l.len())).unwrap_or_default()
    }
}

/// The layout and the followers' copies.
pub struct LiveMap {
    pub layout: Layout,
    pub layout_bytes: usize,
    mirrors: Vec<Mirror>,
    pub stats: MapStats,
    client: reqwest::Client,
    base: String,
    event: i64,
}

/// A delta event's data.
#[derive(Debug, Deserialize)]
struct DeltaIn {
    from: u64,
    version: u64,
    at: u64,
    changes: Vec<(i64, String)>,
}

fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

impl LiveMap {
    /// Reads the status and its layout, and starts `streams` followers of the event's stream from it.
    pub async fn start(base: &str, event: i64, streams: usize) -> anyhow::Result<Arc<LiveMap>> {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(3600)).build()?;
        let status = read_status(&client, base, event).await?;
        let layout_url = format!("{base}{}", status.layout);
        let res = client.get(&layout_url).send().await.with_context(|| format!("GET {layout_url}"))?;
        anyhow::ensure!(res.status().is_success(), "GET {layout_url}: {}", res.status());
        let body = res.bytes().await?;
        let layout = Layout::parse(&body).context("the layout")?;
        anyhow::ensure!(layout.len() == status.statuses.len(), "the status and the layout count different seats");
        let mirrors = (0..streams.max(1))
            .map(|_| Mirror { statuses: RwLock::new(status.statuses.clone()), version: AtomicU64::new(status.version) })
            .collect();
        let map = Arc::new(LiveMap {
            layout,
            layout_bytes: body.len(),
            mirrors,
            stats: MapStats::default(),
            client,
            base: base.to_owned(),
            event,
        });
        for i in 0..map.mirrors.len() {
            tokio::spawn(map.clone().follow(i));
        }
        Ok(map)
    }

    /// Which seats follower `fan`'s copy shows available now.
    pub fn available(&self, fan: usize) -> Available {
        let mirror = &self.mirrors[fan % self.mirrors.len()];
        mirror.statuses.read().map(|s| s.iter().map(|b| *b == 0).collect()).unwrap_or_default()
    }

    /// Whether follower `fan`'s copy shows any seat available now.
    pub fn any_available(&self, fan: usize) -> bool {
        let mirror = &self.mirrors[fan % self.mirrors.len()];
        mirror.statuses.read().is_ok_and(|s| s.contains(&0))
    }

    /// Follows the stream into copy `i`, forever (the run aborts it): from the copy's version, again after a
    /// dropped connection, and from a fresh status after a resync.
    async fn follow(self: Arc<Self>, i: usize) {
        let mirror = &self.mirrors[i];
        // A client IP of its own, as each page has (the gateway limits each IP).
        let ip = format!("10.254.{}.{}", (i >> 8) & 0xff, i & 0xff);
        loop {
            let since = mirror.version.load(Ordering::Relaxed);
            let url = format!("{}/events/{}/seats/stream?since={since}", self.base, self.event);
            let res =
                self.client.get(&url).header("accept", "text/event-stream").header("x-forwarded-for", &ip).send().await;
            let resync = match res {
                Ok(res) if res.status().is_success() => self.read_stream(res, mirror).await,
                // Refused (the gateway has not seen the event's room yet, or a limit) or unreachable: again.
                _ => false,
            };
            if resync {
                self.stats.resyncs.fetch_add(1, Ordering::Relaxed);
                match read_status(&self.client, &self.base, self.event).await {
                    Ok(status) if status.statuses.len() == self.layout.len() => {
                        if let Ok(mut s) = mirror.statuses.write() {
                            *s = status.statuses;
                        }
                        mirror.version.store(status.version, Ordering::Relaxed);
                    }
                    _ => tokio::time::sleep(Duration::from_millis(500)).await,
                }
            } else {
                self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    /// Applies a stream's deltas to `mirror` until it ends; true when it ended asking for a resync (or a
    /// delta did not follow on from the copy's version).
    async fn read_stream(&self, mut res: reqwest::Response, mirror: &Mirror) -> bool {
        let mut pending = String::new();
        loop {
            let piece = match res.chunk().await {
                Ok(Some(piece)) => piece,
                _ => return false,
            };
            self.stats.stream_bytes.fetch_add(piece.len() as u64, Ordering::Relaxed);
            pending.push_str(&String::from_utf8_lossy(&piece));
            while let Some(end) = pending.find("\n\n") {
                let block: String = pending.drain(..end + 2).collect();
                let kind = block.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or("");
                let data = block.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or("");
                match kind {
                    "resync" => return true,
                    "delta" => {
                        let Ok(delta) = serde_json::from_str::<DeltaIn>(data) else { return true };
                        // Each delta starts where the copy stands (a copy at 0, from before the first change,
                        // takes the log from its start); anything else is a gap: start again.
                        let at = mirror.version.load(Ordering::Relaxed);
                        if delta.from != at + 1 && at != 0 {
                            return true;
                        }
                        let late = now_us().saturating_sub(delta.at * 1000);
                        if let Ok(mut statuses) = mirror.statuses.write() {
                            for (seat, status) in &delta.changes {
                                if let Some(pos) = self.layout.position(*seat) {
                                    statuses[pos] = match status.as_str() {
                                        "a" => 0,
                                        "h" => 1,
                                        _ => 2,
                                    };
                                }
                            }
                        }
                        mirror.version.store(delta.version, Ordering::Relaxed);
                        self.stats.deltas.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut l) = self.stats.latencies_us.lock() {
                            l.push(late);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// How many copies equal a status read now, once they have caught up with it (each copy is compared at
    /// the status's version exactly). `(agreeing, compared)`; `(_, 0)` when the map never held still for a
    /// comparison. A status may show changes past its version (a hold whose time ran out in Redis before the
    /// lapse step logged it): the copies get them with the next delta, so a disagreement is looked at again
    /// while the map still moves, for up to 15 s, and only one that outlasts that counts.
    pub async fn agreement(&self) -> (usize, usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        let mut last = (0, 0);
        while tokio::time::Instant::now() < deadline {
            let Ok(status) = read_status(&self.client, &self.base, self.event).await else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let caught_up = tokio::time::Instant::now() + Duration::from_secs(3);
            while self.mirrors.iter().any(|m| m.version.load(Ordering::Relaxed) < status.version)
                && tokio::time::Instant::now() < caught_up
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let at_version: Vec<&Mirror> =
                self.mirrors.iter().filter(|m| m.version.load(Ordering::Relaxed) == status.version).collect();
            if at_version.len() < self.mirrors.len() {
                // The map moved on meanwhile (a lapse): read it again.
                continue;
            }
            let agreeing =
                at_version.iter().filter(|m| m.statuses.read().map(|s| *s == status.statuses).unwrap_or(false)).count();
            last = (agreeing, self.mirrors.len());
            if agreeing == self.mirrors.len() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        last
    }
}

/// `GET /events/{id}/seats/status`, decoded.
pub async fn read_status(client: &reqwest::Client, base: &str, event: i64) -> anyhow::Result<Status> {
    let url = format!("{base}/events/{event}/seats/status");
    let res = client.get(&url).send().await.with_context(|| format!("GET {url}"))?;
    anyhow::ensure!(res.status().is_success(), "GET {url}: {}", res.status());
    Status::parse(&res.bytes().await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_unpacks_two_bits_a_seat_from_the_lowest() {
        let packed = base64::engine::general_purpose::STANDARD.encode([0b01_10_01_00u8, 0b10]);
        let body = serde_json::json!({ "version": 9, "layout": "/l", "seats": 5, "statuses": packed });
        let status = Status::parse(&serde_json::to_vec(&body).expect("json")).expect("status");
        assert_eq!((status.version, status.statuses), (9, vec![0, 1, 2, 1, 2]));
        let short = serde_json::json!({ "version": 9, "layout": "/l", "seats": 9, "statuses": "AA==" });
        assert!(Status::parse(&serde_json::to_vec(&short).expect("json")).is_err());
    }
}
