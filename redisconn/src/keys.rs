//! The Redis keys more than one program names: booking writes an event's seat map and the order stream, the
//! gateway reads them, and the replay's checker reads the gateway's queue. Each is built here once, so the
//! services cannot drift apart. Every key of an event carries the hash tag `{ev<id>}` (a script touches one
//! slot); `prefix` is `REDIS_KEY_PREFIX`, shared by both services.

use std::fmt::Display;

/// A key of the event's seat map: `version`, `log`, `lapses`, `taken` or `server` (see `lua/lib/seatmap_log.lua`).
pub fn seatmap(prefix: &str, event: impl Display, name: &str) -> String {
    format!("{prefix}seatmap:{{ev{event}}}:{name}")
}

/// Every key of the event's waiting room is this and the key's name (see `lua/queue_admit.lua`'s header).
pub fn queue_base(prefix: &str, event: impl Display) -> String {
    format!("{prefix}queue:{{ev{event}}}:")
}

/// The stream of order events the outbox relay publishes, one for every event (no hash tag: no script touches
/// it together with an event's keys).
pub fn order_stream(prefix: &str) -> String {
    format!("{prefix}outbox:orders")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_events_keys_share_its_hash_tag() {
        assert_eq!(seatmap("p:", 7, "log"), "p:seatmap:{ev7}:log");
        assert_eq!(format!("{}settings", queue_base("p:", 7)), "p:queue:{ev7}:settings");
        assert_eq!(order_stream("p:"), "p:outbox:orders");
    }
}
