//! A room's schedule: changes set through the admin API, applied on every node when their time comes, shown in
//! the admin view, cancellable while they wait, and recorded with their outcome once applied.

use std::time::Duration;

use serde_json::{Value, json};
use tokens::unix_now;

use crate::harness::*;

async fn schedule(node: &GatewayProcess, event: i64, ask: Value) -> Reply {
    let url = format!("{}/admin/events/{event}/schedule", node.admin);
    node.send(node.client.post(url).bearer_auth(ADMIN_TOKEN).json(&ask)).await
}

async fn timeline(node: &GatewayProcess, event: i64) -> Reply {
    let url = format!("{}/admin/events/{event}/schedule", node.admin);
    node.send(node.client.get(url).bearer_auth(ADMIN_TOKEN)).await
}

async fn cancel(node: &GatewayProcess, event: i64, id: &str) -> Reply {
    let url = format!("{}/admin/events/{event}/schedule/{id}", node.admin);
    node.send(node.client.delete(url).bearer_auth(ADMIN_TOKEN)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_changes_apply_on_every_node_when_their_time_comes() {
    let upstream = Upstream::start().await;
    let p = prefix();
    let a = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let b = GatewayProcess::start(Node::new(upstream.addr, &p)).await;
    let event = 601;
    a.configure(event, json!({"state": "paused", "admit_per_minute": 60000, "abandon_after_seconds": 600})).await;
    b.wait_for_room(event).await;
    let waiting = a.join(event, "sched-fan").await;
    assert_eq!(waiting.body["state"], "paused", "{}", waiting.text);

    // The sale opens in three seconds; a minute later the rate comes down and the room lets fans straight in.
    let opens = unix_now() + 3;
    let open = schedule(&a, event, json!({"at": opens, "set": {"state": "open"}})).await;
    assert_eq!(open.status, 201, "{}", open.text);
    let later =
        schedule(&b, event, json!({"at": opens + 60, "set": {"admit_per_minute": 120, "queueing": "passthrough"}}))
            .await;
    assert_eq!(later.status, 201, "{}", later.text);
    let listed = timeline(&b, event).await;
    let ids: Vec<&str> =
        listed.body["waiting"].as_array().expect("waiting").iter().filter_map(|c| c["id"].as_str()).collect();
    assert_eq!(ids, [open.body["id"].as_str().expect("id"), later.body["id"].as_str().expect("id")], "{}", listed.text);
    // Both nodes' admin views show what waits.
    for node in [&a, &b] {
        let shown = testkit::eventually(Duration::from_secs(3), async || {
            node.room(event).await.body["schedule"].as_array().is_some_and(|s| s.len() == 2)
        })
        .await;
        assert!(shown, "{}", node.room(event).await.text);
    }

    // Its time comes: every node has the room open, and the waiting fan goes in.
    for node in [&a, &b] {
        let opened =
            testkit::eventually(Duration::from_secs(8), async || node.room(event).await.body["state"] == "open").await;
        assert!(opened, "{}", node.room(event).await.text);
    }
    let seen_open = unix_now();
    let fan = b.poll_until(event, &waiting.ticket(), "admitted", |r| r.body["state"] == "admitted").await;
    assert_eq!(fan.status, 200);
    let record = timeline(&a, event).await;
    let applied = &record.body["applied"][0];
    assert_eq!(
        (applied["id"].as_str(), applied["outcome"].as_str()),
        (open.body["id"].as_str(), Some("applied")),
        "{}",
        record.text
    );
    let applied_at = applied["applied_at"].as_u64().expect("applied_at");
    // Not before its time, and before it was seen applied.
    assert!((opens..=seen_open).contains(&applied_at), "applied at {applied_at}, due at {opens}, seen at {seen_open}");
    assert_eq!(record.body["waiting"].as_array().map(Vec::len), Some(1), "{}", record.text);

    // The later change is cancelled while it waits; cancelling it again finds nothing.
    let id = later.body["id"].as_str().expect("id");
    assert_eq!(cancel(&a, event, id).await.status, 204);
    let again = cancel(&b, event, id).await;
    assert_eq!((again.status, again.code()), (404, "change_not_found"), "{}", again.text);
    assert_eq!(timeline(&b, event).await.body["waiting"], json!([]));

    // A change the room refuses when it applies (back to the pre-queue after places were given) is recorded so.
    let back = schedule(&a, event, json!({"at": unix_now(), "set": {"state": "prequeue"}})).await;
    assert_eq!(back.status, 201, "{}", back.text);
    let refused = testkit::eventually(Duration::from_secs(5), async || {
        timeline(&a, event).await.body["applied"][0]["outcome"] == "state_change_refused"
    })
    .await;
    assert!(refused, "{}", timeline(&a, event).await.text);
    assert_eq!(a.room(event).await.body["state"], "open");
    upstream.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_takes_only_valid_changes_for_a_room_that_exists() {
    let upstream = Upstream::start().await;
    let a = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let event = 602;
    let unknown = schedule(&a, event, json!({"at": unix_now() + 60, "set": {"state": "open"}})).await;
    assert_eq!((unknown.status, unknown.code()), (404, "queue_not_found"), "{}", unknown.text);
    a.configure(event, json!({"state": "paused"})).await;
    for (ask, status, code) in [
        (json!({"at": unix_now() + 60, "set": {"admit_per_minute": 0}}), 422, "setting_out_of_range"),
        (json!({"at": unix_now() + 60, "set": {"state": "sold_out"}}), 422, "state_not_settable"),
        (json!({"at": unix_now() + 60, "set": {}}), 422, "empty_change"),
        (json!({"at": 5_000_000_000_u64, "set": {"state": "open"}}), 422, "setting_out_of_range"),
        (json!({"at": unix_now() + 60, "set": {"colour": "red"}}), 422, "invalid_schedule"),
        (json!({"set": {"state": "open"}}), 422, "invalid_schedule"),
        (json!("not an object"), 422, "invalid_schedule"),
    ] {
        let refused = schedule(&a, event, ask.clone()).await;
        assert_eq!((refused.status, refused.code()), (status, code), "{ask}: {}", refused.text);
    }
    assert_eq!(timeline(&a, event).await.body["waiting"], json!([]), "nothing refused was kept");
    upstream.stop().await;
}
