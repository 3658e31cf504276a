//! Rate limits (governor's GCRA): per admitted account on proxied traffic, and a coarser limit per client IP on
//! joins and polls. The client IP is read from the deployment's one forwarding header only when the TCP peer is
//! a trusted proxy. An IPv6 client is limited by its /64, the block one subscriber is given: limiting each /128
//! would give anyone billions of budgets.
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
use governor::state::keyed::DefaultKeyedStateStore;
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
    client_header: ClientIpHeader,
    clock: DefaultClock,
}

/// The one header a deployment's trusted proxies name the client in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientIpHeader {
    /// `X-Forwarded-For`: the right-most address that is not itself a trusted proxy.
    XForwardedFor,
    /// A header holding one address (`CF-Connecting-IP`, `True-Client-IP`, `X-Real-IP`...).
    Single(http::HeaderName),
}

impl std::str::FromStr for ClientIpHeader {
    type Err = String;
    fn from_str(raw: &str) -> Result<Self, String> {
        let name =
            http::HeaderName::from_bytes(raw.trim().as_bytes()).map_err(|_| format!("`{raw}` is not a header name"))?;
        Ok(if name == "x-forwarded-for" { Self::XForwardedFor } else { Self::Single(name) })
    }
}

/// The field trusted proxies name the client in by default.
static X_FORWARDED_FOR: http::HeaderName = http::HeaderName::from_static("x-forwarded-for");

impl ClientIpHeader {
    pub fn name(&self) -> &http::HeaderName {
        match self {
            Self::XForwardedFor => &X_FORWARDED_FOR,
            Self::Single(name) => name,
        }
    }
}

/// A trusted proxy named the client in a form that is not an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnreadableClientIp;

/// An address as proxies write it: `ip`, `ip:port`, `[ipv6]` or `[ipv6]:port`.
pub fn parse_ip(raw: &str) -> Option<IpAddr> {
    let raw = raw.trim();
    if let Ok(ip) = raw.parse() {
        return Some(ip);
    }
    if let Some(rest) = raw.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        let port_ok = after.is_empty() || after.strip_prefix(':').is_some_and(|p| p.parse::<u16>().is_ok());
        return port_ok.then(|| ip.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6)).flatten();
    }
    let (ip, port) = raw.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    ip.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// The network an address belongs to, `v4` or `v6` bits long (an IPv4-mapped address counts as IPv4): what
/// caps per client network (streams, queue places) count by.
pub fn address_prefix(ip: IpAddr, v4: u8, v6: u8) -> IpAddr {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    let length = if ip.is_ipv4() { v4 } else { v6 };
    IpNet::new(ip, length).map_or(ip, |net| net.trunc().addr())
}

/// The key an address is limited by: an IPv4 address itself (also when written IPv4-mapped), an IPv6 address's
/// /64.
pub fn limit_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from_bits(v6.to_bits() & !u128::from(u64::MAX))),
        },
        v4 => v4,
    }
}

/// A limiter per account. Its keys are accounts named by proofs the gateway itself verified, so nobody picks
/// keys to collide, and foldhash (seeded per map) costs less than SipHash on every request forwarded.
type AccountLimiter =
    RateLimiter<AccountId, DefaultKeyedStateStore<AccountId, foldhash::fast::RandomState>, DefaultClock>;

/// The account limiter for one count of live nodes.
struct Shared {
    nodes: u32,
    limiter: AccountLimiter,
}

impl Shared {
    fn new(rps: u32, burst: u32, nodes: u32) -> Self {
        let nodes = nodes.max(1);
        let quota = quota(rps.div_ceil(nodes), burst.max(rps).div_ceil(nodes));
        Self { nodes, limiter: RateLimiter::dashmap_with_hasher(quota, foldhash::fast::RandomState::default()) }
    }
}

fn quota(per_second: u32, burst: u32) -> Quota {
    let rate = NonZeroU32::new(per_second.max(1)).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(burst.max(per_second).max(1)).unwrap_or(NonZeroU32::MIN);
    Quota::per_second(rate).allow_burst(burst)
}

