//! Group commit: checkouts settled together in one `checkout_batch` statement get exactly the answers they
//! would get alone, and a batch that fails whole is settled again one by one.

use std::time::Duration;

use booking::domain::{EventId, HoldToken, SeatId};
use booking::store::batcher::{BatchPolicy, CheckoutBatcher};
use booking::store::orders::{self, Answer, Checkout, CheckoutError, NewOrder};
use booking::store::outbox;
use futures::future::join_all;
use sqlx::PgPool;
use uuid::Uuid;

use crate::app::{TestApp, eventually};

/// The cap these tests run with.
const CAP: usize = 4;

async fn currency(app: &TestApp) -> String {
    sqlx::query_scalar("SELECT currency::text FROM events WHERE id = $1")
        .bind(app.event)
        .fetch_one(&app.pool)
        .await
        .expect("currency")
}

fn new_order(event: i64, currency: &str, account: &str, seats: &[i64], key: &str) -> NewOrder {
    NewOrder {
        event: EventId(event),
        account: account.to_owned(),
        hold: HoldToken(Uuid::new_v4()),
        seats: seats.iter().copied().map(SeatId).collect(),
        currency: currency.to_owned(),
        payment_window_seconds: 600,
        max_seats_per_account: CAP,
        idempotency_key: key.to_owned(),
        fingerprint: format!("test {key}"),
    }
}

/// Checks out alone, expecting a new order; returns its id.
async fn created_alone(app: &TestApp, new: &NewOrder) -> Uuid {
    match orders::checkout(&app.pool, new).await {
        Ok(Checkout::Created(order)) => order.id.0,
        other => panic!("expected a new order, got {other:?}"),
    }
}

