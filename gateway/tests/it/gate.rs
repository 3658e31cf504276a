//! The gate: with a room's challenge on, a new place costs a solved proof of work, single use and bound to the
//! room and the account; forged and spent solutions are refused, or held in an endless queue.

use std::time::{Duration, Instant};

use altcha::{Challenge, SolveChallengeOptions};
use futures::future::join_all;
use gateway::gate::{CHALLENGE_LIFETIME, Gate, payload_field};
use serde_json::json;
use tokens::{Keyring, unix_now};

use crate::harness::*;

/// Solves a challenge as a client would, from the JSON the gateway sent.
fn solve(challenge: &serde_json::Value) -> String {
    let challenge: Challenge = serde_json::from_value(challenge.clone()).expect("an ALTCHA challenge");
    let solution = altcha::solve_challenge(SolveChallengeOptions::new(&challenge)).expect("solvable").expect("in time");
    payload_field(&challenge, &solution)
}

/// Asks for a challenge (a join without one) and solves it.
async fn solved(node: &GatewayProcess, event: i64, account: &str) -> String {
    let asked = node.join(event, account).await;
    assert_eq!((asked.status, asked.code()), (428, "challenge_required"), "{}", asked.text);
    solve(&asked.body["challenge"])
}

async fn gated_room(node: &GatewayProcess, event: i64, settings: serde_json::Value) {
    let mut all = json!({"challenge": "on", "challenge_difficulty": 2000, "admit_per_minute": 600});
    all.as_object_mut().expect("object").extend(settings.as_object().expect("object").clone());
    node.configure(event, all).await;
    node.wait_for_room(event).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_room_asks_for_work_and_each_solution_pays_for_one_place_once() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let b = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let event = 301;
    gated_room(&a, event, json!({"state": "paused"})).await;
    let room = a.room(event).await;
    assert_eq!((room.body["challenge"].as_str(), room.body["challenge_difficulty"].as_u64()), (Some("on"), Some(2000)));

    // No solution: 428 with the challenge, its difficulty and where the solution goes.
    let asked = a.join(event, "fan-1").await;
    assert_eq!((asked.status, asked.code()), (428, "challenge_required"), "{}", asked.text);
    assert_eq!((asked.body["difficulty"].as_u64(), asked.body["field"].as_str()), (Some(2000), Some("altcha")));
    assert_eq!(asked.body["challenge"]["parameters"]["algorithm"], "SHA-256");
    let paid = solve(&asked.body["challenge"]);

    // Solved: a place, on the other node too (every node shares the gate's secrets).
    let joined = b.join_paying(event, "fan-1", &paid).await;
    assert_eq!(joined.status, 200, "{}", joined.text);
    assert_eq!(joined.place(), 1);
    // The same solution again, on either node: spent.
    for node in [&a, &b] {
        let again = node.join_paying(event, "fan-1", &paid).await;
        assert_eq!((again.status, again.code()), (409, "challenge_spent"), "{}", again.text);
    }
    // Joining again without one returns the place the account holds: a reload costs no new work.
    let reload = a.join(event, "fan-1").await;
    assert_eq!((reload.status, reload.place()), (200, 1), "{}", reload.text);

    // Another account's solution, or one for another room, pays for nothing.
    let theirs = solved(&a, event, "fan-2").await;
    let stolen = a.join_paying(event, "fan-3", &theirs).await;
    assert_eq!((stolen.status, stolen.code()), (403, "challenge_not_yours"), "{}", stolen.text);
    gated_room(&a, event + 1, json!({"state": "paused"})).await;
    let elsewhere = a.join_paying(event + 1, "fan-2", &theirs).await;
    assert_eq!((elsewhere.status, elsewhere.code()), (403, "challenge_not_yours"), "{}", elsewhere.text);
    // ... and was not spent by those refusals: fan-2 still joins with it.
    assert_eq!(a.join_paying(event, "fan-2", &theirs).await.place(), 2);

    // A forged key, a challenge from another deployment, garbage.
    let asked = a.join(event, "fan-4").await;
    let mut forged: serde_json::Value = asked.body["challenge"].clone();
    let solution = json!({"counter": 7, "derivedKey": "00".repeat(32)});
    let field = base64_json(&json!({"challenge": forged.take(), "solution": solution}));
    let refused = a.join_paying(event, "fan-4", &field).await;
    assert_eq!((refused.status, refused.code()), (403, "challenge_failed"), "{}", refused.text);
    let foreign =
        Gate::new(b"another deployment's admission secret, 32+ bytes").issue(event, "fan-4", 1000, unix_now());
    let foreign = payload_field(&foreign, &solve_local(&foreign));
    assert_eq!(a.join_paying(event, "fan-4", &foreign).await.code(), "challenge_failed");
    let garbage = a.join_paying(event, "fan-4", "bm90IGpzb24=").await;
    assert_eq!((garbage.status, garbage.code()), (400, "challenge_malformed"), "{}", garbage.text);

    // An expired challenge is no forgery: the answer is a new one.
    let gate = Gate::from_keyring_spec(KEYS);
    let old = gate.issue(event, "fan-4", 1000, unix_now() - CHALLENGE_LIFETIME.as_secs() - 5);
    let late = a.join_paying(event, "fan-4", &payload_field(&old, &solve_local(&old))).await;
    assert_eq!((late.status, late.code()), (428, "challenge_expired"), "{}", late.text);
    assert!(late.body["challenge"]["signature"].is_string(), "{}", late.text);

    // Turned off, live: an account token is enough again.
    b.configure(event, json!({"challenge": "off"})).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let open = a.join(event, "fan-5").await;
        if open.status == 200 {
            assert_eq!(open.place(), 3);
            break;
        }
        assert_eq!(open.status, 428, "{}", open.text);
        assert!(Instant::now() < deadline, "the challenge stayed on");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each node counts what its gate did: four challenges issued (fan-1, fan-2, fan-4, and the expired one's
    // replacement), and every refusal by its kind.
    let counts =
        [("issued", 4), ("solved", 2), ("spent", 2), ("not_yours", 2), ("failed", 2), ("malformed", 1), ("expired", 1)];
    for (outcome, expected) in counts {
        let series = format!("gateway_gate_total{{outcome=\"{outcome}\"}}");
        let counted = a.metric(&series).await.unwrap_or(0) + b.metric(&series).await.unwrap_or(0);
        assert_eq!(counted, expected, "{outcome}");
    }
}

fn base64_json(value: &serde_json::Value) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(value.to_string())
}

