//! Prometheus metrics, served by the admin listener at `/metrics`. Labels stay low-cardinality: the event id
//! (a handful per deployment) and the HTTP status, never an account or an IP.

use std::sync::OnceLock;

use metrics::Counter;

use crate::room::Live;

/// The queue figures of one refresh, as gauges.
pub fn record_room(event: i64, live: &Live) {
    let label = event.to_string();
    let set = |name: &'static str, value: f64| metrics::gauge!(name, "event" => label.clone()).set(value);
    set("waiting_room_waiting", live.waiting() as f64);
    set("waiting_room_prequeue", live.counts.prequeue as f64);
    set("waiting_room_active", live.counts.active as f64);
    set("waiting_room_admitted_total", live.counts.admitted_total as f64);
    set("waiting_room_admissions_per_minute", live.admitted_last_minute as f64);
    set("waiting_room_abandoned_total", live.counts.abandoned_total as f64);
    set("waiting_room_freed_total", live.counts.freed_total as f64);
    set("waiting_room_admit_per_minute_setting", f64::from(live.settings.admit_per_minute));
    set("waiting_room_rate_in_force", f64::from(live.settings.rate()));
    let challenged = live.settings.challenge != crate::room::ChallengeMode::Off;
    set(
        "waiting_room_challenge_difficulty",
        if challenged { f64::from(live.settings.challenge_difficulty) } else { 0.0 },
    );
    if let Some(ms) = live.median_wait_ms {
        set("waiting_room_median_wait_seconds", ms as f64 / 1000.0);
    }
    if let Some(e) = &live.eta_error {
        let by = |name: &'static str, quantile: &'static str, value: f64| {
            metrics::gauge!(name, "event" => label.clone(), "quantile" => quantile).set(value);
        };
        by("waiting_room_eta_error_seconds", "0.5", e.abs_p50_seconds);
        by("waiting_room_eta_error_seconds", "0.9", e.abs_p90_seconds);
        by("waiting_room_eta_error_ratio", "0.5", e.rel_p50);
        by("waiting_room_eta_error_ratio", "0.9", e.rel_p90);
    }
}

/// Response counters by kind and status, registered once each: looking a labelled counter up in the registry
/// on every request would cost a hash and a lock per request.
static RESPONSES: [[OnceLock<Counter>; 600]; 2] = [const { [const { OnceLock::new() }; 600] }; 2];

/// One request the gateway answered (`proxied` false) or proxied to booking, by status.
pub fn record_response(proxied: bool, status: u16) {
    let kind = if proxied { "proxied" } else { "gateway" };
    let counter =
        |status: u16| metrics::counter!("gateway_responses_total", "kind" => kind, "status" => status.to_string());
    match RESPONSES[usize::from(proxied)].get(usize::from(status)) {
        Some(slot) => slot.get_or_init(|| counter(status)).increment(1),
        None => counter(status).increment(1),
    }
}

/// A room's settings written back after Redis lost them.
pub fn record_room_restored() {
    metrics::counter!("waiting_room_rooms_restored_total").increment(1);
}

/// One room retired by this node, over for the time set.
pub fn record_room_retired() {
    metrics::counter!("waiting_room_rooms_retired_total").increment(1);
}

/// One connection closed at once: its client IP holds as many as it may.
pub fn record_connection_refused() {
    metrics::counter!("gateway_connections_refused_total").increment(1);
}

/// One connection closed because its request's head did not arrive in time.
pub fn record_head_timeout() {
    metrics::counter!("gateway_head_timeouts_total").increment(1);
}

/// The limits a request may be refused by.
const RATE_LIMITS: [&str; 2] = ["account", "ip"];

/// Registers at zero the labelled counters a dashboard charts from the start: until something counts, a series
/// that does not exist is a blank panel, not a zero.
pub fn register_zeros() {
    for limit in RATE_LIMITS {
        metrics::counter!("gateway_rate_limited_total", "limit" => limit).increment(0);
    }
}

/// One request refused by a rate limit (`limit`: one of [`RATE_LIMITS`]).
pub fn record_rate_limited(limit: &'static str) {
    metrics::counter!("gateway_rate_limited_total", "limit" => limit).increment(1);
}

/// One queue write the replicas `GATEWAY_REDIS_WAIT_REPLICAS` asks for did not acknowledge in time: a join
/// refused with a 503 (`refused`), or an admission step or a room's settings left on the master alone.
pub fn record_unreplicated(refused: bool) {
    let outcome = if refused { "refused" } else { "unreplicated" };
    metrics::counter!("waiting_room_unreplicated_writes_total", "outcome" => outcome).increment(1);
}

/// What the gate did with one join: `issued` a challenge, `solved` (a place paid for), or refused a solution
/// as `malformed`, `failed`, `not_yours`, `expired` or `spent`; `held` counts those answered instead as a
/// waiting fan that never advances (a room's `infinite_queue_for_failed`); `network_full` counts joins refused
/// by the room's `places_per_network`.
pub fn record_gate(outcome: &'static str) {
    metrics::counter!("gateway_gate_total", "outcome" => outcome).increment(1);
}

/// What a sponsor pass did: `admitted`, `spent` (used before), `full` (the room at `max_active`).
pub fn record_pass(outcome: &'static str) {
    metrics::counter!("gateway_passes_total", "outcome" => outcome).increment(1);
}

/// A join that sent a presale code: `accepted` (it gave or returned a place) or `refused`.
pub fn record_code(outcome: &'static str) {
    metrics::counter!("gateway_presale_codes_total", "outcome" => outcome).increment(1);
}