fn created(settled: &Result<Checkout, CheckoutError>) -> &orders::Order {
    match settled {
        Ok(Checkout::Created(order)) => order,
        other => panic!("expected a new order, got {other:?}"),
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn a_batch_settles_each_checkout_as_it_would_be_settled_alone(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    let cur = currency(&app).await;
    let seats = app.seats_on_sale().await;
    let held_back = app.held_back_seats().await;
    let event = app.event;
    let new = |account: &str, seats: &[i64], key: &str| new_order(event, &cur, account, seats, key);

    // Before the batch: a sold seat, a key that answered, an account at its cap, an order past its deadline,
    // a hold already checked out.
    created_alone(&app, &new("fan-sold", &[seats[20]], "k-sold")).await;
    let answered = new("fan-answered", &[seats[21]], "k-answered");
    let answered_order = created_alone(&app, &answered).await;
    created_alone(&app, &new("fan-capped", &seats[22..26], "k-capped")).await;
    let lapsed = created_alone(&app, &new("fan-lapsed", &[seats[26]], "k-lapsed")).await;
    app.pass_deadline(&lapsed.to_string()).await;
    let used = new("fan-used", &[seats[27]], "k-used");
    created_alone(&app, &used).await;
    created_alone(&app, &new("fan-9", &seats[28..31], "k9")).await;

    let batch = vec![
        new("fan-1", &[seats[0]], "k1"),
        new("fan-2", &[seats[1], seats[2]], "k2"),
        // One account twice, with two keys.
        new("fan-3", &[seats[3]], "k3a"),
        new("fan-3", &[seats[4]], "k3b"),
        new("fan-4", &[held_back[0]], "k4"),
        new("fan-5", &[seats[5], seats[20]], "k5"),
        // A retry of an answered checkout, then the same key for another request.
        answered.clone(),
        NewOrder { fingerprint: "another request".into(), ..answered.clone() },
        new("fan-capped", &[seats[6]], "k-capped-2"),
        NewOrder { idempotency_key: "k-used-2".into(), seats: vec![SeatId(seats[7])], ..used.clone() },
        // Two fans after one seat in the same batch.
        new("fan-6", &[seats[8]], "k6"),
        new("fan-7", &[seats[8]], "k7"),
        new("fan-8", &[seats[26]], "k8"),
        // One seat left under fan-9's cap, asked for twice in the same batch.
        new("fan-9", &[seats[9]], "k9a"),
        new("fan-9", &[seats[10]], "k9b"),
    ];
    let settled = orders::checkout_batch(&app.pool, &batch).await.expect("batch");
    assert_eq!(settled.len(), batch.len());

    assert_eq!(created(&settled[0]).seats.iter().map(|s| s.0.0).collect::<Vec<_>>(), [seats[0]]);
    assert_eq!(created(&settled[1]).seats.iter().map(|s| s.0.0).collect::<Vec<_>>(), [seats[1], seats[2]]);
    assert_eq!(created(&settled[2]).seats[0].0.0, seats[3]);
    assert_eq!(created(&settled[3]).seats[0].0.0, seats[4]);
    assert!(matches!(settled[4], Ok(Checkout::NotOnSale(SeatId(s))) if s == held_back[0]), "{:?}", settled[4]);
    assert!(matches!(settled[5], Err(CheckoutError::SeatSold(SeatId(s))) if s == seats[20]), "{:?}", settled[5]);
    assert!(
        matches!(&settled[6], Ok(Checkout::Replay(Answer::Order(o))) if o.id.0 == answered_order),
        "{:?}",
        settled[6]
    );
    assert!(matches!(settled[7], Ok(Checkout::Mismatch)), "{:?}", settled[7]);
    assert!(matches!(settled[8], Ok(Checkout::AccountCap { owned: 4 })), "{:?}", settled[8]);
    assert!(matches!(settled[9], Err(CheckoutError::HoldUsed)), "{:?}", settled[9]);
    let pair = [&settled[10], &settled[11]];
    assert_eq!(pair.iter().filter(|s| matches!(s, Ok(Checkout::Created(_)))).count(), 1, "{pair:?}");
    assert_eq!(
        pair.iter().filter(|s| matches!(s, Err(CheckoutError::SeatSold(SeatId(x))) if *x == seats[8])).count(),
        1,
        "{pair:?}"
    );
    assert_eq!(created(&settled[12]).seats[0].0.0, seats[26]);
    assert_eq!(created(&settled[13]).seats[0].0.0, seats[9]);
    assert!(matches!(settled[14], Ok(Checkout::AccountCap { owned: 4 })), "{:?}", settled[14]);
    // The plainly new items went together, in the batch's own statement; fan-3's two went one by one, each in
    // a subtransaction of its own.
    assert_eq!(transactions_of(&app, &["fan-1", "fan-2"]).await, 1, "the new items were not written together");
    assert_eq!(transactions_of(&app, &["fan-1", "fan-2", "fan-3"]).await, 3, "an account twice went set-based");

    // Refused items wrote nothing; the lapsed order was expired to make room; the prices are the
    // allocations' (assert_invariants).
    for seat in [seats[5], seats[6], seats[7], seats[10], held_back[0]] {
        assert_eq!(app.active_orders_for_seat(seat).await, 0, "seat {seat}");
    }
    let lapsed_status: (String, Option<String>) =
        sqlx::query_as("SELECT status, cancel_reason FROM orders WHERE id = $1")
            .bind(lapsed)
            .fetch_one(&app.pool)
            .await
            .expect("lapsed");
    assert_eq!(lapsed_status, ("cancelled".into(), Some("expired".into())));
    app.assert_invariants().await;

    // Each new order has its key and exactly one outbox row, identical to the snapshot the other writers use.
    let new_orders: Vec<Uuid> = settled
        .iter()
        .filter_map(|s| match s {
            Ok(Checkout::Created(o)) => Some(o.id.0),
            _ => None,
        })
        .collect();
    assert_eq!(new_orders.len(), 7);
    let (events, faithful, keys): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE e.data = order_snapshot(e.order_id)),
                (SELECT count(*) FROM idempotency_keys k WHERE k.order_id = ANY ($1))
         FROM order_events e WHERE e.order_id = ANY ($1) AND e.kind = 'order.reserved'",
    )
    .bind(&new_orders)
    .fetch_one(&app.pool)
    .await
    .expect("outbox");
    assert_eq!((events, faithful, keys), (7, 7, 7));
    app.stop().await;
}

/// Waits until a backend running `query_like` waits for a lock.
async fn blocked(app: &TestApp, query_like: &str) -> bool {
    eventually(Duration::from_secs(10), async || {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
        )
        .bind(query_like)
        .fetch_one(&app.pool)
        .await
        .expect("pg_stat_activity");
        n > 0
    })
    .await
}

