//! The waiting-room gateway, on pingora. This slice forwards `/events/{id}/...` to booking only with a valid
//! admission proof for that event, checked in-process (no Redis, no network call). The queue, admission at a
//! live rate, per-account limits and the admin listener come next (see the gateway issue).

pub mod admission;
pub mod config;
pub mod proxy;
