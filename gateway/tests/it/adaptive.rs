//! Adaptive admission: a room whose rate follows booking's answers, as two gateway nodes see them. Booking
//! slowed, then stopped, mid-queue brings the rate down within 5 s on both nodes, and it climbs back once
//! booking answers again.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use futures::future::join_all;
use serde_json::{Value, json};
use tokens::unix_now;

use crate::harness::*;

/// Fans who reached booking: each round sends one request per fan at once, alternating nodes, until `stop`
/// (about 50 rounds a second, bounded to 10,000 rounds and two minutes). Answers are not read for their content: booking's latency, as the
/// gateways measure it, is what counts.
fn fans_browsing(nodes: [String; 2], event: i64, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(3)).build().expect("client");
        let started = Instant::now();
        for round in 0..10_000 {
            if stop.load(SeqCst) || started.elapsed() > Duration::from_secs(120) {
                return;
            }
            let sends = (0..8).map(|i| {
                let auth = format!("Bearer {}", proof_for(&format!("browser-{i}"), KEYS, event, unix_now(), 600));
                let url = format!("{}/events/{event}/seats", nodes[(round + i) % 2]);
                client.get(url).header("authorization", auth).send()
            });
            join_all(sends).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

async fn rate_where(node: &GatewayProcess, event: i64, within: Duration, done: impl Fn(u64, &str) -> bool) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let room = node.room(event).await;
        let (rate, reason) = (room.body["rate_in_force"].as_u64(), room.body["rate_reason"].as_str());
        if let (Some(rate), Some(reason)) = (rate, reason)
            && done(rate, reason)
        {
            return room.body;
        }
        assert!(Instant::now() < deadline, "room {event} never got there within {within:?}: {}", room.text);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn booking_slowed_then_stopped_brings_the_rate_down_within_5_s_and_back_after() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let b = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let event = 401;
    let (floor, ceiling) = (60, 6000);
    let set = a
        .configure(
            event,
            json!({"state": "open", "max_active": 1, "abandon_after_seconds": 600, "admit_per_minute": 600,
                   "rate_mode": "adaptive", "rate_floor": floor, "rate_ceiling": ceiling, "target_p99_ms": 200}),
        )
        .await;
    assert_eq!(set.status, 200, "{}", set.text);
    b.wait_for_room(event).await;
    // One fan inside and a few waiting: the room has work, so its nodes decide its rate.
    for fan in ["adaptive-in", "adaptive-1", "adaptive-2"] {
        assert_eq!(a.join(event, fan).await.status, 200);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let load = fans_browsing([a.base.clone(), b.base.clone()], event, stop.clone());

    // Booking answers at once: the rate climbs to the ceiling, on both nodes.
    for node in [&a, &b] {
        rate_where(node, event, Duration::from_secs(20), |rate, _| rate == ceiling).await;
    }
    let healthy = a.room(event).await;
    assert!(healthy.body["rate_reason"].as_str().is_some_and(|r| r.contains("within targets")), "{}", healthy.text);

    // Every answer slower than the target: the rate is cut within 5 s, and both nodes say so.
    upstream.booking.delay_ms.store(400, SeqCst);
    let slowed = Instant::now();
    for node in [&a, &b] {
        let room = rate_where(node, event, Duration::from_secs(5).saturating_sub(slowed.elapsed()), |rate, reason| {
            rate < ceiling && reason.starts_with("p99 over 200 ms")
        })
        .await;
        assert!(room["rate_in_force"].as_u64() >= Some(floor), "{room}");
    }

    // Booking stops answering, its availability too: nothing comes back, and the rate goes to the floor (the
    // question of what is left, which waits on booking, holds up no decision).
    upstream.booking.stopped.store(true, SeqCst);
    upstream.booking.delay_ms.store(0, SeqCst);
    let stopped = Instant::now();
    for node in [&a, &b] {
        rate_where(node, event, Duration::from_secs(5).saturating_sub(stopped.elapsed()), |_, reason| {
            reason.starts_with("booking stalled")
        })
        .await;
    }
    // Halved once a second: from the ceiling to the floor takes seven decisions, and while booking stays stopped
    // the rate never climbs in between (a stall that comes and goes as clients give up is still a stall).
    let lowest = std::sync::atomic::AtomicU64::new(u64::MAX);
    rate_where(&a, event, Duration::from_secs(20), |rate, reason| {
        let before = lowest.fetch_min(rate, SeqCst);
        assert!(rate <= before, "the rate rose from {before} to {rate} while booking was stopped ({reason})");
        rate == floor
    })
    .await;
    let metric = format!("waiting_room_rate_in_force{{event=\"{event}\"}}");
    let at_floor = testkit::eventually(Duration::from_secs(3), async || b.metric(&metric).await == Some(floor)).await;
    assert!(at_floor, "node b's Prometheus shows the floor: {:?}", b.metric(&metric).await);

    // Booking answers again: the rate climbs back to the ceiling.
    upstream.booking.stopped.store(false, SeqCst);
    for node in [&a, &b] {
        rate_where(node, event, Duration::from_secs(30), |rate, _| rate == ceiling).await;
    }
    stop.store(true, SeqCst);
    load.await.expect("the fans' task");

    // A fixed room is never moved.
    let fixed = 402;
    a.configure(fixed, json!({"state": "open", "admit_per_minute": 120})).await;
    a.wait_for_room(fixed).await;
    let room = a.room(fixed).await;
    assert_eq!((room.body["rate_mode"].as_str(), room.body["rate_in_force"].as_u64()), (Some("fixed"), Some(120)));
    assert!(room.body.get("rate_reason").is_none(), "{}", room.text);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_settings_are_checked() {
    let upstream = Upstream::start().await;
    let a = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let put = |patch: Value| {
        a.send(a.client.put(format!("{}/admin/events/403", a.admin)).bearer_auth(ADMIN_TOKEN).json(&patch))
    };
    for (patch, field) in [
        (json!({"rate_floor": 0}), "rate_floor"),
        (json!({"rate_ceiling": 1_000_001}), "rate_ceiling"),
        (json!({"target_p99_ms": 5}), "target_p99_ms"),
        (json!({"target_503_percent": 101}), "target_503_percent"),
    ] {
        let refused = put(patch).await;
        assert_eq!((refused.status, refused.code()), (422, "setting_out_of_range"), "{}", refused.text);
        assert!(refused.body["message"].as_str().is_some_and(|m| m.contains(field)), "{}", refused.text);
    }
    let crossed = put(json!({"rate_floor": 500, "rate_ceiling": 100})).await;
    assert_eq!((crossed.status, crossed.code()), (422, "setting_out_of_range"), "{}", crossed.text);
    assert!(crossed.body["message"].as_str().is_some_and(|m| m.contains("rate_floor is above")), "{}", crossed.text);
    let mode = put(json!({"rate_mode": "fastest"})).await;
    assert!(matches!(mode.status, 400 | 422), "{}", mode.text);
    // A node whose view is not read yet answers 503 for a while; then: no such room.
    let read = testkit::eventually(Duration::from_secs(5), async || a.room(403).await.status != 503).await;
    assert!(read, "the node's view is never read");
    assert_eq!(a.room(403).await.status, 404, "nothing was configured");
    upstream.stop().await;
}
