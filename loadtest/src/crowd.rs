//! Who is in the crowd, and what the gate costs them. A run may add bots to its fans: `--bots` accounts from
//! `--bot-addresses` addresses, interleaved with the fans as they arrive, that never think, never walk away
//! and join as fast as they can. When a room asks for a proof of work (428), fans solve it, as the page does
//! but natively; bots solve it within a budget of hashes (`--bots-solve all`) or send forgeries (`none`).
//!
//! Solving work is counted in hashes, exactly (a solution's counter plus one), and turned into CPU time with
//! this machine's cost per hash, measured once before the run: every solver here runs the same code, so shares
//! of hashes are shares of CPU.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use altcha::{Challenge, Payload, Solution, SolveChallengeOptions};
use base64::Engine;
use serde::Serialize;
use serde_json::Value;

/// A member of the crowd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Fan,
    Bot,
}

/// Whether bots solve the room's challenge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BotsSolve {
    /// Never: a bot sends a forged solution instead.
    None,
    /// Always, within the bot's budget.
    All,
}

/// The crowd of one run.
#[derive(Debug, Clone)]
pub struct Crowd {
    pub fans: usize,
    pub bots: usize,
    pub bot_addresses: usize,
    pub bots_solve: BotsSolve,
    /// The hashes one bot may spend on solving over the whole run.
    pub bot_budget_hashes: u64,
    /// Joins a bot tries while the gate refuses it.
    pub bot_attempts: u32,
}

impl Crowd {
    /// What goose user `n` is: fans and bots interleave evenly over the arrival, and the k-th of each kind
    /// gets the k-th number of its kind.
    pub fn member(&self, n: usize) -> (Kind, usize) {
        let total = (self.fans + self.bots).max(1);
        let bots_before = |i: usize| i * self.bots / total;
        let (before, after) = (bots_before(n), bots_before(n + 1));
        if after > before { (Kind::Bot, before) } else { (Kind::Fan, n - before) }
    }

    /// The address a bot comes from: one of `bot_addresses`, each in a network (a /24) of its own, as a botnet's
    /// or a proxy service's are.
    pub fn bot_ip(&self, bot: usize) -> String {
        let a = bot % self.bot_addresses.max(1);
        format!("172.{}.{}.9", 16 + (a >> 8) % 16, a & 0xff)
    }
}

/// What one kind got and spent.
#[derive(Debug, Default)]
pub struct Tally {
    pub places: AtomicU64,
    /// Answered as a waiting fan with a ticket that holds no place (a room's endless queue for forgers).
    pub held: AtomicU64,
    pub admitted: AtomicU64,
    pub orders: AtomicU64,
    pub seats: AtomicU64,
    pub solves: AtomicU64,
    pub hashes: AtomicU64,
    /// Joins the gate refused (a forged, spent or foreign solution; or the network's cap).
    pub refused: AtomicU64,
    /// Bots that gave up: their budget could not pay for the next challenge.
    pub out_of_budget: AtomicU64,
}

impl Tally {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn figures(&self, accounts: usize, ns_per_hash: f64) -> KindFigures {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        KindFigures {
            accounts: accounts as u64,
            places: get(&self.places),
            held_in_the_endless_queue: get(&self.held),
            admitted: get(&self.admitted),
            orders: get(&self.orders),
            seats: get(&self.seats),
            solves: get(&self.solves),
            hashes: get(&self.hashes),
            solving_cpu_seconds: get(&self.hashes) as f64 * ns_per_hash / 1e9,
            refused_by_the_gate: get(&self.refused),
            out_of_budget: get(&self.out_of_budget),
        }
    }
}

/// Both kinds' tallies, and the machine's cost of a hash.
#[derive(Debug, Default)]
pub struct Tallies {
    pub fans: Tally,
    pub bots: Tally,
    /// Nanoseconds of CPU per hash, measured before the run.
    pub ns_per_hash: std::sync::OnceLock<f64>,
}

impl Tallies {
    pub fn of(&self, kind: Kind) -> &Tally {
        match kind {
            Kind::Fan => &self.fans,
            Kind::Bot => &self.bots,
        }
    }

    /// The crowd's figures: present when the run had bots, or anyone solved a challenge.
    pub fn figures(&self, crowd: &Crowd) -> Option<CrowdFigures> {
        let ns = self.ns_per_hash.get().copied().unwrap_or(0.0);
        let (fans, bots) = (self.fans.figures(crowd.fans, ns), self.bots.figures(crowd.bots, ns));
        if crowd.bots == 0 && fans.solves == 0 {
            return None;
        }
        let share = |part: u64, other: u64| (part + other > 0).then(|| part as f64 / (part + other) as f64);
        let per_place = |k: &KindFigures| (k.places > 0).then(|| k.solving_cpu_seconds * 1000.0 / k.places as f64);
        Some(CrowdFigures {
            ns_per_hash: ns,
            bots_share_of_places: share(bots.places, fans.places),
            bots_share_of_seats: share(bots.seats, fans.seats),
            bots_share_of_solving: share(bots.hashes, fans.hashes),
            fan_cpu_ms_per_place: per_place(&fans),
            bot_cpu_ms_per_place: per_place(&bots),
            fans,
            bots,
        })
    }
}

