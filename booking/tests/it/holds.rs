//! Holds under contention: all or nothing, one winner, no false conflicts, compare-and-* on tokens.

use std::collections::HashSet;
use std::time::Duration;

use futures::future::join_all;
use sqlx::PgPool;

use crate::app::{TestApp, hold_when_free};

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

#[sqlx::test(migrations = "../migrations")]
async fn two_hundred_concurrent_holds_on_one_seat_grant_exactly_one(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let seat = app.seats_on_sale().await[0];
    let accounts: Vec<String> = (0..200).map(|i| format!("fan-{i}")).collect();
    let responses = join_all(accounts.iter().map(|a| app.hold_owned(a.clone(), vec![seat]))).await;
    let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
    assert_eq!(count(&statuses, 201), 1, "statuses: {statuses:?}");
    assert_eq!(count(&statuses, 409), 199, "statuses: {statuses:?}");
    for r in responses.iter().filter(|r| r.status == 409) {
        assert_eq!(r.code(), "seat_unavailable");
        assert_eq!(r.body["seat_id"], seat);
        assert!(r.str("label").contains("Row"), "a refusal names the seat: {}", r.body);
    }
    let winner = responses.iter().find(|r| r.status == 201).expect("a winner");
    let mut app = app;
    assert_eq!(app.seat_value(seat).await, Some(winner.str("hold_token")));
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn overlapping_baskets_grant_one_winner_and_losers_hold_nothing(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    let seats = app.seats_on_sale().await;
    let common = seats[0];
    // Basket i: two seats of its own and the contested one, in varying positions.
    let baskets: Vec<Vec<i64>> = (0..60)
        .map(|i| {
            let own = [seats[1 + 2 * i], seats[2 + 2 * i]];
            match i % 3 {
                0 => vec![common, own[0], own[1]],
                1 => vec![own[0], common, own[1]],
                _ => vec![own[0], own[1], common],
            }
        })
        .collect();
    let responses =
        join_all(baskets.iter().enumerate().map(|(i, b)| app.hold_owned(format!("fan-{i}"), b.clone()))).await;
    let winners: Vec<usize> = (0..60).filter(|&i| responses[i].status == 201).collect();
    assert_eq!(winners.len(), 1, "statuses: {:?}", responses.iter().map(|r| r.status).collect::<Vec<_>>());
    let winner_token = responses[winners[0]].str("hold_token");
    for (i, r) in responses.iter().enumerate() {
        if i == winners[0] {
            for &seat in &baskets[i] {
                assert_eq!(app.seat_value(seat).await.as_deref(), Some(winner_token.as_str()));
            }
            continue;
        }
        assert_eq!(r.status, 409, "basket {i}: {}", r.body);
        assert_eq!(r.body["seat_id"], common, "the refusal names the contested seat");
        for &seat in baskets[i].iter().filter(|&&s| s != common) {
            assert_eq!(app.seat_value(seat).await, None, "loser {i} holds seat {seat}");
        }
    }
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn disjoint_concurrent_holds_never_conflict(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let seats = app.seats_on_sale().await;
    let responses = join_all((0..100).map(|i| app.hold_owned(format!("fan-{i}"), vec![seats[i]]))).await;
    let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
    assert_eq!(count(&statuses, 201), 100, "statuses: {statuses:?}");
    let tokens: HashSet<String> = responses.iter().map(|r| r.str("hold_token")).collect();
    assert_eq!(tokens.len(), 100, "every hold has its own token");
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_hold_is_priced_from_the_catalogue(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let seats = app.seats_on_sale().await;
    let r = app.hold("fan-1", &seats[..3]).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let prices: Vec<i64> =
        r.body["seats"].as_array().expect("seats").iter().map(|s| s["price_cents"].as_i64().expect("price")).collect();
    assert_eq!(prices.len(), 3);
    assert_eq!(r.body["total_cents"].as_i64(), Some(prices.iter().sum()));
    assert_eq!(r.str("currency"), "EUR");
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn release_with_a_wrong_token_or_by_another_account_leaves_the_hold(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    let seat = app.seats_on_sale().await[0];
    let hold = app.hold("fan-a", &[seat]).await;
    assert_eq!(hold.status, 201);
    let token = hold.str("hold_token");

    let unknown = app.release("fan-a", &uuid::Uuid::new_v4().to_string()).await;
    assert_eq!((unknown.status, unknown.code()), (404, "hold_not_found"));
    let other = app.release("fan-b", &token).await;
    assert_eq!((other.status, other.code()), (403, "hold_not_yours"));
    let extend = app.extend("fan-b", &token).await;
    assert_eq!((extend.status, extend.code()), (403, "hold_not_yours"));
    let steal = app.checkout("fan-b", &token, "steal-1").await;
    assert_eq!((steal.status, steal.code()), (403, "hold_not_yours"));

    assert_eq!(app.seat_value(seat).await, Some(token.clone()), "the hold survived");
    assert_eq!(app.hold("fan-c", &[seat]).await.status, 409);

    let own = app.release("fan-a", &token).await;
    assert_eq!((own.status, own.body["released"].as_i64()), (200, Some(1)));
    assert_eq!(app.seat_value(seat).await, None);
    assert_eq!(app.hold("fan-c", &[seat]).await.status, 201, "a released seat is free again");
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn stale_token_cannot_release_extend_or_check_out_a_rehold(pool: PgPool) {
    let mut app = TestApp::spawn_with(pool, &["--hold-ttl-ms", "700"]).await;
    let seats = app.seats_on_sale().await;
    let basket = [seats[0], seats[1]];
    let a = app.hold("fan-a", &basket).await;
    assert_eq!(a.status, 201);
    let a_token = a.str("hold_token");

    // A's hold expires; B holds the same seats.
    let b = hold_when_free(&app, "fan-b", &basket, Duration::from_secs(5)).await;
    assert_eq!(b.status, 201, "{}", b.body);
    let b_token = b.str("hold_token");

    let extend = app.extend("fan-a", &a_token).await;
    assert_eq!((extend.status, extend.code()), (409, "hold_expired"));
    let checkout = app.checkout("fan-a", &a_token, "a-late").await;
    assert_eq!((checkout.status, checkout.code()), (409, "hold_expired"));
    let release = app.release("fan-a", &a_token).await;
    assert_eq!((release.status, release.body["released"].as_i64()), (200, Some(0)), "{}", release.body);

    for &seat in &basket {
        assert_eq!(app.seat_value(seat).await, Some(b_token.clone()), "B's hold is untouched");
    }
    let bought = app.checkout("fan-b", &b_token, "b-1").await;
    assert_eq!(bought.status, 201, "{}", bought.body);
    app.assert_invariants().await;
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn extension_is_capped_by_the_absolute_maximum(pool: PgPool) {
    let app = TestApp::spawn_with(pool, &["--hold-ttl-ms", "60000", "--hold-max-ms", "90000"]).await;
    let seat = app.seats_on_sale().await[0];
    let hold = app.hold("fan-a", &[seat]).await;
    let first = time::OffsetDateTime::parse(&hold.str("expires_at"), &time::format_description::well_known::Rfc3339)
        .expect("rfc3339");
    let token = hold.str("hold_token");
    let mut last = first;
    for _ in 0..3 {
        let r = app.extend("fan-a", &token).await;
        assert_eq!(r.status, 200, "{}", r.body);
        last = time::OffsetDateTime::parse(&r.str("expires_at"), &time::format_description::well_known::Rfc3339)
            .expect("rfc3339");
    }
    // Created at (first - 60 s); capped at created + 90 s = first + 30 s.
    let cap = first + time::Duration::seconds(30);
    assert!(last > first, "extension moved the expiry");
    assert!(last <= cap + time::Duration::milliseconds(5), "expiry {last} passed the cap {cap}");
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn an_account_cannot_hold_more_than_its_cap(pool: PgPool) {
    let app = TestApp::spawn_with(pool, &["--max-seats-per-account", "4"]).await;
    let seats = app.seats_on_sale().await;
    assert_eq!(app.hold("fan-a", &seats[0..3]).await.status, 201);
    let over = app.hold("fan-a", &seats[3..5]).await;
    assert_eq!((over.status, over.code()), (409, "account_limit_reached"), "{}", over.body);
    assert_eq!(app.hold("fan-a", &seats[3..4]).await.status, 201, "up to the cap is fine");
    assert_eq!(app.hold("fan-b", &seats[4..8]).await.status, 201, "another account has its own cap");
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn concurrent_holds_by_one_account_respect_its_cap(pool: PgPool) {
    let app = TestApp::spawn_with(pool, &["--max-seats-per-account", "8"]).await;
    let seats = app.seats_on_sale().await;
    let responses = join_all((0..20).map(|i| app.hold("fan-a", &seats[2 * i..2 * i + 2]))).await;
    let granted = responses.iter().filter(|r| r.status == 201).count();
    assert_eq!(granted, 4, "8 seats in baskets of 2: {:?}", responses.iter().map(|r| r.status).collect::<Vec<_>>());
    assert!(responses.iter().all(|r| r.status == 201 || r.code() == "account_limit_reached"));
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn seat_map_shows_holds_and_sales_and_moves_its_version(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let seats = app.seats_on_sale().await;
    let before = app.seat_map("fan-a").await;
    assert_eq!(before.status, 200);
    assert_eq!(before.body["seats"].as_array().expect("seats").len(), seats.len());
    let held = app.hold("fan-a", &[seats[0]]).await;
    let sold = app.hold("fan-b", &[seats[1]]).await;
    assert_eq!(app.checkout("fan-b", &sold.str("hold_token"), "k").await.status, 201);
    let after = app.seat_map("fan-a").await;
    let status_of = |id: i64| {
        after.body["seats"].as_array().expect("seats").iter().find(|s| s["seat_id"] == id).expect("seat")["status"]
            .as_str()
            .expect("status")
            .to_owned()
    };
    assert_eq!(held.status, 201);
    assert_eq!(status_of(seats[0]), "held");
    assert_eq!(status_of(seats[1]), "sold");
    assert_eq!(status_of(seats[2]), "available");
    assert!(after.body["version"].as_u64() > before.body["version"].as_u64());
    let held_back = app.held_back_seats().await;
    assert!(!held_back.is_empty());
    assert!(
        after.body["seats"]
            .as_array()
            .expect("seats")
            .iter()
            .all(|s| !held_back.contains(&s["seat_id"].as_i64().expect("id"))),
        "held-back seats are not on the map"
    );
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn releasing_a_held_back_block_puts_it_on_sale(pool: PgPool) {
    let app = TestApp::spawn_with(pool, &["--catalogue-refresh-ms", "100"]).await;
    let sponsor_seat = app.held_back_seats().await[0];
    let refused = app.hold("fan-a", &[sponsor_seat]).await;
    assert_eq!((refused.status, refused.code()), (422, "seat_not_on_sale"));
    // The sponsor gives the block back: inserting its allocation rows is what puts it on sale.
    sqlx::query(
        "INSERT INTO seat_allocations (event_id, seat_id, ticket_type_id)
         SELECT $1, $2, min(id) FROM ticket_types WHERE event_id = $1",
    )
    .bind(app.event)
    .bind(sponsor_seat)
    .execute(&app.pool)
    .await
    .expect("release the block");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let granted = loop {
        let r = app.hold("fan-a", &[sponsor_seat]).await;
        if r.status == 201 || tokio::time::Instant::now() >= deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(granted.status, 201, "{}", granted.body);
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn holds_survive_redis_forgetting_its_scripts(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    let seats = app.seats_on_sale().await;
    assert_eq!(app.hold("fan-a", &seats[..1]).await.status, 201);
    // A restart or failover empties the script cache: EVALSHA answers NOSCRIPT and the script is sent again.
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut app.redis).await.expect("SCRIPT FLUSH");
    let r = app.hold("fan-a", &seats[1..2]).await;
    assert_eq!(r.status, 201, "{}", r.body);
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_whole_number_written_with_a_fraction_is_the_same_seat(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let seat = app.seats_on_sale().await[0];
    let url = app.url(&format!("/events/{}/holds", app.event));
    let body = format!("{{\"seat_ids\": [{seat}.0]}}");
    let req =
        app.client.post(url).bearer_auth(app.proof("fan-a")).header("content-type", "application/json").body(body);
    let r = app.send(req).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["seats"][0]["seat_id"], seat);
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn bought_seats_count_against_the_cap_at_hold_time(pool: PgPool) {
    let app = TestApp::spawn_with(pool, &["--max-seats-per-account", "4"]).await;
    let seats = app.seats_on_sale().await;
    let first = app.hold("fan-a", &seats[0..3]).await;
    assert_eq!(app.checkout("fan-a", &first.str("hold_token"), "k").await.status, 201);
    let over = app.hold("fan-a", &seats[3..5]).await;
    assert_eq!((over.status, over.code()), (409, "account_limit_reached"), "{}", over.body);
    assert_eq!(over.body["counted"], 3, "the three bought seats are counted: {}", over.body);
    assert_eq!(app.hold("fan-a", &seats[3..4]).await.status, 201);
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn fans_opening_the_map_together_share_one_build_until_it_expires(pool: PgPool) {
    let app = TestApp::spawn_with(pool, &["--seat-map-cache-ms", "1500"]).await;
    let seats = app.seats_on_sale().await;
    let first = app.seat_map("fan-a").await;
    assert_eq!(app.hold("fan-b", &[seats[0]]).await.status, 201);
    // Within the cache window every fan gets the same map (same version), even after a hold.
    let app = &app;
    let together = join_all((0..20).map(|i| async move { app.seat_map(&format!("fan-{i}")).await })).await;
    assert!(together.iter().all(|m| m.status == 200 && m.body["version"] == first.body["version"]));
    // After it, the map is rebuilt and shows the hold.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let later = app.seat_map("fan-a").await;
    assert_ne!(later.body["version"], first.body["version"]);
    let held = later.body["seats"].as_array().expect("seats").iter().find(|s| s["seat_id"] == seats[0]).expect("seat");
    assert_eq!(held["status"], "held");
}

#[sqlx::test(migrations = "../migrations")]
async fn the_map_is_gzipped_for_clients_that_accept_it_and_says_the_same(pool: PgPool) {
    use std::io::Read;
    let app = TestApp::spawn_with(pool, &["--seat-map-cache-ms", "60000"]).await;
    let seats = app.seats_on_sale().await;
    assert_eq!(app.hold("fan-b", &[seats[0]]).await.status, 201);
    let get = |encoding: &'static str| {
        let url = app.url(&format!("/events/{}/seats", app.event));
        let req = app.client.get(url).bearer_auth(app.proof("fan-a")).header("accept-encoding", encoding);
        async move {
            let res = req.send().await.expect("request reached the server");
            let headers = res.headers().clone();
            (res.status().as_u16(), headers, res.bytes().await.expect("body"))
        }
    };
    // Fetched together, so one build answers every encoding.
    let (plain, zipped, star, refused) = tokio::join!(get("identity"), get("gzip, br"), get("*"), get("gzip;q=0"));
    for (status, headers, _) in [&plain, &zipped, &star, &refused] {
        assert_eq!(*status, 200);
        assert_eq!(headers["vary"], "accept-encoding");
    }
    assert!(plain.1.get("content-encoding").is_none() && refused.1.get("content-encoding").is_none());
    assert_eq!(
        (&zipped.1["content-encoding"], &star.1["content-encoding"]),
        (&"gzip".parse().expect("hv"), &"gzip".parse().expect("hv"))
    );
    assert!(zipped.2.len() * 5 < plain.2.len(), "gzip {} bytes, plain {}", zipped.2.len(), plain.2.len());
    let mut unzipped = Vec::new();
    flate2::read::GzDecoder::new(&zipped.2[..]).read_to_end(&mut unzipped).expect("a gzip stream");
    let (a, b): (serde_json::Value, serde_json::Value) =
        (serde_json::from_slice(&unzipped).expect("json"), serde_json::from_slice(&plain.2).expect("json"));
    assert_eq!(a, b, "the gzipped map is the same map");
    let held = a["seats"].as_array().expect("seats").iter().find(|s| s["seat_id"] == seats[0]).expect("seat");
    assert_eq!(held["status"], "held");
    app.stop().await;
}
