//! The live seat map's change log and its two cacheable halves: every change reaches the log in the same
//! script that makes it, lapses too, and the status plus the log's deltas always equal the truth.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine;
use booking::domain::EventId;
use booking::store::holds::Keys;
use futures::future::join_all;
use rand::prelude::*;
use sqlx::PgPool;

use crate::app::{ADMIN_TOKEN, TestApp, eventually};

/// One entry of the log: its version and its changes (seat, status letter).
type Entry = (u64, Vec<(i64, char)>);

/// The log's entries after `version`.
async fn log_since(app: &mut TestApp, version: u64) -> Vec<Entry> {
    let key = Keys::new(&app.prefix).expect("prefix").log(EventId(app.event));
    let raw: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(&key)
        .arg(format!("({version}-0"))
        .arg("+")
        .query_async(&mut app.redis)
        .await
        .expect("XRANGE");
    raw.into_iter()
        .map(|(id, fields)| {
            let (v, seq) = id.split_once('-').expect("stream id");
            assert_eq!(seq, "0", "an entry id is the version");
            let changes = fields["c"]
                .split(',')
                .map(|c| {
                    let (seat, status) = c.split_once(':').expect("seat:status");
                    (seat.parse().expect("seat id"), status.chars().next().expect("status"))
                })
                .collect();
            (v.parse().expect("version"), changes)
        })
        .collect()
}

/// GET without any credential.
async fn get(app: &TestApp, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = app.client.get(app.url(path));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.send().await.expect("request reached the server")
}

/// The status answer decoded: its version and each seat's status letter (a, h or s), by seat id, read against
/// the layout it names.
async fn status(app: &TestApp) -> (u64, HashMap<i64, char>) {
    let res = get(app, &format!("/events/{}/seats/status", app.event), &[]).await;
    assert_eq!(res.status(), 200);
    let body: serde_json::Value = res.json().await.expect("json");
    let layout: serde_json::Value =
        get(app, body["layout"].as_str().expect("layout url"), &[]).await.json().await.expect("layout");
    let ids: Vec<i64> = serde_json::from_value(layout["seats"]["seat_id"].clone()).expect("seat ids");
    assert_eq!(body["seats"].as_u64(), Some(ids.len() as u64));
    let packed = base64::engine::general_purpose::STANDARD.decode(body["statuses"].as_str().expect("statuses"));
    let packed = packed.expect("base64");
    let statuses = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| (id, ['a', 'h', 's', '?'][usize::from((packed[i / 4] >> ((i % 4) * 2)) & 3)]))
        .collect();
    (body["version"].as_u64().expect("version"), statuses)
}

/// Every seat on sale as Postgres (sold) and Redis (held) say now, read directly.
async fn truth(app: &mut TestApp) -> HashMap<i64, char> {
    let sold: Vec<i64> = sqlx::query_scalar(
        "SELECT seat_id FROM order_seats WHERE event_id = $1 AND active
         AND (expires_at IS NULL OR expires_at > now())",
    )
    .bind(app.event)
    .fetch_all(&app.pool)
    .await
    .expect("sold");
    let mut out = HashMap::new();
    for seat in app.seats_on_sale().await {
        let status = if sold.contains(&seat) {
            's'
        } else {
            match app.seat_value(seat).await {
                None => 'a',
                Some(v) if v.starts_with("sold:") => 's',
                Some(_) => 'h',
            }
        };
        out.insert(seat, status);
    }
    out
}

/// A snapshot with the deltas after its version applied in order.
fn apply(mut map: HashMap<i64, char>, deltas: &[Entry]) -> HashMap<i64, char> {
    for (_, changes) in deltas {
        for &(seat, status) in changes {
            map.insert(seat, status);
        }
    }
    map
}

/// What booking's availability says a fan could hold now.
async fn available(app: &TestApp) -> u64 {
    let url = app.url(&format!("/events/{}/availability", app.event));
    let res = app.send(app.client.get(url).bearer_auth(app.proof("fan-x"))).await;
    res.body["seats_available"].as_u64().expect("seats_available")
}

