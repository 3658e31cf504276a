//! The outbox relay: every order event reaches the Redis Stream under its own id, even when the relay process dies
//! between publishing and recording that it published, and again when Redis loses the stream or its tail.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use reqwest::Method;
use sqlx::PgPool;

use crate::app::{TestApp, eventually};

/// The test database's URL, for a relay process of its own.
fn database_url(pool: &PgPool) -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set by deploy/test");
    let db = pool.connect_options().get_database().expect("database name").to_owned();
    let (server, _) = base.rsplit_once('/').expect("a URL with a database");
    format!("{server}/{db}")
}

fn relay(app: &TestApp, extra: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_booking"))
        .args(["relay", "--outbox-relay-interval-ms", "20", "--outbox-relay-batch", "4"])
        .args(extra)
        .env("DATABASE_URL", database_url(&app.pool))
        .env("REDIS_URL", std::env::var("REDIS_URL").expect("REDIS_URL"))
        .env("REDIS_KEY_PREFIX", &app.prefix)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        // Warnings land in the test's own output, which the runner shows when the test fails.
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start booking relay")
}

/// An app with no relay of its own, and five orders: the ids of the order events they wrote.
async fn five_orders(pool: PgPool) -> (TestApp, Vec<i64>) {
    let app = TestApp::spawn_with(pool, &["--outbox-relay-interval-ms", "0", "--sweep-interval-ms", "0"]).await;
    let seats = app.seats_on_sale().await;
    for (i, &seat) in seats.iter().take(5).enumerate() {
        app.reserve(&format!("fan-{i}"), &[seat]).await;
    }
    let written =
        sqlx::query_scalar("SELECT id FROM order_events ORDER BY id").fetch_all(&app.pool).await.expect("ids");
    (app, written)
}

/// A relay that aborts once it has published `rows` rows, before it marks its last batch; waits for it to end.
async fn crash_after(app: &TestApp, rows: usize) {
    let mut crashing = relay(app, &["--crash-after-publish", &rows.to_string()]);
    let status =
        tokio::time::timeout(Duration::from_secs(20), crashing.wait()).await.expect("relay ends").expect("wait");
    assert!(!status.success(), "the relay aborted: {status:?}");
}

/// Stream entries as (outbox id, every other field).
async fn stream(app: &mut TestApp) -> Vec<(i64, Vec<(String, String)>)> {
    let key = format!("{}outbox:orders", app.prefix);
    let entries: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg(&key).arg("-").arg("+").query_async(&mut app.redis).await.expect("XRANGE");
    entries
        .into_iter()
        .map(|(_, fields)| {
            let id = fields.iter().find(|(k, _)| k == "id").and_then(|(_, v)| v.parse().ok()).expect("id field");
            (id, fields.into_iter().filter(|(k, _)| k != "id").collect())
        })
        .collect()
}

async fn backlog(app: &TestApp) -> i64 {
    booking::store::outbox::backlog(&app.pool).await.expect("backlog")
}