/// How many transactions wrote the accounts' orders.
async fn transactions_of(app: &TestApp, accounts: &[&str]) -> i64 {
    sqlx::query_scalar("SELECT count(DISTINCT xmin::text) FROM orders WHERE account_id = ANY($1)")
        .bind(accounts)
        .fetch_one(&app.pool)
        .await
        .expect("transactions")
}

#[sqlx::test(migrations = "../migrations")]
async fn a_batch_waits_for_the_checkouts_announced_before_it_went_and_only_for_those(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let cur = currency(&app).await;
    let seats = app.seats_on_sale().await;
    let order = |account: &str, seat: i64| new_order(app.event, &cur, account, &[seat], account);
    let spawn = |announced: booking::store::batcher::Announced, new: NewOrder| {
        tokio::spawn(async move { announced.checkout(new).await })
    };
    // A wait far longer than any checkout, so a batch that waited for nothing shows.
    let batcher = CheckoutBatcher::start(
        app.pool.clone(),
        None,
        BatchPolicy { max: 32, in_flight: 1, wait: Duration::from_secs(5) },
    );
    let at_most = Duration::from_secs(3);

    // Three requests enter the Redis gate together; one is through it. Its batch waits for the other two,
    // and all three are written in one transaction.
    let (a, b, c) = (batcher.announce(), batcher.announce(), batcher.announce());
    let first = spawn(a, order("fan-a", seats[0]));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!first.is_finished(), "the batch went without the two checkouts on their way");
    let others = [spawn(b, order("fan-b", seats[1])), spawn(c, order("fan-c", seats[2]))];
    let settled = tokio::time::timeout(at_most, join_all([first].into_iter().chain(others))).await.expect("settled");
    for s in &settled {
        created(s.as_ref().expect("join"));
    }
    assert_eq!(transactions_of(&app, &["fan-a", "fan-b", "fan-c"]).await, 1, "one batch");

    // A lone checkout with nothing on its way goes at once.
    let alone = tokio::time::timeout(at_most, batcher.checkout(order("fan-d", seats[3]))).await;
    created(&alone.expect("a lone checkout waited for company that was not coming"));

    // A checkout announced and then refused before Postgres (dropped) is no longer waited for.
    let (e, f) = (batcher.announce(), batcher.announce());
    let ready = spawn(e, order("fan-e", seats[4]));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!ready.is_finished(), "the batch went without the checkout on its way");
    drop(f);
    let settled = tokio::time::timeout(at_most, ready).await.expect("waited for a refused checkout");
    created(&settled.expect("join"));

    // One announced that never comes holds a batch back only for the wait.
    let batcher = CheckoutBatcher::start(
        app.pool.clone(),
        None,
        BatchPolicy { max: 32, in_flight: 1, wait: Duration::from_millis(300) },
    );
    let (g, _never) = (batcher.announce(), batcher.announce());
    let started = std::time::Instant::now();
    let settled = tokio::time::timeout(at_most, g.checkout(order("fan-g", seats[5]))).await.expect("waited too long");
    created(&settled);
    assert!(started.elapsed() >= Duration::from_millis(300), "the batch did not wait for the announced checkout");
    assert_eq!(app.order_count().await, 6);
    app.assert_invariants().await;
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_batch_that_fails_whole_is_settled_one_by_one(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let cur = currency(&app).await;
    let seats = app.seats_on_sale().await;
    let (w, x, y) = (seats[0], seats[1], seats[2]);
    // One batch at a time, so checkouts queue behind a busy one and go together.
    let batcher =
        CheckoutBatcher::start(app.pool.clone(), None, BatchPolicy { max: 32, in_flight: 1, wait: Duration::ZERO });
    // Two intruders' checkouts, not yet committed: Postgres sees their seats, the batch's checks cannot.
    let intrude = async |seat: i64| {
        let mut tx = app.pool.begin().await.expect("begin");
        sqlx::query(
            "SELECT * FROM checkout_order(gen_random_uuid(), $1, $2, gen_random_uuid(), $3, $4, 600, 8, 'k', 'f')",
        )
        .bind(app.event)
        .bind(format!("intruder-{seat}"))
        .bind(vec![seat])
        .bind(&cur)
        .execute(&mut *tx)
        .await
        .expect("intruder");
        tx
    };
    let on_w = intrude(w).await;
    let on_x = intrude(x).await;

    // A lone checkout of w takes the only slot and waits for the intruder on w.
    let z = tokio::spawn({
        let (b, n) = (batcher.clone(), new_order(app.event, &cur, "fan-z", &[w], "kz"));
        async move { b.checkout(n).await }
    });
    assert!(blocked(&app, "%checkout_order%").await, "the lone checkout never waited");
    let xy: Vec<_> = [("fan-x", x), ("fan-y", y)]
        .into_iter()
        .map(|(account, seat)| {
            let (b, n) = (batcher.clone(), new_order(app.event, &cur, account, &[seat], account));
            tokio::spawn(async move { b.checkout(n).await })
        })
        .collect();
    // The intruder on w gives up: z goes through, and x and y (queued meanwhile) go as one batch, which
    // waits for the intruder on x.
    on_w.rollback().await.expect("rollback");
    assert!(blocked(&app, "%checkout_batch%").await, "x and y never went as one batch");
    // The intruder on x commits: the batch statement fails whole, and x and y are settled one by one.
    on_x.commit().await.expect("commit");

    assert_eq!(created(&z.await.expect("z")).seats[0].0.0, w);
    let mut xy = join_all(xy).await.into_iter().map(|r| r.expect("join"));
    let (sx, sy) = (xy.next().expect("x"), xy.next().expect("y"));
    assert!(matches!(sx, Err(CheckoutError::SeatSold(SeatId(s))) if s == x), "{sx:?}");
    assert_eq!(created(&sy).seats[0].0.0, y);
    assert_eq!((app.active_orders_for_seat(x).await, app.active_orders_for_seat(y).await), (1, 1));
    let y_orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE account_id = 'fan-y'")
        .fetch_one(&app.pool)
        .await
        .expect("count");
    assert_eq!(y_orders, 1, "the failed batch wrote nothing; the retry wrote y once");
    app.assert_invariants().await;
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn forty_concurrent_checkouts_through_http_all_succeed(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    let seats = app.seats_on_sale().await;
    let fans: Vec<(String, i64)> = (0..40).map(|i| (format!("fan-{i}"), seats[i])).collect();
    let holds = join_all(fans.iter().map(|(f, s)| app.hold(f, std::slice::from_ref(s)))).await;
    assert!(holds.iter().all(|h| h.status == 201));
    let asks: Vec<(String, String)> =
        fans.iter().zip(&holds).map(|((f, _), h)| (h.str("hold_token"), format!("key-{f}"))).collect();
    let checkouts = join_all(fans.iter().zip(&asks).map(|((f, _), (token, key))| app.checkout(f, token, key))).await;
    let statuses: Vec<u16> = checkouts.iter().map(|r| r.status).collect();
    assert!(statuses.iter().all(|&s| s == 201), "statuses: {statuses:?}");
    for ((_, seat), r) in fans.iter().zip(&checkouts) {
        assert_eq!(r.body["seats"][0]["seat_id"], *seat, "{}", r.body);
    }
    let reserved: i64 = sqlx::query_scalar("SELECT count(*) FROM order_events WHERE kind = 'order.reserved'")
        .fetch_one(&app.pool)
        .await
        .expect("events");
    assert_eq!((app.order_count().await, reserved), (40, 40));
    // Redis knows every seat is sold, and every hold became an order.
    for ((_, seat), (token, _)) in fans.iter().zip(&asks) {
        assert_eq!(app.seat_value(*seat).await, Some(format!("sold:{token}")), "seat {seat}");
    }
    let records = app.redis_keys().await.into_iter().filter(|k| k.contains(":token:")).count();
    assert_eq!(records, 0, "every hold record was deleted when its order was marked");
    app.assert_invariants().await;
    app.stop().await;
}

/// How much of the order tables has been read so far (flushed from this connection first).
#[derive(Debug, Clone, Copy)]
struct Reads {
    /// Sequential scans of the order tables.
    seq_scans: i64,
    /// Index entries read from the order tables' indexes.
    index_entries: i64,
}

impl std::ops::Sub for Reads {
    type Output = Reads;
    fn sub(self, before: Reads) -> Reads {
        Reads { seq_scans: self.seq_scans - before.seq_scans, index_entries: self.index_entries - before.index_entries }
    }
}

async fn order_table_reads(conn: &mut sqlx::PgConnection) -> Reads {
    // Postgres 15 and later flush this connection's counters on demand. Before 15 a backend sends them to the
    // statistics collector at most every 500 ms, at the end of a statement: wait that out, then send them.
    if sqlx::query("SELECT pg_stat_force_next_flush()").execute(&mut *conn).await.is_err() {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        sqlx::query("SELECT pg_stat_clear_snapshot()").execute(&mut *conn).await.expect("send the counters");
    }
    let (seq_scans, index_entries): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT sum(seq_scan) FROM pg_stat_user_tables
                 WHERE relname IN ('orders', 'order_seats', 'idempotency_keys', 'order_events'))::bigint,
                (SELECT sum(idx_tup_read) FROM pg_stat_user_indexes
                 WHERE relname IN ('orders', 'order_seats', 'idempotency_keys', 'order_events'))::bigint",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("read counters");
    Reads { seq_scans, index_entries }
}