fn solve_local(challenge: &Challenge) -> altcha::Solution {
    altcha::solve_challenge(SolveChallengeOptions::new(challenge)).expect("solvable").expect("in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_solution_sent_twenty_times_at_once_through_two_nodes_buys_one_place() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let b = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let event = 311;
    gated_room(&a, event, json!({"state": "paused"})).await;
    b.wait_for_room(event).await;
    let paid = solved(&a, event, "fan-1").await;
    // The same account, so that a spent solution and a place already held cannot be told apart by the place:
    // only the script's spent set refuses the copies.
    let replies =
        join_all((0..20).map(|i| if i % 2 == 0 { &a } else { &b }).map(|n| n.join_paying(event, "fan-1", &paid))).await;
    let placed = replies.iter().filter(|r| r.status == 200).count();
    let spent = replies.iter().filter(|r| r.status == 409 && r.code() == "challenge_spent").count();
    assert_eq!((placed, spent), (1, 19), "{:?}", replies.iter().map(|r| &r.text).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_infinite_queue_on_a_forger_waits_for_a_turn_that_never_comes() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let gw = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let event = 321;
    gated_room(&gw, event, json!({"state": "paused", "infinite_queue_for_failed": true, "admit_per_minute": 60000}))
        .await;
    // Two honest fans ahead, then a forger.
    for fan in ["fan-1", "fan-2"] {
        let paid = solved(&gw, event, fan).await;
        assert_eq!(gw.join_paying(event, fan, &paid).await.status, 200);
    }
    let asked = gw.join(event, "bot-1").await;
    let forged = base64_json(
        &json!({"challenge": asked.body["challenge"], "solution": {"counter": 1, "derivedKey": "ab".repeat(32)}}),
    );
    let held = gw.join_paying(event, "bot-1", &forged).await;
    assert_eq!((held.status, held.body["state"].as_str()), (200, Some("paused")), "{}", held.text);
    let ticket = held.ticket();
    let claims = Keyring::parse(KEYS).expect("keys").verify_ticket(&ticket).expect("a ticket");
    assert!(claims.held, "{claims:?}");
    // At the back of the line, behind the two honest fans.
    let position = held.body["position"].as_u64().expect("a position");
    assert_eq!(position, 3, "{}", held.text);
    // The honest fans are admitted; the forger keeps its position, polled like any fan, and is never admitted.
    gw.configure(event, json!({"state": "open"})).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let fans = ["fan-1", "fan-2"];
    loop {
        let admitted = join_all(fans.iter().map(|f| gw.join(event, f))).await;
        if admitted.iter().all(|r| r.body["state"] == "admitted") {
            break;
        }
        assert!(Instant::now() < deadline, "the honest fans were not admitted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..3 {
        let poll = gw.status(event, &ticket).await;
        assert_eq!((poll.status, poll.body["state"].as_str()), (200, Some("waiting")), "{}", poll.text);
        assert_eq!(poll.body["position"].as_u64(), Some(position), "{}", poll.text);
        assert!(poll.body["admission_token"].is_null());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(gw.metric("gateway_gate_total{outcome=\"held\"}").await.unwrap_or(0) >= 1);
    // A held ticket took no place: the next honest fan is third, not fourth.
    let paid = solved(&gw, event, "fan-3").await;
    assert_eq!(gw.join_paying(event, "fan-3", &paid).await.place(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_room_raises_its_difficulty_while_joins_outrun_admission_and_lowers_it_after() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let b = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let event = 331;
    let settings = json!({"state": "paused", "challenge": "auto", "challenge_difficulty": 1000,
        "challenge_min_difficulty": 1000, "challenge_max_difficulty": 8000, "challenge_window_seconds": 1,
        "admit_per_minute": 60});
    gated_room(&a, event, settings).await;
    b.wait_for_room(event).await;
    // The room admits one fan a second; four waves of six joins, each solved by its fan, come faster.
    let surge = async {
        for wave in 0..4 {
            let fans: Vec<String> = (0..6).map(|i| format!("fan-{wave}-{i}")).collect();
            let asked = join_all(fans.iter().map(|f| a.join(event, f))).await;
            let fields: Vec<String> = asked.iter().map(|r| solve(&r.body["challenge"])).collect();
            let joined = join_all(fans.iter().zip(&fields).map(|(f, x)| b.join_paying(event, f, x))).await;
            assert!(joined.iter().all(|r| r.status == 200), "{:?}", joined.iter().map(|r| &r.text).collect::<Vec<_>>());
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
    };
    // The other node's view, watched meanwhile: the difficulty doubles at least twice.
    let watch = async {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut highest = 0;
        while highest < 4000 && Instant::now() < deadline {
            highest = highest.max(b.room(event).await.body["challenge_difficulty"].as_u64().unwrap_or(0));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        highest
    };
    let ((), highest) = tokio::join!(surge, watch);
    assert!(highest >= 4000, "the difficulty rose only to {highest}");
    // Quiet again: halved each window down to the floor, on both nodes, and in Prometheus.
    let deadline = Instant::now() + Duration::from_secs(15);
    for node in [&a, &b] {
        loop {
            let room = node.room(event).await;
            if room.body["challenge_difficulty"] == 1000 {
                break;
            }
            assert!(Instant::now() < deadline, "the difficulty did not come down: {}", room.text);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(a.metric(&format!("waiting_room_challenge_difficulty{{event=\"{event}\"}}")).await, Some(1000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_network_gets_its_rooms_share_of_places_and_a_refused_solution_stays_unspent() {
    let upstream = Upstream::start().await;
    let p = prefix();
    // Behind a trusted CDN the client's own address counts: a /24 for IPv4, a /48 for IPv6.
    let node = |p: &str| Node::new(upstream.addr, p).arg("--trusted-proxies", "127.0.0.1/32");
    let a = GatewayProcess::start(node(&p)).await;
    let b = GatewayProcess::start(node(&p)).await;
    let event = 341;
    gated_room(&a, event, json!({"state": "paused", "places_per_network": 3})).await;
    b.wait_for_room(event).await;
    let from = |node, account, ip, altcha| join_from(node, event, account, ip, altcha);
    // Three fans of one campus network, through both nodes, at once; a fourth from it is refused.
    let fans = ["fan-1", "fan-2", "fan-3", "fan-4"];
    let mut fields = Vec::new();
    for fan in fans {
        fields.push(solved(&a, event, fan).await);
    }
    let ips = ["192.0.2.10", "192.0.2.11", "192.0.2.12"];
    let joined = join_all((0..3).map(|i| from(if i % 2 == 0 { &a } else { &b }, fans[i], ips[i], &fields[i]))).await;
    assert!(joined.iter().all(|r| r.status == 200), "{:?}", joined.iter().map(|r| &r.text).collect::<Vec<_>>());
    let refused = from(&b, "fan-4", "192.0.2.200", &fields[3]).await;
    assert_eq!((refused.status, refused.code()), (429, "too_many_places"), "{}", refused.text);
    assert_eq!(refused.body["places_per_network"], 3);
    assert!(refused.header("retry-after").is_some());
    // Another network is not held back; IPv6 networks are /48s.
    let other = solved(&a, event, "fan-5").await;
    assert_eq!(from(&a, "fan-5", "198.51.100.7", &other).await.status, 200);
    let v6: Vec<String> = vec![solved(&a, event, "fan-6").await, solved(&a, event, "fan-7").await];
    assert_eq!(from(&a, "fan-6", "2001:db8:1:1::1", &v6[0]).await.status, 200);
    assert_eq!(from(&a, "fan-7", "2001:db8:1:ffff::1", &v6[1]).await.status, 200);
    // Raised live: fan-4 joins with the solution the refusal left unspent.
    a.configure(event, json!({"places_per_network": 4})).await;
    let joined = from(&b, "fan-4", "192.0.2.200", &fields[3]).await;
    assert_eq!(joined.status, 200, "{}", joined.text);
}

/// A join paid with `altcha`, sent through a trusted proxy on behalf of the client at `ip`.
async fn join_from(node: &GatewayProcess, event: i64, account: &str, ip: &str, altcha: &str) -> Reply {
    let req = node.client.post(format!("{}/queue/{event}/join", node.base)).bearer_auth(account_token(account));
    node.send(req.header(gateway::gate::HEADER, altcha).header("x-forwarded-for", ip)).await
}

/// `gateway admin pass`: the operators' CLI mints a pass through a node's admin listener.
fn mint_pass(node: &GatewayProcess, event: i64, account: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["admin", "--url", &node.admin, "--token", ADMIN_TOKEN, "pass", &event.to_string(), "--account", account])
        .output()
        .expect("run gateway admin pass");
    assert!(out.status.success(), "gateway admin pass: {}", String::from_utf8_lossy(&out.stderr));
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the pass as JSON");
    view["pass"].as_str().expect("a pass").to_owned()
}

async fn join_on_pass(node: &GatewayProcess, event: i64, account: &str, pass: &str) -> Reply {
    let req = node.client.post(format!("{}/queue/{event}/join", node.base)).bearer_auth(account_token(account));
    node.send(req.header("sponsor-pass", pass)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sponsor_pass_admits_its_account_at_once_within_max_active_and_only_once() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let b = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let event = 351;
    // A gated room that admits one fan a minute and at most two at once: the line would take a while.
    gated_room(&a, event, json!({"state": "open", "admit_per_minute": 1, "max_active": 2})).await;
    b.wait_for_room(event).await;
    let vip = mint_pass(&a, event, "vip-1");

    // On the other node, with no challenge solved: in at once, with a proof booking takes.
    let joined = join_on_pass(&b, event, "vip-1", &vip).await;
    assert_eq!((joined.status, joined.body["state"].as_str()), (200, Some("admitted")), "{}", joined.text);
    let proof = joined.body["admission_token"].as_str().expect("a proof");
    let reached = b.get(&format!("/events/{event}/seats"), &[("authorization", &format!("Bearer {proof}"))]).await;
    assert_eq!(reached.status, 200, "{}", reached.text);
    // Single use, on any node.
    for node in [&a, &b] {
        let again = join_on_pass(node, event, "vip-1", &vip).await;
        assert_eq!((again.status, again.code()), (409, "pass_spent"), "{}", again.text);
    }
    // Bound to its account and event; signed here or worthless.
    let theirs = mint_pass(&a, event, "vip-2");
    assert_eq!(join_on_pass(&a, event, "vip-3", &theirs).await.code(), "pass_not_yours");
    gated_room(&a, event + 1, json!({"state": "open"})).await;
    assert_eq!(join_on_pass(&a, event + 1, "vip-2", &theirs).await.code(), "pass_not_yours");
    let forged = tokens::Keyring::parse(OTHER_SECRET_SAME_KID).expect("keys").sign(&tokens::PassClaims::new(
        tokens::AccountId::parse("vip-2").expect("id"),
        event,
        unix_now(),
        600,
        "made-up".into(),
    ));
    let refused = join_on_pass(&a, event, "vip-2", &forged).await;
    assert_eq!((refused.status, refused.code()), (403, "pass_invalid"), "{}", refused.text);

    // Within max_active: the second pass fills the room; the third waits, kept, until there is room.
    assert_eq!(join_on_pass(&a, event, "vip-2", &theirs).await.body["state"], "admitted");
    let third = mint_pass(&b, event, "vip-4");
    let full = join_on_pass(&a, event, "vip-4", &third).await;
    assert_eq!((full.status, full.code()), (409, "room_full"), "{}", full.text);
    assert!(full.header("retry-after").is_some());
    a.configure(event, json!({"max_active": 3})).await;
    let admitted = join_on_pass(&b, event, "vip-4", &third).await;
    assert_eq!(admitted.body["state"], "admitted", "{}", admitted.text);
    let passes = a.metric("gateway_passes_total{outcome=\"admitted\"}").await.unwrap_or(0)
        + b.metric("gateway_passes_total{outcome=\"admitted\"}").await.unwrap_or(0);
    assert_eq!(passes, 3);
}