#[sqlx::test(migrations = "../migrations")]
async fn a_relay_killed_between_publish_and_commit_loses_nothing(pool: PgPool) {
    let mut app = TestApp::spawn_with(pool, &["--outbox-relay-interval-ms", "0", "--sweep-interval-ms", "0"]).await;
    let seats = app.seats_on_sale().await;
    for (i, &seat) in seats.iter().take(9).enumerate() {
        let (order, _) = app.reserve(&format!("fan-{i}"), &[seat]).await;
        if i % 3 == 0 {
            assert_eq!(app.pay(&order, "payment.succeeded").await.status, 200);
        }
        if i == 0 {
            assert_eq!(app.admin(Method::POST, &format!("/admin/orders/{order}/refund")).await.status, 200);
        }
    }
    let written: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM order_events ORDER BY id").fetch_all(&app.pool).await.expect("ids");
    assert_eq!(written.len(), 9 + 3 + 1);

    // Batches of at most 4 (fewer when a transaction elsewhere on the server holds the relay back): the batch
    // that brings the count to 10 is on the stream when the process aborts, and the cursor is not past it.
    crash_after(&app, 10).await;
    let after_crash = stream(&mut app).await;
    let marked = written.len() - usize::try_from(backlog(&app).await).expect("a count");
    assert!((10..=written.len()).contains(&after_crash.len()), "the relay stopped at 10: {}", after_crash.len());
    assert!(
        (after_crash.len() - 4..after_crash.len()).contains(&marked),
        "the cursor stands before the last batch published ({marked} of {} marked)",
        after_crash.len()
    );

    let mut healthy = relay(&app, &[]);
    assert!(eventually(Duration::from_secs(20), async || backlog(&app).await == 0).await, "the relay caught up");
    healthy.kill().await.expect("kill");

    let entries = stream(&mut app).await;
    let mut by_id: HashMap<i64, Vec<Vec<(String, String)>>> = HashMap::new();
    for (id, fields) in entries {
        by_id.entry(id).or_default().push(fields);
    }
    let mut ids: Vec<i64> = by_id.keys().copied().collect();
    ids.sort_unstable();
    assert_eq!(ids, written, "every event was delivered");
    // The next relay found the crashed batch on the stream and moved the cursor past it: nothing twice.
    let duplicated: Vec<i64> = ids.iter().copied().filter(|id| by_id[id].len() > 1).collect();
    assert!(after_crash.len() > marked, "the crash left a batch published and unmarked");
    assert!(duplicated.is_empty(), "published twice: {duplicated:?}");
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_relay_killed_after_publishing_the_last_rows_leaves_none_unmarked(pool: PgPool) {
    let (mut app, written) = five_orders(pool).await;
    // The process aborts once the stream has every row, before it marks the last batch.
    crash_after(&app, written.len()).await;
    assert_eq!(stream_ids(&mut app).await, written, "the stream has every row");
    assert!(backlog(&app).await > 0, "the last batch is not marked");
    // The next relay finds nothing left to publish: the cursor it moved to the stream's end must stay there.
    let mut healthy = relay(&app, &[]);
    assert!(eventually(Duration::from_secs(20), async || backlog(&app).await == 0).await, "the cursor caught up");
    healthy.kill().await.expect("kill");
    assert_eq!(stream_ids(&mut app).await, written, "nothing published twice");
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_stream_that_redis_lost_whole_or_in_part_is_published_again(pool: PgPool) {
    let (mut app, written) = five_orders(pool).await;
    let mut relaying = relay(&app, &[]);
    assert!(eventually(Duration::from_secs(20), async || stream_ids(&mut app).await == written).await);

    // Its tail lost (a restart that lost the last second of the append-only file): the tail comes back, once.
    let key = format!("{}outbox:orders", app.prefix);
    let entries: Vec<(String, Vec<String>)> =
        redis::cmd("XRANGE").arg(&key).arg("-").arg("+").query_async(&mut app.redis).await.expect("XRANGE");
    let tail: Vec<&str> = entries[3..].iter().map(|(entry, _)| entry.as_str()).collect();
    let _: i64 = redis::cmd("XDEL").arg(&key).arg(&tail).query_async(&mut app.redis).await.expect("XDEL");
    assert!(
        eventually(Duration::from_secs(20), async || stream_ids(&mut app).await == written).await,
        "the tail again"
    );

    // The whole stream lost (FLUSHALL, or a replica without it): everything again, once.
    let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut app.redis).await.expect("DEL");
    assert!(eventually(Duration::from_secs(20), async || stream_ids(&mut app).await == written).await, "all again");
    relaying.kill().await.expect("kill");

    // A stream that keeps only the latest 3 entries gets only those 3 again.
    let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut app.redis).await.expect("DEL");
    let mut short = relay(&app, &["--outbox-stream-max-len", "3"]);
    let latest = written[written.len() - 3..].to_vec();
    let again = eventually(Duration::from_secs(20), async || stream_ids(&mut app).await == latest).await;
    assert!(again, "the latest 3 of {written:?}: {:?}", stream_ids(&mut app).await);
    short.kill().await.expect("kill");

    // Rows older than the window are not published again, however many the stream keeps.
    sqlx::query("UPDATE order_events SET created_at = now() - interval '1 hour' WHERE id = ANY($1)")
        .bind(&written[..2])
        .execute(&app.pool)
        .await
        .expect("backdate");
    let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut app.redis).await.expect("DEL");
    let mut windowed = relay(&app, &[]);
    let recent = written[2..].to_vec();
    let again = eventually(Duration::from_secs(20), async || stream_ids(&mut app).await == recent).await;
    assert!(again, "the {recent:?} of the last ten minutes: {:?}", stream_ids(&mut app).await);
    windowed.kill().await.expect("kill");
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn the_relay_in_booking_publishes_each_change_with_the_order_as_it_became(pool: PgPool) {
    let mut app = TestApp::spawn_with(pool, &["--outbox-relay-interval-ms", "50"]).await;
    let seat = app.seats_on_sale().await[0];
    let (order, _) = app.reserve("fan-a", &[seat]).await;
    assert_eq!(app.pay(&order, "payment.succeeded").await.status, 200);
    assert!(eventually(Duration::from_secs(10), async || backlog(&app).await == 0).await, "the relay caught up");
    let entries = stream(&mut app).await;
    let field = |fields: &[(String, String)], name: &str| {
        fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap_or_default()
    };
    let kinds: Vec<String> = entries.iter().map(|(_, f)| field(f, "kind")).collect();
    assert_eq!(kinds, ["order.reserved", "order.paid"]);
    let paid = &entries[1].1;
    assert_eq!((field(paid, "from"), field(paid, "to")), ("reserved".into(), "paid".into()));
    assert_eq!(field(paid, "order_id"), order);
    let data: serde_json::Value = serde_json::from_str(&field(paid, "data")).expect("data is JSON");
    assert_eq!(data["status"], "paid");
    assert_eq!(data["account_id"], "fan-a");
    assert_eq!(data["seat_ids"], serde_json::json!([seat]));
    app.stop().await;
}

