//! Presale codes: a room whose `access` is `code_required` takes code holders only; one whose access is
//! `codes_first` admits them ahead of everyone who joined without one. A code binds to the first account that
//! redeems it (or to as many as a shared code allows), within its window; a refused code costs its sender.

use futures::future::join_all;
use serde_json::{Value, json};
use tokens::Keyring;

use crate::harness::*;

/// `POST /queue/{event}/join` as `account` with a presale code.
async fn join_with_code(node: &GatewayProcess, event: i64, account: &str, code: &str) -> Reply {
    let req = node.client.post(format!("{}/queue/{event}/join", node.base)).bearer_auth(account_token(account));
    node.send(req.header(gateway::codes::HEADER, code)).await
}

/// `POST /admin/events/{event}/codes`.
async fn make_codes(node: &GatewayProcess, event: i64, ask: Value) -> Reply {
    let req = node.client.post(format!("{}/admin/events/{event}/codes", node.admin)).bearer_auth(ADMIN_TOKEN);
    node.send(req.json(&ask)).await
}

async fn codes_of(node: &GatewayProcess, event: i64, ask: Value) -> Vec<String> {
    let made = make_codes(node, event, ask).await;
    assert_eq!(made.status, 201, "{}", made.text);
    serde_json::from_value(made.body["codes"].clone()).expect("codes")
}