/// Asserts that versions go up by exactly one from `after` (from the first entry when the log started after
/// `after` was read: a new log starts at Redis's clock).
fn assert_no_gaps(after: u64, log: &[Entry]) {
    let after = if after == 0 { log.first().map_or(0, |e| e.0 - 1) } else { after };
    for (i, (v, _)) in log.iter().enumerate() {
        assert_eq!(
            *v,
            after + 1 + i as u64,
            "versions have no gaps: {:?}",
            log.iter().map(|e| e.0).collect::<Vec<_>>()
        );
    }
}

async fn redis_now_ms(app: &mut TestApp) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(&mut app.redis).await.expect("TIME");
    s * 1000 + us / 1000
}

/// Waits (at most `within`) for a log entry after `after` that makes `seat` available; the Redis time then.
async fn await_available(app: &mut TestApp, after: u64, seat: i64, within: Duration) -> Option<i64> {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if log_since(app, after).await.iter().any(|(_, c)| c.contains(&(seat, 'a'))) {
            return Some(redis_now_ms(app).await);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

fn ms_of(rfc3339: &str) -> i64 {
    let at = time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339).expect("time");
    (at.unix_timestamp_nanos() / 1_000_000) as i64
}

#[sqlx::test(migrations = "../migrations")]
async fn every_change_is_logged_by_the_script_that_makes_it_with_versions_that_have_no_gaps(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    let seats = app.seats_on_sale().await;
    let (start, _) = status(&app).await;

    let all = available(&app).await;
    assert_eq!(all, seats.len() as u64);
    let a = app.hold("fan-a", &seats[0..2]).await;
    assert_eq!(a.status, 201);
    assert_eq!(available(&app).await, all - 2, "held seats are not available");
    let b = app.hold("fan-b", &seats[2..3]).await;
    assert_eq!(b.status, 201);
    assert_eq!(app.hold("fan-c", &seats[1..3]).await.status, 409, "a refusal changes nothing");
    assert_eq!(app.extend("fan-a", &a.str("hold_token")).await.status, 200, "an extension changes no status");
    assert_eq!(app.release("fan-b", &b.str("hold_token")).await.status, 200);
    let order = app.checkout("fan-a", &a.str("hold_token"), "key-a").await;
    assert_eq!(order.status, 201);
    let order_id = order.str("order_id");
    assert_eq!(app.pay(&order_id, "payment.succeeded").await.body["outcome"], "paid", "paying changes no status");
    let cancel = app.admin(reqwest::Method::POST, &format!("/admin/orders/{order_id}/cancel")).await;
    assert_eq!(cancel.body["order"]["status"], "refund_due", "{}", cancel.body);

    let log = log_since(&mut app, start).await;
    assert_no_gaps(start, &log);
    let changes: Vec<&[(i64, char)]> = log.iter().map(|(_, c)| c.as_slice()).collect();
    let (s0, s1, s2) = (seats[0], seats[1], seats[2]);
    assert_eq!(
        changes,
        vec![
            &[(s0, 'h'), (s1, 'h')][..],
            &[(s2, 'h')][..],
            &[(s2, 'a')][..],
            &[(s0, 's'), (s1, 's')][..],
            &[(s0, 'a'), (s1, 'a')][..],
        ]
    );
    let (now, map) = status(&app).await;
    assert_eq!(now, log.last().expect("entries").0, "the status shows the log's last version");
    assert_eq!(available(&app).await, all, "everything is back");
    assert!(seats[0..3].iter().all(|s| map[s] == 'a'));
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_lapsed_hold_and_an_unpaid_order_past_its_deadline_are_logged_available_within_a_second(pool: PgPool) {
    let mut app = TestApp::spawn_with(
        pool,
        &[
            "--hold-ttl-ms",
            "600",
            "--hold-max-ms",
            "600",
            "--payment-window-seconds",
            "1",
            "--payment-max-seconds",
            "1",
        ],
    )
    .await;
    let seats = app.seats_on_sale().await;
    let (start, _) = status(&app).await;
    let hold = app.hold("fan-a", &seats[0..1]).await;
    assert_eq!(hold.status, 201);
    let expires = ms_of(&hold.str("expires_at"));
    let seen = await_available(&mut app, start, seats[0], Duration::from_secs(5)).await.expect("the lapse is logged");
    assert!(seen >= expires && seen - expires <= 1_000, "logged {} ms after the hold's expiry", seen - expires);

    let (order_id, _) = app.reserve("fan-b", &seats[1..2]).await;
    let due = ms_of(&app.order("fan-b", &order_id).await.str("payment_due_at"));
    let after = log_since(&mut app, start).await.last().expect("entries").0;
    let seen = await_available(&mut app, after, seats[1], Duration::from_secs(5)).await.expect("the lapse is logged");
    assert!(seen >= due && seen - due <= 1_000, "logged {} ms after the order's deadline", seen - due);
    assert_no_gaps(start, &log_since(&mut app, start).await);
    app.stop().await;
}

/// A Redis restart that lost its writes (this one keeps no files, so it loses them all) loses the markers of
/// the orders made just before: Postgres has them sold, and the map's log would say nothing of them (a reserved
/// order's seats would come back as available when the hold they came from lapses). Booking meets the Redis
/// that was gone and writes those markers again, and the log says sold.
#[sqlx::test(migrations = "../migrations")]
async fn after_redis_lost_its_last_writes_the_recent_orders_seats_are_marked_and_logged_sold_again(pool: PgPool) {
    let mut redis_server = testkit::OwnRedis::start().await;
    let url = format!("redis://127.0.0.1:{}/", redis_server.port);
    let mut app = TestApp::spawn_with(pool, &["--redis-url", &url, "--sweep-interval-ms", "200"]).await;
    let seats = app.seats_on_sale().await;
    let (reserved, reserved_token) = app.reserve("fan-r", &seats[0..2]).await;
    let (paid, paid_token) = app.reserve("fan-p", &seats[2..3]).await;
    assert_eq!(app.pay(&paid, "payment.succeeded").await.body["outcome"], "paid");
    // Past the window in which the sweeper writes paid orders again anyway.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let marked = [(seats[0], &reserved_token), (seats[1], &reserved_token), (seats[2], &paid_token)];
    for (seat, token) in marked {
        assert_eq!(app.seat_value(seat).await, Some(format!("sold:{token}")));
    }

    redis_server.restart(false).await;
    let back = eventually(Duration::from_secs(15), async || {
        let mut all = true;
        for (seat, token) in marked {
            // The test's own connection meets the restart too: its first command fails.
            let value: Option<String> =
                redis::cmd("GET").arg(app.seat_key(seat)).query_async(&mut app.redis).await.unwrap_or(None);
            all &= value == Some(format!("sold:{token}"));
        }
        all
    });
    assert!(back.await, "the markers of both orders are written again");
    let log: Vec<(i64, char)> = log_since(&mut app, 0).await.into_iter().flat_map(|(_, c)| c).collect();
    for (seat, _) in marked {
        assert!(log.contains(&(seat, 's')), "seat {seat} is logged sold again: {log:?}");
    }
    let (_, statuses) = status(&app).await;
    assert_eq!([0, 1, 2].map(|i| statuses[&seats[i]]), ['s', 's', 's']);
    assert_eq!(app.order("fan-r", &reserved).await.str("status"), "reserved");
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_hold_released_after_it_ran_out_but_before_its_lapse_was_logged_is_logged_available(pool: PgPool) {
    // No lapse step in this process: the release is the only thing that can log the lapse.
    let mut app =
        TestApp::spawn_with(pool, &["--hold-ttl-ms", "200", "--hold-max-ms", "200", "--lapse-interval-ms", "0"]).await;
    let seats = app.seats_on_sale().await;
    let (start, _) = status(&app).await;
    let hold = app.hold("fan-a", &seats[0..2]).await;
    assert_eq!(hold.status, 201);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.seat_value(seats[0]).await, None, "the hold ran out");
    app.release("fan-a", &hold.str("hold_token")).await;
    let log = log_since(&mut app, start).await;
    assert_no_gaps(start, &log);
    let last: Vec<(i64, char)> = log.last().expect("entries").1.clone();
    assert_eq!(last, vec![(seats[0], 'a'), (seats[1], 'a')], "{log:?}");
    let (_, map) = status(&app).await;
    assert!(seats[0..2].iter().all(|s| map[s] == 'a'));
    app.stop().await;
}

/// One run of the lapse step over the app's event: (lapses taken, seats logged, version or 0, ms until the next
/// lapse is due or -1).
async fn lapse_once(app: &mut TestApp) -> (i64, i64, i64, i64) {
    let script = redis::Script::new(booking::store::holds::sources::SEATMAP_LAPSE);
    let (keys, event) = (app.keys(), EventId(app.event));
    let mut inv = script.prepare_invoke();
    for key in keys.map(event) {
        inv.key(key);
    }
    inv.arg(keys.seat_prefix(event)).arg(100);
    inv.invoke_async(&mut app.redis).await.expect("seatmap_lapse")
}

#[sqlx::test(migrations = "../migrations")]
async fn a_lapse_due_by_the_index_waits_while_redis_still_holds_its_seats(pool: PgPool) {
    // A key expires once Redis's clock is past its expiry, and a script reads keys as of its start, so a lapse
    // may be due by TIME while its seats still carry its token. Moving the index entries into the past while
    // the keys live on makes that instant last: the step must neither log those seats available nor drop the
    // entries, and must log them once Redis lets the keys go. No sweeper: its first pass over an event writes
    // the live order's marker again, as after a Redis loss, and the order's seat would wait on.
    let mut app = TestApp::spawn_with(pool, &["--lapse-interval-ms", "0", "--sweep-interval-ms", "0"]).await;
    let seats = app.seats_on_sale().await;
    let (start, _) = status(&app).await;
    let hold = app.hold("fan-a", &seats[0..2]).await;
    assert_eq!(hold.status, 201);
    app.reserve("fan-b", &seats[2..3]).await;
    let lapses = app.keys().lapses(EventId(app.event));
    let members: Vec<String> =
        redis::cmd("ZRANGE").arg(&lapses).arg(0).arg(-1).query_async(&mut app.redis).await.expect("ZRANGE");
    assert_eq!(members.len(), 2, "the hold's and the order's: {members:?}");
    let (taken, _, _, next_due) = lapse_once(&mut app).await;
    assert_eq!(taken, 0, "nothing is due yet");
    assert!((1..=600_000).contains(&next_due), "the first is due within a hold's life: {next_due} ms");
    let past = redis_now_ms(&mut app).await - 1_000;
    for member in &members {
        let _: i64 =
            redis::cmd("ZADD").arg(&lapses).arg(past).arg(member).query_async(&mut app.redis).await.expect("ZADD");
    }
    let logged = log_since(&mut app, start).await.last().expect("entries").0;
    // Nothing is taken while Redis holds the seats, and both are due now: the step comes back at once.
    assert_eq!(lapse_once(&mut app).await, (0, 0, 0, 0), "nothing is taken while Redis holds the seats");
    assert_eq!(log_since(&mut app, logged).await, vec![], "nothing logged");
    let left: i64 = redis::cmd("ZCARD").arg(&lapses).query_async(&mut app.redis).await.expect("ZCARD");
    assert_eq!(left, 2, "both wait in the index");
    let (_, map) = status(&app).await;
    assert_eq!(seats[0..3].iter().map(|s| map[s]).collect::<String>(), "hhs");

    for &seat in &seats[0..3] {
        let _: i64 =
            redis::cmd("PEXPIRE").arg(app.seat_key(seat)).arg(1).query_async(&mut app.redis).await.expect("PEXPIRE");
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (taken, logged_seats, version, next_due) = lapse_once(&mut app).await;
    assert_eq!((taken, logged_seats), (2, 3), "both lapses taken, their three seats logged");
    assert_eq!(next_due, -1, "none waits");
    let log = log_since(&mut app, logged).await;
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].0, version as u64);
    let mut changes = log[0].1.clone();
    changes.sort();
    assert_eq!(changes, seats[0..3].iter().map(|&s| (s, 'a')).collect::<Vec<_>>());
    assert_no_gaps(start, &log_since(&mut app, start).await);
    let (_, map) = status(&app).await;
    assert!(seats[0..2].iter().all(|s| map[s] == 'a'), "the hold's seats are free (the order stays live in Postgres)");
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn layout_and_status_are_public_cacheable_and_the_same_bytes_for_every_fan(pool: PgPool) {
    let app = TestApp::spawn_with(pool, &["--seat-map-cache-ms", "60000"]).await;
    let path = format!("/events/{}/seats/status", app.event);
    let (one, two) = tokio::join!(get(&app, &path, &[("accept-encoding", "gzip")]), get(&app, &path, &[]));
    for res in [&one, &two] {
        assert_eq!(res.headers()["cache-control"], "public, max-age=1");
        assert_eq!(res.headers()["vary"], "accept-encoding");
    }
    assert_eq!(one.headers()["content-encoding"], "gzip");
    assert_eq!(one.headers()["etag"], two.headers()["etag"], "one tag for one status, whatever the encoding");
    let etag = one.headers()["etag"].to_str().expect("etag").to_owned();
    let plain = two.bytes().await.expect("body");
    let body: serde_json::Value = serde_json::from_slice(&plain).expect("json");
    let zipped = one.bytes().await.expect("body");
    let mut unzipped = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&zipped[..]), &mut unzipped).expect("gunzip");
    assert_eq!(unzipped, plain, "the same bytes for every fan");
    let again = get(&app, &path, &[("if-none-match", &etag)]).await;
    assert_eq!((again.status().as_u16(), again.headers()["etag"].to_str().ok()), (304, Some(&*etag)));

    let layout_path = body["layout"].as_str().expect("layout").to_owned();
    let catalogue: i64 = layout_path.rsplit('/').next().expect("version").parse().expect("number");
    let (a, b) = tokio::join!(get(&app, &layout_path, &[]), get(&app, &layout_path, &[]));
    assert_eq!(a.headers()["cache-control"], "public, max-age=31536000, immutable");
    let tag = a.headers()["etag"].clone();
    assert_eq!(tag, b.headers()["etag"]);
    let (a, b) = (a.bytes().await.expect("body"), b.bytes().await.expect("body"));
    assert_eq!(a, b, "the same bytes for every fan");
    let layout: serde_json::Value = serde_json::from_slice(&a).expect("json");
    assert_eq!(layout["catalogue_version"], catalogue);
    assert_eq!(layout["seats"]["seat_id"].as_array().map(Vec::len), body["seats"].as_u64().map(|n| n as usize));
    let not_modified = get(&app, &layout_path, &[("if-none-match", tag.to_str().expect("tag"))]).await;
    assert_eq!(not_modified.status(), 304);

    let old = get(&app, &format!("/events/{}/seats/layout/{}", app.event, catalogue - 1), &[]).await;
    assert_eq!(old.status(), 404);
    let old: serde_json::Value = old.json().await.expect("json");
    assert_eq!((old["error"].as_str(), old["layout"].as_str()), (Some("layout_not_current"), Some(&*layout_path)));
    for (path, code) in [
        (format!("/events/{}/seats/status", 999_999), 404),
        ("/events/0/seats/status".to_owned(), 400),
        (format!("/events/{}/seats/layout/x", app.event), 400),
    ] {
        assert_eq!(get(&app, &path, &[]).await.status(), code, "{path}");
    }
    app.stop().await;
}

