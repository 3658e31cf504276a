//! `booking-bench`: holds and checkouts per second through booking, side by side with the same work done raw
//! on the same machine — `redis-benchmark` running EVALSHA of the same acquire script, and `pgbench` running
//! single-row INSERTs — and the ratios between them.
//!
//! It works in a scratch schema of its own (migrated, then seeded with one event), so it neither reads nor
//! writes the stack's tables: it starts its own `booking serve` child on a scratch port, key prefix and that
//! schema, drives it with `wrk`, runs `pgbench` in the same schema, and at the end drops the schema and
//! deletes the keys. Everything runs on loopback, each phase bounded by its duration.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use secrecy::{ExposeSecret, SecretString};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, PgPool};
use tokens::{AccountId, AdmissionClaims, Keyring, unix_now};

use booking::domain::{EventId, HoldToken, SeatId};
use booking::seed::{SeedOptions, seed};
use booking::store::holds::{Acquired, Ask, HoldTimes, Holds, Keys};

#[derive(Debug, clap::Parser)]
#[command(
    name = "booking-bench",
    version,
    about = "Measure holds and checkouts per second through booking against redis-benchmark and pgbench on this machine"
)]
pub struct BenchArgs {
    #[command(flatten)]
    pub db: booking::config::DatabaseArgs,
    /// Redis connection URL.
    #[arg(long, env = "REDIS_URL", value_parser = secret)]
    pub redis_url: SecretString,
    /// Admission keyring (the child server verifies with it, the bench signs with it).
    #[arg(long, env = "ADMISSION_KEYS", value_parser = secret)]
    pub admission_keys: SecretString,
    /// Seconds each measured phase runs.
    #[arg(long, default_value_t = 8)]
    pub seconds: u64,
    /// Concurrent connections of wrk and redis-benchmark. Enough for booking's group commit to fill its
    /// batches: with fewer, the CPU stays partly idle while each checkout waits in turn for Redis, its batch and
    /// the commit's fsync, so the figure measures latency rather than capacity.
    #[arg(long, default_value_t = 128)]
    pub connections: u32,
    /// pgbench runs with each of these client counts, comma-separated; checkouts are held against the best of
    /// them (pgbench peaks at a different count on each machine).
    #[arg(long, value_delimiter = ',', default_value = "8,16,32,64", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub pgbench_clients: Vec<u32>,
    /// The booking binary to run as the scratch server (default: the one built beside this), to compare two builds with the same
    /// driver, one run after the other.
    #[arg(long)]
    pub server: Option<std::path::PathBuf>,
    /// Port of the scratch booking server (below 32768).
    #[arg(long, default_value_t = 18070)]
    pub port: u16,
    /// Seats in the scratch venue: each round's holds for its checkout phase, and the rest for the hold phase
    /// (one seat per hold; the default leaves 300,000, 37,500 per second over 8 s).
    #[arg(long, default_value_t = 600_000)]
    pub seats: u32,
    /// Holds prepared (untimed) for each round's checkout phase (the default allows 12,500 checkouts per second
    /// over 8 s).
    #[arg(long, default_value_t = 100_000)]
    pub checkout_holds: usize,
    /// Rounds of checkouts and pgbench, run in turn; each figure is the median round: one slow spell of a
    /// shared machine can move a single run's ratio by a quarter.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=20))]
    pub rounds: u16,
}

fn secret(raw: &str) -> Result<SecretString, String> {
    Ok(SecretString::from(raw.to_owned()))
}

/// One measured figure: its rate in each round it ran, and the CPU spent over all of them.
struct Figure {
    what: String,
    /// Operations a second, one per round.
    per_second: Vec<f64>,
    /// What the rounds' runs noted (each different note once).
    notes: Vec<String>,
    /// Clock ticks the servers spent over the rounds: the scratch booking server, Postgres, Redis.
    ticks: [u64; 3],
    ops: f64,
    /// Whether a booking server took part (its column is printed only then).
    booking: bool,
    /// WAL the cluster wrote over the rounds (for the Postgres phases): records, full-page images, bytes.
    wal: Option<[f64; 3]>,
}

impl Figure {
    fn new(what: &str) -> Self {
        Self {
            what: what.into(),
            per_second: vec![],
            notes: vec![],
            ticks: [0; 3],
            ops: 0.0,
            booking: false,
            wal: None,
        }
    }

