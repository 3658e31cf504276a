//! Seats booking picks: best available under contention, its filters and splits, nearby seats offered when a
//! seat went, and the idempotency of `POST /holds`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::future::join_all;
use redis::AsyncCommands;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::app::{Resp, TestApp, eventually};

/// Where a seat is: section, row, number, x, y, accessible.
type Place = (String, String, i32, i32, i32, bool);

async fn places(app: &TestApp) -> HashMap<i64, Place> {
    let rows: Vec<(i64, String, String, i32, i32, i32, bool)> = sqlx::query_as(
        "SELECT s.id, sec.name, s.row_label, s.number, s.x, s.y, s.accessible
         FROM seat_allocations a JOIN seats s ON s.id = a.seat_id JOIN sections sec ON sec.id = s.section_id
         WHERE a.event_id = $1",
    )
    .bind(app.event)
    .fetch_all(&app.pool)
    .await
    .expect("seats");
    rows.into_iter().map(|(id, sec, row, n, x, y, acc)| (id, (sec, row, n, x, y, acc))).collect()
}

fn seat_ids(v: &Value) -> Vec<i64> {
    v.as_array().expect("array").iter().map(|s| s["seat_id"].as_i64().or_else(|| s.as_i64()).expect("id")).collect()
}

/// Whether the seats are one row's consecutive numbers.
fn side_by_side(places: &HashMap<i64, Place>, seats: &[i64]) -> bool {
    let mut at: Vec<&Place> = seats.iter().map(|s| &places[s]).collect();
    at.sort_by_key(|p| p.2);
    at.windows(2).all(|w| w[0].0 == w[1].0 && w[0].1 == w[1].1 && w[1].2 == w[0].2 + 1)
}

fn best(quantity: usize, extra: Value) -> Value {
    let mut ask = json!({ "quantity": quantity });
    if let (Some(ask), Some(extra)) = (ask.as_object_mut(), extra.as_object()) {
        ask.extend(extra.clone());
    }
    json!({ "best_available": ask })
}

