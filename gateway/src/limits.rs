//! Rate limits (governor's GCRA): per admitted account on proxied traffic, and a coarser limit per client IP on
//! joins and polls. The client IP is read from forwarding headers only when the TCP peer is a trusted proxy.
//! Idle keys are evicted by the ticker, so memory stays bounded by the keys active within one refill period.
//!
//! An account's budget is shared by the gateway nodes without a Redis call per request: each node enforces its
//! share, the rate and the burst divided by the number of live nodes (rounded up), which the ticker reads from
//! Redis every second (`lua/gateway_nodes.lua`). With N nodes and an account's requests spread over them (as a
//! CDN or a round-robin balancer does), the account gets at most `ceil(rate / N) × N` requests a second, so
//! less than `rate + N`, and a burst of less than `burst + N`. Routing that pins an account to one node gives it
//! one node's share, never more. For a second after a node joins, the others still divide by the old count
//! (one share too many); a node that dies uncleanly counts for `NODE_ALIVE` more (the others stay stricter).

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::RwLock;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use ipnet::IpNet;
use tokens::AccountId;

/// How long a node counts as alive after it last said so; it says so every second.
pub const NODE_ALIVE: Duration = Duration::from_secs(3);

/// The gateway's limiters.
pub struct Limits {
    per_account: RwLock<Shared>,
    account_rps: u32,
    account_burst: u32,
    per_ip: DefaultKeyedRateLimiter<IpAddr>,
    trusted: Vec<IpNet>,
    clock: DefaultClock,
}

/// The account limiter for one count of live nodes.
struct Shared {
    nodes: u32,
    limiter: DefaultKeyedRateLimiter<AccountId>,
}

impl Shared {
    fn new(rps: u32, burst: u32, nodes: u32) -> Self {
        let nodes = nodes.max(1);
        Self { nodes, limiter: RateLimiter::keyed(quota(rps.div_ceil(nodes), burst.max(rps).div_ceil(nodes))) }
    }
}

fn quota(per_second: u32, burst: u32) -> Quota {
    let rate = NonZeroU32::new(per_second.max(1)).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(burst.max(per_second).max(1)).unwrap_or(NonZeroU32::MIN);
    Quota::per_second(rate).allow_burst(burst)
}

impl Limits {
    pub fn new(account_rps: u32, account_burst: u32, ip_rps: u32, ip_burst: u32, trusted: Vec<IpNet>) -> Self {
        Self {
            per_account: RwLock::new(Shared::new(account_rps, account_burst, 1)),
            account_rps,
            account_burst,
            per_ip: RateLimiter::keyed(quota(ip_rps, ip_burst)),
            trusted,
            clock: DefaultClock::default(),
        }
    }

    /// `Err(wait)` when the account is over this node's share of its limit.
    pub fn check_account(&self, account: &AccountId) -> Result<(), Duration> {
        let shared = self.per_account.read().unwrap_or_else(|p| p.into_inner());
        shared.limiter.check_key(account).map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// How many gateway nodes share each account's budget.
    pub fn nodes(&self) -> u32 {
        self.per_account.read().unwrap_or_else(|p| p.into_inner()).nodes
    }

    /// Sets how many gateway nodes share each account's budget. A new count starts the accounts' limits afresh
    /// at the new share (counts change rarely: a node starts or stops).
    pub fn set_nodes(&self, nodes: u32) {
        let nodes = nodes.max(1);
        if self.nodes() == nodes {
            return;
        }
        let fresh = Shared::new(self.account_rps, self.account_burst, nodes);
        *self.per_account.write().unwrap_or_else(|p| p.into_inner()) = fresh;
    }

    /// `Err(wait)` when the IP is over its limit.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Duration> {
        self.per_ip.check_key(&ip).map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// Forgets keys whose limit has fully refilled (they would start afresh anyway).
    pub fn evict_idle(&self) {
        {
            let shared = self.per_account.read().unwrap_or_else(|p| p.into_inner());
            shared.limiter.retain_recent();
            shared.limiter.shrink_to_fit();
        }
        self.per_ip.retain_recent();
        self.per_ip.shrink_to_fit();
    }

    /// Keys currently tracked (accounts, IPs).
    pub fn tracked(&self) -> (usize, usize) {
        (self.per_account.read().unwrap_or_else(|p| p.into_inner()).limiter.len(), self.per_ip.len())
    }

    /// Whether `ip` is a trusted proxy, whose forwarding headers are believed.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client's IP. From a trusted peer: `CF-Connecting-IP`, else the right-most `X-Forwarded-For` entry
    /// that is not itself a trusted proxy. From anyone else: the peer, whatever the headers say.
    pub fn client_ip(&self, peer: IpAddr, cf_connecting_ip: Option<&str>, forwarded_for: &[&str]) -> IpAddr {
        if !self.is_trusted(peer) {
            return peer;
        }
        if let Some(ip) = cf_connecting_ip.and_then(|v| v.trim().parse().ok()) {
            return ip;
        }
        let hops: Vec<IpAddr> =
            forwarded_for.iter().flat_map(|v| v.split(',')).filter_map(|h| h.trim().parse().ok()).collect();
        hops.iter().rev().find(|ip| !self.is_trusted(**ip)).or(hops.first()).copied().unwrap_or(peer)
    }
}

/// `Retry-After` seconds for a wait (at least 1).
pub fn retry_after_seconds(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0).max(u64::from(wait.is_zero()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(trusted: &[&str]) -> Limits {
        Limits::new(1, 2, 1, 1, trusted.iter().map(|n| n.parse().expect("cidr")).collect())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn forwarding_headers_count_only_from_trusted_peers() {
        let l = limits(&["10.0.0.0/8"]);
        assert_eq!(l.client_ip(ip("203.0.113.9"), Some("1.2.3.4"), &["5.6.7.8"]), ip("203.0.113.9"));
        assert_eq!(l.client_ip(ip("10.1.1.1"), Some("1.2.3.4"), &["5.6.7.8"]), ip("1.2.3.4"));
        assert_eq!(l.client_ip(ip("10.1.1.1"), None, &["9.9.9.9, 5.6.7.8, 10.2.2.2"]), ip("5.6.7.8"));
        assert_eq!(l.client_ip(ip("10.1.1.1"), None, &["garbage"]), ip("10.1.1.1"));
        assert_eq!(l.client_ip(ip("10.1.1.1"), None, &["10.3.3.3"]), ip("10.3.3.3"));
    }

    #[test]
    fn an_account_over_its_limit_waits_while_others_go_on() {
        let l = limits(&[]);
        let (a, b) = (AccountId::parse("a").expect("id"), AccountId::parse("b").expect("id"));
        assert!(l.check_account(&a).is_ok());
        assert!(l.check_account(&a).is_ok());
        let wait = l.check_account(&a).expect_err("third request within a second");
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1), "{wait:?}");
        assert!(l.check_account(&b).is_ok());
        assert_eq!(l.tracked().0, 2);
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_seconds(Duration::ZERO), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(10)), 1);
        assert_eq!(retry_after_seconds(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_seconds(Duration::from_millis(2100)), 3);
    }
}
