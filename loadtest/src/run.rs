//! One on-sale run: its settings, and what the fans saw (counts, timings, confirmed orders), shared by every
//! goose user of the process and summarised at the end.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokens::Keyring;
use tokio::sync::Semaphore;

use crate::crowd::{Crowd, CrowdFigures, Tallies};
use crate::map::LiveMap;

/// What a run is told.
pub struct Settings {
    pub event: i64,
    /// Prefix of the fans' account ids, unique per run.
    pub run_id: String,
    pub accounts: Keyring,
    pub issuer: String,
    /// Share of fans who close the tab while queued.
    pub abandon_queue: f64,
    /// Share of fans who let their hold expire instead of checking out.
    pub abandon_hold: f64,
    /// Share of fans who check out but never pay.
    pub abandon_payment: f64,
    /// Share of fans who go for the best sections.
    pub best_share: f64,
    /// Think time between seeing the map and holding, and between holding and paying, in ms.
    pub think_ms: (u64, u64),
    /// Holds a fan tries before giving up.
    pub hold_attempts: u32,
    /// The longest a fan waits in the queue.
    pub max_wait: Duration,
    /// The gateway nodes' URLs: fan n goes to the (n mod count)-th, as a CDN spreads its clients.
    pub gateways: Vec<String>,
    /// Fans and bots, and what bots do at the gate.
    pub crowd: Crowd,
}

/// A confirmed order, as the fan saw it (the invariant checker looks each one up).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Confirmed {
    pub order_id: String,
    pub account: String,
    pub seat_ids: Vec<i64>,
    pub total_cents: i64,
    /// Booking told the fan the order is paid.
    #[serde(default)]
    pub paid: bool,
}

/// A fan's turn in the queue, as it saw it (the checker compares turns: a place is never given twice, and no
/// fan is put behind one who joined after it).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Turn {
    pub account: String,
    /// The place its first ticket carried (0: in the pre-queue, where places are drawn at the opening).
    pub place: u64,
    /// When it first asked to join, and when a join was answered with its place, in ms since the run started.
    pub join_sent_ms: u64,
    pub join_answered_ms: u64,
    /// When it was admitted, by the gateway's clock (the proof's `iat`, Unix seconds), if it was.
    pub admitted_at: Option<u64>,
    pub outcome: TurnOutcome,
}

/// How a fan's wait in the queue ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnOutcome {
    Admitted,
    /// Closed the tab on purpose (`--abandon-queue`).
    Abandoned,
    /// Told the event sold out or the room closed.
    Closed,
    /// Told its place lapsed or its session ended (409) although it kept polling.
    Lapsed,
    /// Still waiting after `--max-wait-seconds`.
    TimedOut,
    /// Still waiting after `--max-wait-seconds`, last told that every seat left was held (`all_held`): nobody
    /// is let in until one comes back, so the wait says nothing about the fan's place.
    HeldBack,
    /// A request failed without an answer.
    Failed,
}

/// Counters and timings.
#[derive(Default)]
pub struct Stats {
    pub joined: AtomicU64,
    pub admitted: AtomicU64,
    pub abandoned_queue: AtomicU64,
    pub abandoned_hold: AtomicU64,
    pub lapsed: AtomicU64,
    pub sold_out_told: AtomicU64,
    pub held: AtomicU64,
    pub conflicts: AtomicU64,
    pub gave_up: AtomicU64,
    pub orders: AtomicU64,
    pub seats_sold: AtomicU64,
    pub checkout_refused: AtomicU64,
    pub paid: AtomicU64,
    pub unpaid: AtomicU64,
    pub payment_failed: AtomicU64,
    pub timed_out: AtomicU64,
    /// Fans admitted when their map showed nothing left to hold.
    pub admitted_nothing_left: AtomicU64,
    /// Status answers fans read, and their bytes.
    pub map_statuses: AtomicU64,
    pub map_status_bytes: AtomicU64,
    /// What fans and bots got, and what they spent at the gate.
    pub crowd: Tallies,
    timings: Mutex<Timings>,
}

/// The run at one moment: totals so far, and the latencies of the window since the sample before.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Sample {
    pub at_seconds: f64,
    pub joined: u64,
    pub admitted: u64,
    /// Fans in the queue now (joined, and neither admitted nor gone).
    pub waiting: u64,
    pub seats_sold: u64,
    /// Of those, admitted bots and the seats bots bought (`crate::crowd`).
    #[serde(default)]
    pub bots_admitted: u64,
    #[serde(default)]
    pub bots_seats: u64,
    pub hold_ms: Percentiles,
    pub checkout_ms: Percentiles,
    pub delta_ms: Percentiles,
}

