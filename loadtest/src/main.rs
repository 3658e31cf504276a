//! `loadtest`: replays an on-sale with goose, then proves nothing was double-sold.
//!
//! `loadtest onsale` drives N fans (default 20,000) through the gateway: queue, seat map, hold, checkout and
//! payment; it shows progress while it runs and writes goose's HTML report, `charts.html` (the run over time,
//! self-contained SVG), `summary.json`, `summary.md`, `series.json`, `orders.jsonl` (every order a fan saw
//! confirmed) and `turns.jsonl` (each fan's place, join and admission). `loadtest check` reads Postgres and
//! Redis and asserts the invariants, printing any offending rows. `deploy/onsale` runs both against the local
//! stack.

mod chart;
mod check;
mod crowd;
mod fan;
mod map;
mod mapbench;
mod picker;
mod run;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use goose::config::GooseConfiguration;
use goose::prelude::*;
use secrecy::{ExposeSecret, SecretString};
use tokens::Keyring;

use crate::fan::journey;
use crate::run::{Run, Settings, Stats, Summary};

#[derive(Debug, Parser)]
#[command(name = "loadtest", version, about = "On-sale replays with goose, and the invariant checker")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay an on-sale through the gateway.
    Onsale(Box<OnsaleArgs>),
    /// Check the invariants of a finished run against Postgres and Redis.
    Check(CheckArgs),
    /// Load the live seat map: many stream subscribers while holds and releases go to booking, then a
    /// reconnect storm (`deploy/bench-seatmap` runs it).
    MapBench(MapBenchArgs),
}

#[derive(Debug, Args)]
struct MapBenchArgs {
    /// The gateway's public URL (plain HTTP).
    #[arg(long, env = "GATEWAY_URL", default_value = "http://127.0.0.1:18000")]
    gateway: String,
    /// Booking's URL, where the holds and releases go.
    #[arg(long, env = "BOOKING_URL", default_value = "http://127.0.0.1:18080")]
    booking: String,
    /// The event (it must have a waiting room, and at least 100 free seats).
    #[arg(long)]
    event: i64,
    /// Stream subscribers, each on its own connection.
    #[arg(long, default_value_t = 10_000)]
    subscribers: usize,
    /// Seat changes a second (half holds, half their releases).
    #[arg(long, default_value_t = 1_000)]
    changes_per_second: u64,
    /// How long the changes go on, in seconds.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Keyring that signs admission proofs (booking verifies them).
    #[arg(long, env = "ADMISSION_KEYS", value_parser = secret)]
    admission_keys: SecretString,
    /// The gateway's process id, to read its memory per subscriber.
    #[arg(long)]
    gateway_pid: Option<u32>,
}