impl Limits {
    pub fn new(account_rps: u32, account_burst: u32, ip_rps: u32, ip_burst: u32, trusted: Vec<IpNet>) -> Self {
        Self::with_header(account_rps, account_burst, ip_rps, ip_burst, trusted, ClientIpHeader::XForwardedFor)
    }

    pub fn with_header(
        account_rps: u32,
        account_burst: u32,
        ip_rps: u32,
        ip_burst: u32,
        trusted: Vec<IpNet>,
        client_header: ClientIpHeader,
    ) -> Self {
        Self {
            client_header,
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

    /// `Err(wait)` when the IP (an IPv6 address's /64) is over its limit.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Duration> {
        self.per_ip.check_key(&limit_key(ip)).map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// [`Limits::check_ip`] for a request that costs `n` of the address's budget (an answer many times the
    /// size of most); one that costs more than the whole burst waits a second and is never let through.
    pub fn check_ip_n(&self, ip: IpAddr, n: u32) -> Result<(), Duration> {
        let Some(n) = NonZeroU32::new(n) else { return Ok(()) };
        match self.per_ip.check_key_n(&limit_key(ip), n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(not_until.wait_time_from(self.clock.now())),
            Err(_) => Err(Duration::from_secs(1)),
        }
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

    /// The header trusted proxies name the client in.
    pub fn client_header(&self) -> &ClientIpHeader {
        &self.client_header
    }

    /// The client's IP, given the values of [`Self::client_header`]. From anyone but a trusted proxy: the peer,
    /// whatever the headers say. From a trusted proxy: what its header says (the peer if it sent none), or
    /// [`UnreadableClientIp`]; never the proxy's own address for a value it could not read, which would put all
    /// its clients under one limit.
    pub fn client_ip(&self, peer: IpAddr, values: &[&str]) -> Result<IpAddr, UnreadableClientIp> {
        if !self.is_trusted(peer) || values.is_empty() {
            return Ok(peer);
        }
        match self.client_header {
            ClientIpHeader::Single(_) => match values {
                [one] => parse_ip(one).ok_or(UnreadableClientIp),
                _ => Err(UnreadableClientIp),
            },
            ClientIpHeader::XForwardedFor => {
                let hops = values.iter().flat_map(|v| v.split(',')).map(parse_ip).collect::<Option<Vec<IpAddr>>>();
                let hops = hops.ok_or(UnreadableClientIp)?;
                hops.iter().rev().find(|ip| !self.is_trusted(**ip)).or(hops.first()).copied().ok_or(UnreadableClientIp)
            }
        }
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
        assert_eq!(l.client_ip(ip("203.0.113.9"), &["5.6.7.8"]), Ok(ip("203.0.113.9")));
        assert_eq!(l.client_ip(ip("10.1.1.1"), &["9.9.9.9, 5.6.7.8, 10.2.2.2"]), Ok(ip("5.6.7.8")));
        assert_eq!(l.client_ip(ip("10.1.1.1"), &["9.9.9.9", "5.6.7.8:4711"]), Ok(ip("5.6.7.8")));
        assert_eq!(l.client_ip(ip("10.1.1.1"), &["[2001:db8::1]:443"]), Ok(ip("2001:db8::1")));
        assert_eq!(l.client_ip(ip("10.1.1.1"), &["10.3.3.3"]), Ok(ip("10.3.3.3")));
        assert_eq!(l.client_ip(ip("10.1.1.1"), &[]), Ok(ip("10.1.1.1")), "the proxy's own request");
        // Never the proxy's own address for a value it could not read: all its clients would share one limit.
        for bad in ["garbage", "1.2.3.4, unknown", "1.2.3.4:99999", ""] {
            assert_eq!(l.client_ip(ip("10.1.1.1"), &[bad]), Err(UnreadableClientIp), "{bad:?}");
        }
    }

    #[test]
    fn one_named_header_is_believed_and_no_other() {
        let header: ClientIpHeader = "CF-Connecting-IP".parse().expect("name");
        let l = Limits::with_header(1, 2, 1, 1, vec!["10.0.0.0/8".parse().expect("cidr")], header.clone());
        assert_eq!(l.client_header(), &header);
        assert_eq!(l.client_ip(ip("10.1.1.1"), &["1.2.3.4"]), Ok(ip("1.2.3.4")));
        assert_eq!(l.client_ip(ip("10.1.1.1"), &["1.2.3.4", "5.6.7.8"]), Err(UnreadableClientIp));
        assert_eq!(l.client_ip(ip("10.1.1.1"), &["1.2.3.4, 5.6.7.8"]), Err(UnreadableClientIp));
        assert_eq!("X-Forwarded-For".parse::<ClientIpHeader>(), Ok(ClientIpHeader::XForwardedFor));
        assert!("bad header".parse::<ClientIpHeader>().is_err());
    }

    #[test]
    fn an_ipv6_client_is_limited_by_its_64_and_a_mapped_ipv4_as_itself() {
        let l = limits(&[]);
        assert!(l.check_ip(ip("2001:db8:1:2::1")).is_ok());
        assert!(l.check_ip(ip("2001:db8:1:2:ffff::9")).is_err(), "another address of the same /64 shares its limit");
        assert!(l.check_ip(ip("2001:db8:1:3::1")).is_ok(), "the next /64 is another subscriber");
        assert_eq!(limit_key(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(limit_key(ip("192.0.2.7")), ip("192.0.2.7"));
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

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    /// Forwarding-header-like text: addresses, ports, brackets, commas and anything else.
    fn forwarded() -> impl Strategy<Value = String> {
        prop_oneof![
            "(([0-9]{1,3}\\.){3}[0-9]{1,3}(:[0-9]{1,6})?)(, ?([0-9]{1,3}\\.){3}[0-9]{1,3}){0,3}",
            "\\[?[0-9a-f:]{2,39}\\]?(:[0-9]{1,6})?",
            "[0-9a-f:.,\\[\\] ]{0,40}",
            any::<String>(),
        ]
    }

    proptest! {
        #[test]
        fn the_client_ip_choice_never_panics_and_never_believes_an_untrusted_peer(
            values in prop::collection::vec(forwarded(), 0..3),
            trusted_peer in any::<bool>(),
        ) {
            let limits = Limits::new(1, 1, 1, 1, vec!["10.0.0.0/8".parse().expect("cidr")]);
            let peer: IpAddr = if trusted_peer { "10.0.0.1" } else { "203.0.113.1" }.parse().expect("ip");
            let refs: Vec<&str> = values.iter().map(String::as_str).collect();
            match limits.client_ip(peer, &refs) {
                Ok(ip) if !trusted_peer => prop_assert_eq!(ip, peer),
                Ok(ip) => {
                    // The peer itself (no header), or an address the header names.
                    let named = refs.iter().flat_map(|v| v.split(',')).filter_map(parse_ip).any(|a| a == ip);
                    prop_assert!(ip == peer && refs.is_empty() || named, "{:?} gave {}", refs, ip);
                }
                Err(UnreadableClientIp) => prop_assert!(trusted_peer && !refs.is_empty()),
            }
        }

        #[test]
        fn every_address_parses_back_in_every_form_proxies_write(v4 in any::<u32>(), v6 in any::<u128>(), port in any::<u16>()) {
            let v4 = std::net::Ipv4Addr::from_bits(v4);
            let v6 = std::net::Ipv6Addr::from_bits(v6);
            prop_assert_eq!(parse_ip(&format!(" {v4} ")), Some(IpAddr::V4(v4)));
            prop_assert_eq!(parse_ip(&format!("{v4}:{port}")), Some(IpAddr::V4(v4)));
            prop_assert_eq!(parse_ip(&v6.to_string()), Some(IpAddr::V6(v6)));
            prop_assert_eq!(parse_ip(&format!("[{v6}]:{port}")), Some(IpAddr::V6(v6)));
            prop_assert_eq!(parse_ip(&format!("[{v6}]")), Some(IpAddr::V6(v6)));
            // The /64 key keeps the first 64 bits and nothing else.
            let key = limit_key(IpAddr::V6(v6));
            if v6.to_ipv4_mapped().is_none() {
                prop_assert_eq!(key, IpAddr::V6(std::net::Ipv6Addr::from_bits(v6.to_bits() >> 64 << 64)));
            }
        }
    }
}