#[derive(Default)]
struct Timings {
    queue_wait_ms: Vec<u64>,
    /// Admitted fans who were promised a wait at the join: (promised, waited), in seconds.
    eta: Vec<(f64, f64)>,
    /// The same for every later poll of an admitted fan that promised a wait: (promised, waited from then).
    eta_polls: Vec<(f64, f64)>,
    hold_ms: Vec<u64>,
    checkout_ms: Vec<u64>,
    payment_ms: Vec<u64>,
    admitted_at_ms: Vec<u64>,
    last_order_ms: u64,
    /// When the last payment booking called paid came back, since the start (ms).
    last_paid_ms: u64,
    /// When each fan was told `sold_out`, since the start (ms).
    sold_out_told_ms: Vec<u64>,
    statuses: BTreeMap<String, u64>,
    confirmed: Vec<Confirmed>,
    turns: Vec<Turn>,
    series: Vec<Sample>,
    /// How far into `hold_ms`, `checkout_ms` and the map's latencies the last sample read.
    sampled: (usize, usize, usize),
}

impl Stats {
    pub fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn with(&self, f: impl FnOnce(&mut Timings)) {
        if let Ok(mut t) = self.timings.lock() {
            f(&mut t);
        }
    }

    /// An answer seen, by request name and status (`join 200`, `hold 409`...).
    pub fn status(&self, name: &str, status: u16) {
        self.with(|t| *t.statuses.entry(format!("{name} {status}")).or_default() += 1);
    }

    /// A fan admitted after `waited`, having been promised `promised` seconds at the join (if it was).
    pub fn admitted(&self, since_start: Duration, waited: Duration, promised: Option<f64>) {
        Self::add(&self.admitted);
        self.with(|t| {
            t.admitted_at_ms.push(since_start.as_millis() as u64);
            t.queue_wait_ms.push(waited.as_micros() as u64);
            if let Some(promised) = promised {
                t.eta.push((promised, waited.as_secs_f64()));
            }
        });
    }

    /// The waits promised at an admitted fan's polls after its join, each with the wait it had from then.
    pub fn promises(&self, pairs: impl Iterator<Item = (f64, f64)>) {
        self.with(|t| t.eta_polls.extend(pairs));
    }

    /// A fan read the map's status (`bytes` as they came over the wire).
    pub fn map_status(&self, bytes: usize) {
        Self::add(&self.map_statuses);
        self.map_status_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn hold_latency(&self, took: Duration) {
        self.with(|t| t.hold_ms.push(took.as_micros() as u64));
    }

    pub fn checkout_latency(&self, took: Duration) {
        self.with(|t| t.checkout_ms.push(took.as_micros() as u64));
    }

    /// A checkout the fan saw succeed.
    pub fn confirmed(&self, order: &Confirmed, since_start: Duration) {
        Self::add(&self.orders);
        self.seats_sold.fetch_add(order.seat_ids.len() as u64, Ordering::Relaxed);
        self.with(|t| t.last_order_ms = t.last_order_ms.max(since_start.as_millis() as u64));
    }

    /// An order as the fan left it (paid or not), for the checker.
    pub fn settled(&self, order: Confirmed) {
        self.with(|t| t.confirmed.push(order));
    }

    /// A payment booking called paid, `took` long, coming back `since_start` into the run.
    pub fn paid(&self, took: Duration, since_start: Duration) {
        Self::add(&self.paid);
        self.with(|t| {
            t.payment_ms.push(took.as_micros() as u64);
            t.last_paid_ms = t.last_paid_ms.max(since_start.as_millis() as u64);
        });
    }

    /// A waiting fan was told the event is sold out, `since_start` into the run.
    pub fn told_sold_out(&self, since_start: Duration) {
        Self::add(&self.sold_out_told);
        self.with(|t| t.sold_out_told_ms.push(since_start.as_millis() as u64));
    }

    /// Records where the run stands now, with the latencies since the last sample.
    pub fn sample(&self, at: Duration, map: Option<&LiveMap>) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (joined, admitted) = (get(&self.joined), get(&self.admitted));
        let gone = get(&self.abandoned_queue) + get(&self.timed_out) + get(&self.sold_out_told) + get(&self.lapsed);
        let from = self.timings.lock().map(|t| t.sampled.2).unwrap_or(0);
        let (deltas, delta_end) = map.map_or((Vec::new(), from), |m| m.stats.latencies_since(from));
        self.with(|t| {
            let (h, c, _) = t.sampled;
            let window = |v: &[u64], from: usize| Percentiles::of(v.get(from..).unwrap_or_default().to_vec());
            let sample = Sample {
                at_seconds: at.as_secs_f64(),
                joined,
                admitted,
                waiting: joined.saturating_sub(admitted + gone),
                seats_sold: get(&self.seats_sold),
                bots_admitted: get(&self.crowd.bots.admitted),
                bots_seats: get(&self.crowd.bots.seats),
                hold_ms: window(&t.hold_ms, h),
                checkout_ms: window(&t.checkout_ms, c),
                delta_ms: Percentiles::of(deltas),
            };
            t.sampled = (t.hold_ms.len(), t.checkout_ms.len(), delta_end);
            t.series.push(sample);
        });
    }