#[derive(Debug, Args)]
struct OnsaleArgs {
    /// The gateway's public URL, or several gateway nodes' URLs, comma-separated: fans are spread over them
    /// round robin, as a CDN spreads its clients.
    #[arg(long, env = "GATEWAY_URLS", default_value = "http://127.0.0.1:18000", value_delimiter = ',')]
    gateway: Vec<String>,
    /// The event on sale (it must have a waiting room).
    #[arg(long)]
    event: i64,
    /// Fans in the run.
    #[arg(long, default_value_t = 20_000)]
    fans: usize,
    /// Seconds over which the fans arrive.
    #[arg(long, default_value_t = 10)]
    burst_seconds: u64,
    /// Requests in flight at once: the CDN's pool of connections to the gateway (fans share them).
    #[arg(long, default_value_t = 256)]
    connections: usize,
    /// Share of fans who close the tab while queued.
    #[arg(long, default_value_t = 0.05)]
    abandon_queue: f64,
    /// Share of fans who let their hold expire instead of checking out.
    #[arg(long, default_value_t = 0.03)]
    abandon_hold: f64,
    /// Share of fans who check out but never pay (their orders lapse at the payment deadline).
    #[arg(long, default_value_t = 0.05)]
    abandon_payment: f64,
    /// Share of fans who go for the best sections.
    #[arg(long, default_value_t = 0.7)]
    best_share: f64,
    /// Shortest think time (map to hold, hold to checkout), ms.
    #[arg(long, default_value_t = 300)]
    think_min_ms: u64,
    /// Longest think time, ms.
    #[arg(long, default_value_t = 1500)]
    think_max_ms: u64,
    /// The room's admission rate, to draw beside the admissions it measures (the gateway's setting; the run
    /// does not read it).
    #[arg(long)]
    admit_per_minute_setting: Option<u32>,
    /// Followers of the seat map's stream: each keeps a page's copy of the map, and fans pick from them in turn.
    #[arg(long, default_value_t = 50)]
    map_streams: usize,
    /// Holds a fan tries (around the seats 409s name) before giving up.
    #[arg(long, default_value_t = 5)]
    hold_attempts: u32,
    /// The longest any fan waits in the queue, seconds; also bounds the whole run (plus 300 s).
    #[arg(long, default_value_t = 1800)]
    max_wait_seconds: u64,
    /// Bots in the crowd besides the fans: accounts that join as fast as they can (interleaved with the fans'
    /// arrival), never think and never walk away.
    #[arg(long, default_value_t = 0)]
    bots: usize,
    /// The addresses the bots come from, each in a network of its own.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=4096))]
    bot_addresses: u64,
    /// Whether bots solve a room's proof-of-work challenge (within --bot-cpu-ms) or send forgeries.
    #[arg(long, value_enum, default_value_t = crowd::BotsSolve::None)]
    bots_solve: crowd::BotsSolve,
    /// CPU each bot may spend solving over the run, in ms of this machine's solver.
    #[arg(long, default_value_t = 1000.0)]
    bot_cpu_ms: f64,
    /// Joins a bot tries while the gate refuses it.
    #[arg(long, default_value_t = 3)]
    bot_attempts: u32,
    /// Output directory (report.html, charts.html, summary.json, summary.md, series.json, orders.jsonl,
    /// turns.jsonl).
    #[arg(long, default_value = "target/onsale")]
    out: PathBuf,
    /// Keyring that signs the fans' account tokens (the gateway verifies with it).
    #[arg(long, env = "ACCOUNT_KEYS", value_parser = secret)]
    account_keys: SecretString,
    /// Issuer of the account tokens.
    #[arg(long, env = "ACCOUNT_ISSUER", default_value = "platform")]
    account_issuer: String,
}

#[derive(Debug, Args)]
struct CheckArgs {
    /// The event of the run.
    #[arg(long)]
    event: i64,
    /// A run with faults injected (`deploy/chaos`): 503 with `Retry-After` is allowed, the admission bounds are
    /// not checked (a flushed Redis forgets its steps), and the order stream must hold every change of the event.
    #[arg(long)]
    chaos: bool,
    /// The run's output directory.
    #[arg(long, default_value = "target/onsale")]
    out: PathBuf,
    #[arg(long, env = "DATABASE_URL", value_parser = secret)]
    database_url: SecretString,
    #[arg(long, env = "REDIS_URL", value_parser = secret)]
    redis_url: SecretString,
    /// The gateway's Redis key prefix.
    #[arg(long, env = "REDIS_KEY_PREFIX", default_value = "")]
    redis_key_prefix: String,
}

fn secret(raw: &str) -> Result<SecretString, String> {
    Ok(SecretString::from(raw.to_owned()))
}

#[tokio::main]
async fn main() {
    telemetry::init_logging("warn");
    if let Err(e) = execute(Cli::parse()).await {
        eprintln!("loadtest: {e:#}");
        std::process::exit(1);
    }
}

async fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Onsale(args) => onsale(*args).await,
        Command::MapBench(args) => {
            anyhow::ensure!(args.subscribers > 0 && args.seconds > 0, "--subscribers and --seconds must be at least 1");
            mapbench::run(mapbench::Bench {
                gateway: args.gateway,
                booking: args.booking,
                event: args.event,
                subscribers: args.subscribers,
                changes_per_second: args.changes_per_second,
                seconds: args.seconds,
                admission: Keyring::parse(args.admission_keys.expose_secret()).context("ADMISSION_KEYS")?,
                gateway_pid: args.gateway_pid,
            })
            .await
        }
        Command::Check(args) => {
            check::run(&check::Target {
                database_url: args.database_url.expose_secret(),
                redis_url: args.redis_url.expose_secret(),
                redis_key_prefix: &args.redis_key_prefix,
                event: args.event,
                out: &args.out,
                chaos: args.chaos,
            })
            .await
        }
    }
}

