//! Freed slots: a fan who leaves, or whose order is paid, gives its slot to the next fan at once, on every node;
//! a fan who leaves also gives up its admission.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::*;

async fn freed_total(node: &GatewayProcess, event: i64) -> Value {
    node.room(event).await.body["live"]["freed_total"].clone()
}

/// Waits (bounded) until the node's view counts `n` freed slots.
async fn wait_freed(node: &GatewayProcess, event: i64, n: u64) {
    let counted = testkit::eventually(Duration::from_secs(5), async || freed_total(node, event).await == n).await;
    assert!(counted, "freed_total is {}, not {n}", freed_total(node, event).await);
}

/// Every node reports the same count of fans in the room's ETA error.
async fn counted_fans_equal(nodes: &[&GatewayProcess], event: i64) {
    let same = testkit::eventually(Duration::from_secs(5), async || {
        let mut counts = Vec::new();
        for node in nodes {
            counts.push(node.room(event).await.body["live"]["eta_error"]["fans"].clone());
        }
        counts.windows(2).all(|w| w[0] == w[1])
    })
    .await;
    assert!(same, "the nodes disagree on the fans counted");
}

/// One room with room for one fan: `first` is admitted at once, `second` waits.
async fn one_slot(node: &GatewayProcess, event: i64) -> (Reply, Reply) {
    node.configure(
        event,
        json!({"state": "open", "admit_per_minute": 60000, "max_active": 1, "abandon_after_seconds": 600}),
    )
    .await;
    node.wait_for_room(event).await;
    let first = node.join(event, "fan-first").await;
    assert_eq!((first.status, first.body["state"].as_str()), (200, Some("admitted")), "{}", first.text);
    let second = node.join(event, "fan-second").await;
    assert_eq!((second.status, second.body["position"].as_u64()), (200, Some(1)), "{}", second.text);
    (first, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_who_leaves_frees_its_slot_at_once_and_its_admission_ends_on_every_node() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let b = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let event = 341;
    let (first, second) = one_slot(&a, event).await;
    let proof = first.body["admission_token"].as_str().expect("a proof").to_owned();
    let bearer = format!("Bearer {proof}");
    let seats = format!("/events/{event}/seats");
    b.wait_for_room(event).await;
    assert_eq!(b.get(&seats, &[("authorization", &bearer)]).await.status, 200, "admitted: booking is reached");

    // Who leaves must say who it is.
    let anonymous = a.leave(event, None).await;
    assert_eq!((anonymous.status, anonymous.code()), (401, "proof_required"), "{}", anonymous.text);
    let elsewhere = a.leave(event + 1, Some(&proof)).await;
    assert_eq!((elsewhere.status, elsewhere.code()), (403, "ticket_wrong_event"), "{}", elsewhere.text);

    // The first fan leaves with its ticket, through one node.
    let left = a.leave(event, Some(&first.ticket())).await;
    assert_eq!((left.status, left.body["state"].as_str()), (200, Some("left")), "{}", left.text);
    assert!(left.header("set-cookie").is_some_and(|c| c.contains("Max-Age=0")), "the ticket's cookie is cleared");
    // The next fan goes in at once (the next step), and the leaver's proof is refused on both nodes.
    b.poll_until(event, &second.ticket(), "the next fan admitted", |r| r.body["state"] == "admitted").await;
    for node in [&a, &b] {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let refused = node.get(&seats, &[("authorization", &bearer)]).await;
            if (refused.status, refused.code()) == (401, "admission_ended") {
                break;
            }
            assert!(Instant::now() < deadline, "the proof still works: {} {}", refused.status, refused.text);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let polled = a.status(event, &first.ticket()).await;
    assert_eq!((polled.status, polled.code()), (409, "session_ended"), "{}", polled.text);
    wait_freed(&a, event, 1).await;

    // Leaving again changes nothing; the proof says who leaves as well as the ticket.
    let again = b.leave(event, Some(&proof)).await;
    assert_eq!(again.status, 200, "{}", again.text);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(freed_total(&a, event).await, 1, "a slot is freed once");

    // Joining again is a new place, behind everyone.
    let back = a.join(event, "fan-first").await;
    assert_eq!((back.status, back.body["state"].as_str()), (200, Some("waiting")), "{}", back.text);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paid_order_in_bookings_event_stream_frees_its_fans_slot_and_only_that() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let event = 342;
    let (first, second) = one_slot(&a, event).await;
    // Booking's relay writes every change of an order to this stream (docs/api.md, "The order event stream").
    let mut conn = redis().await;
    let publish = |kind: &'static str, account: &'static str, id: u32| {
        let data = json!({"status": "x", "event_id": event, "account_id": account, "seat_ids": [1]}).to_string();
        let mut cmd = redis::cmd("XADD");
        cmd.arg(format!("{p}outbox:orders")).arg("*").arg("id").arg(id).arg("kind").arg(kind);
        cmd.arg("order_id").arg(format!("order-{id}")).arg("event_id").arg(event).arg("from").arg("");
        cmd.arg("to").arg("x").arg("data").arg(data).arg("at").arg("2026-12-07T00:00:00Z");
        cmd
    };
    // An order reserved, or one paid in another event, frees nothing.
    let _: String = publish("order.reserved", "fan-first", 1).query_async(&mut conn).await.expect("XADD");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let waiting = a.status(event, &second.ticket()).await;
    assert_eq!((waiting.status, waiting.body["position"].as_u64()), (200, Some(1)), "{}", waiting.text);
    // Paid: the next fan goes in, and the payer keeps its admission (to see its order).
    let _: String = publish("order.paid", "fan-first", 2).query_async(&mut conn).await.expect("XADD");
    a.poll_until(event, &second.ticket(), "the next fan admitted", |r| r.body["state"] == "admitted").await;
    let proof = format!("Bearer {}", first.body["admission_token"].as_str().expect("a proof"));
    assert_eq!(a.get(&format!("/events/{event}/seats"), &[("authorization", &proof)]).await.status, 200);
    wait_freed(&a, event, 1).await;
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_admitted_fans_promised_wait_is_set_against_the_wait_it_had_once_on_every_node() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let b = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let event = 343;
    a.configure(event, json!({"state": "open", "admit_per_minute": 120, "abandon_after_seconds": 600})).await;
    a.wait_for_room(event).await;
    b.wait_for_room(event).await;
    let first = a.join(event, "eta-0").await;
    assert_eq!(first.body["state"], "admitted", "{}", first.text);
    let mut tickets = Vec::new();
    for fan in ["eta-1", "eta-2", "eta-3"] {
        let joined = a.join(event, fan).await;
        if joined.body["state"] == "waiting" {
            assert!(joined.body["eta_seconds"].as_u64().is_some(), "a waiting fan is promised a wait: {}", joined.text);
            tickets.push(joined.ticket());
        }
    }
    assert!(!tickets.is_empty(), "at 2 a second, someone waits");
    // Joined on one node and seen admitted only by the other: the first node reports them all the same.
    for ticket in &tickets {
        b.poll_until(event, ticket, "admitted", |r| r.body["state"] == "admitted").await;
        assert_eq!(b.status(event, ticket).await.body["state"], "admitted");
    }
    let counted = async |node: &GatewayProcess| {
        let counted = testkit::eventually(Duration::from_secs(5), async || {
            node.room(event).await.body["live"]["eta_error"]["fans"] == tickets.len()
        })
        .await;
        let view = node.room(event).await;
        assert!(counted, "{} fans promised a wait, counted: {}", tickets.len(), view.body["live"]["eta_error"]);
        let p90 = view.body["live"]["eta_error"]["abs_p90_seconds"].as_f64().expect("a figure");
        assert!((0.0..60.0).contains(&p90), "{p90}");
    };
    counted(&a).await;
    // Polled on the first node too once admitted: still each fan once, on both.
    for ticket in &tickets {
        assert_eq!(a.status(event, ticket).await.body["state"], "admitted");
    }
    let more = a.join(event, "eta-late").await;
    a.poll_until(event, &more.ticket(), "admitted", |r| r.body["state"] == "admitted").await;
    let counted_late = usize::from(more.body["eta_seconds"].as_u64().is_some());
    let total = testkit::eventually(Duration::from_secs(5), async || {
        a.room(event).await.body["live"]["eta_error"]["fans"] == tickets.len() + counted_late
    })
    .await;
    assert!(total, "{}", a.room(event).await.body["live"]["eta_error"]);
    counted_fans_equal(&[&a, &b], event).await;
    upstream.stop().await;
}
