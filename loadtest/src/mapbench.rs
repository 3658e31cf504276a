//! `loadtest map-bench`: the live seat map under load. Many subscribers of one gateway's stream (raw sockets,
//! the lightest client there is, so the gateway is what is measured) while holds and releases go to booking
//! at a set rate; then every subscriber drops and comes back at once with `Last-Event-ID`. It reports how late
//! deltas arrived (from the change's commit, Redis's clock, to receipt), how many subscribers saw every
//! change, the gateway's memory per subscriber, the reconnect storm, and the status's size.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::future::join_all;
use memchr::memmem::Finder;
use serde_json::json;
use tokens::{AccountId, AdmissionClaims, Keyring, unix_now};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::map::read_status;
use crate::picker::Layout;

/// What the bench is told.
pub struct Bench {
    pub gateway: String,
    pub booking: String,
    pub event: i64,
    pub subscribers: usize,
    pub changes_per_second: u64,
    pub seconds: u64,
    pub admission: Keyring,
    pub gateway_pid: Option<u32>,
}

/// Delta latency histogram: one bucket per millisecond up to ten seconds (the last bucket holds the rest).
struct Histogram {
    buckets: Vec<AtomicU64>,
}

impl Histogram {
    fn new() -> Self {
        Self { buckets: (0..10_001).map(|_| AtomicU64::new(0)).collect() }
    }

    fn record(&self, ms: u64) {
        self.buckets[(ms as usize).min(10_000)].fetch_add(1, Ordering::Relaxed);
    }

    fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// The smallest bucket (ms) at or below which `q` of the samples fall.
    fn quantile(&self, q: f64) -> u64 {
        let total = self.count();
        let wanted = ((total as f64) * q).ceil() as u64;
        let mut seen = 0;
        for (ms, b) in self.buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if seen >= wanted.max(1) {
                return ms as u64;
            }
        }
        10_000
    }
}

/// One subscriber's state, shared with the report.
struct Sub {
    /// The last version its deltas reached.
    version: AtomicU64,
    resyncs: AtomicU64,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Host and port of an `http://host:port` URL.
fn host_port(url: &str) -> anyhow::Result<(String, u16)> {
    let rest = url.strip_prefix("http://").context("the gateway URL must be http://host:port")?;
    let hostport = rest.split('/').next().unwrap_or(rest);
    let (host, port) = hostport.rsplit_once(':').context("the gateway URL needs a port")?;
    Ok((host.to_owned(), port.parse().context("port")?))
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim().parse().ok()
}

/// Opens one subscription; returns the socket once the answer's head arrived (200), with what came after it.
async fn subscribe(
    addr: &(String, u16),
    event: i64,
    i: usize,
    resume: Option<u64>,
    since: u64,
) -> anyhow::Result<(TcpStream, String)> {
    let mut sock = TcpStream::connect((addr.0.as_str(), addr.1)).await?;
    let start = match resume {
        Some(v) => format!("last-event-id: {v}\r\n"),
        None => String::new(),
    };
    let query = if resume.is_some() { String::new() } else { format!("?since={since}") };
    let request = format!(
        "GET /events/{event}/seats/stream{query} HTTP/1.1\r\nhost: {}\r\naccept: text/event-stream\r\n\
         x-forwarded-for: 10.{}.{}.{}\r\n{start}\r\n",
        addr.0,
        (i >> 16) & 0xff,
        (i >> 8) & 0xff,
        i & 0xff
    );
    sock.write_all(request.as_bytes()).await?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), sock.read(&mut buf)).await??;
        anyhow::ensure!(n > 0, "closed before the head");
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&head);
            anyhow::ensure!(text.starts_with("HTTP/1.1 200"), "{}", text.lines().next().unwrap_or(""));
            return Ok((sock, String::from_utf8_lossy(&head[end + 4..]).into_owned()));
        }
    }
}

/// What one event of a stream is, to the bench.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Delta { version: u64, at: u64 },
    Resync,
    Other,
}