async fn onsale(args: OnsaleArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.fans > 0 && args.connections > 0, "--fans and --connections must be at least 1");
    anyhow::ensure!(!args.gateway.is_empty() && args.gateway.iter().all(|g| !g.is_empty()), "--gateway names no URL");
    let first = args.gateway[0].clone();
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    // Before anything runs: the solver's cost here, to turn hashes into CPU time and the bots' budget into hashes.
    let ns_per_hash = tokio::task::spawn_blocking(crowd::measure_ns_per_hash).await?;
    let crowd = crowd::Crowd {
        fans: args.fans,
        bots: args.bots,
        bot_addresses: args.bot_addresses as usize,
        bots_solve: args.bots_solve,
        bot_budget_hashes: (args.bot_cpu_ms.max(0.0) * 1e6 / ns_per_hash.max(1.0)) as u64,
        bot_attempts: args.bot_attempts.max(1),
    };
    let settings = Settings {
        event: args.event,
        run_id: format!("lt{:x}", rand::random::<u32>()),
        accounts: Keyring::parse(args.account_keys.expose_secret()).context("ACCOUNT_KEYS")?,
        issuer: args.account_issuer.clone(),
        abandon_queue: args.abandon_queue,
        abandon_hold: args.abandon_hold,
        abandon_payment: args.abandon_payment,
        best_share: args.best_share,
        think_ms: (args.think_min_ms, args.think_max_ms),
        hold_attempts: args.hold_attempts,
        max_wait: Duration::from_secs(args.max_wait_seconds),
        gateways: args.gateway.clone(),
        crowd,
    };
    let run = Run {
        settings,
        stats: Stats::default(),
        connections: tokio::sync::Semaphore::new(args.connections),
        started: Instant::now(),
    };
    if fan::RUN.set(run).is_err() {
        anyhow::bail!("one run per process");
    }
    let run = fan::RUN.get().context("the run")?;
    let _ = run.stats.crowd.ns_per_hash.set(ns_per_hash);
    let map = map::LiveMap::start(&first, args.event, args.map_streams)
        .await
        .context("reading the event's seat map (layout and status) through the gateway")?;
    if fan::MAP.set(map.clone()).is_err() {
        anyhow::bail!("one map per process");
    }
    eprintln!(
        "on-sale: {} fans{} arriving over {} s at {} (event {}), {} connections; report in {}",
        args.fans,
        if args.bots > 0 {
            format!(" and {} bots from {} addresses", args.bots, args.bot_addresses)
        } else {
            String::new()
        },
        args.burst_seconds,
        args.gateway.join(", "),
        args.event,
        args.connections,
        args.out.display()
    );

    run.stats.sample(Duration::ZERO, fan::MAP.get().map(|m| &**m));
    let progress = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        tick.tick().await;
        loop {
            tick.tick().await;
            run.stats.sample(run.started.elapsed(), fan::MAP.get().map(|m| &**m));
            let s = &run.stats;
            let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
            let p = run::Process::now();
            eprintln!(
                "  {:>5.0} s  joined {:>6}  admitted {:>6}  held {:>6}  orders {:>6}  seats sold {:>6}  conflicts {:>6}  told sold out {:>6}  map deltas {:>6}  (cpu {:.0} s, peak {:.0} MiB)",
                run.started.elapsed().as_secs_f64(),
                get(&s.joined),
                get(&s.admitted),
                get(&s.held),
                get(&s.orders),
                get(&s.seats_sold),
                get(&s.conflicts),
                get(&s.sold_out_told),
                fan::MAP.get().map_or(0, |m| get(&m.stats.deltas)),
                p.cpu_seconds,
                p.peak_memory_mib,
            );
        }
    });

    let users = args.fans + args.bots;
    let hatch_rate = (users as f64 / args.burst_seconds.max(1) as f64).max(1.0);
    let report = args.out.join("report.html");
    let attack = GooseAttack::initialize_with_config(GooseConfiguration::default())?
        .register_scenario(scenario!("Fan").register_transaction(transaction!(journey).set_name("journey")))
        .set_client_builder_without_cookies(
            goose::client::GooseClientBuilder::new().without_cookies().timeout(Duration::from_secs(30)),
        )?
        .set_default(GooseDefault::Host, first.as_str())?
        .set_default(GooseDefault::Users, users)?
        .set_default(GooseDefault::IncreaseRate, format!("{hatch_rate}").as_str())?
        .set_default(GooseDefault::Iterations, 1)?
        .set_default(GooseDefault::ReportFile, report.to_string_lossy().as_ref())?
        .set_default(GooseDefault::NoTelnet, true)?
        .set_default(GooseDefault::NoWebSocket, true)?
        .set_default(GooseDefault::NoAutoStart, false)?
        .set_default(GooseDefault::Quiet, 1)?;
    // Each fan gives up after --max-wait-seconds in the queue; the whole run is bounded too.
    let bound = Duration::from_secs(args.max_wait_seconds + 300);
    let result = tokio::time::timeout(bound, attack.execute()).await;
    progress.abort();
    let wall = run.started.elapsed();
    result.with_context(|| format!("the run did not end within {} s", bound.as_secs()))?.context("the goose run")?;

    run.stats.sample(wall, Some(&map));
    let agreement = map.agreement().await;
    let summary = run.stats.summary(wall, &run.settings, Some((&map, agreement)));
    let title = format!("On-sale run, event {}", args.event);
    std::fs::write(
        args.out.join("charts.html"),
        chart::page(&title, &run.stats.series(), args.admit_per_minute_setting, summary.crowd.as_ref()),
    )?;
    std::fs::write(args.out.join("series.json"), serde_json::to_string_pretty(&run.stats.series())?)?;
    let confirmed = run.stats.take_confirmed();
    let mut orders = String::new();
    for c in &confirmed {
        orders.push_str(&serde_json::to_string(c)?);
        orders.push('\n');
    }
    std::fs::write(args.out.join("orders.jsonl"), orders)?;
    let mut turns = String::new();
    for t in run.stats.take_turns() {
        turns.push_str(&serde_json::to_string(&t)?);
        turns.push('\n');
    }
    std::fs::write(args.out.join("turns.jsonl"), turns)?;
    std::fs::write(args.out.join("summary.json"), serde_json::to_string_pretty(&summary)?)?;
    let text = render(&summary, args.fans);
    std::fs::write(args.out.join("summary.md"), &text)?;
    println!("{text}");
    // Every page's copy, built from a status and the stream's deltas, must be the map itself.
    match agreement {
        (_, 0) => eprintln!("loadtest: the map kept moving; the followers' copies were not compared"),
        (agreeing, compared) => anyhow::ensure!(
            agreeing == compared,
            "{} of {compared} followers' copies of the seat map differ from the status",
            compared - agreeing
        ),
    }
    Ok(())
}