/// Outbox ids in the order the stream holds them.
async fn stream_ids(app: &mut TestApp) -> Vec<i64> {
    stream(app).await.into_iter().map(|(id, _)| id).collect()
}

#[sqlx::test(migrations = "../migrations")]
async fn a_row_committed_after_later_ones_is_published_not_skipped(pool: PgPool) {
    let mut app = TestApp::spawn_with(pool, &["--outbox-relay-interval-ms", "0", "--sweep-interval-ms", "0"]).await;
    let seats = app.seats_on_sale().await;
    let (first, _) = app.reserve("fan-a", &[seats[0]]).await;

    // A transaction writes an event row and stays open while a later checkout writes and commits its own: the
    // open row has the smaller id, the later one is visible first.
    let mut open = app.pool.begin().await.expect("begin");
    let late: i64 = sqlx::query_scalar(
        "INSERT INTO order_events (order_id, event_id, kind, from_status, to_status, data)
         SELECT id, event_id, 'order.extended', status, status, '{}' FROM orders WHERE id = $1::uuid RETURNING id",
    )
    .bind(&first)
    .fetch_one(&mut *open)
    .await
    .expect("insert the late row");
    let (second, _) = app.reserve("fan-b", &[seats[1]]).await;
    let ids_of = async |app: &TestApp, order: &str| -> Vec<i64> {
        sqlx::query_scalar("SELECT id FROM order_events WHERE order_id = $1::uuid ORDER BY id")
            .bind(order)
            .fetch_all(&app.pool)
            .await
            .expect("ids")
    };
    let reserved_first = ids_of(&app, &first).await;
    let reserved_second = ids_of(&app, &second).await;
    assert!(reserved_first[0] < late && late < reserved_second[0], "{reserved_first:?} {late} {reserved_second:?}");

    let mut relay = relay(&app, &[]);
    assert!(
        eventually(Duration::from_secs(20), async || !stream_ids(&mut app).await.is_empty()).await,
        "the relay published the first order's event"
    );
    // Many relay ticks (20 ms each) with the late row's transaction still open: the relay waits for it rather
    // than publish past it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(stream_ids(&mut app).await, reserved_first, "nothing past the open transaction is published");
    assert_eq!(backlog(&app).await, 1, "the second order's event waits (the late row is not visible yet)");

    open.commit().await.expect("commit");
    assert!(eventually(Duration::from_secs(20), async || backlog(&app).await == 0).await, "the relay caught up");
    relay.kill().await.expect("kill");
    assert_eq!(
        stream_ids(&mut app).await,
        [reserved_first[0], late, reserved_second[0]],
        "every row once, in the order their transactions first wrote"
    );
    app.stop().await;
}