/// Asserts that a phase of `ops` operations scanned no order table whole and read at most `per_op` index
/// entries an operation: a lookup by the wrong index walks every seat sold (128 and more here), which is far
/// more. The bounds leave room over what each phase reads on Postgres 15 (3 to 19 an operation), since
/// versions may count entries a little differently; each lookup this test was written for read 31 to 160.
fn assert_looked_up(phase: &str, reads: Reads, ops: i64, per_op: i64) {
    assert_eq!(reads.seq_scans, 0, "{phase} scanned an order table whole ({} scans)", reads.seq_scans);
    assert!(
        reads.index_entries <= ops * per_op,
        "{phase} read {} index entries for {ops} operations (at most {per_op} each expected)",
        reads.index_entries
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn orders_are_looked_up_by_index_even_when_the_statistics_say_the_tables_are_empty(pool: PgPool) {
    // No booking server (its sweeper would query the same tables meanwhile): the store's functions on one
    // connection, so the cached plans and the scan counters are that connection's alone.
    let seeded =
        booking::seed::seed(&pool, &booking::seed::SeedOptions { seats: 500, sponsor_seats: 0, ..Default::default() })
            .await
            .expect("seed");
    let event = seeded.event_id;
    let one = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*pool.connect_options()).clone())
        .await
        .expect("one connection");
    let cur: String = sqlx::query_scalar("SELECT currency::text FROM events WHERE id = $1")
        .bind(event)
        .fetch_one(&one)
        .await
        .expect("currency");
    let seats: Vec<i64> =
        sqlx::query_scalar("SELECT seat_id FROM seat_allocations WHERE event_id = $1 ORDER BY seat_id LIMIT 200")
            .bind(event)
            .fetch_all(&one)
            .await
            .expect("seats");
    // Statistics of empty order tables: the plans made now are the ones a young database caches.
    sqlx::query("ANALYZE orders, order_seats, idempotency_keys, order_events").execute(&one).await.expect("analyse");
    let reads = || async { order_table_reads(&mut one.acquire().await.expect("conn")).await };
    let mut ids = Vec::new();

    // In batches of 16 (the set-based path and, for an account's later orders, the slow one), 128 seats sold.
    let before = reads().await;
    for (b, chunk) in seats[..128].chunks(16).enumerate() {
        let news: Vec<NewOrder> = chunk
            .iter()
            .enumerate()
            .map(|(i, &seat)| {
                new_order(event, &cur, &format!("fan-{}", (b * 16 + i) % 40), &[seat], &format!("b{b}-{i}"))
            })
            .collect();
        let settled = orders::checkout_batch(&one, &news).await.expect("batch");
        ids.extend(settled.iter().map(|s| created(s).id.0));
    }
    let batched = reads().await;
    assert_looked_up("checkouts in batches", batched - before, 128, 12);

    // Alone, with 128 seats of the event sold: each basket's seats are looked up, not the event's.
    for (i, &seat) in seats[128..132].iter().enumerate() {
        let new = new_order(event, &cur, &format!("solo-{i}"), &[seat], &format!("k{i}"));
        ids.push(created(&orders::checkout(&one, &new).await).id.0);
    }
    let alone = reads().await;
    assert_looked_up("checkouts alone", alone - batched, 4, 12);

    // The lifecycle's step, as payments and cancellations run it: 20 orders paid, 10 cancelled.
    for (i, id) in ids[..30].iter().enumerate() {
        let (to, reason) = if i < 20 { ("paid", None) } else { ("cancelled", Some("operator")) };
        let moved: bool = sqlx::query_scalar("SELECT transition_order($1, 'reserved', $2, $3, $4)")
            .bind(id)
            .bind(to)
            .bind(reason)
            .bind(format!("order.{to}"))
            .fetch_one(&one)
            .await
            .expect("transition");
        assert!(moved, "order {id} did not move to {to}");
    }
    let moved = reads().await;
    assert_looked_up("order transitions", moved - alone, 30, 20);

    // Unpaid orders past their deadline (moved by the test, outside the counts): 10 expired by the sweeper's
    // step, and 4 whose seats new checkouts take over (freeing them on the way).
    let (swept, stale) = (&ids[30..40], &ids[40..44]);
    for moved_back in [
        "UPDATE orders SET payment_due_at = now() - interval '1 second' WHERE id = ANY ($1)",
        "UPDATE order_seats SET expires_at = now() - interval '1 second' WHERE order_id = ANY ($1)",
    ] {
        sqlx::query(moved_back).bind(&ids[30..44]).execute(&one).await.expect("deadline");
    }
    let due = reads().await;
    for id in swept {
        let expired: bool =
            sqlx::query_scalar("SELECT expire_order($1)").bind(id).fetch_one(&one).await.expect("expire");
        assert!(expired, "order {id} did not expire");
    }
    let expired = reads().await;
    assert_looked_up("expiries", expired - due, 10, 20);
    for (i, &seat) in seats[40..44].iter().enumerate() {
        let new = new_order(event, &cur, &format!("late-{i}"), &[seat], &format!("late-{i}"));
        created(&orders::checkout(&one, &new).await);
    }
    let taken_over = reads().await;
    assert_looked_up("checkouts of seats in stale orders", taken_over - expired, 4, 48);
    let statuses: Vec<String> =
        sqlx::query_scalar("SELECT status || '/' || cancel_reason FROM orders WHERE id = ANY ($1) ORDER BY id")
            .bind(stale)
            .fetch_all(&one)
            .await
            .expect("statuses");
    assert_eq!(statuses, ["cancelled/expired"; 4], "the stale orders were freed on the way");

    // The outbox relay publishes every row written above, then finds nothing left. It publishes a row once no
    // transaction that began before it is open, anywhere on the server (the snapshot's xmin is the cluster's):
    // other tests' transactions may hold it back a moment, so it first waits for them.
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM order_events").fetch_one(&one).await.expect("events");
    let visible = eventually(Duration::from_secs(30), async || {
        sqlx::query_scalar::<_, bool>("SELECT max(txid) < pg_snapshot_xmin(pg_current_snapshot()) FROM order_events")
            .fetch_one(&one)
            .await
            .expect("xmin")
    })
    .await;
    assert!(visible, "a transaction stayed open for 30 s");
    let counted = reads().await;
    let mut conn = testkit::redis().await;
    let stream = outbox::Stream { key: format!("test-{}:outbox:orders", Uuid::new_v4()), max_len: 0 };
    let published = outbox::relay_batch(&one, &mut conn, &stream, 10_000, |_| {}).await.expect("relay");
    assert_eq!(published as i64, events);
    assert_eq!(outbox::relay_batch(&one, &mut conn, &stream, 10_000, |_| {}).await.expect("relay again"), 0);
    let relayed = reads().await;
    assert_looked_up("the outbox relay", relayed - counted, events, 8);
    let _: () = redis::cmd("DEL").arg(&stream.key).query_async(&mut conn).await.expect("drop the stream");
    one.close().await;
}