/// What the bench looks for in a stream, each searcher built once.
struct Patterns {
    /// An event's end.
    end: Finder<'static>,
    resync: Finder<'static>,
    delta: Finder<'static>,
    version: Finder<'static>,
    at: Finder<'static>,
}

static PATTERNS: LazyLock<Patterns> = LazyLock::new(|| Patterns {
    end: Finder::new(b"\n\n"),
    resync: Finder::new(b"event: resync"),
    delta: Finder::new(b"event: delta"),
    version: Finder::new(b"\"version\":"),
    at: Finder::new(b"\"at\":"),
});

/// The number right after `key` in `text`, if any.
fn number_after(text: &[u8], key: &Finder) -> Option<u64> {
    let start = key.find(text)? + key.needle().len();
    let digits = text[start..].iter().take_while(|b| b.is_ascii_digit()).take(19);
    digits.fold(None, |n, &d| Some(n.unwrap_or(0) * 10 + u64::from(d - b'0')))
}

/// Reads one event (the text between two blank lines, chunk-size lines included): only a delta's version and
/// time, which come first in its data; the changes are never scanned.
fn seen(block: &[u8]) -> Seen {
    let p = &*PATTERNS;
    let head = &block[..block.len().min(160)];
    if p.resync.find(head).is_some() {
        return Seen::Resync;
    }
    if p.delta.find(head).is_none() {
        return Seen::Other;
    }
    match (number_after(head, &p.version), number_after(head, &p.at)) {
        (Some(version), Some(at)) => Seen::Delta { version, at },
        _ => Seen::Other,
    }
}

/// Reads a subscription until it closes (or its task is aborted), recording each delta's lateness. The client
/// shares the box with the server, so it reads as little as it can: events' ends are found with memchr, only
/// the head of each is looked at, and only an unfinished event's bytes are moved, to the buffer's start.
async fn read(mut sock: impl AsyncRead + Unpin, pending: String, sub: Arc<Sub>, hist: Arc<Histogram>) {
    let mut buf = pending.into_bytes();
    let mut filled = buf.len();
    buf.resize(filled.max(16_384), 0);
    loop {
        if filled == buf.len() {
            // One event larger than the buffer: it grows.
            buf.resize(buf.len() * 2, 0);
        }
        let n = match sock.read(&mut buf[filled..]).await {
            Ok(n) if n > 0 => n,
            _ => return,
        };
        let received = now_ms();
        filled += n;
        let mut done = 0;
        while let Some(end) = PATTERNS.end.find(&buf[done..filled]) {
            let block = &buf[done..done + end];
            done += end + 2;
            match seen(block) {
                Seen::Resync => {
                    sub.resyncs.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Seen::Delta { version, at } => {
                    hist.record(received.saturating_sub(at));
                    sub.version.fetch_max(version, Ordering::Relaxed);
                }
                Seen::Other => {}
            }
        }
        buf.copy_within(done..filled, 0);
        filled -= done;
    }
}

/// Drops every subscription (their tasks end and close their sockets) and waits until they have.
async fn drop_all(tasks: Vec<tokio::task::JoinHandle<()>>) {
    tasks.iter().for_each(|t| t.abort());
    join_all(tasks).await;
}

/// CPU time (user and system, in clock ticks) of a process, and of the whole machine.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it do not.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

fn machine_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
    let f: Vec<u64> = cpu.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    // Everything but idle and iowait is busy.
    let [user, nice, system, _idle, _iowait, irq, softirq, ..] = f[..] else { return None };
    Some(user + nice + system + irq + softirq)
}

/// Where the machine's CPU went over a span: the gateway, this client, everything else.
struct CpuSpan {
    gateway: Option<u64>,
    client: Option<u64>,
    machine: Option<u64>,
    at: Instant,
}

impl CpuSpan {
    fn start(gateway_pid: Option<u32>) -> Self {
        Self {
            gateway: gateway_pid.and_then(cpu_ticks),
            client: cpu_ticks(std::process::id()),
            machine: machine_ticks(),
            at: Instant::now(),
        }
    }

