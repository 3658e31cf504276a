//! Rate limits and the admin listener's guard.

use std::time::Duration;

use futures::future::join_all;
use serde_json::json;
use tokens::unix_now;

use crate::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_over_its_limit_gets_429_while_another_is_unaffected() {
    let upstream = Upstream::start().await;
    let node = Node::new(upstream.addr, &prefix()).arg("--account-rps", 1).arg("--account-burst", 3);
    let gw = GatewayProcess::start(node).await;
    let event = 201;
    let heavy = format!("Bearer {}", proof_for("fan-heavy", KEYS, event, unix_now(), 60));
    let light = format!("Bearer {}", proof_for("fan-light", KEYS, event, unix_now(), 60));
    let path = format!("/events/{event}/seats");
    let replies = join_all((0..6).map(|_| async { gw.get(&path, &[("authorization", &heavy)]).await })).await;
    let limited: Vec<&Reply> = replies.iter().filter(|r| r.status == 429).collect();
    assert_eq!(replies.iter().filter(|r| r.status == 200).count(), 3, "the burst of 3 goes through");
    assert_eq!(limited.len(), 3);
    for r in &limited {
        assert_eq!(r.code(), "rate_limited");
        assert!(r.header("retry-after").and_then(|v| v.parse::<u64>().ok()).is_some_and(|s| s >= 1));
    }
    assert_eq!(gw.get(&path, &[("authorization", &light)]).await.status, 200, "another account is not limited");
    assert_eq!(upstream.hits(), 4, "limited requests never reach booking");
    upstream.stop().await;
}