/// The `later` number a ticket carries (0: none).
fn later(reply: &Reply) -> u64 {
    Keyring::parse(KEYS).expect("keys").verify_ticket(&reply.ticket()).expect("a valid ticket").later
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presale_takes_code_holders_only_and_each_code_binds_within_its_window_and_cap() {
    let upstream = Upstream::start().await;
    let node = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let (event, other) = (331, 332);
    node.configure(event, json!({"state": "paused", "access": "code_required"})).await;
    node.configure(other, json!({"state": "paused"})).await;
    node.wait_for_room(event).await;
    assert_eq!(node.room(event).await.body["access"], "code_required");

    let single = codes_of(&node, event, json!({"count": 3})).await;
    assert_eq!(single.len(), 3);
    let shared = codes_of(&node, event, json!({"code": "fan-club", "uses": 2})).await;
    assert_eq!(shared, vec!["FANCLUB".to_owned()]);
    let now = tokens::unix_now();
    let soon = codes_of(&node, event, json!({"starts_at": now + 3600})).await;
    let over = codes_of(&node, event, json!({"starts_at": now - 100, "ends_at": now - 50})).await;
    let elsewhere = codes_of(&node, other, json!({})).await;

    // Without a code: refused, and nothing given.
    let bare = node.join(event, "fan-a").await;
    assert_eq!((bare.status, bare.code()), (403, "code_required"), "{}", bare.text);
    // A single-use code, typed in lower case: the first account to send it gets a place, and keeps it.
    let first = join_with_code(&node, event, "fan-a", &single[0].to_lowercase()).await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.place(), 1);
    let again = node.join(event, "fan-a").await;
    assert_eq!((again.status, again.place()), (200, 1), "a holder joins again without the code: {}", again.text);
    let taken = join_with_code(&node, event, "fan-b", &single[0]).await;
    assert_eq!((taken.status, taken.code()), (409, "code_spent"), "{}", taken.text);

    // Every other way a code is wrong has its own code, and gives nothing.
    let cases = [
        ("NOPE-NOPE-NOPE", 403, "code_unknown"),
        (elsewhere[0].as_str(), 403, "code_other_event"),
        (soon[0].as_str(), 403, "code_not_yet"),
        (over[0].as_str(), 403, "code_ended"),
        ("x!", 400, "code_malformed"),
    ];
    for (code, status, expected) in cases {
        let refused = join_with_code(&node, event, "fan-b", code).await;
        assert_eq!((refused.status, refused.code()), (status, expected), "{code}: {}", refused.text);
    }
    let not_yet = join_with_code(&node, event, "fan-b", &soon[0]).await;
    assert!(not_yet.body["starts_at"].as_str().is_some_and(|at| at.ends_with('Z')), "{}", not_yet.text);

    // A shared code admits as many accounts as it allows.
    for fan in ["fan-c", "fan-d"] {
        let joined = join_with_code(&node, event, fan, "FanClub").await;
        assert_eq!(joined.status, 200, "{fan}: {}", joined.text);
    }
    let third = join_with_code(&node, event, "fan-e", "FANCLUB").await;
    assert_eq!((third.status, third.code()), (409, "code_spent"), "{}", third.text);

    // The report counts and lists the redemptions.
    let report =
        node.send(node.client.get(format!("{}/admin/events/{event}/codes", node.admin)).bearer_auth(ADMIN_TOKEN)).await;
    assert_eq!(report.status, 200, "{}", report.text);
    assert_eq!(report.body["redeemed_total"], 3);
    let batches = report.body["batches"].as_array().expect("batches");
    assert_eq!(batches.len(), 4);
    let redeemed: Vec<(u64, u64)> =
        batches.iter().map(|b| (b["count"].as_u64().unwrap_or(0), b["redeemed"].as_u64().unwrap_or(0))).collect();
    assert!(redeemed.contains(&(3, 1)) && redeemed.contains(&(1, 2)), "{redeemed:?}");
    let mut who: Vec<(String, String)> = report.body["redemptions"]
        .as_array()
        .expect("redemptions")
        .iter()
        .map(|r| (r["account"].as_str().unwrap_or("").to_owned(), r["code"].as_str().unwrap_or("").to_owned()))
        .collect();
    who.sort();
    let single_0 = single[0].replace('-', "");
    assert_eq!(
        who,
        vec![("fan-a".into(), single_0), ("fan-c".into(), "FANCLUB".into()), ("fan-d".into(), "FANCLUB".into())]
    );

    // Asks the admin API refuses.
    let clash = make_codes(&node, event, json!({"code": "FANCLUB"})).await;
    assert_eq!((clash.status, clash.code()), (409, "code_exists"), "{}", clash.text);
    for (ask, code) in [
        (json!({"count": 0}), "setting_out_of_range"),
        (json!({"count": 2, "code": "ABCDE"}), "invalid_request"),
        (json!({"code": "no"}), "invalid_request"),
        (json!({"starts_at": 20, "ends_at": 10}), "setting_out_of_range"),
        (json!({"colour": "red"}), "invalid_request"),
    ] {
        let refused = make_codes(&node, event, ask.clone()).await;
        assert_eq!((refused.status, refused.code()), (422, code), "{ask}: {}", refused.text);
    }
    assert_eq!(make_codes(&node, 339, json!({})).await.status, 404);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_single_use_code_sent_by_twenty_accounts_at_once_through_two_nodes_binds_to_one() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let b = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let event = 333;
    a.configure(event, json!({"state": "paused", "access": "code_required"})).await;
    let code = codes_of(&a, event, json!({})).await.remove(0);
    let nodes = [&a, &b];
    let racers: Vec<String> = (0..20).map(|i| format!("racer-{i}")).collect();
    let answers =
        join_all(racers.iter().enumerate().map(|(i, fan)| join_with_code(nodes[i % 2], event, fan, &code))).await;
    let placed: Vec<&Reply> = answers.iter().filter(|r| r.status == 200).collect();
    let spent = answers.iter().filter(|r| (r.status, r.code()) == (409, "code_spent")).count();
    assert_eq!((placed.len(), spent), (1, 19), "{:?}", answers.iter().map(|r| &r.text).collect::<Vec<_>>());
    assert_eq!(placed[0].place(), 1);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_codes_first_code_holders_are_admitted_ahead_of_everyone_who_joined_without_one() {
    let upstream = Upstream::start().await;
    let node = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let event = 334;
    node.configure(
        event,
        json!({"state": "paused", "access": "codes_first", "admit_per_minute": 60000, "max_active": 2, "abandon_after_seconds": 600}),
    )
    .await;
    node.wait_for_room(event).await;
    let codes = codes_of(&node, event, json!({"count": 3})).await;

    // Three fans without a code join first: they wait behind the code holders, first come first served.
    let mut public = Vec::new();
    for (i, fan) in ["pub-1", "pub-2", "pub-3"].into_iter().enumerate() {
        let joined = node.join(event, fan).await;
        assert_eq!(joined.status, 200, "{}", joined.text);
        assert_eq!((joined.place(), later(&joined)), (0, i as u64 + 1));
        assert_eq!(joined.body["position"], i + 1);
        public.push(joined.ticket());
    }
    // Two code holders join after them and go ahead.
    let mut holders = Vec::new();
    for (i, fan) in ["code-1", "code-2"].into_iter().enumerate() {
        let joined = join_with_code(&node, event, fan, &codes[i]).await;
        assert_eq!((joined.status, joined.place()), (200, i as u64 + 1), "{}", joined.text);
        holders.push(joined.ticket());
    }
    node.poll_until(event, &public[0], "the first fan without a code is behind both holders", |r| {
        r.body["position"] == 3
    })
    .await;
    assert_eq!(node.room(event).await.body["live"]["waiting_without_code"], 3);

    // Open, with room for two: both holders are admitted; the fans without a code wait.
    node.configure(event, json!({"state": "open"})).await;
    for ticket in &holders {
        node.poll_until(event, ticket, "a code holder admitted", |r| r.body["state"] == "admitted").await;
    }
    node.poll_until(event, &public[0], "next after the holders", |r| r.body["position"] == 1).await;
    // A holder who comes now still goes first; so does switching access to public change nothing for those
    // already in line: a fan without a code who joins then waits behind them.
    let late = join_with_code(&node, event, "code-3", &codes[2]).await;
    assert_eq!((late.status, late.place(), late.body["position"].as_u64()), (200, 3, Some(1)), "{}", late.text);
    node.configure(event, json!({"access": "public"})).await;
    let fourth = node.join(event, "pub-4").await;
    assert_eq!((fourth.status, later(&fourth)), (200, 4), "{}", fourth.text);
    node.poll_until(event, &public[0], "behind the late holder", |r| r.body["position"] == 2).await;

    // Room for one more: the late holder, not the first fan without a code.
    node.configure(event, json!({"max_active": 3})).await;
    node.poll_until(event, &late.ticket(), "the late holder admitted", |r| r.body["state"] == "admitted").await;
    let still =
        node.poll_until(event, &public[0], "the first fan without a code is next", |r| r.body["position"] == 1).await;
    assert_eq!(still.body["state"], "waiting");

    // Room for everyone: the fans without a code go in, in the order they came, and get tickets with places.
    node.configure(event, json!({"max_active": 100})).await;
    let mut places = Vec::new();
    for ticket in &public {
        let admitted = node.poll_until(event, ticket, "admitted", |r| r.body["state"] == "admitted").await;
        places.push(admitted.place());
    }
    assert_eq!(places, vec![4, 5, 6], "the line keeps its order behind the holders' places 1 to 3");
    node.poll_until(event, &fourth.ticket(), "the fourth fan admitted", |r| r.body["state"] == "admitted").await;
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guessing_codes_spends_the_guessers_rate_limit() {
    let upstream = Upstream::start().await;
    let node =
        GatewayProcess::start(Node::new(upstream.addr, &prefix()).arg("--account-rps", 1).arg("--account-burst", 6))
            .await;
    let event = 335;
    node.configure(event, json!({"state": "paused", "access": "code_required"})).await;
    let code = codes_of(&node, event, json!({})).await.remove(0);
    // Each guess costs two of the account's six: the check before it and the penalty after a refusal.
    let mut answers = Vec::new();
    for i in 0..8 {
        answers.push(join_with_code(&node, event, "guesser", &format!("GUESS{i:04}")).await);
    }
    let refused = answers.iter().filter(|r| r.code() == "code_unknown").count();
    let limited = answers.iter().filter(|r| (r.status, r.code()) == (429, "rate_limited")).count();
    assert!((3..=4).contains(&refused) && refused + limited == 8, "{refused} refused, {limited} limited");
    assert!(answers.last().is_some_and(|r| r.header("retry-after").is_some()));
    // Another account still redeems a real code.
    let honest = join_with_code(&node, event, "honest", &code).await;
    assert_eq!(honest.status, 200, "{}", honest.text);
    upstream.stop().await;
}
