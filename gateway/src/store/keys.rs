//! Every key name the gateway builds: an event's queue keys (one hash tag per event), booking's seat-map keys
//! it reads, and the keys that span events.

/// Builds every key of one event's queue. The prefix namespaces a deployment (or a test) and never contains a
/// brace, so `{ev<id>}` is the key's hash tag.
#[derive(Debug, Clone)]
pub struct QueueKeys {
    base: String,
}

impl QueueKeys {
    pub fn new(prefix: &str, event: i64) -> Self {
        Self { base: redisconn::keys::queue_base(prefix, event) }
    }

    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.base)
    }

    /// All twenty-nine keys, in script order.
    pub fn all(&self) -> Vec<String> {
        KEY_NAMES.iter().map(|name| self.key(name)).collect()
    }

    /// Every key the room has: the scripts' twenty-nine and its presale code batches (`queue_retire`'s keys).
    pub fn every(&self) -> Vec<String> {
        let mut keys = self.all();
        keys.push(self.key("codebatches"));
        keys
    }
}

/// The keys every queue script receives, in this order (the scripts' headers list them).
const KEY_NAMES: [&str; 29] = [
    "settings", "seq", "head", "places", "who", "joined", "seen", "active", "skipped", "batches", "stats", "waits",
    "pre", "prelist", "shuffle", "spent", "networks", "codes", "uses", "holders", "later", "laterwho", "left",
    "health", "schedule", "applied", "draws", "etas", "etaerrs",
];

/// Booking's keys of an event's seat map that the gateway reads: the version and the change log (booking
/// writes them, `lua/lib/seatmap_log.lua`; both services share `REDIS_KEY_PREFIX`).
#[derive(Debug, Clone)]
pub struct SeatMapKeys {
    pub version: String,
    pub log: String,
}

impl SeatMapKeys {
    pub fn new(prefix: &str, event: i64) -> Self {
        Self {
            version: redisconn::keys::seatmap(prefix, event, "version"),
            log: redisconn::keys::seatmap(prefix, event, "log"),
        }
    }
}

/// The set of events that have a waiting room (no hash tag: read on its own, never inside a script).
pub fn rooms_key(prefix: &str) -> String {
    format!("{prefix}queue:rooms")
}

/// The rooms retired: over, their keys deleted. A node that still remembers one forgets it instead of
/// restoring it (no hash tag: it spans every event).
pub fn retired_key(prefix: &str) -> String {
    format!("{prefix}queue:retired")
}

/// Which room each presale code belongs to (no hash tag: it spans every event), so that a code sent to another
/// room is told apart from one that does not exist.
pub fn codes_index_key(prefix: &str) -> String {
    format!("{prefix}queue:codes")
}

/// A demo sign-in code (no hash tag: a key on its own).
pub fn signin_key(prefix: &str, code: &str) -> String {
    format!("{prefix}gateway:signin:{code}")
}

/// The gateway nodes that said lately that they are alive (`lua/gateway_nodes.lua`).
pub fn nodes_key(prefix: &str) -> String {
    format!("{prefix}gateway:nodes")
}

/// Booking's order event stream (booking writes it, `booking/src/store/outbox.rs`; both services share
/// `REDIS_KEY_PREFIX`).
pub fn outbox_key(prefix: &str) -> String {
    redisconn::keys::order_stream(prefix)
}