/// What the model run does to one live hold or order it knows.
#[derive(Clone)]
enum Known {
    Hold { account: String, token: String },
    Order { id: String },
}

#[sqlx::test(migrations = "../migrations")]
async fn status_plus_deltas_equals_the_truth_after_random_holds_releases_checkouts_expiries_and_refunds(pool: PgPool) {
    // LIVE_MAP_OPS sets the number of operations (10,000 by default).
    let ops: usize = std::env::var("LIVE_MAP_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let mut app = TestApp::spawn_with(
        pool,
        &[
            "--hold-ttl-ms",
            "700",
            "--hold-max-ms",
            "1400",
            "--payment-window-seconds",
            "1",
            "--payment-max-seconds",
            "2",
            "--max-seats-per-account",
            "1000",
        ],
    )
    .await;
    let seats = app.seats_on_sale().await;
    let (start, first) = status(&app).await;
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let mut known: Vec<Known> = Vec::new();
    let mut middle = None;
    let mut done_by_kind: HashMap<&str, usize> = HashMap::new();
    let wave = 24;
    for round in 0..ops.div_ceil(wave) {
        let batch: Vec<(u8, usize, Vec<i64>, String)> = (0..wave.min(ops - round * wave))
            .map(|i| {
                let n = rng.random_range(1..=3);
                let basket = seats.choose_multiple(&mut rng, n).copied().collect();
                (rng.random_range(0..10u8), rng.random_range(0..usize::MAX), basket, format!("fan-{}", i % 12))
            })
            .collect();
        let calls = batch.into_iter().map(|(kind, pick, basket, account)| {
            let target = (!known.is_empty()).then(|| known[pick % known.len()].clone());
            let app = &app;
            async move {
                match (kind, target) {
                    (0..=4, _) | (_, None) => {
                        let r = app.hold(&account, &basket).await;
                        (
                            "hold",
                            r.status == 201,
                            (r.status == 201).then(|| Known::Hold { account, token: r.str("hold_token") }),
                        )
                    }
                    (5, Some(Known::Hold { account, token })) => {
                        ("release", app.release(&account, &token).await.status == 200, None)
                    }
                    (6, Some(Known::Hold { account, token })) => {
                        ("extend", app.extend(&account, &token).await.status == 200, None)
                    }
                    (7 | 8, Some(Known::Hold { account, token })) => {
                        let r = app.checkout(&account, &token, &token).await;
                        ("checkout", r.status == 201, (r.status == 201).then(|| Known::Order { id: r.str("order_id") }))
                    }
                    (5 | 6, Some(Known::Order { id })) => {
                        ("pay", app.pay(&id, "payment.succeeded").await.body["outcome"] == "paid", None)
                    }
                    (7, Some(Known::Order { id })) => {
                        ("refund", admin_post(app, &format!("/admin/orders/{id}/refund")).await, None)
                    }
                    (_, Some(Known::Order { id })) => {
                        ("cancel", admin_post(app, &format!("/admin/orders/{id}/cancel")).await, None)
                    }
                    (_, Some(Known::Hold { .. })) => ("nothing", false, None),
                }
            }
        });
        // Mid-run, a status is read while a wave of changes is under way.
        let mid_run = async { if round == ops / wave / 2 { Some(status(&app).await) } else { None } };
        let (results, mid) = tokio::join!(join_all(calls), mid_run);
        middle = middle.or(mid);
        for (kind, done, new) in results {
            *done_by_kind.entry(kind).or_insert(0) += usize::from(done);
            known.extend(new);
        }
        if known.len() > 400 {
            known.drain(..200);
        }
    }
    // Let every hold and unpaid order lapse, and the lapse step log it.
    let lapses = Keys::new(&app.prefix).expect("prefix").lapses(EventId(app.event));
    let mut conn = app.redis.clone();
    let settled = eventually(Duration::from_secs(15), async || {
        let left: i64 = redis::cmd("ZCARD").arg(&lapses).query_async(&mut conn).await.expect("ZCARD");
        left == 0
    })
    .await;
    assert!(settled, "every lapse was logged");
    let truth = truth(&mut app).await;
    let log = log_since(&mut app, start).await;
    assert_no_gaps(start, &log);
    for kind in ["hold", "release", "extend", "checkout", "pay", "refund", "cancel"] {
        assert!(done_by_kind.get(kind).copied().unwrap_or(0) > ops / 1000, "too few of {kind}: {done_by_kind:?}");
    }
    eprintln!("{} log entries; done: {done_by_kind:?}", log.len());
    let counts = truth.values().fold(HashMap::new(), |mut m, s| {
        *m.entry(*s).or_insert(0) += 1;
        m
    });
    assert!(counts.get(&'s').copied().unwrap_or(0) > 0, "some seats stay sold: {counts:?}");
    assert_eq!(apply(first, &log), truth, "the first status and every delta since");
    let taken_key = Keys::new(&app.prefix).expect("prefix").taken(EventId(app.event));
    let taken: usize = redis::cmd("SCARD").arg(&taken_key).query_async(&mut app.redis).await.expect("SCARD");
    assert_eq!(taken, truth.values().filter(|s| **s != 'a').count(), "the taken set counts what is held or sold");
    let (mid_version, mid) = middle.expect("a status mid-run");
    let since_mid: Vec<Entry> = log.iter().filter(|(v, _)| *v > mid_version).cloned().collect();
    assert_eq!(apply(mid, &since_mid), truth, "a status read mid-run and the deltas after its version");
    let (end_version, end) = status(&app).await;
    assert_eq!((end_version, &end), (log.last().expect("entries").0, &truth), "the status now is the truth");
    app.assert_invariants().await;
    app.stop().await;
}

/// An operator's POST; whether it changed the order (409: not possible in the order's state now).
async fn admin_post(app: &TestApp, path: &str) -> bool {
    let res = app.client.post(app.url(path)).bearer_auth(ADMIN_TOKEN).send().await.expect("admin request");
    assert!(res.status().is_success() || res.status() == 409, "{path}: {}", res.status());
    res.status().is_success()
}