    pub fn series(&self) -> Vec<Sample> {
        self.timings.lock().map(|t| t.series.clone()).unwrap_or_default()
    }

    /// A fan's wait in the queue, once it ended.
    pub fn turn(&self, turn: Turn) {
        self.with(|t| t.turns.push(turn));
    }

    pub fn take_turns(&self) -> Vec<Turn> {
        self.timings.lock().map(|mut t| std::mem::take(&mut t.turns)).unwrap_or_default()
    }

    pub fn take_confirmed(&self) -> Vec<Confirmed> {
        self.timings.lock().map(|mut t| std::mem::take(&mut t.confirmed)).unwrap_or_default()
    }

    /// The summary of the run so far, with what the live map's followers measured and how many of their copies
    /// agreed with the status at the end.
    pub fn summary(&self, wall: Duration, settings: &Settings, map: Option<(&LiveMap, (usize, usize))>) -> Summary {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let t = self.timings.lock().map(|t| Timings {
            queue_wait_ms: t.queue_wait_ms.clone(),
            eta: t.eta.clone(),
            eta_polls: t.eta_polls.clone(),
            hold_ms: t.hold_ms.clone(),
            checkout_ms: t.checkout_ms.clone(),
            payment_ms: t.payment_ms.clone(),
            admitted_at_ms: t.admitted_at_ms.clone(),
            last_order_ms: t.last_order_ms,
            last_paid_ms: t.last_paid_ms,
            sold_out_told_ms: t.sold_out_told_ms.clone(),
            statuses: t.statuses.clone(),
            confirmed: Vec::new(),
            turns: Vec::new(),
            series: Vec::new(),
            sampled: (0, 0, 0),
        });
        let t = t.unwrap_or_default();
        let mut admitted_at = t.admitted_at_ms.clone();
        admitted_at.sort_unstable();
        let admissions_per_minute = match (admitted_at.first(), admitted_at.last()) {
            (Some(first), Some(last)) if last > first => {
                Some((admitted_at.len() - 1) as f64 * 60_000.0 / (last - first) as f64)
            }
            _ => None,
        };
        let server_errors = t.statuses.iter().filter(|(k, _)| is_5xx(k)).map(|(_, v)| v).sum();
        let (conflicts, seats_sold) = (get(&self.conflicts), get(&self.seats_sold));
        let statuses = get(&self.map_statuses);
        let live_map = map.map(|(m, (agreeing, compared))| {
            let minutes = wall.as_secs_f64() / 60.0;
            let streams = compared.max(1) as f64;
            MapFigures {
                layout_bytes: m.layout_bytes as u64,
                status_bytes_per_fan: get(&self.map_status_bytes).checked_div(statuses).unwrap_or(0),
                streams: compared as u64,
                stream_bytes_per_minute: (get(&m.stats.stream_bytes) as f64 / streams / minutes.max(1e-9)) as u64,
                deltas: get(&m.stats.deltas),
                resyncs: get(&m.stats.resyncs),
                reconnects: get(&m.stats.reconnects),
                copies_agreeing_at_the_end: agreeing as u64,
                delta_latency_ms: Percentiles::of(m.stats.take_latencies()),
            }
        });
        Summary {
            event: settings.event,
            wall_seconds: wall.as_secs_f64(),
            joined: get(&self.joined),
            admitted: get(&self.admitted),
            abandoned_in_queue: get(&self.abandoned_queue),
            abandoned_holds: get(&self.abandoned_hold),
            lapsed: get(&self.lapsed),
            told_sold_out: get(&self.sold_out_told),
            held: get(&self.held),
            conflicts,
            conflicts_per_seat_sold: (seats_sold > 0).then(|| conflicts as f64 / seats_sold as f64),
            admitted_with_nothing_left: get(&self.admitted_nothing_left),
            gave_up: get(&self.gave_up),
            orders: get(&self.orders),
            seats_sold,
            checkouts_refused: get(&self.checkout_refused),
            orders_paid: get(&self.paid),
            orders_left_unpaid: get(&self.unpaid),
            payments_failed: get(&self.payment_failed),
            timed_out_in_queue: get(&self.timed_out),
            admissions_per_minute,
            first_admission_to_last_order_seconds: admitted_at
                .first()
                .map(|first| t.last_order_ms.saturating_sub(*first) as f64 / 1000.0),
            queue_wait_ms: Percentiles::of(t.queue_wait_ms),
            // Fans told after the last sale, each as long after it as it took (a fan told sooner was told
            // on a sale this run's fans did not see end: it counts as 0).
            sold_out_told_after_last_sale_ms: (t.last_paid_ms > 0 && !t.sold_out_told_ms.is_empty()).then(|| {
                Percentiles::of(t.sold_out_told_ms.iter().map(|at| at.saturating_sub(t.last_paid_ms) * 1000).collect())
            }),
            eta_at_join: EtaError::of(&t.eta),
            eta_at_polls: EtaError::of(&t.eta_polls),
            hold_ms: Percentiles::of(t.hold_ms),
            checkout_ms: Percentiles::of(t.checkout_ms),
            payment_ms: Percentiles::of(t.payment_ms),
            statuses: t.statuses,
            server_errors,
            live_map,
            crowd: self.crowd.figures(&settings.crowd),
            process: Process::now(),
        }
    }
}

