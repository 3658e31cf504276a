//! Retired rooms: a room that is over (or that an operator retires) has its keys deleted, and every node
//! forgets it instead of restoring it from its view, so the work of each tick follows the rooms that are live,
//! not every room there ever was.

use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;

use crate::harness::*;

/// `DELETE /admin/events/{event}` on a node's admin listener.
async fn retire(node: &GatewayProcess, event: i64) -> Reply {
    node.send(node.client.delete(format!("{}/admin/events/{event}", node.admin)).bearer_auth(ADMIN_TOKEN)).await
}

/// The room's keys Redis still holds, by name.
async fn keys_left(prefix: &str, event: i64) -> Vec<String> {
    let keys = gateway::store::QueueKeys::new(prefix, event);
    let mut conn = redis().await;
    let mut left = Vec::new();
    for key in keys.every() {
        let there: bool = conn.exists(&key).await.expect("EXISTS");
        if there {
            left.push(key.rsplit(':').next().unwrap_or_default().to_owned());
        }
    }
    left
}

/// Waits (bounded) until the node no longer knows the room.
async fn forgotten(node: &GatewayProcess, event: i64) -> bool {
    testkit::eventually(Duration::from_secs(10), async || node.room(event).await.status == 404).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_room_is_deleted_forgotten_by_every_node_and_made_anew_empty() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let b = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let event = 361;
    a.configure(event, json!({"state": "paused"})).await;
    let mut joined_before = Vec::new();
    for fan in ["fan-1", "fan-2"] {
        let joined = a.join(event, fan).await;
        assert_eq!(joined.status, 200, "{}", joined.text);
        joined_before.push(joined);
    }
    let made = a
        .send(
            a.client
                .post(format!("{}/admin/events/{event}/codes", a.admin))
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({"code": "RETIREDROOM"})),
        )
        .await;
    assert_eq!(made.status, 201, "{}", made.text);
    b.wait_for_room(event).await;
    assert!(keys_left(&p, event).await.len() > 2);

    let retired = retire(&b, event).await;
    assert_eq!(retired.status, 204, "{}", retired.text);
    // Both nodes drop it rather than write it back from their views (a node that restored it would still
    // show it), and nothing of it is left in Redis: its keys, its listing, its codes in the index.
    for node in [&a, &b] {
        assert!(forgotten(node, event).await, "a node still shows the room: {}", node.room(event).await.text);
    }
    // The place counter stays, with the head at it, so places are never given twice for the event.
    assert_eq!(keys_left(&p, event).await, ["seq", "head"], "every other key of the room is gone");
    let mut conn = redis().await;
    let listed: bool = conn.sismember(format!("{p}queue:rooms"), event).await.expect("SISMEMBER");
    assert!(!listed, "the room is no longer listed");
    let indexed: Option<i64> = conn.hget(format!("{p}queue:codes"), "RETIREDROOM").await.expect("HGET");
    assert_eq!(indexed, None, "its codes left the index");
    let joined = a.join(event, "fan-3").await;
    assert_eq!((joined.status, joined.code()), (404, "queue_not_found"), "{}", joined.text);
    let again = retire(&a, event).await;
    assert_eq!((again.status, again.code()), (404, "queue_not_found"), "{}", again.text);

    // An operator's change makes it anew, empty: the first fan to join is first in line, at a place after
    // every place the retired room gave, and a ticket of the retired room is not taken for anyone's.
    a.configure(event, json!({"state": "open", "admit_per_minute": 60000})).await;
    a.wait_for_room(event).await;
    b.wait_for_room(event).await;
    let first = b.join(event, "fan-3").await;
    assert_eq!((first.status, first.body["state"].as_str()), (200, Some("admitted")), "{}", first.text);
    assert!(first.place() > 2, "a place after the retired room's: {}", first.text);
    let old = a.status(event, &joined_before[0].ticket()).await;
    assert_eq!((old.status, old.code()), (409, "session_ended"), "{}", old.text);
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_over_for_the_time_set_retires_on_its_own_and_one_being_prepared_does_not() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p).arg("--retire-after-seconds", 1)).await;
    // Being prepared: closed, nobody ever admitted. Ending: a fan was let in, left, and the room closed.
    let (prepared, ended) = (362, 363);
    a.configure(prepared, json!({"state": "closed"})).await;
    a.configure(ended, json!({"state": "open", "admit_per_minute": 60000})).await;
    a.wait_for_room(ended).await;
    let fan = a.join(ended, "fan-in").await;
    assert_eq!((fan.status, fan.body["state"].as_str()), (200, Some("admitted")), "{}", fan.text);
    // Not over while a fan is inside.
    a.configure(ended, json!({"state": "closed"})).await;
    let left = a.leave(ended, Some(&fan.ticket())).await;
    assert_eq!(left.status, 200, "{}", left.text);

    assert!(forgotten(&a, ended).await, "the room over was not retired: {}", a.room(ended).await.text);
    assert_eq!(keys_left(&p, ended).await, ["seq", "head"]);
    assert_eq!(a.metric("waiting_room_rooms_retired_total").await, Some(1));
    // The prepared room has been closed longer than the other, and stays.
    let kept = a.room(prepared).await;
    assert_eq!((kept.status, kept.body["state"].as_str()), (200, Some("closed")), "{}", kept.text);
    upstream.stop().await;
}