/// How many gateway nodes this node says share each account's budget (its `gateway_nodes` gauge).
async fn nodes_seen(gw: &GatewayProcess) -> Option<u32> {
    gw.metric("gateway_nodes").await.and_then(|n| u32::try_from(n).ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_an_accounts_budget_and_one_takes_it_whole_when_the_other_leaves() {
    let upstream = Upstream::start().await;
    let shared = prefix();
    let node = || Node::new(upstream.addr, &shared).arg("--account-rps", 1).arg("--account-burst", 100);
    let (a, b) = (GatewayProcess::start(node()).await, GatewayProcess::start(node()).await);
    let both = testkit::eventually(Duration::from_secs(10), async || {
        nodes_seen(&a).await == Some(2) && nodes_seen(&b).await == Some(2)
    })
    .await;
    assert!(both, "each node counts two: {:?} {:?}", nodes_seen(&a).await, nodes_seen(&b).await);

    // 400 requests at once, spread over the two nodes as a balancer would: each node lets its share of the burst
    // (50 of 100) through, so the account gets its burst once, not once per node. The burst is large against
    // the refills, so only a machine that takes most of a minute over this could blur the two.
    let event = 202;
    let auth = format!("Bearer {}", proof_for("fan-spread", KEYS, event, unix_now(), 60));
    let path = format!("/events/{event}/seats");
    let headers = [("authorization", auth.as_str())];
    let nodes = [&a, &b];
    let started = std::time::Instant::now();
    let replies = join_all((0..400).map(|i| nodes[i % 2].get(&path, &headers))).await;
    // Each node's share refills at 1 a second (the rate, 1, divided by 2 and rounded up) while they run.
    let refills = 2 * started.elapsed().as_secs().saturating_add(1) as usize;
    let passed = replies.iter().filter(|r| r.status == 200).count();
    assert!(
        (100..=100 + refills).contains(&passed),
        "{passed} of 400 passed: the burst of 100, plus at most {refills} refills"
    );
    assert!(replies.iter().all(|r| r.status == 200 || r.status == 429));

    // The second node stops: the first takes the whole budget back within a couple of seconds.
    drop(b);
    let alone = testkit::eventually(Duration::from_secs(10), async || nodes_seen(&a).await == Some(1)).await;
    assert!(alone, "the node counts itself alone: {:?}", nodes_seen(&a).await);
    let other = format!("Bearer {}", proof_for("fan-alone", KEYS, event, unix_now(), 60));
    let started = std::time::Instant::now();
    let replies = join_all((0..200).map(|_| async { a.get(&path, &[("authorization", &other)]).await })).await;
    let refills = started.elapsed().as_secs().saturating_add(1) as usize;
    let passed = replies.iter().filter(|r| r.status == 200).count();
    assert!(
        (100..=100 + refills).contains(&passed),
        "{passed} of 200 passed on the node alone: the whole burst of 100"
    );
    upstream.stop().await;
}

/// Three polls at once, each claiming another client IP in `X-Forwarded-For`; how many were limited.
async fn limited_polls(gw: &GatewayProcess, event: i64, forwarded: [&str; 3]) -> usize {
    limited_polls_by(gw, event, "x-forwarded-for", forwarded).await
}

/// Three polls at once, each claiming another client IP in `header`; how many were limited.
async fn limited_polls_by(gw: &GatewayProcess, event: i64, header: &str, forwarded: [&str; 3]) -> usize {
    let path = format!("/queue/{event}/status");
    let replies = join_all(forwarded.iter().map(|ip| {
        let path = &path;
        async move { gw.get(path, &[(header, ip), ("authorization", "Bearer not-a-ticket")]).await }
    }))
    .await;
    for r in &replies {
        assert!(r.status == 429 || (r.status == 401 && r.code() == "ticket_invalid"), "{}", r.text);
    }
    replies.iter().filter(|r| r.status == 429).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_are_believed_only_from_trusted_proxies() {
    let upstream = Upstream::start().await;
    let strict = Node::new(upstream.addr, &prefix()).arg("--ip-rps", 1).arg("--ip-burst", 2);
    let untrusting = GatewayProcess::start(strict.clone()).await;
    // From an untrusted peer, a spoofed X-Forwarded-For is ignored: all three polls are charged to 127.0.0.1.
    assert_eq!(limited_polls(&untrusting, 202, ["1.1.1.1", "2.2.2.2", "3.3.3.3"]).await, 1);
    drop(untrusting);
    let trusting = GatewayProcess::start(strict.arg("--trusted-proxies", "127.0.0.0/8")).await;
    // Behind a trusted proxy, each client IP has its own limit...
    assert_eq!(limited_polls(&trusting, 202, ["1.1.1.1", "2.2.2.2", "3.3.3.3"]).await, 0);
    // ...and one client is still limited however it spreads over the proxy's connections.
    assert_eq!(limited_polls(&trusting, 202, ["9.9.9.9", "9.9.9.9", "9.9.9.9"]).await, 1);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_named_header_is_believed_ipv6_clients_share_their_64_and_unreadable_values_are_refused() {
    let upstream = Upstream::start().await;
    let strict = Node::new(upstream.addr, &prefix()).arg("--ip-rps", 1).arg("--ip-burst", 2);
    let xff = GatewayProcess::start(strict.clone().arg("--trusted-proxies", "127.0.0.0/8")).await;
    // A port after the address is read, not taken for garbage.
    assert_eq!(limited_polls(&xff, 204, ["1.1.1.1:5000", "2.2.2.2:5000", "[2001:db8::1]:443"]).await, 0);
    // Three addresses of one /64 are one subscriber.
    assert_eq!(limited_polls(&xff, 204, ["2001:db8:7::1", "2001:db8:7::2", "2001:db8:7::3"]).await, 1);
    // A value the proxy wrote that is no address is refused, never charged to the proxy's own address.
    for bad in ["unknown", "1.1.1.1, garbage", "1.1.1.1:99999"] {
        let r = xff.get("/queue/204/status", &[("x-forwarded-for", bad)]).await;
        assert_eq!((r.status, r.code()), (400, "client_ip_unreadable"), "{bad}: {}", r.text);
    }
    drop(xff);
    let cf = GatewayProcess::start(
        strict.arg("--trusted-proxies", "127.0.0.0/8").arg("--client-ip-header", "CF-Connecting-IP"),
    )
    .await;
    // The deployment's header is the one believed; X-Forwarded-For from the same proxy is not.
    assert_eq!(limited_polls_by(&cf, 205, "cf-connecting-ip", ["1.1.1.1", "2.2.2.2", "3.3.3.3"]).await, 0);
    assert_eq!(limited_polls(&cf, 205, ["4.4.4.4", "5.5.5.5", "6.6.6.6"]).await, 1, "all charged to the proxy");
    upstream.stop().await;
}

/// A connection that sent part of a head and waits: the slow client the cap is for.
async fn slow_connection(base: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(base.trim_start_matches("http://")).await.expect("connect");
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.expect("write");
    stream
}

/// Whether the gateway closed `stream` without answering within 5 s.
async fn closed_unanswered(stream: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    match tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut buf)).await {
        Ok(Ok(_)) => buf.is_empty(),
        Ok(Err(_)) => true,
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_per_ip_cap_are_closed_at_once_and_trusted_proxies_are_not_capped() {
    let upstream = Upstream::start().await;
    let capped = Node::new(upstream.addr, &prefix()).arg("--max-connections-per-ip", 3);
    let gw = GatewayProcess::start(capped.clone()).await;
    // The start-up probe's connection (opened and dropped) is counted until the gateway reads its end.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut held = join_all((0..3).map(|_| slow_connection(&gw.base))).await;
    // Pingora reads the first bytes of each before the fourth arrives: the three are counted, and kept.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for stream in &mut held {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(100), tokio::io::AsyncReadExt::read(stream, &mut byte));
        assert!(read.await.is_err(), "one of the first three connections was not kept");
    }
    let mut fourth = slow_connection(&gw.base).await;
    assert!(closed_unanswered(&mut fourth).await, "a fourth connection from one IP was kept");
    drop(held.pop());
    // The gateway learns of the close when its read of that connection ends: until then, still refused.
    let healthy = testkit::eventually(Duration::from_secs(5), async || {
        let res = gw.client.get(format!("{}/healthz", gw.base)).send().await;
        res.is_ok_and(|r| r.status() == 200)
    })
    .await;
    assert!(healthy, "once one closed, another connection is served");
    drop(held);
    drop(gw);
    // Behind a trusted proxy every fan arrives from its few addresses: no cap.
    let trusting = GatewayProcess::start(capped.arg("--trusted-proxies", "127.0.0.0/8")).await;
    let held = join_all((0..5).map(|_| slow_connection(&trusting.base))).await;
    assert_eq!(trusting.get("/healthz", &[]).await.status, 200);
    drop(held);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_needs_its_token_and_refuses_bad_settings() {
    let upstream = Upstream::start().await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let event = 203;
    let url = format!("{}/admin/events/{event}", gw.admin);
    let no_token = gw.send(gw.client.put(&url).json(&json!({"state": "open"}))).await;
    assert_eq!((no_token.status, no_token.code()), (401, "admin_token_required"));
    let wrong = gw.send(gw.client.get(&url).bearer_auth("integration-admin-tokeX")).await;
    assert_eq!(wrong.status, 401);
    let cases = [
        (json!({}), 422, "empty_change"),
        (json!({"admit_per_minute": 0}), 422, "setting_out_of_range"),
        (json!({"session_seconds": 1}), 422, "setting_out_of_range"),
        (json!({"state": "sold_out"}), 422, "state_not_settable"),
        (json!({"state": "party"}), 422, "invalid_settings"),
        (json!({"rate": 5}), 422, "invalid_settings"),
        (json!({"admit_per_minute": -5}), 422, "invalid_settings"),
    ];
    for (body, status, code) in cases {
        let r = gw.send(gw.client.put(&url).bearer_auth(ADMIN_TOKEN).json(&body)).await;
        assert_eq!((r.status, r.code()), (status, code), "{body}: {}", r.text);
    }
    let not_json = gw.send(gw.client.put(&url).bearer_auth(ADMIN_TOKEN).body("{")).await;
    assert_eq!((not_json.status, not_json.code()), (422, "invalid_settings"));
    // A node answers 503 until its ticker has listed the rooms once (a busy box may take a while to start it).
    let listed =
        testkit::eventually(Duration::from_secs(10), async || gw.room(event).await.code() != "queue_unavailable");
    assert!(listed.await, "the node's view of the rooms was never fresh");
    assert_eq!(gw.room(event).await.code(), "queue_not_found", "nothing was created by refused changes");
    let bad_id = gw.send(gw.client.get(format!("{}/admin/events/abc", gw.admin)).bearer_auth(ADMIN_TOKEN)).await;
    assert_eq!((bad_id.status, bad_id.code()), (400, "invalid_path"));

    gw.configure(event, json!({"state": "open"})).await;
    gw.join(event, "fan-1").await;
    let back = gw.send(gw.client.put(&url).bearer_auth(ADMIN_TOKEN).json(&json!({"state": "prequeue"}))).await;
    assert_eq!((back.status, back.code()), (409, "state_change_refused"), "{}", back.text);
    gw.wait_for_room(event).await;
    let metrics = gw.send(gw.client.get(format!("{}/metrics", gw.admin))).await;
    assert!(metrics.text.contains(&format!("waiting_room_admitted_total{{event=\"{event}\"}}")), "{}", metrics.text);
    upstream.stop().await;
}

/// A kind of token the gateway checks, signed with the harness's keys.
fn kind(keys: &str, audience: &'static str, issuer: &str, event: Option<i64>) -> testkit::forgery::Kind {
    let (kid, secret) = keys.split_once(':').expect("kid:secret");
    testkit::forgery::Kind { kid: kid.into(), secret: secret.into(), audience, issuer: issuer.into(), event }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_forged_tampered_or_misused_credential_is_refused_with_its_code() {
    use testkit::forgery::{Forgery, Refused};
    let upstream = Upstream::start().await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let event = 206;
    let proof = kind(KEYS, tokens::ADMISSION_AUDIENCE, tokens::ADMISSION_ISSUER, Some(event));
    let ticket = kind(KEYS, tokens::TICKET_AUDIENCE, tokens::ADMISSION_ISSUER, Some(event));
    let account = kind(ACCOUNT_KEYS, tokens::ACCOUNT_AUDIENCE, "platform", None);
    // Each kind's table, plus the other kinds' valid tokens presented in its place, and where each is presented.
    let misused = |name: &'static str, token: String| Forgery { name, token, refused: Refused::Invalid };
    let mut proofs = proof.forgeries("fan-a");
    proofs.push(misused("a queue ticket as a proof", ticket.valid("fan-a")));
    proofs.push(misused("an account token as a proof", account.valid("fan-a")));
    let mut tickets = ticket.forgeries("fan-a");
    tickets.push(misused("a proof as a ticket", proof.valid("fan-a")));
    let mut accounts = account.forgeries("fan-a");
    accounts.push(misused("a proof as an account token", proof.valid("fan-a")));
    accounts.push(misused("a ticket as an account token", ticket.valid("fan-a")));
    let tables = [
        ("admission", reqwest::Method::GET, format!("/events/{event}"), proofs, proof.valid("fan-a")),
        ("ticket", reqwest::Method::GET, format!("/queue/{event}/status"), tickets, ticket.valid("fan-a")),
        ("account", reqwest::Method::POST, format!("/queue/{event}/join"), accounts, account.valid("fan-a")),
    ];
    for (prefix, method, path, cases, valid) in tables {
        for case in &cases {
            let (status, code) = match case.refused {
                Refused::Invalid => (401, format!("{prefix}_invalid")),
                Refused::Expired => (401, format!("{prefix}_expired")),
                Refused::WrongEvent => (403, format!("{prefix}_wrong_event")),
            };
            let req = gw.client.request(method.clone(), format!("{}{path}", gw.base)).bearer_auth(&case.token);
            let r = gw.send(req).await;
            assert_eq!((r.status, r.code()), (status, code.as_str()), "{prefix}: {}: {}", case.name, r.text);
        }
        // The table's own valid token gets past the credential check (the room does not exist: 404 after it).
        let r = gw.send(gw.client.request(method, format!("{}{path}", gw.base)).bearer_auth(&valid)).await;
        assert!(!r.code().starts_with(prefix) && r.status != 401, "{prefix}: the valid token: {}", r.text);
    }
    // An account token where a ticket is due is named as such.
    let r = gw
        .get(&format!("/queue/{event}/status"), &[("authorization", &format!("Bearer {}", account.valid("fan-a")))])
        .await;
    assert_eq!((r.status, r.code()), (401, "ticket_required"));
    assert_eq!(upstream.hits(), 1, "no forged proof reached booking; the valid one did");
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_settings_never_get_a_server_error_and_only_valid_ones_apply() {
    let upstream = Upstream::start().await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let event = 207;
    let url = format!("{}/admin/events/{event}", gw.admin);
    let made = gw.send(gw.client.put(&url).bearer_auth(ADMIN_TOKEN).json(&json!({"state": "paused"}))).await;
    assert!(made.status < 300, "{}", made.text);
    let mut statuses = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    for body in testkit::draw(testkit::settings_bodies(), 200) {
        let r = gw.send(gw.client.put(&url).bearer_auth(ADMIN_TOKEN).json(&body)).await;
        statuses.insert(r.status);
        if !matches!(r.status, 200 | 201 | 400 | 409 | 422) || (r.status >= 400 && r.code().is_empty()) {
            failures.push(format!("{body}: {} {}", r.status, r.text));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(statuses.iter().any(|s| *s < 300) && statuses.contains(&422), "{statuses:?}");
    // Whatever was accepted along the way, the room's settings are all within range now.
    gw.wait_for_room(event).await;
    let room = gw.room(event).await;
    let within = |field: &str, min: i64, max: i64| room.body[field].as_i64().is_some_and(|v| (min..=max).contains(&v));
    assert!(within("admit_per_minute", 1, 1_000_000) && within("max_active", 1, 10_000_000), "{}", room.text);
    assert!(within("session_seconds", 10, 86_400) && within("abandon_after_seconds", 5, 86_400), "{}", room.text);
    upstream.stop().await;
}