    /// Records a round that did `ops` operations in `--seconds`, with the CPU `cpu` saw since it started and
    /// the WAL written meanwhile (Postgres phases), and says how it went on stderr.
    fn add(&mut self, args: &BenchArgs, ops: f64, cpu: CpuMeter, wal: Option<[f64; 3]>, note: String) {
        let spent = cpu.spent();
        let booking = cpu.booking.is_some();
        let wal_note = wal.map(|w| format!("; {}", wal_per_op(&w, ops))).unwrap_or_default();
        eprintln!("bench:   {:.0} a second; {}{wal_note}", ops / args.seconds as f64, cpu_per_op(&spent, ops, booking));
        if let Some(w) = wal {
            let total = self.wal.get_or_insert([0.0; 3]);
            for (total, w) in total.iter_mut().zip(w) {
                *total += w;
            }
        }
        self.per_second.push(ops / args.seconds as f64);
        for (total, spent) in self.ticks.iter_mut().zip(spent) {
            *total += spent;
        }
        self.ops += ops;
        self.booking |= booking;
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// The median round (the lower middle one of an even count).
    fn median(&self) -> f64 {
        let mut sorted = self.per_second.clone();
        sorted.sort_by(f64::total_cmp);
        sorted.get(sorted.len().saturating_sub(1) / 2).copied().unwrap_or(0.0)
    }

    /// Each round's rate, " / "-separated.
    fn rounds(&self) -> String {
        self.per_second.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(" / ")
    }

    /// The servers' CPU per operation, over every round, and the WAL per operation where it was measured.
    fn cpu_per_op(&self) -> String {
        let wal = self.wal.map(|w| format!("; {}", wal_per_op(&w, self.ops))).unwrap_or_default();
        format!("{}{wal}", cpu_per_op(&self.ticks, self.ops, self.booking))
    }
}

/// "WAL N records, N full pages, N bytes": what the cluster wrote, per operation.
fn wal_per_op(wal: &[f64; 3], ops: f64) -> String {
    let ops = ops.max(1.0);
    format!("WAL {:.1} records, {:.2} full pages, {:.0} bytes", wal[0] / ops, wal[1] / ops, wal[2] / ops)
}

/// "booking N µs, Postgres N µs, Redis N µs": clock ticks spent by each, per operation.
fn cpu_per_op(ticks: &[u64; 3], ops: f64, booking: bool) -> String {
    let us = |i: usize| ticks[i] as f64 * 1e6 / clock_ticks_per_second() / ops.max(1.0);
    let booking = if booking { format!("booking {:.0} µs, ", us(0)) } else { String::new() };
    format!("{booking}Postgres {:.0} µs, Redis {:.0} µs", us(1), us(2))
}

/// Every figure of a run.
struct Figures {
    holds: Figure,
    evalsha: Figure,
    checkouts: Figure,
    /// One per `--pgbench-clients`, in the order asked, with its client count.
    pgbench: Vec<(u32, Figure)>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    booking::telemetry::init();
    run(&<BenchArgs as clap::Parser>::parse()).await
}

/// The `booking` binary built beside this one (`target/<profile>/booking`).
fn sibling_booking() -> anyhow::Result<std::path::PathBuf> {
    let me = std::env::current_exe()?;
    let booking = me.with_file_name("booking");
    anyhow::ensure!(
        booking.exists(),
        "no booking binary beside {} (build it: cargo build --release -p booking), or pass --server",
        me.display()
    );
    Ok(booking)
}

async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let checkout_seats = usize::from(args.rounds) * args.checkout_holds;
    anyhow::ensure!(
        args.checkout_holds > 0 && checkout_seats < args.seats as usize,
        "--checkout-holds ({}) times --rounds ({}) must be at least 1 and fewer than --seats ({}): the rest are \
         the hold phase's",
        args.checkout_holds,
        args.rounds,
        args.seats
    );
    anyhow::ensure!(!args.pgbench_clients.is_empty(), "--pgbench-clients needs at least one client count");
    for tool in ["wrk", "redis-benchmark", "pgbench"] {
        which(tool).with_context(|| format!("`{tool}` is not installed (deploy/stack up installs it)"))?;
    }
    let ring = Keyring::parse(args.admission_keys.expose_secret()).context("ADMISSION_KEYS")?;
    // One tag per run names its schema, its Redis keys and its accounts, so cleanup removes exactly what this
    // run made.
    let tag = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    let schema = format!("bench_{tag}");
    let url = scratch_url(args.db.database_url.expose_secret(), &schema)?;
    let admin = PgPool::connect(args.db.database_url.expose_secret()).await.context("connecting to Postgres")?;
    // The schema's name is "bench_" and 12 hex digits of a fresh UUID: nothing to quote.
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .context("creating the scratch schema")?;
    let work = std::env::temp_dir().join(format!("booking-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;

    let run = async {
        // Seeding 250,000 seats takes seconds by design: no slow-statement warnings in the bench's output.
        let options = url.parse::<PgConnectOptions>().context("DATABASE_URL")?.disable_statement_logging();
        let pool = PgPool::connect_with(options).await.context("connecting to the scratch schema")?;
        booking::MIGRATOR.run(&pool).await.context("migrating the scratch schema")?;
        eprintln!("bench: seeding a scratch event of {} seats in schema {schema}", args.seats);
        let seeded = seed(
            &pool,
            &SeedOptions { seats: args.seats, sponsor_seats: 0, event_name: "bench".into(), ..Default::default() },
        )
        .await?;
        // Statistics taken now, with the order tables empty: the worst case for plans cached per connection
        // (a young database), which the checkout functions must survive (migration 008), and no autovacuum
        // analysing the seeded tables in the middle of a run.
        sqlx::query(
            "ANALYZE venues, sections, seats, events, ticket_types, seat_allocations, orders, order_seats,
             idempotency_keys, order_events, payment_events",
        )
        .execute(&pool)
        .await
        .context("analysing the scratch schema")?;
        let scratch = Scratch { url: &url, pool: &pool, ring: &ring, event: EventId(seeded.event_id), tag: &tag };
        let figures = measure(args, &scratch, &work).await;
        pool.close().await;
        figures
    };
    // Ctrl-C stops the run (wrk and redis-benchmark get it too and return early) and still cleans up.
    let outcome = tokio::select! {
        outcome = run => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };

    eprintln!("bench: cleaning up");
    cleanup(&admin, args, &schema, &tag).await;
    let _ = std::fs::remove_dir_all(&work);

    let Figures { holds, evalsha, checkouts, pgbench } = &outcome?;
    let all = [holds, evalsha, checkouts].into_iter().chain(pgbench.iter().map(|(_, f)| f));
    println!();
    println!("{:<58} {:>10}  {:<24} notes", "measured on this machine, client included", "per second", "rounds");
    for f in all.clone() {
        println!("{:<58} {:>10.0}  {:<24} {}", f.what, f.median(), f.rounds(), f.notes.join(" | "));
    }
    println!("(per second: the median round)");
    println!();
    println!("server CPU per operation (from /proc, over every round; clients not counted):");
    for f in all {
        println!("  {:<56} {}", f.what, f.cpu_per_op());
    }
    let (best_clients, best) =
        pgbench.iter().max_by(|a, b| a.1.median().total_cmp(&b.1.median())).context("no pgbench run")?;
    let per_round: Vec<String> = (0..checkouts.per_second.len())
        .map(|r| {
            let fastest = pgbench.iter().filter_map(|(_, p)| p.per_second.get(r)).copied().fold(0.0, f64::max);
            format!("{:.2}", checkouts.per_second[r] / fastest)
        })
        .collect();
    println!();
    println!(
        "holds through booking / raw EVALSHA            = {:.2}  (target >= 0.50)",
        holds.median() / evalsha.median()
    );
    println!(
        "checkouts through booking / pgbench at its best = {:.2}  (target >= 0.50; pgbench -c{best_clients}, the fastest of -c{})",
        checkouts.median() / best.median(),
        args.pgbench_clients.iter().map(u32::to_string).collect::<Vec<_>>().join(", -c")
    );
    println!("  round by round, against the round's fastest     = {}", per_round.join(" / "));
    for (clients, p) in pgbench.iter().filter(|(c, _)| c != best_clients) {
        println!("  against {:<38} = {:.2}", format!("pgbench -c{clients}"), checkouts.median() / p.median());
    }
    Ok(())
}

/// `url` with its search path set to `schema` alone, for this process's pool, the child server and pgbench.
fn scratch_url(url: &str, schema: &str) -> anyhow::Result<String> {
    anyhow::ensure!(!url.contains("options="), "DATABASE_URL already sets `options`; the bench needs to set its own");
    let sep = if url.contains('?') { '&' } else { '?' };
    Ok(format!("{url}{sep}options=-c%20search_path%3D{schema}"))
}

/// What one run works in: the scratch schema's URL and pool, the seeded event, and the run's tag.
struct Scratch<'a> {
    url: &'a str,
    pool: &'a PgPool,
    ring: &'a Keyring,
    event: EventId,
    tag: &'a str,
}

async fn measure(args: &BenchArgs, scratch: &Scratch<'_>, work: &std::path::Path) -> anyhow::Result<Figures> {
    let Scratch { pool, ring, event, tag, .. } = *scratch;
    let prefix = &format!("bench-{tag}:");
    let seat_ids: Vec<i64> =
        sqlx::query_scalar("SELECT seat_id FROM seat_allocations WHERE event_id = $1 ORDER BY seat_id")
            .bind(event.0)
            .fetch_all(pool)
            .await?;
    let (first, last) = (seat_ids[0], seat_ids[seat_ids.len() - 1]);
    anyhow::ensure!(last - first + 1 == seat_ids.len() as i64, "bench seats are not contiguous");
    let base = format!("http://127.0.0.1:{}", args.port);
    let start_server = async || {
        let mut server = ScratchServer::start(args, scratch.url, prefix)?;
        server.wait_ready().await?;
        // Warm the server's catalogue cache, so the first timed requests do not wait for the cold load.
        let account = AccountId::parse(&format!("bench{tag}-warm"))?;
        warm_up(args.port, event, &ring.sign(&AdmissionClaims::new(account, event.0, unix_now(), 60))).await?;
        anyhow::Ok(server)
    };
    let mut server = start_server().await?;

    // Phase 1: holds through booking. One seat per hold, every request a different seat, eight per account.
    // The checkout rounds use the seats above the ones this may reach.
    let rounds = usize::from(args.rounds);
    let hold_seats = seat_ids.len() - rounds * args.checkout_holds;
    let proofs = work.join("proofs.txt");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&proofs)?);
    for i in 0..hold_seats.div_ceil(8) {
        let account = AccountId::parse(&format!("bench{tag}-h{i}"))?;
        writeln!(file, "{}", ring.sign(&AdmissionClaims::new(account, event.0, unix_now(), 3600)))?;
    }
    file.flush()?;
    drop(file);
    let script = work.join("holds.lua");
    std::fs::write(&script, [include_str!("../wrk/common.lua"), include_str!("../wrk/holds.lua")].concat())?;
    eprintln!("bench: holds through booking for {} s", args.seconds);
    let cpu = CpuMeter::start(server.pid());
    let out = wrk(
        args,
        &script,
        &base,
        &[&event.0.to_string(), &first.to_string(), &hold_seats.to_string(), &proofs.to_string_lossy()],
    )?;
    let granted = field(&out, "granted")?;
    let ran_out = granted as usize >= hold_seats;
    if ran_out {
        eprintln!("bench: warning: every bench seat was held; raise --seats for a longer run");
    }
    let mut holds = Figure::new("holds through booking (HTTP + JWT + EVALSHA), 201s");
    holds.add(args, granted, cpu, None, floor_note(wrk_note(args, &out)?, ran_out, "--seats"));

    // Phase 2: the same script straight at Redis.
    eprintln!("bench: redis-benchmark EVALSHA of lua/acquire_hold.lua");
    let cpu = CpuMeter::start(None);
    let per_second = redis_benchmark(args, event, tag).await?;
    let mut evalsha = Figure::new("raw redis-benchmark EVALSHA acquire_hold.lua");
    evalsha.add(args, per_second * args.seconds as f64, cpu, None, format!("redis-benchmark -c{}", args.connections));

    // Phases 3 and 4, in rounds: checkouts through booking, of holds prepared untimed (one seat each, one per
    // account), then pgbench, single-row INSERT into a table shaped like order_seats, with each client count.
    // Side by side in each round, so a slow spell of the shared machine weighs on both sides of the ratio.
    let mut checkouts = Figure::new("checkouts through booking (Redis verify + Postgres tx), 201s");
    let mut pgbench_runs: Vec<(u32, Figure)> = args
        .pgbench_clients
        .iter()
        .map(|&c| (c, Figure::new(&format!("raw pgbench single-row INSERT, {c} clients"))))
        .collect();
    let script = work.join("checkouts.lua");
    std::fs::write(&script, [include_str!("../wrk/common.lua"), include_str!("../wrk/checkouts.lua")].concat())?;
    for round in 0..rounds {
        let of = format!("round {} of {}", round + 1, args.rounds);
        if round > 0 {
            server = start_server().await?;
        }
        eprintln!("bench: {of}: preparing {} holds for the checkout phase", args.checkout_holds);
        let holds_file = work.join("holds.txt");
        let from = hold_seats + round * args.checkout_holds;
        prepare_holds(args, ring, event, tag, &seat_ids[from..from + args.checkout_holds], &holds_file).await?;
        checkpoint(pool).await;
        eprintln!("bench: {of}: checkouts through booking for {} s", args.seconds);
        let cpu = CpuMeter::start(server.pid());
        let wal = WalMeter::start(pool).await;
        let out = wrk(args, &script, &base, &[&event.0.to_string(), &holds_file.to_string_lossy()])?;
        let created = field(&out, "created")?;
        let ran_out = created as usize >= args.checkout_holds;
        if ran_out {
            eprintln!("bench: warning: every prepared hold was checked out; raise --checkout-holds");
        }
        let wal = wal.spent(pool).await;
        checkouts.add(args, created, cpu, wal, floor_note(wrk_note(args, &out)?, ran_out, "--checkout-holds"));
        server.stop();

        for (clients, figure) in &mut pgbench_runs {
            let clients = *clients;
            checkpoint(pool).await;
            eprintln!("bench: {of}: pgbench single-row INSERT, {clients} clients");
            let cpu = CpuMeter::start(None);
            let wal = WalMeter::start(pool).await;
            let per_second = pgbench(args, clients, scratch.url, pool, work).await?;
            let wal = wal.spent(pool).await;
            figure.add(args, per_second * args.seconds as f64, cpu, wal, format!("pgbench -c{clients} (fsync on)"));
        }
    }
    Ok(Figures { holds, evalsha, checkouts, pgbench: pgbench_runs })
}