/// One kind's figures in the summary.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct KindFigures {
    pub accounts: u64,
    pub places: u64,
    pub held_in_the_endless_queue: u64,
    pub admitted: u64,
    pub orders: u64,
    pub seats: u64,
    pub solves: u64,
    pub hashes: u64,
    pub solving_cpu_seconds: f64,
    pub refused_by_the_gate: u64,
    pub out_of_budget: u64,
}

/// Fans against bots.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct CrowdFigures {
    pub ns_per_hash: f64,
    pub fans: KindFigures,
    pub bots: KindFigures,
    pub bots_share_of_places: Option<f64>,
    pub bots_share_of_seats: Option<f64>,
    /// Of all the hashes solved in the run.
    pub bots_share_of_solving: Option<f64>,
    pub fan_cpu_ms_per_place: Option<f64>,
    pub bot_cpu_ms_per_place: Option<f64>,
}

/// A solved challenge: what a join sends in its `altcha` field, and the hashes it took.
pub struct Solved {
    pub field: String,
    pub hashes: u64,
}

fn field(challenge: Challenge, solution: Solution) -> String {
    let payload = Payload { challenge, solution };
    base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(&payload).unwrap_or_default())
}

/// Solves the challenge of a 428 answer, as a client would (`None`: not a challenge this solver can take).
pub fn solve(answer: &Value) -> Option<Solved> {
    let challenge: Challenge = serde_json::from_value(answer["challenge"].clone()).ok()?;
    let options = SolveChallengeOptions { timeout_ms: 0, ..SolveChallengeOptions::new(&challenge) };
    let solution = altcha::solve_challenge(options).ok()??;
    let hashes = u64::from(solution.counter) + 1;
    Some(Solved { field: field(challenge, solution), hashes })
}

/// A forgery of the challenge of a 428 answer: the challenge as given, with a made-up key.
pub fn forge(answer: &Value) -> Option<String> {
    let challenge: Challenge = serde_json::from_value(answer["challenge"].clone()).ok()?;
    Some(field(challenge, Solution { counter: 0, derived_key: "00".repeat(32), time: None }))
}

/// This machine's CPU per hash of the solver, from solving challenges made here, on one thread with nothing
/// else running (before the run): nanoseconds.
pub fn measure_ns_per_hash() -> f64 {
    let started = Instant::now();
    let mut hashes = 0u64;
    for _ in 0..8 {
        let options = altcha::CreateChallengeOptions {
            algorithm: "SHA-256".into(),
            cost: 1,
            counter: Some(50_000),
            ..altcha::CreateChallengeOptions::default()
        };
        let Ok(challenge) = altcha::create_challenge(options) else { return 0.0 };
        let solve = SolveChallengeOptions { timeout_ms: 0, ..SolveChallengeOptions::new(&challenge) };
        if let Ok(Some(s)) = altcha::solve_challenge(solve) {
            hashes += u64::from(s.counter) + 1;
        }
    }
    started.elapsed().as_nanos() as f64 / hashes.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crowd(fans: usize, bots: usize) -> Crowd {
        Crowd { fans, bots, bot_addresses: 200, bots_solve: BotsSolve::All, bot_budget_hashes: 0, bot_attempts: 3 }
    }

    #[test]
    fn fans_and_bots_interleave_and_number_each_kind_from_zero() {
        let c = crowd(6, 3);
        let kinds: Vec<(Kind, usize)> = (0..9).map(|n| c.member(n)).collect();
        let bots: Vec<usize> = kinds.iter().filter(|(k, _)| *k == Kind::Bot).map(|(_, i)| *i).collect();
        let fans: Vec<usize> = kinds.iter().filter(|(k, _)| *k == Kind::Fan).map(|(_, i)| *i).collect();
        assert_eq!((bots, fans), (vec![0, 1, 2], vec![0, 1, 2, 3, 4, 5]));
        assert!(kinds[..4].iter().any(|(k, _)| *k == Kind::Bot), "bots arrive from the start: {kinds:?}");
        assert!((0..10).all(|n| crowd(10, 0).member(n) == (Kind::Fan, n)));
    }

    #[test]
    fn bots_come_from_their_addresses_each_in_its_own_network() {
        let c = crowd(0, 1000);
        let ips: std::collections::HashSet<String> = (0..1000).map(|b| c.bot_ip(b)).collect();
        assert_eq!(ips.len(), 200);
        let networks: std::collections::HashSet<String> =
            ips.iter().map(|ip| ip.rsplit_once('.').map(|(n, _)| n.to_owned()).unwrap_or_default()).collect();
        assert_eq!(networks.len(), 200);
    }

    #[test]
    fn a_solution_costs_its_counter_plus_one_hashes_and_a_forgery_none() {
        let options = altcha::CreateChallengeOptions {
            algorithm: "SHA-256".into(),
            cost: 1,
            counter: Some(1234),
            hmac_signature_secret: Some("test".into()),
            ..altcha::CreateChallengeOptions::default()
        };
        let challenge = altcha::create_challenge(options).expect("a challenge");
        let answer = serde_json::json!({ "challenge": challenge });
        let solved = solve(&answer).expect("solved");
        assert_eq!(solved.hashes, 1235);
        assert_ne!(forge(&answer).expect("forged"), solved.field);
    }
}