fn is_5xx(key: &str) -> bool {
    key.rsplit(' ').next().is_some_and(|s| s.starts_with('5') && s.len() == 3)
}

/// p50, p95, p99 and max of a set of durations, in ms (from microsecond samples).
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of microsecond samples, reported in milliseconds.
    pub fn of(mut micros: Vec<u64>) -> Self {
        if micros.is_empty() {
            return Self::default();
        }
        micros.sort_unstable();
        let ms = |us: u64| us as f64 / 1000.0;
        let at = |q: f64| ms(micros[((micros.len() as f64 * q).ceil() as usize).clamp(1, micros.len()) - 1]);
        Self { count: micros.len(), p50: at(0.50), p95: at(0.95), p99: at(0.99), max: ms(micros[micros.len() - 1]) }
    }
}

/// The error of the ETAs a room promised, against the waits fans had: absolute, in seconds, and relative to
/// the wait (over fans who waited a second or more).
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct EtaError {
    pub fans: usize,
    pub abs_p50_s: f64,
    pub abs_p90_s: f64,
    pub rel_p50: f64,
    pub rel_p90: f64,
    /// Mean of (waited - promised): above 0, fans waited longer than promised.
    pub mean_late_s: f64,
}

impl EtaError {
    /// From (promised, waited) pairs in seconds; `None` without any.
    pub fn of(pairs: &[(f64, f64)]) -> Option<Self> {
        if pairs.is_empty() {
            return None;
        }
        let nearest = |mut v: Vec<f64>, q: f64| {
            if v.is_empty() {
                return 0.0;
            }
            v.sort_by(f64::total_cmp);
            v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]
        };
        let abs: Vec<f64> = pairs.iter().map(|(p, w)| (w - p).abs()).collect();
        let rel: Vec<f64> = pairs.iter().filter(|(_, w)| *w >= 1.0).map(|(p, w)| (w - p).abs() / w).collect();
        Some(Self {
            fans: pairs.len(),
            abs_p50_s: nearest(abs.clone(), 0.5),
            abs_p90_s: nearest(abs, 0.9),
            rel_p50: nearest(rel.clone(), 0.5),
            rel_p90: nearest(rel, 0.9),
            mean_late_s: pairs.iter().map(|(p, w)| w - p).sum::<f64>() / pairs.len() as f64,
        })
    }
}

/// The load generator's own cost.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct Process {
    pub cpu_seconds: f64,
    pub peak_memory_mib: f64,
}

impl Process {
    /// CPU time and peak resident memory of this process (Linux `/proc`).
    pub fn now() -> Self {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command name (which may contain spaces): utime and stime are the 12th and 13th.
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let hwm_kib = status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        Self { cpu_seconds: (ticks(11) + ticks(12)) / 100.0, peak_memory_mib: hwm_kib / 1024.0 }
    }
}

