//! The live seat map's stream, served by the gateway from the event's change log in Redis. The log is written
//! here by the very Lua function booking's scripts use to write it (`lua/lib/seatmap_log.lua`).

use std::time::Duration;

use futures::future::join_all;
use gateway::store::SeatMapKeys;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{GatewayProcess, Node, Upstream, prefix, redis};

const EVENT: i64 = 5;

/// Appends one entry of changes ("seat:status") to the event's log as booking's scripts do; its version.
async fn publish(prefix: &str, changes: &[&str]) -> u64 {
    let source = concat!(
        include_str!("../../../lua/lib/seatmap_log.lua"),
        "return seatmap_publish(KEYS[1], KEYS[2], KEYS[3], ARGV)"
    );
    let keys = SeatMapKeys::new(prefix, EVENT);
    let script = redis::Script::new(source);
    let mut inv = script.prepare_invoke();
    inv.key(&keys.version).key(&keys.log).key(format!("{prefix}seatmap:{{ev{EVENT}}}:taken"));
    for change in changes {
        inv.arg(*change);
    }
    inv.invoke_async(&mut redis().await).await.expect("publish")
}

/// A gateway with a room for [`EVENT`] (a stream is served for events with a room).
async fn gateway(prefix: &str) -> (GatewayProcess, Upstream) {
    let upstream = Upstream::start().await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, prefix)).await;
    gw.configure(EVENT, json!({ "state": "open" })).await;
    gw.wait_for_room(EVENT).await;
    (gw, upstream)
}

/// One Server-Sent Event.
#[derive(Debug, Clone, Default)]
struct Sse {
    id: Option<String>,
    event: String,
    data: Value,
}

/// A subscriber reading the stream as it comes.
struct Subscriber {
    res: reqwest::Response,
    pending: String,
}

impl Subscriber {
    async fn open(gw: &GatewayProcess, query: &str, last_event_id: Option<u64>) -> Self {
        let mut req = gw.client.get(format!("{}/events/{EVENT}/seats/stream{query}", gw.base));
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id.to_string());
        }
        let res = req.header("accept", "text/event-stream").send().await.expect("the stream opens");
        assert_eq!(res.status().as_u16(), 200);
        assert_eq!(res.headers()["content-type"], "text/event-stream");
        Self { res, pending: String::new() }
    }

    /// The next event (heartbeats skipped); `None` when the stream ended.
    async fn next(&mut self) -> Option<Sse> {
        loop {
            if let Some(end) = self.pending.find("\n\n") {
                let block: String = self.pending.drain(..end + 2).collect();
                let mut sse = Sse::default();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        sse.id = Some(v.to_owned());
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        sse.event = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        sse.data = serde_json::from_str(v).expect("data is JSON");
                    }
                }
                if sse.event.is_empty() {
                    continue;
                }
                return Some(sse);
            }
            let piece = tokio::time::timeout(Duration::from_secs(10), self.res.chunk()).await.expect("no stall");
            self.pending.push_str(std::str::from_utf8(&piece.expect("read")?).expect("utf-8"));
        }
    }

    /// Deltas until one reaches `version`: every change in order, and the versions they covered.
    async fn until(&mut self, version: u64) -> (Vec<(i64, String)>, Vec<(u64, u64)>) {
        let (mut changes, mut spans) = (Vec::new(), Vec::new());
        while spans.last().is_none_or(|(_, to)| *to < version) {
            let sse = self.next().await.expect("the stream goes on");
            assert_eq!(sse.event, "delta", "{sse:?}");
            let (from, to) = (sse.data["from"].as_u64().expect("from"), sse.data["version"].as_u64().expect("to"));
            assert_eq!(sse.id, Some(to.to_string()), "the id is the version reached");
            let at = sse.data["at"].as_u64().expect("at");
            let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis();
            assert!(
                u128::from(at) <= now_ms && now_ms - u128::from(at) < 60_000,
                "at is when the change was made: {at}"
            );
            spans.push((from, to));
            for c in sse.data["changes"].as_array().expect("changes") {
                changes.push((c[0].as_i64().expect("seat"), c[1].as_str().expect("status").to_owned()));
            }
        }
        (changes, spans)
    }
}