/// The child `booking serve` under test.
struct ScratchServer {
    child: Option<Child>,
    port: u16,
}

impl ScratchServer {
    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn start(args: &BenchArgs, database_url: &str, prefix: &str) -> anyhow::Result<Self> {
        let exe = match &args.server {
            Some(exe) => exe.clone(),
            None => sibling_booking()?,
        };
        let child = Command::new(exe)
            .args(["serve", "--listen", &format!("127.0.0.1:{}", args.port), "--redis-key-prefix", prefix])
            .args(["--hold-ttl-ms", "600000"])
            .env("DATABASE_URL", database_url)
            .env("REDIS_URL", args.redis_url.expose_secret())
            .env("ADMISSION_KEYS", args.admission_keys.expose_secret())
            .env("RUST_LOG", "warn,sqlx::query=error")
            .stdin(Stdio::null())
            .spawn()
            .context("starting the scratch booking server")?;
        Ok(Self { child: Some(child), port: args.port })
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("the scratch booking server exited: {status}");
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the scratch booking server did not listen on port {} within 15 s", self.port)
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGINT lets it drain; it exits within a second or two.
            let _ = Command::new("kill").args(["-INT", &child.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ScratchServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts a timed Postgres phase just after a checkpoint, so both phases begin alike (every page's first change
/// writes its full image again) and a checkpoint set off by the runs' WAL (the server log showed one starting
/// every one or two runs, each about 530 MB of WAL after the last) does not land in the middle of one phase
/// and not the other. Needs the `pg_checkpoint` role (`deploy/stack up` grants it); without it
/// the run goes on, with a warning.
async fn checkpoint(pool: &PgPool) {
    if let Err(e) = sqlx::query("CHECKPOINT").execute(pool).await {
        eprintln!("bench: warning: no CHECKPOINT before the phase ({e}); a checkpoint may land in the middle of it");
    }
}

/// WAL the whole cluster wrote during a phase, from `pg_stat_wal` (records, full-page images, bytes): a
/// checkout writes several rows and index entries where pgbench's INSERT writes one row and one append to its
/// key, and an index that takes its entries at random places (random UUIDs) gets a full-page image of each
/// page's first change after a checkpoint. `None` where the server does not have the view.
struct WalMeter(Option<[f64; 3]>);

impl WalMeter {
    async fn start(pool: &PgPool) -> Self {
        Self(Self::read(pool).await)
    }

    async fn spent(self, pool: &PgPool) -> Option<[f64; 3]> {
        let (start, end) = (self.0?, Self::read(pool).await?);
        Some(std::array::from_fn(|i| end[i] - start[i]))
    }

    async fn read(pool: &PgPool) -> Option<[f64; 3]> {
        let row: (i64, i64, f64) = sqlx::query_as("SELECT wal_records, wal_fpi, wal_bytes::float8 FROM pg_stat_wal")
            .fetch_one(pool)
            .await
            .ok()?;
        Some([row.0 as f64, row.1 as f64, row.2])
    }
}

/// CPU the servers of a phase spent, read from `/proc`: the scratch booking server (when there is one), every
/// `postgres` process on the machine (with the backends that exited meanwhile, which their postmaster's
/// children's times collect) and every `redis-server`. Linux only; elsewhere the figures read as zero.
///
/// The client is not counted: its process times include what it does before the clock starts (wrk builds every
/// request of the phase then).
struct CpuMeter {
    booking: Option<u32>,
    start: [u64; 3],
}

impl CpuMeter {
    fn start(booking: Option<u32>) -> Self {
        Self { booking, start: Self::ticks(booking) }
    }

    /// Clock ticks spent since the start: booking, Postgres, Redis.
    fn spent(&self) -> [u64; 3] {
        let end = Self::ticks(self.booking);
        std::array::from_fn(|i| end[i].saturating_sub(self.start[i]))
    }

    /// Clock ticks so far: booking, Postgres, Redis.
    fn ticks(booking: Option<u32>) -> [u64; 3] {
        let mut t = [0; 3];
        let Ok(dir) = std::fs::read_dir("/proc") else { return t };
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
            // "pid (comm) state ppid ...": the fields after the command name, which may hold spaces.
            let Some((head, rest)) = stat.rsplit_once(") ") else { continue };
            let comm = head.split_once(" (").map_or("", |(_, c)| c);
            let f: Vec<u64> = rest.split(' ').map(|x| x.parse().unwrap_or(0)).collect();
            // utime, stime, cutime, cstime: fields 14-17 of the line, indices 11-14 of what follows the name.
            let [mine, children] = match f.get(11..15) {
                Some(&[utime, stime, cutime, cstime]) => [utime + stime, cutime + cstime],
                _ => continue,
            };
            match comm {
                _ if Some(pid) == booking => t[0] += mine,
                "postgres" if is_postmaster(f[1]) => t[1] += mine + children,
                "postgres" => t[1] += mine,
                "redis-server" => t[2] += mine,
                _ => {}
            }
        }
        t
    }
}

/// Whether `pid` is a postmaster: a `postgres` process whose parent is not one.
fn is_postmaster(parent: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{parent}/comm")).is_ok_and(|c| c.trim() != "postgres")
}

fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// One `GET /events/{id}` over a raw socket (booking has no HTTP client dependency), answered 200.
async fn warm_up(port: u16, event: EventId, proof: &str) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let req = format!(
        "GET /events/{event} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {proof}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(req.as_bytes()).await?;
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut reply)).await??;
    let head = String::from_utf8_lossy(&reply[..reply.len().min(64)]).into_owned();
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "warm-up request refused: {head}");
    Ok(())
}

fn which(tool: &str) -> anyhow::Result<()> {
    let ok = Command::new("sh").args(["-c", &format!("command -v {tool}")]).stdout(Stdio::null()).status()?.success();
    if ok { Ok(()) } else { bail!("not found") }
}

/// wrk in one thread: with more, the first thread sends while the next still prepares its requests, before
/// wrk's clock starts, and those requests count (`bench/common.lua` says more).
fn wrk(args: &BenchArgs, script: &std::path::Path, base: &str, script_args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("wrk")
        .args(["-t", "1", "-c", &args.connections.to_string(), "-d", &format!("{}s", args.seconds)])
        .args(["--latency", "-s"])
        .arg(script)
        .arg(base)
        .arg("--")
        .args(script_args)
        .output()
        .context("running wrk")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || !text.contains("BENCH ") {
        bail!("wrk failed: {}{}", text, String::from_utf8_lossy(&out.stderr));
    }
    Ok(text)
}

/// A wrk phase's note: connections, latency, and whatever did not go as asked (answers with an error status,
/// and wrk's socket errors, timeouts included).
fn wrk_note(args: &BenchArgs, out: &str) -> anyhow::Result<String> {
    let mut note =
        format!("wrk -c{}, p50 {} us, p99 {} us", args.connections, field(out, "p50_us")?, field(out, "p99_us")?);
    let other = field(out, "other")?;
    if other > 0.0 {
        note += &format!("; {other} answers with an error status");
    }
    if let Some(errors) = out.lines().find_map(|l| l.trim().strip_prefix("Socket errors: ")) {
        note += &format!("; socket errors: {errors}");
    }
    Ok(note)
}

/// A phase that used up what was prepared for it measured a floor, not a rate: its line says so, beside the
/// ratio it feeds.
fn floor_note(note: String, ran_out: bool, option: &str) -> String {
    if ran_out { format!("{note}; RAN OUT of prepared work, a floor only: raise {option}") } else { note }
}

/// Reads `name=<number>` from the `BENCH` line a wrk script prints.
fn field(out: &str, name: &str) -> anyhow::Result<f64> {
    out.lines()
        .filter(|l| l.starts_with("BENCH "))
        .flat_map(|l| l.split_whitespace())
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")).and_then(|v| v.parse().ok()))
        .with_context(|| format!("no {name} in wrk output: {out}"))
}

/// redis-benchmark sending EVALSHA of the acquire script with fresh random keys per call (so, like the holds
/// through booking, almost every call grants). On a single server it works in a scratch database, flushed
/// afterwards. On a cluster it goes straight to the master serving the bench event's slot, the one booking's
/// holds reach, with keys under the run's prefix and the event's hash tag (deleted by the cleanup):
/// `redis-benchmark --cluster` would spread the keys over every master, which no single event's holds do.
async fn redis_benchmark(args: &BenchArgs, event: EventId, tag: &str) -> anyhow::Result<f64> {
    let target = redisconn::Target::parse(args.redis_url.expose_secret()).context("REDIS_URL")?;
    let cluster = target.is_cluster();
    let keys = if cluster { format!("bench-{tag}:{{ev{}}}", event.0) } else { "bench:{evB}".to_owned() };
    let (addr, _) = target.serving(&keys).await.context("finding the server that holds the bench's keys")?;
    let node = target.node(&addr)?;
    let (host, port) = addr.rsplit_once(':').context("host:port")?;
    // redis-benchmark takes a password only on its command line (`-a`): a local benchmark's scratch Redis.
    let redisconn::Target::Single(client) = &node else { bail!("a node is a single server") };
    let auth: Vec<String> = match client.get_connection_info().redis_settings().password() {
        Some(password) => vec!["-a".into(), password.to_owned()],
        None => Vec::new(),
    };
    let mut conn = node.connected(redisconn::Options::default()).await?;
    let source = booking::store::holds::sources::ACQUIRE_HOLD;
    let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(source).query_async(&mut conn).await?;
    let requests = (args.seconds * 40_000).to_string();
    let db: &[&str] = if cluster { &[] } else { &["--dbnum", "9"] };
    let key = |name: &str| format!("{keys}:{name}");
    let out = Command::new("redis-benchmark")
        .args(&auth)
        .args(["-h", host, "-p", port, "-c", &args.connections.to_string(), "-n", &requests])
        .args(["-r", "1000000000", "-q"])
        .args(db)
        .args(["EVALSHA", &sha, "7"])
        .args([key("token:__rand_int__"), key("account:__rand_int__"), key("version")])
        .args([key("log"), key("lapses"), key("taken")])
        .args([key("seat:__rand_int__")])
        .args(["token", "account", "600000", "8", "3600000", "1", "", "1"])
        .output()
        .context("running redis-benchmark")?;
    if !cluster {
        let _: () = redis::cmd("SELECT").arg(9).query_async(&mut conn).await?;
        let _: () = redis::cmd("FLUSHDB").arg("ASYNC").query_async(&mut conn).await?;
    }
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
    text.lines()
        .filter_map(|l| l.split_once(": ").map(|(_, r)| r))
        .filter_map(|r| r.split(" requests per second").next())
        .filter_map(|n| n.trim().parse::<f64>().ok())
        .next_back()
        .with_context(|| format!("no rate in redis-benchmark output: {text}"))
}

/// Holds for the checkout phase, made straight through the store (untimed), written as "<proof> <token>".
async fn prepare_holds(
    args: &BenchArgs,
    ring: &Keyring,
    event: EventId,
    tag: &str,
    seats: &[i64],
    path: &std::path::Path,
) -> anyhow::Result<()> {
    let prefix = &format!("bench-{tag}:");
    let conn = booking::store::redis_connection(args.redis_url.expose_secret()).await?;
    let times = HoldTimes {
        ttl: Duration::from_secs(600),
        max_total: Duration::from_secs(1200),
        record_retention: Duration::from_secs(3600),
    };
    let holds = Holds::new(conn, Keys::new(prefix)?, Duration::from_secs(5), times);
    let lines: Vec<String> = futures::stream::iter(seats.iter().enumerate())
        .map(|(i, &seat)| {
            let holds = holds.clone();
            // One fan, one basket, one checkout: as in a sale, no two checkouts of an account race.
            let account = format!("bench{tag}-c{i}");
            async move {
                let token = HoldToken::generate();
                let ask = Ask {
                    account: &account,
                    token,
                    seats: &[SeatId(seat)],
                    blocks: &[0],
                    block_size: 1,
                    max_per_account: 8,
                    idempotency: None,
                };
                match holds.acquire(event, &ask).await? {
                    Acquired::Granted { .. } => {
                        let claims = AdmissionClaims::new(AccountId::parse(&account)?, event.0, unix_now(), 3600);
                        // A random Idempotency-Key, as clients make them (a UUIDv4), not the time-ordered token.
                        let key = uuid::Uuid::new_v4();
                        Ok::<_, anyhow::Error>(format!("{} {} {key}", ring.sign(&claims), token))
                    }
                    other => bail!("could not prepare a hold on seat {seat}: {other:?}"),
                }
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    for line in lines {
        writeln!(file, "{line}")?;
    }
    file.flush()?;
    Ok(())
}

/// pgbench of a single-row INSERT into a scratch table shaped like `order_seats`.
async fn pgbench(
    args: &BenchArgs,
    clients: u32,
    url: &str,
    pool: &PgPool,
    work: &std::path::Path,
) -> anyhow::Result<f64> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_insert (id bigserial PRIMARY KEY, event_id bigint NOT NULL,
         seat_id bigint NOT NULL, account_id text NOT NULL, price_cents bigint NOT NULL,
         created_at timestamptz NOT NULL DEFAULT now())",
    )
    .execute(pool)
    .await?;
    let script = work.join("insert.sql");
    std::fs::write(
        &script,
        "\\set seat random(1, 1000000000)\n\
         INSERT INTO bench_insert (event_id, seat_id, account_id, price_cents) VALUES (1, :seat, 'bench', 7500);\n",
    )?;
    let out = Command::new("pgbench")
        .args(["-n", "-c", &clients.to_string(), "-j", "2", "-T", &args.seconds.to_string(), "-f"])
        .arg(&script)
        .arg(url)
        .output()
        .context("running pgbench")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!("pgbench failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    }
    text.lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l.trim_start_matches("tps = ").split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no tps in pgbench output: {text}"))
}

/// Drops the scratch schema (everything the run wrote to Postgres) and deletes its Redis keys.
async fn cleanup(admin: &PgPool, args: &BenchArgs, schema: &str, tag: &str) {
    let prefix = format!("bench-{tag}:");
    if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE"))).execute(admin).await {
        eprintln!("bench: could not drop the scratch schema {schema}: {e}");
    }
    let Ok(target) = redisconn::Target::parse(args.redis_url.expose_secret()) else { return };
    let Ok(mut conn) = target.connected(redisconn::Options::default()).await else {
        eprintln!("bench: could not reach Redis to delete the keys under {prefix}");
        return;
    };
    if target.is_cluster() {
        // The client sends KEYS to every master (its SCAN would reach one node only) and splits an UNLINK by
        // slot. The bench's own cluster run on a scratch prefix: the pause of a KEYS there is the bench's own.
        let keys: Vec<String> =
            redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(&mut conn).await.unwrap_or_default();
        for chunk in keys.chunks(10_000) {
            let _: redis::RedisResult<()> = redis::cmd("UNLINK").arg(chunk).query_async(&mut conn).await;
        }
    } else {
        let mut cursor: u64 = 0;
        loop {
            let Ok((next, keys)): redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{prefix}*"))
                .arg("COUNT")
                .arg(10_000)
                .query_async(&mut conn)
                .await
            else {
                break;
            };
            if !keys.is_empty() {
                let _: redis::RedisResult<()> = redis::cmd("UNLINK").arg(keys).query_async(&mut conn).await;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
}