/// The short summary, as markdown.
fn render(s: &Summary, fans: usize) -> String {
    let pct = |p: &run::Percentiles| format!("{:.1} / {:.1} / {:.1} ms (n = {})", p.p50, p.p95, p.p99, p.count);
    let opt = |v: Option<f64>, unit: &str| v.map_or("-".to_owned(), |v| format!("{v:.1}{unit}"));
    let mut out = format!(
        "# On-sale run, event {}\n\n| what | figure |\n|---|---|\n\
         | fans | {fans} |\n| wall time | {:.1} s |\n| joined | {} |\n| admitted | {} |\n\
         | admissions per minute (first to last admission) | {} |\n| abandoned while queued | {} |\n\
         | holds | {} |\n| hold conflicts (409) | {} |\n| gave up (no seats left to try) | {} |\n\
         | holds left to expire | {} |\n| orders | {} |\n| seats sold | {} |\n| checkouts refused | {} |\n\
         | orders paid | {} |\n| orders left unpaid | {} |\n| payments not confirmed | {} |\n\
         | told sold out while queued | {} |\n| left the queue after --max-wait-seconds | {} |\n\
         | first admission to last order | {} |\n\
         | queue wait p50 / p95 / p99 | {} |\n| hold latency p50 / p95 / p99 | {} |\n\
         | checkout latency p50 / p95 / p99 | {} |\n\
         | payment (open, pay, webhook) p50 / p95 / p99 | {} |\n| 5xx answers | {} |\n\
         | load generator CPU / peak memory | {:.1} s / {:.0} MiB |\n\n",
        s.event,
        s.wall_seconds,
        s.joined,
        s.admitted,
        opt(s.admissions_per_minute, ""),
        s.abandoned_in_queue,
        s.held,
        s.conflicts,
        s.gave_up,
        s.abandoned_holds,
        s.orders,
        s.seats_sold,
        s.checkouts_refused,
        s.orders_paid,
        s.orders_left_unpaid,
        s.payments_failed,
        s.told_sold_out,
        s.timed_out_in_queue,
        opt(s.first_admission_to_last_order_seconds, " s"),
        pct(&s.queue_wait_ms),
        pct(&s.hold_ms),
        pct(&s.checkout_ms),
        pct(&s.payment_ms),
        s.server_errors,
        s.process.cpu_seconds,
        s.process.peak_memory_mib,
    );
    for (label, eta) in [("ETA at join", &s.eta_at_join), ("ETA at later polls", &s.eta_at_polls)] {
        let Some(e) = eta else { continue };
        out = out.replace(
            "| hold latency p50 / p95 / p99 |",
            &format!(
                "| {label}, error p50 / p90 | {:.1} / {:.1} s; {:.0}% / {:.0}% of the wait (n = {}; on average {:.1} s {}) |\n\
                 | hold latency p50 / p95 / p99 |",
                e.abs_p50_s,
                e.abs_p90_s,
                e.rel_p50 * 100.0,
                e.rel_p90 * 100.0,
                e.fans,
                e.mean_late_s.abs(),
                if e.mean_late_s >= 0.0 { "later than promised" } else { "sooner than promised" },
            ),
        );
    }
    if let Some(told) = &s.sold_out_told_after_last_sale_ms {
        out = out.replace(
            "| left the queue after --max-wait-seconds |",
            &format!(
                "| told sold out after the last payment, p50 / p95 / max | {:.1} / {:.1} / {:.1} s (n = {}) |\n\
                 | left the queue after --max-wait-seconds |",
                told.p50 / 1000.0,
                told.p95 / 1000.0,
                told.max / 1000.0,
                told.count
            ),
        );
    }
    let ratio = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
    out = out.replace(
        "| gave up (no seats left to try) |",
        &format!(
            "| hold conflicts per seat sold | {} |\n| admitted with nothing left to hold | {} |\n| gave up (no seats left to try) |",
            ratio(s.conflicts_per_seat_sold),
            s.admitted_with_nothing_left
        ),
    );
    if let Some(m) = &s.live_map {
        out.push_str(&format!(
            "## Live seat map\n\n| what | figure |\n|---|---|\n\
             | delta latency (commit to receipt) p50 / p95 / p99 | {} |\n| deltas received | {} |\n\
             | layout (read once, cacheable) | {} bytes |\n| status, per fan | {} bytes |\n\
             | stream, per follower per minute | {} bytes |\n| followers (copies agreeing with the status at the end) | {} ({}) |\n\
             | resyncs / reconnects | {} / {} |\n\n",
            pct(&m.delta_latency_ms),
            m.deltas,
            m.layout_bytes,
            m.status_bytes_per_fan,
            m.stream_bytes_per_minute,
            m.streams,
            m.copies_agreeing_at_the_end,
            m.resyncs,
            m.reconnects,
        ));
    }
    if let Some(c) = &s.crowd {
        let share = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:.1}%", v * 100.0));
        let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1} ms"));
        let (f, b) = (&c.fans, &c.bots);
        out.push_str(&format!(
            "## Fans and bots\n\n| what | fans | bots |\n|---|---|---|\n\
             | accounts | {} | {} |\n| places | {} | {} |\n| held in the endless queue | {} | {} |\n\
             | admitted | {} | {} |\n| orders | {} | {} |\n| seats | {} | {} |\n\
             | challenges solved | {} | {} |\n| refused at the gate | {} | {} |\n| out of budget | {} | {} |\n\
             | solving CPU | {:.1} s | {:.1} s |\n| solving CPU per place | {} | {} |\n\n\
             Bots' share: {} of places, {} of seats, {} of the solving CPU ({:.0} ns per hash here).\n\n",
            f.accounts,
            b.accounts,
            f.places,
            b.places,
            f.held_in_the_endless_queue,
            b.held_in_the_endless_queue,
            f.admitted,
            b.admitted,
            f.orders,
            b.orders,
            f.seats,
            b.seats,
            f.solves,
            b.solves,
            f.refused_by_the_gate,
            b.refused_by_the_gate,
            f.out_of_budget,
            b.out_of_budget,
            f.solving_cpu_seconds,
            b.solving_cpu_seconds,
            ms(c.fan_cpu_ms_per_place),
            ms(c.bot_cpu_ms_per_place),
            share(c.bots_share_of_places),
            share(c.bots_share_of_seats),
            share(c.bots_share_of_solving),
            c.ns_per_hash,
        ));
    }
    out.push_str("## Answers by request and status\n\n");
    for (k, n) in &s.statuses {
        out.push_str(&format!("- {k}: {n}\n"));
    }
    out
}