/// Asserts spans follow each other from `after` with nothing missing.
fn assert_contiguous(after: u64, spans: &[(u64, u64)]) {
    let mut at = after;
    for &(from, to) in spans {
        assert_eq!(from, at + 1, "no version skipped: {spans:?}");
        assert!(to >= from);
        at = to;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_stream_says_its_version_then_carries_every_change_in_order() {
    let prefix = prefix();
    let (gw, _upstream) = gateway(&prefix).await;
    let before = publish(&prefix, &["1:h", "2:h"]).await;
    let mut sub = Subscriber::open(&gw, "", None).await;
    let hello = sub.next().await.expect("a first event");
    assert_eq!((hello.event.as_str(), hello.data["version"].as_u64()), ("version", Some(before)));
    assert_eq!(hello.data["status"], format!("/events/{EVENT}/seats/status"));
    let mut last = 0;
    for changes in [vec!["1:s", "2:s"], vec!["3:h"], vec!["3:a", "4:h"]] {
        last = publish(&prefix, &changes).await;
    }
    let (changes, spans) = sub.until(last).await;
    assert_contiguous(before, &spans);
    let expect: Vec<(i64, String)> =
        [(1, "s"), (2, "s"), (3, "h"), (3, "a"), (4, "h")].iter().map(|(s, c)| (*s, (*c).to_owned())).collect();
    assert_eq!(changes, expect);
}

/// The gateway's count of catch-up reads of the log (a stream reading Redis itself instead of its feed).
async fn catch_ups(gw: &GatewayProcess) -> u64 {
    gw.metric("gateway_seatmap_catch_ups_total").await.unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_change_of_an_event_reaches_every_stream_from_the_feed_without_a_read_each() {
    const STREAMS: usize = 200;
    let prefix = prefix();
    let (gw, _upstream) = gateway(&prefix).await;
    // No log yet: every stream starts at version 0, and the log's first version is Redis's clock, not 1.
    let mut subs = join_all((0..STREAMS).map(|_| Subscriber::open(&gw, "", None))).await;
    for sub in &mut subs {
        let hello = sub.next().await.expect("a first event");
        assert_eq!((hello.event.as_str(), hello.data["version"].as_u64()), ("version", Some(0)));
    }
    let before = catch_ups(&gw).await;
    let first = publish(&prefix, &["7:h"]).await;
    assert!(first > 1_000_000, "a new log starts at Redis's clock: {first}");
    let got = join_all(subs.iter_mut().map(|sub| sub.until(first))).await;
    for (changes, spans) in got {
        assert_eq!((changes, spans), (vec![(7, "h".to_owned())], vec![(first, first)]));
    }
    assert_eq!(catch_ups(&gw).await - before, 0, "the feed's frame follows version 0: no stream reads the log");
}

/// The gateway's count of open streams.
async fn streams_open(gw: &GatewayProcess) -> u64 {
    gw.metric("gateway_seatmap_subscribers").await.unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_client_went_away_ends_at_once_without_waiting_for_a_write() {
    let prefix = prefix();
    let (gw, _upstream) = gateway(&prefix).await;
    let port: u16 = gw.base.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    let request = format!("GET /events/{EVENT}/seats/stream HTTP/1.1\r\nhost: x\r\naccept: text/event-stream\r\n\r\n");
    let mut socks = Vec::new();
    for _ in 0..3 {
        let mut sock = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
        sock.write_all(request.as_bytes()).await.expect("request");
        let mut buf = vec![0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(10), sock.read(&mut buf)).await.expect("head").expect("read");
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        socks.push(sock);
    }
    assert!(testkit::eventually(Duration::from_secs(5), async || streams_open(&gw).await == 3).await);
    // Nothing is logged meanwhile, and the next heartbeat is 15 s away: only the closed socket tells.
    socks.truncate(1);
    let gone = testkit::eventually(Duration::from_secs(2), async || streams_open(&gw).await == 1);
    assert!(gone.await, "two closed streams end within 2 s: {} open", streams_open(&gw).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_with_last_event_id_or_since_loses_nothing_and_a_stream_too_far_behind_resyncs() {
    let prefix = prefix();
    let (gw, _upstream) = gateway(&prefix).await;
    let mut versions = Vec::new();
    for seat in 1..=10 {
        versions.push(publish(&prefix, &[&format!("{seat}:h")]).await);
    }
    // A browser's EventSource reconnects with the last id it saw; a client starting from a status uses since.
    for (query, header) in [("", Some(versions[2])), (&*format!("?since={}", versions[2]), None)] {
        let mut sub = Subscriber::open(&gw, query, header).await;
        let newest = *versions.last().expect("versions");
        let (changes, spans) = sub.until(newest).await;
        assert_contiguous(versions[2], &spans);
        assert_eq!(changes.iter().map(|c| c.0).collect::<Vec<_>>(), (4..=versions.len() as i64).collect::<Vec<_>>());
        let seat = versions.len() + 1;
        let next = publish(&prefix, &[&format!("{seat}:h")]).await;
        let (changes, _) = sub.until(next).await;
        assert_eq!(changes, vec![(seat as i64, "h".to_owned())]);
        versions.push(next);
    }
    // Up to date: nothing to replay, and the stream goes on.
    let now = *versions.last().expect("versions");
    let mut sub = Subscriber::open(&gw, "", Some(now)).await;
    let next = publish(&prefix, &["12:s"]).await;
    assert_eq!(sub.until(next).await.1, vec![(now + 1, next)]);

    // The log trimmed to its last two entries: older versions can no longer be carried on.
    let log = SeatMapKeys::new(&prefix, EVENT).log;
    let _: i64 =
        redis::cmd("XTRIM").arg(&log).arg("MAXLEN").arg(2).query_async(&mut redis().await).await.expect("XTRIM");
    for (from, reason) in [(versions[0], "log_too_short"), (next + 100, "unknown_version")] {
        let mut sub = Subscriber::open(&gw, "", Some(from)).await;
        let sse = sub.next().await.expect("an event");
        assert_eq!((sse.event.as_str(), sse.data["reason"].as_str()), ("resync", Some(reason)));
        assert_eq!(sse.data["status"], format!("/events/{EVENT}/seats/status"));
        assert!(sub.next().await.is_none(), "the stream ends after a resync");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_replay_of_a_long_log_is_one_bounded_read_then_a_resync_never_the_whole_log() {
    // The attack: `?since=0` on a sale's log of 50,000 entries was answered with every one of them (4.6 MB,
    // built whole in memory, 50 reads of Redis). A replay now takes at most one read of a bounded length.
    const BOUND: u64 = gateway::edge::stream::CATCH_UP_ENTRIES;
    let prefix = prefix();
    let (gw, _upstream) = gateway(&prefix).await;
    let first = publish(&prefix, &["1:h"]).await;
    let mut last = first;
    for seat in 0..BOUND + 40 {
        last = publish(&prefix, &[&format!("{}:h", 2 + seat)]).await;
    }
    let reads = catch_ups(&gw).await;
    for (query, header) in [("?since=0", None), ("", Some(first))] {
        let mut sub = Subscriber::open(&gw, query, header).await;
        let sse = sub.next().await.expect("an event");
        assert_eq!((sse.event.as_str(), sse.data["reason"].as_str()), ("resync", Some("too_far_behind")), "{query}");
        assert_eq!(sse.data["status"], format!("/events/{EVENT}/seats/status"));
        assert!(sub.next().await.is_none(), "the stream ends after a resync");
        assert!(sub.pending.len() < 256, "nothing else was sent");
    }
    // Further back than the bound is known without reading the log; from 0 only a read tells, and it is one.
    assert_eq!(catch_ups(&gw).await - reads, 1, "one bounded read in all");
    // Within the bound: the whole gap in one delta, and the stream goes on.
    let mut sub = Subscriber::open(&gw, "", Some(last - BOUND)).await;
    let (changes, spans) = sub.until(last).await;
    assert_eq!(spans, vec![(last - BOUND + 1, last)]);
    assert_eq!(changes.len() as u64, BOUND);
    let next = publish(&prefix, &["1:s"]).await;
    assert_eq!(sub.until(next).await.0, vec![(1, "s".to_owned())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_capped_per_address_prefix_per_event_and_per_node_and_end_after_their_lifetime() {
    // The attack: four addresses opened 1,000 streams in 5.5 s, and nothing but the per-IP connection cap stood
    // between about 80 addresses and the node's open files. Behind a trusted proxy, each fan's own address counts.
    const OTHER: i64 = EVENT + 1;
    let prefix = prefix();
    let upstream = Upstream::start().await;
    let node = Node::new(upstream.addr, &prefix)
        .arg("--trusted-proxies", "127.0.0.1/32")
        .arg("--streams-per-prefix", 2)
        .arg("--streams-per-event", 3)
        .arg("--streams-max", 6)
        .arg("--stream-lifetime-seconds", 4);
    let gw = GatewayProcess::start(node).await;
    for event in [EVENT, OTHER] {
        gw.configure(event, json!({ "state": "open" })).await;
        gw.wait_for_room(event).await;
    }
    let version = publish(&prefix, &["1:h"]).await;
    let open = |event: i64, ip: &'static str| {
        let req = gw.client.get(format!("{}/events/{event}/seats/stream", gw.base));
        req.header("accept", "text/event-stream").header("x-forwarded-for", ip).send()
    };
    let refused = async |res: reqwest::Response| {
        let status = res.status().as_u16();
        let retry = res.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let body: Value = res.json().await.expect("a JSON refusal");
        (status, body["error"].as_str().unwrap_or_default().to_owned(), retry.is_some_and(|s| s > 0))
    };
    // Two from one address; its third is its own fault. 2001:db8:0:1::/64, :2:: and :3:: share a /56.
    let mut held = join_all([open(EVENT, "10.0.0.1"), open(EVENT, "10.0.0.1")]).await;
    let third = open(EVENT, "10.0.0.1").await.expect("answered");
    assert_eq!(refused(third).await, (429, "too_many_streams".to_owned(), true));
    held.push(open(OTHER, "2001:db8:0:1::1").await);
    let v6 = open(OTHER, "2001:db8:0:2::1").await.expect("answered");
    assert_eq!(v6.status(), 200, "the /56's second");
    held.push(Ok(v6));
    let v6 = open(OTHER, "2001:db8:0:3::1").await.expect("answered");
    assert_eq!(refused(v6).await, (429, "too_many_streams".to_owned(), true), "the /56's third");
    // The event's third stream, then the event is full; the node's sixth, then the node is full.
    held.push(open(EVENT, "10.0.0.2").await);
    let full = open(EVENT, "10.0.0.3").await.expect("answered");
    assert_eq!(refused(full).await, (503, "streams_full".to_owned(), true), "the event's cap");
    held.push(open(OTHER, "10.0.0.4").await);
    let full = open(OTHER, "10.0.0.5").await.expect("answered");
    assert_eq!(refused(full).await, (503, "streams_full".to_owned(), true), "the node's cap");
    let mut held: Vec<reqwest::Response> = held.into_iter().map(|r| r.expect("opened")).collect();
    assert!(held.iter().all(|r| r.status() == 200), "{:?}", held.iter().map(|r| r.status()).collect::<Vec<_>>());
    // A stream that ends frees its place at once.
    held.remove(0);
    let again = testkit::eventually(Duration::from_secs(5), async || {
        open(EVENT, "10.0.0.6").await.is_ok_and(|r| r.status() == 200)
    });
    assert!(again.await, "a freed place is taken again");
    // Every stream ends by itself within its lifetime (less a random tenth), cleanly: its client resumes.
    let ended = join_all(held.iter_mut().map(|res| async move {
        tokio::time::timeout(Duration::from_secs(20), async { while let Ok(Some(_)) = res.chunk().await {} })
            .await
            .is_ok()
    }))
    .await;
    assert!(ended.iter().all(|e| *e), "every stream ended within its lifetime: {ended:?}");
    let mut sub = Subscriber::open(&gw, "", Some(version)).await;
    let next = publish(&prefix, &["2:h"]).await;
    assert_eq!(sub.until(next).await.0, vec![(2, "h".to_owned())], "a resumed stream goes on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_logged_while_the_first_stream_of_an_event_opens_reaches_it() {
    // The first subscriber starts the event's reader; a change logged as soon as the stream has begun must come
    // through, although the reader may still be connecting (on a cluster it connects to every node).
    for round in 0..5 {
        let prefix = prefix();
        let (gw, _upstream) = gateway(&prefix).await;
        let before = publish(&prefix, &["1:h"]).await;
        let mut sub = Subscriber::open(&gw, &format!("?since={before}"), None).await;
        let next = publish(&prefix, &[&format!("{}:s", round + 2)]).await;
        let (changes, spans) = sub.until(next).await;
        assert_contiguous(before, &spans);
        assert_eq!(changes, vec![(round + 2, "s".to_owned())], "round {round}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_went_back_tells_every_stream_to_resync() {
    let prefix = prefix();
    let (gw, _upstream) = gateway(&prefix).await;
    let first = publish(&prefix, &["1:h"]).await;
    let mut subs = vec![Subscriber::open(&gw, "", None).await, Subscriber::open(&gw, "", Some(first)).await];
    assert_eq!(subs[0].next().await.expect("hello").event, "version");
    let last = publish(&prefix, &["2:h", "3:h"]).await;
    for sub in &mut subs {
        sub.until(last).await;
    }
    // Redis loses the last entry, as a failover to a replica that had not received it would: the log ends at
    // `first` again, and the next change is given the lost entry's version.
    let keys = SeatMapKeys::new(&prefix, EVENT);
    let mut conn = redis().await;
    let _: i64 = redis::cmd("DEL").arg(&keys.log).query_async(&mut conn).await.expect("DEL");
    let _: String = redis::cmd("XADD")
        .arg(&keys.log)
        .arg(format!("{first}-0"))
        .arg("c")
        .arg("1:h")
        .arg("t")
        .arg(0)
        .query_async(&mut conn)
        .await
        .expect("XADD");
    let () = redis::cmd("SET").arg(&keys.version).arg(first).query_async(&mut conn).await.expect("SET");
    assert_eq!(publish(&prefix, &["2:s"]).await, last, "the version is given out again");
    for sub in &mut subs {
        let sse = sub.next().await.expect("an event");
        assert_eq!((sse.event.as_str(), sse.data["reason"].as_str()), ("resync", Some("log_lost")), "{sse:?}");
        assert!(sub.next().await.is_none(), "the stream ends after a resync");
    }
    // A stream from the status's version now goes on as usual.
    let mut sub = Subscriber::open(&gw, "", Some(last)).await;
    let next = publish(&prefix, &["4:h"]).await;
    assert_eq!(sub.until(next).await.0, vec![(4, "h".to_owned())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_has_seen_nothing_is_replayed_the_whole_log_until_it_is_trimmed() {
    let prefix = prefix();
    let (gw, _upstream) = gateway(&prefix).await;
    // Before the first change the map's version is 0; the log then starts at Redis's clock, not at 1.
    let first = publish(&prefix, &["1:h"]).await;
    let last = publish(&prefix, &["2:h"]).await;
    let mut sub = Subscriber::open(&gw, "?since=0", None).await;
    let (changes, spans) = sub.until(last).await;
    assert_eq!(spans.first().map(|s| s.0), Some(first));
    assert_contiguous(first - 1, &spans);
    assert_eq!(changes, vec![(1, "h".to_owned()), (2, "h".to_owned())]);
    // Once entries were trimmed, a client at 0 may have missed them.
    let log = SeatMapKeys::new(&prefix, EVENT).log;
    let _: i64 =
        redis::cmd("XTRIM").arg(&log).arg("MAXLEN").arg(1).query_async(&mut redis().await).await.expect("XTRIM");
    let mut sub = Subscriber::open(&gw, "?since=0", None).await;
    let sse = sub.next().await.expect("an event");
    assert_eq!((sse.event.as_str(), sse.data["reason"].as_str()), ("resync", Some("log_too_short")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_refused_clearly_for_an_unknown_event_a_bad_version_or_another_method() {
    let prefix = prefix();
    let (gw, _upstream) = gateway(&prefix).await;
    let get = |path: &str, headers: &[(&str, &str)]| {
        let (path, headers) =
            (path.to_owned(), headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>());
        let gw = &gw;
        async move {
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            gw.get(&path, &h).await
        }
    };
    let unknown = get("/events/999/seats/stream", &[]).await;
    assert_eq!((unknown.status, unknown.code()), (404, "event_not_found"));
    let bad = get(&format!("/events/{EVENT}/seats/stream"), &[("last-event-id", "x")]).await;
    assert_eq!((bad.status, bad.code()), (400, "invalid_request"));
    let bad = get(&format!("/events/{EVENT}/seats/stream?since=-3"), &[]).await;
    assert_eq!((bad.status, bad.code()), (400, "invalid_request"));
    let post = gw.send(gw.client.post(format!("{}/events/{EVENT}/seats/stream", gw.base))).await;
    assert_eq!((post.status, post.code(), post.header("allow")), (405, "method_not_allowed", Some("GET")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_public_map_reaches_booking_without_a_proof_and_the_rest_still_needs_one() {
    let prefix = prefix();
    let (gw, upstream) = gateway(&prefix).await;
    for path in [format!("/events/{EVENT}/seats/status"), format!("/events/{EVENT}/seats/layout/3")] {
        let reply = gw.get(&path, &[]).await;
        assert_eq!((reply.status, reply.body["upstream"].as_bool()), (200, Some(true)), "{path}");
    }
    assert_eq!(upstream.hits(), 2);
    for path in [format!("/events/{EVENT}/seats"), format!("/events/{EVENT}/seats/layout/..%2f..%2fholds")] {
        let reply = gw.get(&path, &[]).await;
        assert_eq!((reply.status, reply.code()), (401, "admission_required"), "{path}");
    }
    assert_eq!(upstream.hits(), 2, "nothing else reached booking");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_public_map_and_the_stream_are_under_the_per_ip_limit() {
    let prefix = prefix();
    let upstream = Upstream::start().await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix).arg("--ip-rps", 1).arg("--ip-burst", 2)).await;
    gw.configure(EVENT, json!({ "state": "open" })).await;
    gw.wait_for_room(EVENT).await;
    // A burst of two, then one a second: the third and fourth requests in a row are refused, whatever they ask.
    // (A layout sent uncompressed costs more: see below.)
    for path in [format!("/events/{EVENT}/seats/status"), format!("/events/{EVENT}/seats/layout/1")] {
        assert_eq!(gw.get(&path, &[("accept-encoding", "gzip")]).await.status, 200, "{path}");
    }
    for path in [format!("/events/{EVENT}/seats/stream"), format!("/events/{EVENT}/seats/status")] {
        let reply = gw.get(&path, &[]).await;
        assert_eq!((reply.status, reply.code()), (429, "rate_limited"), "{path}");
        assert!(reply.header("retry-after").is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_sent_uncompressed_costs_its_address_twenty_requests_of_its_budget() {
    // The attack: without a CDN in front, one address drew a 1.1 MB uncompressed layout fifty times a second.
    let prefix = prefix();
    let upstream = Upstream::start().await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix).arg("--ip-rps", 1).arg("--ip-burst", 40)).await;
    gw.configure(EVENT, json!({ "state": "open" })).await;
    gw.wait_for_room(EVENT).await;
    let layout = format!("/events/{EVENT}/seats/layout/1");
    for _ in 0..5 {
        assert_eq!(gw.get(&layout, &[("accept-encoding", "gzip, br")]).await.status, 200, "compressed: one each");
    }
    assert_eq!(gw.get(&layout, &[]).await.status, 200, "uncompressed: twenty");
    let refused = gw.get(&layout, &[("accept-encoding", "identity")]).await;
    assert_eq!((refused.status, refused.code()), (429, "rate_limited"), "fifteen left, twenty asked");
    assert!(refused.header("retry-after").is_some());
    assert_eq!(gw.get(&layout, &[("accept-encoding", "GZIP")]).await.status, 200, "a compressed one still fits");
    assert_eq!(gw.get(&format!("/events/{EVENT}/seats/status"), &[]).await.status, 200, "the status costs one");
}

/// The memory each subscriber costs is measured by `deploy/bench-seatmap`, not here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_subscribers_each_receive_every_delta() {
    const SUBSCRIBERS: usize = 5_000;
    const CHANGES: usize = 20;
    let prefix = prefix();
    let (gw, _upstream) = gateway(&prefix).await;
    let start = publish(&prefix, &["1:h"]).await;
    let port: u16 = gw.base.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    // Raw sockets: a client as light as can be, so the gateway is what is measured.
    let request = format!(
        "GET /events/{EVENT}/seats/stream?since={start} HTTP/1.1\r\nhost: x\r\naccept: text/event-stream\r\n\r\n"
    );
    let connect = |_| {
        let request = request.clone();
        async move {
            let mut sock = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
            sock.write_all(request.as_bytes()).await.expect("request");
            sock
        }
    };
    let mut socks = Vec::with_capacity(SUBSCRIBERS);
    for wave in 0..SUBSCRIBERS / 500 {
        socks.extend(join_all((wave * 500..(wave + 1) * 500).map(connect)).await);
    }
    // Every subscriber has its answer's head before the changes come.
    let heads = join_all(socks.iter_mut().map(|sock| async move {
        let mut buf = vec![0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(30), sock.read(&mut buf))
            .await
            .expect("head in time")
            .expect("read");
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200")
    }))
    .await;
    assert!(heads.iter().all(|ok| *ok), "every subscriber got 200");
    let mut last = start;
    for seat in 0..CHANGES {
        last = publish(&prefix, &[&format!("{}:s", 100 + seat)]).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let wanted = format!("\"version\":{last},");
    let received = join_all(socks.iter_mut().map(|sock| {
        let wanted = wanted.clone();
        async move {
            let mut text = String::new();
            let mut buf = vec![0u8; 4096];
            while !text.contains(&wanted) {
                match tokio::time::timeout(Duration::from_secs(30), sock.read(&mut buf)).await {
                    Ok(Ok(n)) if n > 0 => text.push_str(&String::from_utf8_lossy(&buf[..n])),
                    _ => break,
                }
            }
            (100..100 + CHANGES as i64).all(|seat| text.contains(&format!("[{seat},\"s\"]")))
        }
    }))
    .await;
    let all = received.iter().filter(|ok| **ok).count();
    assert_eq!(all, SUBSCRIBERS, "every subscriber received every change");
}