#[sqlx::test(migrations = "../migrations")]
async fn fifty_concurrent_best_available_requests_get_disjoint_blocks_best_first(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let places = places(&app).await;
    let ask = best(4, json!({ "section": "Block 101" }));
    let answers: Vec<Resp> = join_all((0..50).map(|i| {
        let (app, ask) = (&app, ask.clone());
        async move { app.hold_with(&format!("fan-{i}"), ask, None).await }
    }))
    .await;
    let mut taken = HashSet::new();
    let mut grants: Vec<(u64, i64)> = Vec::new();
    for a in &answers {
        assert_eq!(a.status, 201, "{}", a.body);
        let seats = seat_ids(&a.body["seats"]);
        assert_eq!(seats.len(), 4);
        assert!(side_by_side(&places, &seats), "not side by side: {seats:?}");
        for s in &seats {
            assert!(taken.insert(*s), "seat {s} is in two holds");
        }
        assert_eq!(a.body["best_available"]["side_by_side"], true);
        grants.push((
            a.body["version"].as_u64().expect("version"),
            a.body["best_available"]["score"].as_i64().expect("score"),
        ));
    }
    grants.sort();
    let versions: HashSet<u64> = grants.iter().map(|g| g.0).collect();
    assert_eq!(versions.len(), 50, "each grant has a map version of its own");
    let scores: Vec<i64> = grants.iter().map(|g| g.1).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "scores in grant order: {scores:?}");
    // The first free row is C (A and B are held back), 25 seats: 11-14 and 12-15 are half a seat off its centre.
    assert_eq!(scores[0], -1, "{scores:?}");
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn best_available_keeps_to_its_filters_and_never_holds_fewer_seats_than_asked(pool: PgPool) {
    // Two sections of 500: the last row of each has two accessible seats side by side.
    let app = TestApp::spawn_venue(pool, 1000, &[]).await;
    let places = places(&app).await;
    let pair = app.hold_with("fan-a", best(2, json!({ "accessible": true })), None).await;
    assert_eq!(pair.status, 201, "{}", pair.body);
    let seats = seat_ids(&pair.body["seats"]);
    assert!(seats.iter().all(|s| places[s].5), "{seats:?} are not all accessible");
    assert!(side_by_side(&places, &seats));

    // Two accessible seats are left, side by side: three together is refused, naming what is left.
    let three = app.hold_with("fan-b", best(3, json!({ "accessible": true })), None).await;
    assert_eq!((three.status, three.code()), (409, "no_seats_together"), "{}", three.body);
    assert_eq!((three.body["available"].as_u64(), three.body["largest_block"].as_u64()), (Some(2), Some(2)));

    // With allow_split, two accessible seats and no more is still too few: never fewer seats than asked.
    let split = app.hold_with("fan-b", best(3, json!({ "accessible": true, "allow_split": true })), None).await;
    assert_eq!((split.status, split.code()), (409, "no_seats_together"), "{}", split.body);

    // A section asked for is kept to.
    let other_section = app.hold_with("fan-c", best(8, json!({ "section": "Block 102" })), None).await;
    assert_eq!(other_section.status, 201, "{}", other_section.body);
    assert!(seat_ids(&other_section.body["seats"]).iter().all(|s| places[s].0 == "Block 102"));
    let unknown_type = app.hold_with("fan-d", best(3, json!({ "ticket_type_id": 999_999 })), None).await;
    assert_eq!((unknown_type.status, unknown_type.code()), (422, "unknown_ticket_type"), "{}", unknown_type.body);
    let unknown = app.hold_with("fan-d", best(2, json!({ "section": "Block 999" })), None).await;
    assert_eq!((unknown.status, unknown.code()), (422, "unknown_section"));
    let none = app.hold_with("fan-d", json!({}), None).await;
    assert_eq!((none.status, none.code()), (422, "invalid_body"));
    let both =
        app.hold_with("fan-d", json!({ "seat_ids": [seats[0]], "best_available": { "quantity": 1 } }), None).await;
    assert_eq!((both.status, both.code()), (422, "invalid_body"));
    let too_many = app.hold_with("fan-d", best(9, json!({})), None).await;
    assert_eq!((too_many.status, too_many.code()), (422, "too_many_seats"));
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_split_takes_the_longest_pieces_when_no_block_is_whole(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    let places = places(&app).await;
    // Leave free, in the whole venue, only seats 1-3 of row C and seat 20 of row D: hold everything else.
    let keep: Vec<i64> = places
        .iter()
        .filter(|(_, p)| (p.1 == "C" && p.2 <= 3) || (p.1 == "D" && p.2 == 20))
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(keep.len(), 4);
    let mut rest: Vec<i64> = places.keys().copied().filter(|s| !keep.contains(s)).collect();
    rest.sort();
    let holds =
        join_all(rest.chunks(8).enumerate().map(|(i, c)| app.hold_owned(format!("filler-{i}"), c.to_vec()))).await;
    assert!(holds.iter().all(|h| h.status == 201));

    let together = app.hold_with("fan-a", best(4, json!({})), None).await;
    assert_eq!((together.status, together.code()), (409, "no_seats_together"), "{}", together.body);
    assert_eq!((together.body["available"].as_u64(), together.body["largest_block"].as_u64()), (Some(4), Some(3)));
    let split = app.hold_with("fan-a", best(4, json!({ "allow_split": true })), None).await;
    assert_eq!(split.status, 201, "{}", split.body);
    let mut got = seat_ids(&split.body["seats"]);
    got.sort();
    let mut want = keep.clone();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(split.body["best_available"]["side_by_side"], false);
    for s in &keep {
        assert_eq!(app.seat_value(*s).await, Some(split.str("hold_token")));
    }
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_seat_that_went_comes_with_the_nearest_free_blocks(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    let places = places(&app).await;
    let mut row_e: Vec<(i32, i64)> = places.iter().filter(|(_, p)| p.1 == "E").map(|(id, p)| (p.2, *id)).collect();
    row_e.sort();
    let basket: Vec<i64> = row_e[10..13].iter().map(|s| s.1).collect();
    // Someone takes the middle seat, and seats to the left and right of the basket.
    let gone = app.hold("fan-b", &[basket[1], row_e[9].1, row_e[13].1]).await;
    assert_eq!(gone.status, 201);
    let refused = app.hold("fan-a", &basket).await;
    assert_eq!((refused.status, refused.code()), (409, "seat_unavailable"), "{}", refused.body);
    assert_eq!(refused.body["seat_id"], basket[1]);
    let offered = refused.body["alternatives"].as_array().expect("alternatives").clone();
    assert_eq!(offered.len(), 3, "{}", refused.body);

    let centre = |seats: &[i64]| {
        let n = seats.len() as f64;
        let x = seats.iter().map(|s| f64::from(places[s].3)).sum::<f64>() / n;
        let y = seats.iter().map(|s| f64::from(places[s].4)).sum::<f64>() / n;
        (x, y)
    };
    let (cx, cy) = centre(&basket);
    let distance = |seats: &[i64]| {
        let (x, y) = centre(seats);
        (x - cx).hypot(y - cy)
    };
    let mut distances = Vec::new();
    for alt in &offered {
        let seats = seat_ids(&alt["seat_ids"]);
        assert_eq!(seats.len(), 3);
        assert!(side_by_side(&places, &seats), "{seats:?}");
        assert_eq!(alt["labels"].as_array().map(Vec::len), Some(3));
        for s in &seats {
            assert_eq!(app.seat_value(*s).await, None, "offered seat {s} is not free");
        }
        distances.push(distance(&seats));
    }
    assert!(distances.windows(2).all(|w| w[0] <= w[1]), "nearest first: {distances:?} {offered:?}");
    // No free block of three is nearer than the farthest offered.
    let held: HashSet<i64> = [basket[1], row_e[9].1, row_e[13].1].into();
    let mut by_row: HashMap<(&str, &str), Vec<(i32, i64)>> = HashMap::new();
    for (id, p) in &places {
        by_row.entry((p.0.as_str(), p.1.as_str())).or_default().push((p.2, *id));
    }
    // Offered blocks share no seat; any other free block is as far as the farthest offered, or overlaps an
    // offered block that is no farther.
    let offered_seats: Vec<Vec<i64>> = offered.iter().map(|a| seat_ids(&a["seat_ids"])).collect();
    let all: HashSet<i64> = offered_seats.iter().flatten().copied().collect();
    assert_eq!(all.len(), 9, "three disjoint blocks: {offered:?}");
    let farthest = distances.last().copied().unwrap_or(0.0);
    for seats in by_row.values_mut() {
        seats.sort();
        for w in seats.windows(3) {
            let block: Vec<i64> = w.iter().map(|s| s.1).collect();
            if w[2].0 != w[0].0 + 2 || block.iter().any(|s| held.contains(s)) || offered_seats.contains(&block) {
                continue;
            }
            let d = distance(&block);
            let shadowed =
                offered_seats.iter().zip(&distances).any(|(o, od)| *od <= d && o.iter().any(|s| block.contains(s)));
            assert!(d >= farthest - 1e-9 || shadowed, "{block:?} is nearer than an offered block: {offered:?}");
        }
    }
    // The fan takes the first one offered.
    let taken = app.hold("fan-a", &seat_ids(&offered[0]["seat_ids"])).await;
    assert_eq!(taken.status, 201, "{}", taken.body);
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_hold_retried_with_its_idempotency_key_is_the_same_hold_and_counts_once(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    let seats = app.seats_on_sale().await;
    let body = json!({ "seat_ids": &seats[0..4] });

    let first = app.hold_with("fan-a", body.clone(), Some("k-1")).await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert!(first.headers.get("idempotent-replayed").is_none());
    let again = app.hold_with("fan-a", body.clone(), Some("k-1")).await;
    assert_eq!(again.status, 201, "{}", again.body);
    assert_eq!(again.headers.get("idempotent-replayed").and_then(|v| v.to_str().ok()), Some("true"));
    assert_eq!(again.str("hold_token"), first.str("hold_token"));
    assert_eq!(seat_ids(&again.body["seats"]), seat_ids(&first.body["seats"]));
    assert_eq!(again.str("expires_at"), first.str("expires_at"));

    // The cap (8) still has room for four more: the replay did not count.
    let more = app.hold_with("fan-a", json!({ "seat_ids": &seats[4..8] }), Some("k-2")).await;
    assert_eq!(more.status, 201, "{}", more.body);

    // The same key with another body: refused, nothing made.
    let other = app.hold_with("fan-a", json!({ "seat_ids": &seats[8..9] }), Some("k-1")).await;
    assert_eq!((other.status, other.code()), (422, "idempotency_key_reused"), "{}", other.body);
    assert_eq!(app.seat_value(seats[8]).await, None);

    // Keys are per account: another account's k-1 is its own.
    let b = app.hold_with("fan-b", json!({ "seat_ids": &seats[8..9] }), Some("k-1")).await;
    assert_eq!(b.status, 201, "{}", b.body);

    // A refused request gives its key back: once the seat is free, the retry makes the hold.
    let refused = app.hold_with("fan-c", json!({ "seat_ids": &seats[8..9] }), Some("k-3")).await;
    assert_eq!((refused.status, refused.code()), (409, "seat_unavailable"));
    assert_eq!(app.release("fan-b", &b.str("hold_token")).await.status, 200);
    let retried = app.hold_with("fan-c", json!({ "seat_ids": &seats[8..9] }), Some("k-3")).await;
    assert_eq!(retried.status, 201, "{}", retried.body);
    assert!(retried.headers.get("idempotent-replayed").is_none());

    // Concurrent retries of one request: one hold, every answer names it or says the first is in flight.
    let racing =
        join_all((0..10).map(|_| app.hold_with("fan-d", json!({ "seat_ids": &seats[9..11] }), Some("k-4")))).await;
    let tokens: HashSet<String> = racing.iter().filter(|r| r.status == 201).map(|r| r.str("hold_token")).collect();
    assert_eq!(tokens.len(), 1, "{racing:?}");
    for r in &racing {
        assert!(r.status == 201 || (r.status, r.code()) == (409, "request_in_flight"), "{}", r.body);
    }
    let token = tokens.into_iter().next().unwrap_or_default();
    assert_eq!(app.seat_value(seats[9]).await, Some(token));
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_key_in_flight_is_a_409_and_a_key_whose_hold_ended_never_makes_another(pool: PgPool) {
    let mut app = TestApp::spawn_with(pool, &["--hold-ttl-ms", "1000"]).await;
    let seats = app.seats_on_sale().await;
    let event = booking::domain::EventId(app.event);

    // Another request with key "busy" is running (its claim is in Redis, as the server writes it).
    let key = app.keys().hold_idempotency(event, "fan-a", "busy");
    let _: () = app.redis.set(&key, "p:0123456789abcdef").await.expect("SET");
    let dup = app.hold_with("fan-a", json!({ "seat_ids": &seats[0..1] }), Some("busy")).await;
    assert_eq!((dup.status, dup.code()), (409, "request_in_flight"), "{}", dup.body);
    assert_eq!(app.seat_value(seats[0]).await, None, "nothing is held under a key in flight");
    let _: () = app.redis.del(&key).await.expect("DEL");
    let after = app.hold_with("fan-a", json!({ "seat_ids": &seats[0..1] }), Some("busy")).await;
    assert_eq!(after.status, 201, "{}", after.body);

    // The hold runs out: a retry with its key is told so, and holds nothing.
    let body = json!({ "best_available": { "quantity": 2 } });
    let first = app.hold_with("fan-b", body.clone(), Some("late")).await;
    assert_eq!(first.status, 201, "{}", first.body);
    let held = seat_ids(&first.body["seats"]);
    let lapsed = eventually(Duration::from_secs(5), async || app.seat_value(held[0]).await.is_none()).await;
    assert!(lapsed, "the hold ran out");
    let late = app.hold_with("fan-b", body, Some("late")).await;
    assert_eq!((late.status, late.code()), (409, "hold_expired"), "{}", late.body);
    assert_eq!(late.headers.get("idempotent-replayed").and_then(|v| v.to_str().ok()), Some("true"));
    assert_eq!(app.seat_value(held[0]).await, None);
    let invalid = app.hold_with("fan-b", json!({ "seat_ids": [seats[5]] }), Some("bad key")).await;
    assert_eq!((invalid.status, invalid.code()), (400, "idempotency_key_invalid"));
    app.stop().await;
}