    /// "gateway / client / the rest", in cores.
    fn report(&self, gateway_pid: Option<u32>) -> String {
        let now = Self::start(gateway_pid);
        let seconds = self.at.elapsed().as_secs_f64();
        let cores = |a: Option<u64>, b: Option<u64>| Some((b? - a?) as f64 / 100.0 / seconds);
        let (g, c, m) =
            (cores(self.gateway, now.gateway), cores(self.client, now.client), cores(self.machine, now.machine));
        match (g, c, m) {
            (Some(g), Some(c), Some(m)) => format!("{g:.2} / {c:.2} / {:.2}", (m - g - c).max(0.0)),
            _ => "-".to_owned(),
        }
    }
}

/// Runs the bench and prints its report (markdown).
pub async fn run(b: Bench) -> anyhow::Result<()> {
    let b = Arc::new(b);
    let addr = host_port(&b.gateway)?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    let status = read_status(&client, &b.gateway, b.event).await.context("the event's status")?;
    let layout_body = client.get(format!("{}{}", b.gateway, status.layout)).send().await?.bytes().await?;
    let layout = Layout::parse(&layout_body).context("the layout")?;
    let seats: Vec<i64> = (0..layout.len()).filter(|p| status.statuses[*p] == 0).filter_map(|p| layout.id(p)).collect();
    anyhow::ensure!(seats.len() >= 100, "the event needs at least 100 free seats");

    let hist = Arc::new(Histogram::new());
    let subs: Vec<Arc<Sub>> =
        (0..b.subscribers).map(|_| Arc::new(Sub { version: AtomicU64::new(0), resyncs: AtomicU64::new(0) })).collect();
    let rss_before = b.gateway_pid.and_then(rss_kib);
    eprintln!("map-bench: opening {} subscriptions", b.subscribers);
    let opened = Instant::now();
    let mut tasks = Vec::with_capacity(b.subscribers);
    for wave in (0..b.subscribers).collect::<Vec<_>>().chunks(500) {
        let results = join_all(wave.iter().map(|&i| subscribe(&addr, b.event, i, None, status.version))).await;
        for (&i, result) in wave.iter().zip(results) {
            let (sock, rest) = result.with_context(|| format!("subscription {i}"))?;
            subs[i].version.store(status.version, Ordering::Relaxed);
            tasks.push(tokio::spawn(read(sock, rest, subs[i].clone(), hist.clone())));
        }
    }
    let open_seconds = opened.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_during = b.gateway_pid.and_then(rss_kib);

    eprintln!("map-bench: {} changes a second for {} s", b.changes_per_second, b.seconds);
    let cpu = CpuSpan::start(b.gateway_pid);
    let changes = produce_apart(&b, &seats).await?;
    let cpu = cpu.report(b.gateway_pid);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let last = read_status(&client, &b.gateway, b.event).await.map(|s| s.version).unwrap_or(0);
    let caught_up = subs.iter().filter(|s| s.version.load(Ordering::Relaxed) >= last).count();
    let samples = hist.count();
    let (p50, p95, p99, max) = (hist.quantile(0.50), hist.quantile(0.95), hist.quantile(0.99), hist.quantile(1.0));

    // The storm: every subscriber drops and comes back at once, resuming from the last version it saw.
    drop_all(tasks).await;
    let storm_hist = Arc::new(Histogram::new());
    let storm = Instant::now();
    let resumed = AtomicUsize::new(0);
    let mut tasks = Vec::with_capacity(b.subscribers);
    let results = join_all((0..b.subscribers).map(|i| {
        let since = subs[i].version.load(Ordering::Relaxed);
        let (addr, event) = (&addr, b.event);
        async move { (i, subscribe(addr, event, i, Some(since), since).await) }
    }))
    .await;
    let mut refusals: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for (i, result) in results {
        match result {
            Ok((sock, rest)) => {
                resumed.fetch_add(1, Ordering::Relaxed);
                tasks.push(tokio::spawn(read(sock, rest, subs[i].clone(), storm_hist.clone())));
            }
            Err(e) => *refusals.entry(e.to_string()).or_default() += 1,
        }
    }
    if !refusals.is_empty() {
        eprintln!("map-bench: resubscriptions refused: {refusals:?}");
    }
    let storm_seconds = storm.elapsed().as_secs_f64();
    // One more change: each resumed subscriber must receive it, without a resync.
    let resyncs_before: u64 = subs.iter().map(|s| s.resyncs.load(Ordering::Relaxed)).sum();
    produce_one(&b, &client, seats[0]).await?;
    let after = read_status(&client, &b.gateway, b.event).await.map(|s| s.version).unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while subs.iter().any(|s| s.version.load(Ordering::Relaxed) < after) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let storm_caught_up = subs.iter().filter(|s| s.version.load(Ordering::Relaxed) >= after).count();
    let storm_resyncs: u64 = subs.iter().map(|s| s.resyncs.load(Ordering::Relaxed)).sum::<u64>() - resyncs_before;
    drop_all(tasks).await;

    let plain = status_size(&b).await?;
    let per_sub = match (rss_before, rss_during) {
        (Some(a), Some(b2)) => format!("{:.1} KiB", b2.saturating_sub(a) as f64 / b.subscribers as f64),
        _ => "- (no --gateway-pid)".to_owned(),
    };
    println!(
        "| what | figure |\n|---|---|\n\
         | subscribers (opened in) | {} ({open_seconds:.1} s) |\n\
         | changes made (holds and releases through booking) | {changes} in {} s |\n\
         | delta latency, commit to receipt, p50 / p95 / p99 / max | {p50} / {p95} / {p99} / {max} ms ({samples} deltas received) |\n\
         | CPU while the changes were made, cores: gateway / this client / the rest of the box | {cpu} |\n\
         | subscribers that saw the last version | {caught_up} of {} |\n\
         | gateway memory per subscriber | {per_sub} |\n\
         | reconnect storm: resumed with Last-Event-ID | {} of {} in {storm_seconds:.1} s; {storm_caught_up} then got the next change; {storm_resyncs} resyncs |\n\
         | status for {} seats | {plain} bytes before gzip |",
        b.subscribers,
        b.seconds,
        b.subscribers,
        resumed.load(Ordering::Relaxed),
        b.subscribers,
        layout.len(),
    );
    Ok(())
}

