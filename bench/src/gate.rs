//! `gate-bench`: what the proof-of-work gate costs the gateway, and what solving costs a client, on this
//! machine. The gateway's side is its own code (`gateway::gate::Gate`, as a join runs it): issuing a challenge,
//! checking a good solution, refusing a forged one. The client's side is `altcha`'s own solver, native and on
//! one core, the fastest honest client (a script); the page's solve in a browser is `deploy/browser-test
//! --bench-gate`'s.
//!
//! CPU time is the thread's own (`/proc/thread-self/schedstat`), not the wall clock, so another process on the
//! box does not count; each figure is the median of `--rounds` rounds.

use std::time::Duration;

use altcha::{Challenge, Solution, SolveChallengeOptions};
use anyhow::Context;
use clap::Parser;
use gateway::gate::{Gate, payload_field};
use tokens::unix_now;

#[derive(Debug, Parser)]
#[command(name = "gate-bench", about = "Measure the gateway's cost to issue and check proof-of-work challenges")]
struct Args {
    /// Operations per round: enough that a round's CPU time dwarfs the scheduler's tick, at which the
    /// thread's CPU time is brought up to date.
    #[arg(long, default_value_t = 20_000)]
    per_round: u32,
    /// Rounds; each figure is their median.
    #[arg(long, default_value_t = 9)]
    rounds: u32,
    /// The difficulty the native solver is timed at (the room's default).
    #[arg(long, default_value_t = gateway::room::Settings::DEFAULT.challenge_difficulty)]
    difficulty: u32,
    /// Challenges the native solver solves.
    #[arg(long, default_value_t = 40)]
    solves: u32,
}

/// The calling thread's CPU time so far.
fn cpu() -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").context("reading /proc/thread-self/schedstat")?;
    let ns: u64 = stat.split_whitespace().next().and_then(|v| v.parse().ok()).context("schedstat's first field")?;
    Ok(Duration::from_nanos(ns))
}

/// The median over `rounds` of the CPU per operation of `op` run `per_round` times, in microseconds.
fn median_us(rounds: u32, per_round: u32, mut op: impl FnMut(u32)) -> anyhow::Result<f64> {
    let mut figures = Vec::new();
    for _ in 0..rounds {
        let start = cpu()?;
        for i in 0..per_round {
            op(i);
        }
        figures.push((cpu()? - start).as_secs_f64() * 1e6 / f64::from(per_round));
    }
    figures.sort_by(f64::total_cmp);
    Ok(figures[figures.len() / 2])
}

fn solve(challenge: &Challenge) -> anyhow::Result<Solution> {
    altcha::solve_challenge(SolveChallengeOptions { timeout_ms: 0, ..SolveChallengeOptions::new(challenge) })?
        .context("no solution")
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let gate = Gate::new(b"gate-bench: an admission secret of 32 bytes or more");
    let (event, account) = (42, "fan-1");
    let issue = median_us(args.rounds, args.per_round, |_| {
        std::hint::black_box(gate.issue(event, account, args.difficulty, unix_now()));
    })?;
    // Solutions of easy challenges: a check costs the same whatever the difficulty was.
    let solved: Vec<(Challenge, Solution)> = (0..64)
        .map(|_| {
            let challenge = gate.issue(event, account, 1000, unix_now());
            solve(&challenge).map(|s| (challenge, s))
        })
        .collect::<anyhow::Result<_>>()?;
    let fields: Vec<String> = solved.iter().map(|(c, s)| payload_field(c, s)).collect();
    let check = median_us(args.rounds, args.per_round, |i| {
        let paid = gate.check(&fields[i as usize % fields.len()], event, account);
        assert!(paid.is_ok(), "{paid:?}");
    })?;
    // The same challenges with a made-up key: the whole check runs and fails at the last HMAC.
    let forged: Vec<String> =
        solved.iter().map(|(c, s)| payload_field(c, &Solution { derived_key: "00".repeat(32), ..s.clone() })).collect();
    let refuse = median_us(args.rounds, args.per_round, |i| {
        std::hint::black_box(gate.check(&forged[i as usize % forged.len()], event, account).err());
    })?;

    let start = cpu()?;
    let mut counters = 0u64;
    for _ in 0..args.solves {
        counters += u64::from(solve(&gate.issue(event, account, args.difficulty, unix_now()))?.counter) + 1;
    }
    let solving = cpu()? - start;
    let per_hash_ns = solving.as_nanos() as f64 / counters as f64;
    let per_solve_ms = solving.as_secs_f64() * 1e3 / f64::from(args.solves);

    println!("| what | CPU (median of {} rounds of {}) | target |", args.rounds, args.per_round);
    println!("|---|---|---|");
    println!("| issue a challenge | {issue:.1} µs | ≤ 20 µs |");
    println!("| check a good solution | {check:.1} µs | ≤ 50 µs |");
    println!("| refuse a forged solution | {refuse:.1} µs | |");
    println!();
    println!(
        "native solver (altcha, one core): {:.0} ns per hash, {per_solve_ms:.1} ms per challenge at difficulty {} \
         ({} challenges, {counters} hashes)",
        per_hash_ns, args.difficulty, args.solves
    );
    Ok(())
}
