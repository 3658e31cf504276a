//! Booking's answers as this node sees them, per event: how many came back, how many slower than the room's
//! latency target, how many were 503s (booking's own, or the gateway's when booking could not be reached or
//! timed out), and requests still waiting. The ticker hands each adaptive room's figures to
//! `lua/queue_adapt.lua`, which pools every node's and moves the room's admission rate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// The shortest silence that counts as booking stalled (see [`Health::take`]).
const STALL_AT_LEAST: Duration = Duration::from_secs(1);

/// Every event's figures on this node.
#[derive(Debug)]
pub struct Health {
    epoch: Instant,
    events: RwLock<HashMap<i64, Arc<Watch>>>,
}

/// One event's figures since the ticker last took them.
#[derive(Debug, Default)]
struct Watch {
    answered: AtomicU64,
    slow: AtomicU64,
    unavailable: AtomicU64,
    /// Requests sent and not answered yet.
    outstanding: AtomicU64,
    /// When a request last came back, or the first of the outstanding ones left (ms since the epoch).
    progress_ms: AtomicU64,
}

/// What one node saw of an event's answers since it last reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    pub answered: u64,
    /// Answered later than the room's latency target.
    pub slow: u64,
    /// Answered 503 (or 502/504: booking unreachable or timed out).
    pub unavailable: u64,
    /// Requests waiting with nothing answered for twice the target (and at least a second): booking stalled.
    pub stalled: u64,
}

/// One request on its way to booking; [`Pending::finish`] records its answer. Dropped unfinished (the client
/// went away first), it only stops being outstanding.
#[derive(Debug)]
pub struct Pending {
    watch: Arc<Watch>,
    health: Arc<Health>,
    started: Instant,
    target: Duration,
}

impl Default for Health {
    fn default() -> Self {
        Self { epoch: Instant::now(), events: RwLock::new(HashMap::new()) }
    }
}

impl Health {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn watch(&self, event: i64) -> Arc<Watch> {
        if let Some(w) = self.events.read().ok().and_then(|m| m.get(&event).cloned()) {
            return w;
        }
        let Ok(mut map) = self.events.write() else { return Arc::default() };
        map.entry(event).or_default().clone()
    }

    /// A request for `event` leaves for booking; `target` is the room's latency target.
    pub fn start(self: &Arc<Self>, event: i64, target: Duration) -> Pending {
        let watch = self.watch(event);
        if watch.outstanding.fetch_add(1, Ordering::Relaxed) == 0 {
            watch.progress_ms.store(self.now_ms(), Ordering::Relaxed);
        }
        Pending { watch, health: self.clone(), started: Instant::now(), target }
    }

    /// Takes what was seen of `event` since the last call.
    pub fn take(&self, event: i64, target: Duration) -> Report {
        let Some(w) = self.events.read().ok().and_then(|m| m.get(&event).cloned()) else {
            return Report::default();
        };
        let outstanding = w.outstanding.load(Ordering::Relaxed);
        let quiet_for = self.now_ms().saturating_sub(w.progress_ms.load(Ordering::Relaxed));
        // Slow answers come back in bursts that may each outlast the target: silence counts as a stall only
        // once it has lasted twice the target, and at least a second.
        let stalled = u128::from(quiet_for) > (target * 2).max(STALL_AT_LEAST).as_millis();
        Report {
            answered: w.answered.swap(0, Ordering::Relaxed),
            slow: w.slow.swap(0, Ordering::Relaxed),
            unavailable: w.unavailable.swap(0, Ordering::Relaxed),
            stalled: if stalled { outstanding } else { 0 },
        }
    }
}

impl Pending {
    /// Booking's answer (or the gateway's own, when booking failed) had `status`.
    pub fn finish(self, status: u16) {
        let w = &self.watch;
        w.answered.fetch_add(1, Ordering::Relaxed);
        if self.started.elapsed() > self.target {
            w.slow.fetch_add(1, Ordering::Relaxed);
        }
        if matches!(status, 502..=504) {
            w.unavailable.fetch_add(1, Ordering::Relaxed);
        }
        w.progress_ms.store(self.health.now_ms(), Ordering::Relaxed);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.watch.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_counted_once_and_a_silent_booking_reads_as_stalled() {
        let health = Arc::new(Health::default());
        let target = Duration::from_millis(30);
        let silence = STALL_AT_LEAST + Duration::from_millis(50);
        health.start(7, Duration::ZERO).finish(200);
        health.start(7, target).finish(503);
        let report = health.take(7, target);
        assert_eq!(report, Report { answered: 2, slow: 1, unavailable: 1, stalled: 0 });
        assert_eq!(health.take(7, target), Report::default(), "taken once");

        let waiting = health.start(7, target);
        assert_eq!(health.take(7, Duration::from_secs(3600)).stalled, 0, "not waiting longer than the target");
        std::thread::sleep(silence);
        assert_eq!(health.take(7, target).stalled, 1, "nothing back for longer than a stall takes");
        drop(waiting);
        assert_eq!(health.take(7, target).stalled, 0, "a client that went away is not outstanding");
        assert_eq!(health.take(8, target), Report::default(), "another event saw nothing");
    }
}
