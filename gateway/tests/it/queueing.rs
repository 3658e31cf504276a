//! Queueing methods and the queue-all switch, through two gateway nodes: `passthrough` lets fans in as fast as
//! slots allow, whatever the rate; `reject` turns new fans away while the room is full; `queue_all` stops
//! admission while the room stays open.

use std::time::Duration;

use futures::future::join_all;
use serde_json::json;

use crate::harness::*;

/// Everyone joins at once, alternating between the two nodes.
async fn all_join(nodes: [&GatewayProcess; 2], event: i64, fans: &[&str]) -> Vec<Reply> {
    join_all(fans.iter().enumerate().map(|(i, fan)| nodes[i % 2].join(event, fan))).await
}

async fn admitted_total(node: &GatewayProcess, event: i64) -> u64 {
    node.room(event).await.body["live"]["admitted_total"].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passthrough_fills_every_slot_at_once_whatever_the_rate_and_fifo_keeps_the_rate() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let b = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    // One fan a minute, three slots: FIFO lets one in (its burst) and the others wait for the rate.
    let (fifo, pass) = (501, 502);
    let mut settings = json!({"state": "open", "admit_per_minute": 1, "max_active": 3, "abandon_after_seconds": 600});
    a.configure(fifo, settings.clone()).await;
    settings["queueing"] = json!("passthrough");
    a.configure(pass, settings).await;
    for event in [fifo, pass] {
        b.wait_for_room(event).await;
    }
    let fans = ["pt-1", "pt-2", "pt-3", "pt-4", "pt-5"];
    let (in_fifo, in_pass) = tokio::join!(all_join([&a, &b], fifo, &fans), all_join([&a, &b], pass, &fans));
    assert!(
        in_fifo.iter().chain(&in_pass).all(|r| r.status == 200),
        "{:?}",
        in_pass.iter().map(|r| &r.text).collect::<Vec<_>>()
    );

    // Passthrough: the three slots fill at once (within a tick or two), and the other two wait for a slot.
    for node in [&a, &b] {
        // Each node's view, which answers the polls below, has read the step.
        let full = testkit::eventually(Duration::from_secs(5), async || admitted_total(node, pass).await == 3).await;
        assert!(full, "{}", node.room(pass).await.text);
    }
    let mut states = Vec::new();
    for (i, r) in in_pass.iter().enumerate() {
        states.push(if i % 2 == 0 { &a } else { &b }.status(pass, &r.ticket()).await.body["state"].clone());
    }
    assert_eq!(states.iter().filter(|s| *s == "admitted").count(), 3, "{states:?}");
    assert_eq!(states.iter().filter(|s| *s == "waiting").count(), 2, "{states:?}");

    // A slot frees: the next fan in line goes in at once, not a minute later.
    let inside = in_pass.iter().position(|r| r.body["state"] == "admitted").expect("one admitted at its join");
    let left = a.leave(pass, Some(&in_pass[inside].ticket())).await;
    assert_eq!(left.status, 200, "{}", left.text);
    let next = testkit::eventually(Duration::from_secs(5), async || admitted_total(&a, pass).await == 4).await;
    assert!(next, "{}", a.room(pass).await.text);

    // FIFO at one a minute, meanwhile: still the one fan its burst let in.
    assert_eq!(admitted_total(&a, fifo).await, 1, "{}", a.room(fifo).await.text);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_turns_new_fans_away_while_full_and_takes_them_again_when_a_slot_frees() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let b = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let event = 503;
    a.configure(event, json!({"state": "open", "queueing": "reject", "admit_per_minute": 1, "max_active": 2})).await;
    b.wait_for_room(event).await;

    // Six at once for two slots: nobody waits. The fans let in are admitted; the others are turned away with a
    // stable code and a Retry-After, and get no place.
    let fans = ["rj-1", "rj-2", "rj-3", "rj-4", "rj-5", "rj-6"];
    let replies = all_join([&a, &b], event, &fans).await;
    let placed: Vec<&Reply> = replies.iter().filter(|r| r.status == 200).collect();
    let refused: Vec<&Reply> = replies.iter().filter(|r| r.status == 409).collect();
    assert_eq!(placed.len() + refused.len(), fans.len(), "{:?}", replies.iter().map(|r| &r.text).collect::<Vec<_>>());
    assert!(
        (1..=2).contains(&placed.len()),
        "at most the two slots: {:?}",
        placed.iter().map(|r| &r.text).collect::<Vec<_>>()
    );
    for r in &refused {
        assert_eq!(r.code(), "no_places", "{}", r.text);
        assert_eq!(r.header("retry-after"), Some("60"), "{}", r.text);
        assert!(r.body.get("ticket").is_none(), "{}", r.text);
    }
    let settled =
        testkit::eventually(Duration::from_secs(5), async || admitted_total(&a, event).await == placed.len() as u64)
            .await;
    assert!(settled, "every fan given a place goes in: {}", a.room(event).await.text);
    let room = a.room(event).await;
    assert_eq!(
        (room.body["live"]["waiting"].as_u64(), room.body["queueing"].as_str()),
        (Some(0), Some("reject")),
        "{}",
        room.text
    );

    // Full now (the two slots taken, or one taken and the room filled by a latecomer): a new fan is turned away.
    if placed.len() == 1 {
        let late = a.join(event, "rj-late").await;
        assert_eq!(late.status, 200, "a free slot takes a fan at once: {}", late.text);
    }
    let turned = b.join(event, "rj-turned").await;
    assert_eq!((turned.status, turned.code()), (409, "no_places"), "{}", turned.text);

    // One leaves: the next fan who tries is let in at once.
    let left = a.leave(event, Some(&placed[0].ticket())).await;
    assert_eq!(left.status, 200, "{}", left.text);
    let again =
        testkit::eventually(Duration::from_secs(5), async || b.join(event, "rj-turned").await.status == 200).await;
    assert!(again, "{}", b.room(event).await.text);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_all_stops_admission_without_closing_the_room() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let b = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let event = 504;
    a.configure(event, json!({"state": "open", "admit_per_minute": 60000, "queue_all": true})).await;
    b.wait_for_room(event).await;

    // The room is open: fans join and are told the room lets nobody in for now, with no ETA.
    let replies = all_join([&a, &b], event, &["qa-1", "qa-2", "qa-3"]).await;
    for r in &replies {
        assert_eq!(
            (r.status, r.body["state"].as_str(), r.body["queue_all"].as_bool()),
            (200, Some("waiting"), Some(true)),
            "{}",
            r.text
        );
        assert!(r.body["eta_seconds"].is_null(), "{}", r.text);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(admitted_total(&a, event).await, 0, "nobody let in");
    let room = b.room(event).await;
    assert_eq!(
        (room.body["state"].as_str(), room.body["queue_all"].as_bool()),
        (Some("open"), Some(true)),
        "{}",
        room.text
    );

    // Switched off: everyone goes in, in queue order, and is told so.
    a.configure(event, json!({"queue_all": false})).await;
    let all_in = testkit::eventually(Duration::from_secs(5), async || admitted_total(&b, event).await == 3).await;
    assert!(all_in, "{}", b.room(event).await.text);
    let first = b.poll_until(event, &replies[0].ticket(), "admitted", |r| r.body["state"] == "admitted").await;
    assert!(first.body.get("queue_all").is_none(), "{}", first.text);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lottery_places_each_pool_at_random_by_a_recorded_draw() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let b = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let event = 505;
    let settings = json!({"state": "open", "queueing": "lottery", "draw_every_seconds": 5, "admit_per_minute": 60000,
                          "max_active": 1, "abandon_after_seconds": 600});
    a.configure(event, settings).await;
    b.wait_for_room(event).await;

    // Twelve fans join at once: each is in the pool, told when the draw is, with no place yet.
    let fans: Vec<String> = (0..12).map(|i| format!("lot-{i}")).collect();
    let names: Vec<&str> = fans.iter().map(String::as_str).collect();
    let joined = all_join([&a, &b], event, &names).await;
    for r in &joined {
        assert_eq!(
            (r.status, r.body["state"].as_str(), r.body["in_draw"].as_bool()),
            (200, Some("waiting"), Some(true)),
            "{}",
            r.text
        );
        assert!(r.body["position"].is_null(), "{}", r.text);
    }
    // A poll is answered from the node's view of the room, which has the pool and the draw's time once read.
    let told = testkit::eventually(Duration::from_secs(3), async || {
        let polled = b.status(event, &joined[0].ticket()).await;
        polled.body["in_draw"] == true && polled.body["draw_at"].is_string() && polled.body["draw_pool"] == 12
    })
    .await;
    assert!(told, "{}", b.status(event, &joined[0].ticket()).await.text);
    assert_eq!(admitted_total(&a, event).await, 0, "nobody goes in before the draw");

    // The draw: every fan gets a place, one goes in (one slot), and every node's view has it.
    for node in [&a, &b] {
        let drawn = testkit::eventually(Duration::from_secs(12), async || {
            node.room(event).await.body["live"]["places_given"].as_u64() == Some(12)
        })
        .await;
        assert!(drawn, "{}", node.room(event).await.text);
    }
    let mut positions = Vec::new();
    for (i, r) in joined.iter().enumerate() {
        let s = if i % 2 == 0 { &a } else { &b }.status(event, &r.ticket()).await;
        assert!(s.body["ticket"].is_string(), "a new ticket with the place drawn: {}", s.text);
        match s.body["state"].as_str() {
            Some("admitted") => positions.push(0),
            Some("waiting") => positions.push(s.body["position"].as_u64().expect("position")),
            _ => panic!("{}", s.text),
        }
    }
    positions.sort_unstable();
    assert_eq!(positions, (0..12).collect::<Vec<u64>>(), "one in, eleven in line, each at its own position");

    // The draw is recorded and recomputes: the pool in join order, shuffled from the seed, gives the places.
    let url = format!("{}/admin/events/{event}/lottery", a.admin);
    let record = a.send(a.client.get(url).bearer_auth(ADMIN_TOKEN)).await;
    let draw = &record.body["draws"][0];
    let join_order: Vec<String> = serde_json::from_value(draw["join_order"].clone()).expect("join order");
    let places: Vec<Option<String>> = serde_json::from_value(draw["places"].clone()).expect("places");
    let mut pool = join_order.clone();
    pool.sort();
    let mut everyone = fans.clone();
    everyone.sort();
    assert_eq!(pool, everyone, "{}", record.text);
    let recomputed = gateway::room::shuffle::draw(join_order, draw["seed"].as_u64().expect("seed"));
    assert_eq!(recomputed.into_iter().map(Some).collect::<Vec<_>>(), places, "{}", record.text);

    // A fan who joins now waits for the next draw.
    let late = b.join(event, "lot-late").await;
    assert_eq!(
        (late.body["in_draw"].as_bool(), late.body["draw_pool"].as_u64()),
        (Some(true), Some(1)),
        "{}",
        late.text
    );
    // The room goes back to FIFO: the pool left in it is drawn at once, not stranded.
    a.configure(event, json!({"queueing": "fifo"})).await;
    let placed = testkit::eventually(Duration::from_secs(5), async || {
        a.status(event, &late.ticket()).await.body["position"].as_u64() == Some(12)
    })
    .await;
    assert!(placed, "{}", a.status(event, &late.ticket()).await.text);
    upstream.stop().await;
}