/// An admission proof for a bench account (booking checks it as the gateway's).
fn proof(b: &Bench, account: &str) -> anyhow::Result<String> {
    let claims = AdmissionClaims::new(AccountId::parse(account)?, b.event, unix_now(), 3600);
    Ok(b.admission.sign(&claims))
}

/// [`produce`] on a thread and runtime of its own: the subscribers' tasks keep this process's workers busy,
/// and would otherwise delay the producer's ticks (the rate it sets is the load the gateway is measured under).
async fn produce_apart(b: &Arc<Bench>, seats: &[i64]) -> anyhow::Result<u64> {
    let (b, seats) = (b.clone(), seats.to_vec());
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async {
            let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
            produce(&b, &client, &seats).await
        })
    })
    .await?
}

/// Holds and releases seats through booking at `changes_per_second` for `seconds`: each hold of one seat is one
/// change, its release another. Returns the changes made.
async fn produce(b: &Bench, client: &reqwest::Client, seats: &[i64]) -> anyhow::Result<u64> {
    let made = Arc::new(AtomicU64::new(0));
    let pairs = (b.changes_per_second / 2).max(1);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / pairs as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let end = Instant::now() + Duration::from_secs(b.seconds);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(64));
    let mut n = 0usize;
    while Instant::now() < end {
        tick.tick().await;
        let seat = seats[n % seats.len()];
        let account = format!("mapbench-{}", n % 10_000);
        n += 1;
        let (client, made, permit) = (client.clone(), made.clone(), in_flight.clone().acquire_owned().await?);
        let auth = format!("Bearer {}", proof(b, &account)?);
        let base = format!("{}/events/{}/holds", b.booking, b.event);
        tokio::spawn(async move {
            let _permit = permit;
            let Ok(res) =
                client.post(&base).header("authorization", &auth).json(&json!({ "seat_ids": [seat] })).send().await
            else {
                return;
            };
            if res.status().as_u16() != 201 {
                return;
            }
            made.fetch_add(1, Ordering::Relaxed);
            let Ok(body) = res.json::<serde_json::Value>().await else { return };
            let Some(token) = body["hold_token"].as_str() else { return };
            if client.delete(format!("{base}/{token}")).header("authorization", &auth).send().await.is_ok() {
                made.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let _ = in_flight.acquire_many(64).await;
    Ok(made.load(Ordering::Relaxed))
}

/// One hold and its release.
async fn produce_one(b: &Bench, client: &reqwest::Client, seat: i64) -> anyhow::Result<()> {
    let auth = format!("Bearer {}", proof(b, "mapbench-storm")?);
    let base = format!("{}/events/{}/holds", b.booking, b.event);
    let res = client.post(&base).header("authorization", &auth).json(&json!({ "seat_ids": [seat] })).send().await?;
    let body: serde_json::Value = res.json().await?;
    if let Some(token) = body["hold_token"].as_str() {
        client.delete(format!("{base}/{token}")).header("authorization", &auth).send().await?;
    }
    Ok(())
}

/// The status's size, uncompressed (this client's HTTP stack would undo a gzip before it could be measured).
async fn status_size(b: &Bench) -> anyhow::Result<usize> {
    let client = reqwest::Client::builder().build()?;
    let url = format!("{}/events/{}/seats/status", b.gateway, b.event);
    let res = client.get(&url).header("x-forwarded-for", "10.253.0.1").send().await?;
    anyhow::ensure!(res.status().is_success(), "GET {url}: {}", res.status());
    Ok(res.bytes().await?.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delta_is_read_from_its_head_and_a_resync_is_told_apart() {
        let delta = b"\r\n9A\r\nid: 8\nevent: delta\ndata: {\"from\":7,\"version\":8,\"at\":1700000000123,\"changes\":[[1,\"h\"]]}";
        assert_eq!(seen(delta), Seen::Delta { version: 8, at: 1_700_000_000_123 });
        assert_eq!(seen(b"event: resync\ndata: {\"reason\":\"behind\"}"), Seen::Resync);
        assert_eq!(seen(b"retry: 1000\nid: 5\nevent: version\ndata: {\"version\":5}"), Seen::Other);
        assert_eq!(seen(b": heartbeat"), Seen::Other);
        assert_eq!(seen(b"event: delta\ndata: {\"from\":7}"), Seen::Other, "no version or time: not counted");
    }

    #[tokio::test]
    async fn events_split_anywhere_across_reads_are_each_counted_once() {
        let delta = |v: u64| {
            format!("id: {v}\nevent: delta\ndata: {{\"from\":{v},\"version\":{v},\"at\":1,\"changes\":[]}}\n\n")
        };
        let mut text = String::from("ersion\":1}\n\n");
        // A long event, larger than the reader's first buffer, then many short ones.
        text.push_str(&delta(2).replace("[]", &format!("[{}]", vec!["[1,\"h\"]"; 3_000].join(","))));
        (3..=200).for_each(|v| text.push_str(&delta(v)));
        text.push_str(": heartbeat\n\nevent: resync\ndata: {}\n\n");
        let (mut client, server) = tokio::io::duplex(64);
        let sub = Arc::new(Sub { version: AtomicU64::new(0), resyncs: AtomicU64::new(0) });
        let hist = Arc::new(Histogram::new());
        let reader = tokio::spawn(read(
            server,
            "retry: 1000\nid: 1\nevent: version\ndata: {\"v".into(),
            sub.clone(),
            hist.clone(),
        ));
        for piece in text.as_bytes().chunks(37) {
            client.write_all(piece).await.expect("write");
        }
        reader.await.expect("reader");
        assert_eq!(hist.count(), 199, "every delta once");
        assert_eq!(sub.version.load(Ordering::Relaxed), 200);
        assert_eq!(sub.resyncs.load(Ordering::Relaxed), 1, "the resync ends the stream");
    }
}