/// What the run measured, written as `summary.json` and printed.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Summary {
    pub event: i64,
    pub wall_seconds: f64,
    pub joined: u64,
    pub admitted: u64,
    pub abandoned_in_queue: u64,
    pub abandoned_holds: u64,
    pub lapsed: u64,
    pub told_sold_out: u64,
    pub held: u64,
    pub conflicts: u64,
    /// Hold conflicts (409) per seat sold.
    pub conflicts_per_seat_sold: Option<f64>,
    /// Fans admitted when their map showed nothing left to hold.
    pub admitted_with_nothing_left: u64,
    pub gave_up: u64,
    pub orders: u64,
    pub seats_sold: u64,
    pub checkouts_refused: u64,
    pub orders_paid: u64,
    /// Fans who checked out and never paid.
    pub orders_left_unpaid: u64,
    /// Payments that did not end with booking saying `paid`.
    pub payments_failed: u64,
    pub timed_out_in_queue: u64,
    pub admissions_per_minute: Option<f64>,
    pub first_admission_to_last_order_seconds: Option<f64>,
    pub queue_wait_ms: Percentiles,
    /// How long after the last payment each fan still waiting was told `sold_out`.
    #[serde(default)]
    pub sold_out_told_after_last_sale_ms: Option<Percentiles>,
    /// How far the wait promised at the join was from the wait each admitted fan had.
    #[serde(default)]
    pub eta_at_join: Option<EtaError>,
    /// The same for the waits promised at every later poll, against the wait from that poll.
    #[serde(default)]
    pub eta_at_polls: Option<EtaError>,
    pub hold_ms: Percentiles,
    pub checkout_ms: Percentiles,
    /// From opening the payment to booking's `paid` (through the provider and its webhook).
    pub payment_ms: Percentiles,
    /// Answers by request name and status.
    pub statuses: BTreeMap<String, u64>,
    pub server_errors: u64,
    /// What the live seat map cost and how fresh it was.
    pub live_map: Option<MapFigures>,
    /// Fans against bots, and what the gate cost each (present with bots, or with a challenge).
    #[serde(default)]
    pub crowd: Option<CrowdFigures>,
    pub process: Process,
}

/// The live seat map in a run.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct MapFigures {
    /// The layout, read once (a CDN or the browser keeps it).
    pub layout_bytes: u64,
    /// One status answer, as a fan reads it.
    pub status_bytes_per_fan: u64,
    /// Followers of the stream (each a page's copy of the map).
    pub streams: u64,
    /// What one follower's stream carried per minute.
    pub stream_bytes_per_minute: u64,
    pub deltas: u64,
    pub resyncs: u64,
    pub reconnects: u64,
    /// Copies equal to the status at the end (of `streams`).
    pub copies_agreeing_at_the_end: u64,
    /// From a change's commit (Redis's clock) to its receipt by a follower.
    pub delta_latency_ms: Percentiles,
}

/// The whole run: settings, stats, the connection limit, and when it started.
pub struct Run {
    pub settings: Settings,
    pub stats: Stats,
    /// In-flight requests: fans reach the gateway through a CDN that holds a bounded pool of connections.
    pub connections: Semaphore,
    pub started: Instant,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let p = Percentiles::of((1..=100).map(|ms| ms * 1000).collect());
        assert_eq!((p.count, p.p50, p.p95, p.p99, p.max), (100, 50.0, 95.0, 99.0, 100.0));
        assert_eq!(Percentiles::of(vec![7500]).p99, 7.5);
        assert_eq!(Percentiles::of(Vec::new()).count, 0);
    }

    #[test]
    fn eta_errors_are_absolute_and_relative_to_the_wait() {
        assert!(EtaError::of(&[]).is_none());
        // Promised 10 s each; waited 5, 10, 20 and 30 s.
        let e = EtaError::of(&[(10.0, 5.0), (10.0, 10.0), (10.0, 20.0), (10.0, 30.0)]).expect("four fans");
        assert_eq!((e.fans, e.abs_p50_s, e.abs_p90_s), (4, 5.0, 20.0));
        assert_eq!((e.rel_p50, e.rel_p90), (0.5, 1.0));
        assert_eq!(e.mean_late_s, 6.25);
    }

    #[test]
    fn server_errors_are_counted_by_status() {
        assert!(is_5xx("hold 503"));
        assert!(!is_5xx("hold 409"));
        assert!(!is_5xx("status 200"));
    }
}
