//! The waiting room: places, FIFO admission across nodes, the rate, max_active, the pre-queue draw, abandoned
//! fans, live changes, and Redis going away.

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use futures::future::join_all;
use serde_json::json;
use testkit::OwnRedis;
use tokens::{Keyring, unix_now};

use crate::harness::*;

/// Two nodes on one Redis prefix, in front of one upstream.
async fn two_nodes() -> (Upstream, GatewayProcess, GatewayProcess, String) {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let b = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    (upstream, a, b, p)
}

/// Waits (bounded) until `node`'s view of the room satisfies `done`.
async fn wait_until(
    node: &GatewayProcess,
    event: i64,
    within: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + within;
    loop {
        let room = node.room(event).await;
        if room.status == 200 && done(&room.body) {
            return room.body;
        }
        assert!(Instant::now() < deadline, "room {event} never got there: {}", room.text);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Everyone joins at once, alternating between the two nodes.
async fn join_all_fans(a: &GatewayProcess, b: &GatewayProcess, event: i64, fans: &[String]) -> Vec<Reply> {
    let replies = join_all(fans.iter().enumerate().map(|(i, fan)| {
        let node = if i % 2 == 0 { a } else { b };
        node.join(event, fan)
    }))
    .await;
    for r in &replies {
        assert_eq!(r.status, 200, "join: {}", r.text);
    }
    replies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_fans_through_two_nodes_are_admitted_in_queue_order() {
    let (upstream, a, b, p) = two_nodes().await;
    let event = 101;
    a.configure(
        event,
        json!({"state": "paused", "admit_per_minute": 12000, "max_active": 10000, "abandon_after_seconds": 600}),
    )
    .await;
    let fans: Vec<String> = (0..500).map(|i| format!("fan-{i}")).collect();
    let replies = join_all_fans(&a, &b, event, &fans).await;
    let places: Vec<u64> = replies.iter().map(Reply::place).collect();
    let mut sorted = places.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (1..=500).collect::<Vec<u64>>(), "one place each, no gaps, no duplicates");

    b.configure(event, json!({"state": "open"})).await;
    // Each node's view trails Redis by at most one tick: wait for both.
    for node in [&a, &b] {
        wait_until(node, event, Duration::from_secs(20), |r| r["live"]["admitted_total"] == 500).await;
    }

    // The steps walked the queue from place 1 to 500 in order, skipping nobody.
    let steps = batches(&p, event).await;
    let mut head = 0;
    for &(from, to, _, admitted) in &steps {
        assert_eq!(from, head, "steps are contiguous: {steps:?}");
        assert_eq!(admitted, to - from, "nobody skipped");
        head = to;
    }
    assert_eq!(head, 500);
    // Each fan's admission time (Redis) never decreases with its place.
    let mut conn = redis().await;
    let admitted_at: HashMap<String, f64> = redis::cmd("ZRANGE")
        .arg(key(&p, event, "active"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await
        .expect("active");
    let mut by_place: Vec<(u64, f64)> = fans.iter().zip(&places).map(|(f, &place)| (place, admitted_at[f])).collect();
    by_place.sort_by_key(|(place, _)| *place);
    assert!(by_place.windows(2).all(|w| w[0].1 <= w[1].1), "admission order is queue order");

    // Every fan, polling the node it did not join through, is told it is admitted, with a proof for this event.
    let statuses = join_all(replies.iter().enumerate().map(|(i, r)| {
        let node = if i % 2 == 0 { &b } else { &a };
        let ticket = r.ticket();
        async move { node.status(event, &ticket).await }
    }))
    .await;
    let ring = Keyring::parse(KEYS).expect("keys");
    for (fan, s) in fans.iter().zip(&statuses) {
        assert_eq!(s.body["state"], "admitted", "{fan}: {}", s.text);
        let claims = ring.verify_admission(s.body["admission_token"].as_str().expect("proof")).expect("valid proof");
        assert_eq!((claims.sub.as_str(), claims.evt), (fan.as_str(), event));
    }
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_keeps_the_rate_within_one_percent_across_two_nodes() {
    let (upstream, a, b, p) = two_nodes().await;
    let event = 102;
    let per_minute = 1200.0; // 20 a second
    a.configure(
        event,
        json!({"state": "paused", "admit_per_minute": 1200, "max_active": 100000, "abandon_after_seconds": 600}),
    )
    .await;
    let fans: Vec<String> = (0..320).map(|i| format!("fan-{i}")).collect();
    join_all_fans(&a, &b, event, &fans).await;
    b.configure(event, json!({"state": "open"})).await;
    // Both nodes run the step every 100 ms; watch for 12 s (bounded), checking the bound as it goes.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(12) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        check_rate_bound(&batches(&p, event).await, per_minute);
    }
    let steps = batches(&p, event).await;
    check_rate_bound(&steps, per_minute);
    let (first, last) = (steps[0], steps[steps.len() - 1]);
    let window_ms = (last.2 - first.2) as f64;
    assert!(window_ms >= 10_000.0, "a window of at least 10 s: {window_ms} ms");
    // After the opening burst (the first step), admissions follow the rate by Redis's clock.
    let admitted: u64 = steps[1..].iter().map(|s| s.3).sum();
    let expected = per_minute * window_ms / 60_000.0;
    let error = (admitted as f64 - expected).abs() / expected;
    assert!(error <= 0.01, "admitted {admitted} in {window_ms} ms, expected {expected:.1}: {:.2}% off", error * 100.0);
    assert!(steps.iter().all(|s| s.3 == s.1 - s.0), "nobody was skipped");
    upstream.stop().await;
}

/// Admitted by each step never exceeds rate x elapsed since the first step + the burst (500 ms of the rate).
fn check_rate_bound(steps: &[(u64, u64, u64, u64)], per_minute: f64) {
    let Some(first) = steps.first() else { return };
    let burst = (per_minute * 500.0 / 60_000.0).max(1.0);
    let mut total = 0;
    for s in steps {
        total += s.3;
        let bound = per_minute * (s.2 - first.2) as f64 / 60_000.0 + burst;
        assert!(total as f64 <= bound + 1e-9, "{total} admitted by {} ms, bound {bound:.2}", s.2 - first.2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_max_active_within_a_session() {
    let (upstream, a, b, p) = two_nodes().await;
    let event = 103;
    a.configure(
        event,
        json!({"state": "paused", "admit_per_minute": 60000, "max_active": 20, "session_seconds": 10, "abandon_after_seconds": 600}),
    )
    .await;
    let fans: Vec<String> = (0..50).map(|i| format!("fan-{i}")).collect();
    join_all_fans(&a, &b, event, &fans).await;
    b.configure(event, json!({"state": "open"})).await;
    wait_until(&a, event, Duration::from_secs(5), |r| r["live"]["admitted_total"] == 20).await;
    // At 1000 a second, the rate is no limit: only max_active holds the rest back, for the whole session.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let room = b.room(event).await;
    assert_eq!((room.body["live"]["active"].as_u64(), room.body["live"]["waiting"].as_u64()), (Some(20), Some(30)));
    // When the first sessions end, the next fans go in, and again never more than 20 within a session.
    wait_until(&a, event, Duration::from_secs(15), |r| r["live"]["admitted_total"] == 40).await;
    let steps = batches(&p, event).await;
    for s in &steps {
        let in_window: u64 = steps.iter().filter(|o| o.2 <= s.2 && o.2 + 10_000 > s.2).map(|o| o.3).sum();
        assert!(in_window <= 20, "{in_window} admitted within one session window: {steps:?}");
    }
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_change_on_one_node_is_applied_by_the_other() {
    let (upstream, a, b, _) = two_nodes().await;
    let event = 104;
    a.configure(event, json!({"state": "open", "admit_per_minute": 600})).await;
    b.wait_for_room(event).await;
    a.configure(event, json!({"admit_per_minute": 777})).await;
    // Each node reads its rooms every tick; the bound only keeps a broken node from hanging the test.
    wait_until(&b, event, Duration::from_secs(10), |r| r["admit_per_minute"] == 777).await;
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pre_queue_draw_is_a_permutation_anyone_can_recompute() {
    let (upstream, a, b, _) = two_nodes().await;
    let event = 105;
    a.configure(event, json!({"state": "prequeue", "admit_per_minute": 60000, "abandon_after_seconds": 600})).await;
    b.wait_for_room(event).await;
    let fans: Vec<String> = (0..50).map(|i| format!("early-{i}")).collect();
    let replies = join_all_fans(&a, &b, event, &fans).await;
    for r in &replies {
        assert_eq!(
            (r.body["state"].as_str(), r.body["prequeue"].as_bool(), r.place()),
            (Some("waiting"), Some(true), 0)
        );
    }
    let again = b.join(event, "early-0").await;
    assert_eq!((again.body["prequeue"].as_bool(), again.place()), (Some(true), 0), "joining again changes nothing");

    let opened = b.configure(event, json!({"state": "open"})).await;
    assert_eq!(opened.body["drawn"], 50);
    for node in [&a, &b] {
        wait_until(node, event, Duration::from_secs(2), |r| r["state"] == "open").await;
    }
    // Each fan's next poll learns its drawn place (a new ticket).
    let polls = join_all(replies.iter().enumerate().map(|(i, r)| {
        let node = if i % 2 == 0 { &b } else { &a };
        let ticket = r.ticket();
        async move { node.status(event, &ticket).await }
    }))
    .await;
    let places: HashMap<String, u64> = fans.iter().zip(&polls).map(|(f, r)| (f.clone(), r.place())).collect();
    let mut sorted: Vec<u64> = places.values().copied().collect();
    sorted.sort_unstable();
    assert_eq!(sorted, (1..=50).collect::<Vec<u64>>(), "the draw is a permutation of 1..=50");

    // The recorded seed and join order recompute every place.
    let draw = a.send(a.client.get(format!("{}/admin/events/{event}/draw", a.admin)).bearer_auth(ADMIN_TOKEN)).await;
    assert_eq!(draw.status, 200, "{}", draw.text);
    let seed = draw.body["seed"].as_u64().expect("seed");
    let join_order: Vec<String> = serde_json::from_value(draw.body["join_order"].clone()).expect("join order");
    let recomputed = gateway::room::shuffle::draw(join_order.clone(), seed);
    for (k, fan) in recomputed.iter().enumerate() {
        assert_eq!(places[fan], k as u64 + 1, "{fan}'s place recomputed from seed {seed}");
    }
    assert_ne!(recomputed, join_order, "the draw differs from the join order");
    // Live joiners queue behind the drawn fans.
    let late = a.join(event, "late-1").await;
    assert_eq!(late.place(), 51);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_queue_opens_by_itself_at_its_time() {
    let (upstream, a, b, _) = two_nodes().await;
    let event = 106;
    let opens_at = unix_now() + 2;
    a.configure(event, json!({"state": "prequeue", "opens_at": opens_at, "admit_per_minute": 60000})).await;
    b.wait_for_room(event).await;
    let fans: Vec<String> = (0..10).map(|i| format!("early-{i}")).collect();
    let replies = join_all_fans(&a, &b, event, &fans).await;
    assert!(replies.iter().all(|r| r.body["prequeue"] == true));
    wait_until(&b, event, Duration::from_secs(6), |r| r["state"] == "open" && r["live"]["admitted_total"] == 10).await;
    assert!(unix_now() >= opens_at, "not before its time");
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_fans_are_skipped_and_the_queue_keeps_flowing() {
    let (upstream, a, b, _) = two_nodes().await;
    let event = 107;
    a.configure(event, json!({"state": "paused", "admit_per_minute": 60000, "abandon_after_seconds": 5})).await;
    a.wait_for_room(event).await;
    b.wait_for_room(event).await;
    let fans: Vec<String> = (0..20).map(|i| format!("fan-{i}")).collect();
    let replies = join_all_fans(&a, &b, event, &fans).await;
    let (present, gone): (Vec<&Reply>, Vec<&Reply>) = replies.iter().partition(|r| r.place() % 2 == 0);
    // The present half polls every second for 7 s (bounded); the queue opens after 6 s.
    for round in 0..7 {
        let polls = join_all(present.iter().map(|r| async { a.status(event, &r.ticket()).await })).await;
        assert!(polls.iter().all(|p| p.status == 200), "{:?}", polls.iter().map(|p| &p.text).collect::<Vec<_>>());
        if round == 5 {
            b.configure(event, json!({"state": "open"})).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for node in [&a, &b] {
        wait_until(node, event, Duration::from_secs(3), |r| r["live"]["abandoned_total"] == 10).await;
    }
    let room = a.room(event).await;
    assert_eq!(room.body["live"]["admitted_total"], 10, "{}", room.text);
    for r in &present {
        assert_eq!(a.status(event, &r.ticket()).await.body["state"], "admitted");
    }
    for r in &gone {
        let s = b.status(event, &r.ticket()).await;
        assert_eq!((s.status, s.code()), (409, "place_lapsed"), "{}", s.text);
    }
    // A skipped fan who comes back gets a new place at the back, and with nobody waiting, goes in at once.
    let fan = Keyring::parse(KEYS).expect("keys").verify_ticket(&gone[0].ticket()).expect("ticket").sub;
    let back = a.join(event, fan.as_str()).await;
    assert_eq!((back.place(), back.body["state"].as_str()), (21, Some("admitted")), "{}", back.text);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_account_joining_a_hundred_times_at_once_has_one_place() {
    let (upstream, a, b, _) = two_nodes().await;
    let event = 108;
    a.configure(event, json!({"state": "paused"})).await;
    let same = vec!["fan-same".to_owned(); 100];
    let replies = join_all_fans(&a, &b, event, &same).await;
    assert!(replies.iter().all(|r| r.place() == 1), "{:?}", replies.iter().map(Reply::place).collect::<Vec<_>>());
    assert_eq!(a.join(event, "fan-other").await.place(), 2);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_fan_into_an_empty_room_goes_in_at_once_and_reaches_booking() {
    let upstream = Upstream::start().await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let event = 109;
    gw.configure(event, json!({"state": "open", "admit_per_minute": 60})).await;
    let joined = gw.join(event, "fan-first").await;
    assert_eq!(joined.body["state"], "admitted", "{}", joined.text);
    let cookies: Vec<&str> = joined.headers.get_all("set-cookie").iter().filter_map(|v| v.to_str().ok()).collect();
    assert!(cookies.iter().any(|c| c.starts_with("wr_admission=") && c.contains("HttpOnly") && c.contains("Secure")));
    assert!(cookies.iter().any(|c| c.starts_with(&format!("wr_queue_{event}=")) && c.contains("SameSite=Lax")));
    let proof = joined.body["admission_token"].as_str().expect("proof").to_owned();
    let booked = gw.get(&format!("/events/{event}/seats"), &[("authorization", &format!("Bearer {proof}"))]).await;
    assert_eq!(booked.status, 200);
    assert_eq!(upstream.hits(), 1);
    // The next fan waits its turn (60 a minute: the opening burst was one fan).
    let second = gw.join(event, "fan-second").await;
    assert_eq!((second.body["state"].as_str(), second.body["position"].as_u64()), (Some("waiting"), Some(1)));
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_and_tickets_get_clear_refusals() {
    let upstream = Upstream::start().await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let event = 110;
    gw.configure(event, json!({"state": "paused"})).await;
    gw.wait_for_room(event).await;
    let join = |auth: Option<String>| {
        let mut req = gw.client.post(format!("{}/queue/{event}/join", gw.base));
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        gw.send(req)
    };
    let expired = {
        let claims = tokens::AccountClaims::new(
            tokens::AccountId::parse("fan-1").expect("id"),
            "platform",
            unix_now() - 3600,
            60,
        );
        Keyring::parse(ACCOUNT_KEYS).expect("keys").sign(&claims)
    };
    let other_issuer = {
        let claims =
            tokens::AccountClaims::new(tokens::AccountId::parse("fan-1").expect("id"), "elsewhere", unix_now(), 60);
        Keyring::parse(ACCOUNT_KEYS).expect("keys").sign(&claims)
    };
    let cases = [
        (None, 401, "account_required"),
        (Some(format!("Bearer {}", proof(KEYS, event, unix_now(), 60))), 401, "account_invalid"),
        (Some(format!("Bearer {expired}")), 401, "account_expired"),
        (Some(format!("Bearer {other_issuer}")), 401, "account_invalid"),
        (Some("Bearer x".repeat(1500)), 401, "account_invalid"),
    ];
    for (auth, status, code) in cases {
        let r = join(auth.clone()).await;
        assert_eq!((r.status, r.code()), (status, code), "{auth:?}: {}", r.text);
    }
    let unknown = gw.join(999_999, "fan-1").await;
    assert_eq!((unknown.status, unknown.code()), (404, "queue_not_found"));

    let ticket = gw.join(event, "fan-1").await.ticket();
    let tampered = {
        let mut parts: Vec<String> = ticket.split('.').map(str::to_owned).collect();
        parts[2] = parts[2].chars().rev().collect();
        parts.join(".")
    };
    let no_ticket = gw.get(&format!("/queue/{event}/status"), &[]).await;
    assert_eq!((no_ticket.status, no_ticket.code()), (401, "ticket_required"));
    let other_event = gw.status(event + 1, &ticket).await;
    assert_eq!((other_event.status, other_event.code()), (403, "ticket_wrong_event"));
    let bad = gw.status(event, &tampered).await;
    assert_eq!((bad.status, bad.code()), (401, "ticket_invalid"));
    let wrong_method = gw.send(gw.client.delete(format!("{}/queue/{event}/join", gw.base))).await;
    assert_eq!(
        (wrong_method.status, wrong_method.code(), wrong_method.header("allow")),
        (405, "method_not_allowed", Some("POST"))
    );
    let page = gw.get(&format!("/queue/{event}"), &[("accept", "text/html")]).await;
    assert_eq!(page.status, 200);
    assert!(page.header("content-type").is_some_and(|c| c.starts_with("text/html")) && page.text.contains("aria-live"));
    // Never framed (no clickjacking of "join"), and no script but its own (the browser tests run it under this).
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    let policy = page.header("content-security-policy").unwrap_or_default();
    assert!(policy.contains("frame-ancestors 'none'") && policy.contains("script-src 'sha256-"), "{policy}");
    assert!(!policy.contains("unsafe-inline"), "{policy}");
    let as_json = gw
        .get(
            &format!("/queue/{event}"),
            &[("accept", "application/json"), ("authorization", &format!("Bearer {ticket}"))],
        )
        .await;
    assert_eq!((as_json.status, as_json.body["state"].as_str()), (200, Some("paused")), "{}", as_json.text);
    // One URL, two answers by Accept: a CDN must key on it, or it hands the cached page to a JSON client (or
    // the JSON to a browser).
    assert_eq!((page.header("vary"), as_json.header("vary")), (Some("Accept"), Some("Accept")));
    assert_eq!(as_json.header("cache-control"), Some("no-store"));
    assert_eq!(upstream.hits(), 0);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_counts_the_ticket_cookie_beside_an_account_token_and_names_an_account_token_alone() {
    let upstream = Upstream::start().await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let event = 112;
    gw.configure(event, json!({"state": "paused"})).await;
    gw.wait_for_room(event).await;
    let ticket = gw.join(event, "fan-1").await.ticket();
    // A browser of the platform: its login's account token in `Authorization`, the queue's ticket in a cookie.
    let account = format!("Bearer {}", account_token("fan-1"));
    let cookie = format!("theme=dark; wr_queue_{event}={ticket}");
    let path = format!("/queue/{event}/status");
    let both = gw.get(&path, &[("authorization", &account), ("cookie", &cookie)]).await;
    assert_eq!((both.status, both.body["state"].as_str()), (200, Some("paused")), "{}", both.text);
    let alone = gw.get(&path, &[("authorization", &account)]).await;
    assert_eq!((alone.status, alone.code()), (401, "ticket_required"), "{}", alone.text);
    assert!(alone.body["message"].as_str().is_some_and(|m| m.contains("account token")), "{}", alone.text);
    let garbage = gw.get(&path, &[("authorization", "Bearer not-a-token"), ("cookie", &cookie)]).await;
    assert_eq!(garbage.status, 200, "a valid ticket in the cookie still counts: {}", garbage.text);
    assert_eq!(upstream.hits(), 0);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_means_503_for_the_queue_while_admitted_fans_still_reach_booking() {
    let upstream = Upstream::start().await;
    let mut redis_server = OwnRedis::start().await;
    let mut node = Node::new(upstream.addr, &prefix());
    node.redis_url = format!("redis://127.0.0.1:{}/", redis_server.port);
    let gw = GatewayProcess::start(node).await;
    let event = 111;
    gw.configure(event, json!({"state": "open", "admit_per_minute": 60000})).await;
    gw.wait_for_room(event).await;
    let admitted = gw.join(event, "fan-in").await;
    assert_eq!(admitted.body["state"], "admitted", "{}", admitted.text);
    let proof = admitted.body["admission_token"].as_str().expect("proof").to_owned();
    let waiting_ticket = admitted.ticket();

    let _ = redis_server.child.kill();
    let _ = redis_server.child.wait();

    let join = gw.join(event, "fan-late").await;
    assert_eq!((join.status, join.code(), join.header("retry-after")), (503, "queue_unavailable", Some("1")));
    let booked = gw.get(&format!("/events/{event}/seats"), &[("authorization", &format!("Bearer {proof}"))]).await;
    assert_eq!(booked.status, 200, "an admitted fan still reaches booking");
    // Once this node's view is older than it may be (2 s), polls answer 503 too rather than guess.
    let deadline = Instant::now() + Duration::from_secs(6);
    loop {
        let s = gw.status(event, &waiting_ticket).await;
        if s.status == 503 {
            assert_eq!((s.code(), s.header("retry-after")), ("queue_unavailable", Some("1")));
            break;
        }
        assert!(Instant::now() < deadline, "status never went 503: {}", s.text);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(gw.room(event).await.status, 503);
    upstream.stop().await;
}

/// Each fan's position in the queue, as a new join of the same account answers it.
async fn positions(gw: &GatewayProcess, event: i64, fans: &[String]) -> Vec<Option<u64>> {
    let mut out = Vec::new();
    for fan in fans {
        let joined = gw.join(event, fan).await;
        assert_eq!(joined.status, 200, "{}", joined.text);
        out.push(joined.body["position"].as_u64());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_mid_queue_keeps_every_room_and_place() {
    let upstream = Upstream::start().await;
    let mut redis_server = OwnRedis::start_persistent().await;
    let mut node = Node::new(upstream.addr, &prefix());
    node.redis_url = format!("redis://127.0.0.1:{}/", redis_server.port);
    let gw = GatewayProcess::start(node).await;
    let event = 114;
    // One fan inside at a time, and nobody skipped: the others wait where they are.
    gw.configure(
        event,
        json!({"state": "open", "admit_per_minute": 1, "max_active": 1, "abandon_after_seconds": 3600}),
    )
    .await;
    gw.wait_for_room(event).await;
    let fans: Vec<String> = (0..5).map(|i| format!("fan-kept-{i}")).collect();
    let before = positions(&gw, event, &fans).await;
    assert_eq!(before, [None, Some(1), Some(2), Some(3), Some(4)], "the first is in, the others wait in order");

    // A clean restart (an operator's, or a deploy's): every room and place is there again.
    redis_server.restart(true).await;
    // A join is answered by Redis (`queue_join`), which knows the room only from its keys there.
    let back = testkit::eventually(Duration::from_secs(10), async || gw.join(event, "fan-probe").await.status == 200);
    assert!(back.await, "the room is there again");
    assert_eq!(positions(&gw, event, &fans).await, before, "every fan kept its place");

    // A crash (SIGKILL) loses at most the last second of writes: joins older than that are kept.
    let late: Vec<String> = (0..3).map(|i| format!("fan-late-{i}")).collect();
    let joined = positions(&gw, event, &late).await;
    assert_eq!(joined, [Some(6), Some(7), Some(8)], "joiners after the restart come after the others (and the probe)");
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    redis_server.restart(false).await;
    let back = testkit::eventually(Duration::from_secs(10), async || gw.join(event, "fan-probe").await.status == 200);
    assert!(back.await, "the room is there again after a crash");
    assert_eq!(positions(&gw, event, &fans).await, before, "places older than a second survive a crash");
    assert_eq!(positions(&gw, event, &late).await, joined);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sell_out_reported_by_booking_stops_admission_and_tells_waiting_fans() {
    let (upstream, a, b, _) = two_nodes().await;
    let event = 112;
    a.configure(
        event,
        json!({"state": "open", "admit_per_minute": 60000, "max_active": 1, "abandon_after_seconds": 600}),
    )
    .await;
    b.wait_for_room(event).await;
    let first = a.join(event, "fan-in").await;
    assert_eq!(first.body["state"], "admitted", "{}", first.text);
    let waiting = b.join(event, "fan-waiting").await;
    assert_eq!(waiting.body["state"], "waiting", "{}", waiting.text);

    // Every seat sold, two of them awaiting payment: they may come back, so the room is not sold out yet.
    let availability = &upstream.booking;
    availability.seats_available.store(0, SeqCst);
    availability.seats_awaiting_payment.store(2, SeqCst);
    availability.sold_out.store(true, SeqCst);
    for node in [&a, &b] {
        wait_until(node, event, Duration::from_secs(3), |r| r["all_held"] == true).await;
    }
    let unpaid = b.status(event, &waiting.ticket()).await;
    assert_eq!(
        (unpaid.body["state"].as_str(), unpaid.body["seats_may_return"].as_u64()),
        (Some("waiting"), Some(2)),
        "{}",
        unpaid.text
    );
    // Both paid.
    availability.seats_awaiting_payment.store(0, SeqCst);
    for node in [&a, &b] {
        wait_until(node, event, Duration::from_secs(3), |r| r["state"] == "sold_out").await;
    }
    let told = a.status(event, &waiting.ticket()).await;
    assert_eq!((told.status, told.body["state"].as_str()), (200, Some("sold_out")), "{}", told.text);
    let late = b.join(event, "fan-late").await;
    assert_eq!((late.status, late.code(), late.body["state"].as_str()), (409, "sold_out", Some("sold_out")));
    let still_in = a.status(event, &first.ticket()).await;
    assert_eq!(still_in.body["state"], "admitted", "an admitted fan keeps its session");

    // Seats come back (an order cancelled): the room opens again by itself.
    availability.sold_out.store(false, SeqCst);
    wait_until(&a, event, Duration::from_secs(3), |r| r["state"] == "open").await;
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_every_seat_left_is_held_nobody_is_admitted_and_waiting_fans_are_told() {
    let (upstream, a, b, _) = two_nodes().await;
    let event = 113;
    a.configure(event, json!({"state": "open", "admit_per_minute": 60000, "abandon_after_seconds": 600})).await;
    b.wait_for_room(event).await;
    // Five seats held and one awaiting payment, the first of them back in two minutes.
    let availability = &upstream.booking;
    let release = tokens::unix_now() + 120;
    availability.seats_held.store(5, SeqCst);
    availability.seats_awaiting_payment.store(1, SeqCst);
    availability.next_release.store(release, SeqCst);
    availability.seats_available.store(0, SeqCst);
    let release_at = time::OffsetDateTime::from_unix_timestamp(i64::try_from(release).expect("seconds"))
        .expect("time")
        .format(&time::format_description::well_known::Rfc3339)
        .expect("RFC 3339");
    for node in [&a, &b] {
        let room = wait_until(node, event, Duration::from_secs(3), |r| r["all_held"] == true).await;
        assert_eq!(
            (room["seats_may_return"].as_u64(), room["next_release_at"].as_str()),
            (Some(6), Some(&*release_at))
        );
    }
    // Nothing to hold: joiners wait, however fast the rate, and are told why.
    let fans: Vec<String> = (0..6).map(|i| format!("fan-held-{i}")).collect();
    let joined = join_all_fans(&a, &b, event, &fans).await;
    assert!(
        joined.iter().all(|j| j.body["state"] == "waiting"),
        "{:?}",
        joined.iter().map(|j| &j.text).collect::<Vec<_>>()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (i, j) in joined.iter().enumerate() {
        let node = if i % 2 == 0 { &a } else { &b };
        let s = node.status(event, &j.ticket()).await;
        assert_eq!(
            (s.body["state"].as_str(), s.body["all_held"].as_bool()),
            (Some("waiting"), Some(true)),
            "{}",
            s.text
        );
        assert!(s.body["eta_seconds"].is_null(), "no ETA while nothing can be held: {}", s.text);
        assert_eq!(
            (s.body["seats_may_return"].as_u64(), s.body["next_release_at"].as_str()),
            (Some(6), Some(&*release_at)),
            "what may come back, and from when: {}",
            s.text
        );
        assert!(s.body["poll_after_ms"].as_u64() <= Some(6000), "the sale may end any moment: {}", s.text);
    }
    assert_eq!(a.room(event).await.body["live"]["admitted_total"], 0);

    // A hold runs out somewhere: admission resumes by itself, in queue order.
    availability.seats_available.store(3, SeqCst);
    wait_until(&a, event, Duration::from_secs(5), |r| r["live"]["admitted_total"] == 6).await;
    let s = a.status(event, &joined[0].ticket()).await;
    assert_eq!((s.body["state"].as_str(), s.body.get("all_held")), (Some("admitted"), None), "{}", s.text);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_lost_with_redis_is_never_given_again_ahead_of_its_holder() {
    let (upstream, a, b, p) = two_nodes().await;
    let event = 231;
    a.configure(event, json!({"state": "paused"})).await;
    let mut held = Vec::new();
    for i in 0..3 {
        held.push(a.join(event, &format!("fan-held-{i}")).await.place());
    }
    assert_eq!(held, [1, 2, 3]);
    // The other node has only seen the places in its view of the room.
    wait_until(&b, event, Duration::from_secs(5), |r| r["live"]["places_given"] == 3).await;
    // Redis forgets the queue's counter and places (a failover to a replica that lagged, a restart from an
    // append-only file a second old), and both nodes' views catch up with that.
    let mut conn = redis().await;
    for name in ["seq", "places", "who", "joined"] {
        let _: i64 = redis::cmd("DEL").arg(key(&p, event, name)).query_async(&mut conn).await.expect("DEL");
    }
    for node in [&a, &b] {
        wait_until(node, event, Duration::from_secs(5), |r| r["live"]["places_given"] == 0).await;
    }
    // Fans who join now, through either node, come after every place already given out.
    let late = join_all([b.join(event, "fan-late-b"), a.join(event, "fan-late-a")]).await;
    let mut places: Vec<u64> = late.iter().map(Reply::place).collect();
    places.sort_unstable();
    assert_eq!(places, [4, 5], "the places given after the loss");
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_redis_lost_is_restored_from_the_nodes_view_and_takes_fans_again() {
    let upstream = Upstream::start().await;
    let prefix = prefix();
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix)).await;
    let event = 230;
    gw.configure(event, serde_json::json!({"state": "open", "admit_per_minute": 120, "max_active": 77})).await;
    gw.wait_for_room(event).await;
    assert_eq!(gw.join(event, "fan-before").await.status, 200);
    // Everything under the gateway's prefix gone, as FLUSHALL would leave it.
    let mut conn = redis().await;
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(&mut conn).await.expect("KEYS");
    let _: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await.expect("DEL");
    let back =
        testkit::eventually(Duration::from_secs(5), async || gw.join(event, "fan-after").await.status == 200).await;
    assert!(back, "the room takes fans again");
    let room = gw.room(event).await;
    assert_eq!(
        (room.body["state"].as_str(), room.body["max_active"].as_u64()),
        (Some("open"), Some(77)),
        "{}",
        room.text
    );
    upstream.stop().await;
}

/// The attack: the page took the account from its URL's fragment, so a link made by an attacker signed its
/// victim in as the attacker, who then owned whatever the victim queued for and paid. No URL signs anyone in
/// now: a platform sets the account cookie, and the demo's one-time code is exchanged for an `HttpOnly` one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_link_signs_a_browser_in_and_a_demo_sign_in_code_works_once_into_an_http_only_cookie() {
    let upstream = Upstream::start().await;
    let event = 120;
    let off = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let page = off.get(&format!("/queue/{event}"), &[("accept", "text/html")]).await;
    assert_eq!(page.status, 200);
    // The page reads two things from its address, a sponsor pass (worthless to anyone but its account) and a
    // presale code (which a link's maker gives away to whoever follows it), and never an account, nor the
    // cookie that carries one.
    let reads: Vec<&str> = page.text.matches("URLSearchParams(location.").collect();
    assert_eq!(reads.len(), 1, "the page reads its address once");
    assert!(page.text.contains("const fragment = new URLSearchParams(location.hash.slice(1));"), "its fragment");
    let taken: Vec<&str> =
        page.text.split("fragment.get('").skip(1).filter_map(|rest| rest.split_once('\'')).map(|(k, _)| k).collect();
    assert_eq!(taken, ["pass", "code"], "and only a pass and a code from it");
    assert!(!page.text.contains("account="), "the page reads no account");
    assert!(!page.text.contains("document.cookie"), "the page never reads the cookie");
    let code = "0123456789abcdef0123456789abcdef";
    let refused = off.get(&format!("/queue/{event}/signin?code={code}"), &[]).await;
    assert_eq!((refused.status, refused.code()), (404, "not_found"), "no demo sign-in unless it is turned on");

    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix()).arg("--dev-signin", "true")).await;
    gw.configure(event, json!({ "state": "open" })).await;
    gw.wait_for_room(event).await;
    let mint = |token: Option<&str>| {
        let req = gw.client.post(format!("{}/admin/signin-codes", gw.admin));
        let req = match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        gw.send(req.json(&json!({ "account_token": account_token("fan-1") })))
    };
    assert_eq!(mint(None).await.status, 401, "only an operator makes codes");
    let minted = mint(Some(ADMIN_TOKEN)).await;
    assert_eq!(minted.status, 201, "{}", minted.text);
    let code = minted.body["code"].as_str().expect("a code").to_owned();
    let signin = gw.get(&format!("/queue/{event}/signin?code={code}"), &[]).await;
    assert_eq!((signin.status, signin.header("location")), (303, Some(format!("/queue/{event}").as_str())));
    let cookie = signin.header("set-cookie").unwrap_or_default().to_owned();
    assert!(cookie.starts_with("wr_account="), "{cookie}");
    for attribute in ["; HttpOnly", "; SameSite=Lax", "; Secure", "; Path=/queue"] {
        assert!(cookie.contains(attribute), "{attribute} in {cookie}");
    }
    assert_eq!(signin.header("cache-control"), Some("no-store"));
    // The cookie is the account's: it joins.
    let pair = cookie.split(';').next().unwrap_or_default().to_owned();
    let join = gw.send(gw.client.post(format!("{}/queue/{event}/join", gw.base)).header("cookie", pair)).await;
    assert_eq!((join.status, join.body["state"].as_str()), (200, Some("admitted")), "{}", join.text);
    // Once only, and nothing made up or malformed passes.
    let again = gw.get(&format!("/queue/{event}/signin?code={code}"), &[]).await;
    assert_eq!((again.status, again.code()), (401, "signin_code_invalid"));
    let made_up = gw.get(&format!("/queue/{event}/signin?code={}", "f".repeat(32)), &[]).await;
    assert_eq!((made_up.status, made_up.code()), (401, "signin_code_invalid"));
    for bad in ["", "?code=", "?code=XYZ", "?code=0123456789ABCDEF0123456789ABCDEF"] {
        let reply = gw.get(&format!("/queue/{event}/signin{bad}"), &[]).await;
        assert_eq!((reply.status, reply.code()), (400, "invalid_request"), "{bad:?}");
    }
    assert_eq!(upstream.hits(), 0);
}

/// A node that has not yet read a room made a moment ago does not know its session: it never admits a fan
/// for a default session the room does not have (its proof would be refused as lasting too long). Whichever
/// node answers, every proof handed out lasts the room's session and is accepted on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proof_handed_out_as_a_room_opens_lasts_its_session_and_passes_every_node() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    // A slow ticker: this node lists the new room late.
    let b = GatewayProcess::start(Node::new(upstream.addr, &p).arg("--tick-ms", 1000)).await;
    let event = 130;
    a.configure(event, json!({ "state": "open", "session_seconds": 120 })).await;
    let joined = b.join(event, "first-fan").await;
    assert_eq!(joined.status, 200, "{}", joined.text);
    // Admitted at once, or at a later tick: either way with the room's session.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut answer = joined;
    let ticket = answer.ticket();
    while answer.body["state"] != "admitted" {
        assert!(Instant::now() < deadline, "never admitted: {}", answer.text);
        tokio::time::sleep(Duration::from_millis(200)).await;
        answer = b.status(event, &ticket).await;
    }
    let proof = answer.body["admission_token"].as_str().expect("a proof").to_owned();
    let claims = Keyring::parse(KEYS).expect("keys").verify_admission(&proof).expect("a valid proof");
    assert!(claims.exp - claims.iat <= 121, "the room's session, not a default one: {claims:?}");
    a.wait_for_room(event).await;
    b.wait_for_room(event).await;
    for node in [&a, &b] {
        let reply = node.get(&format!("/events/{event}"), &[("authorization", &format!("Bearer {proof}"))]).await;
        assert_eq!(reply.status, 200, "{}", reply.text);
    }
}
