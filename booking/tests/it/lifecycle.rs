//! The order lifecycle: payment webhooks (storms, out of order, late), the sweeper, operators' refunds and
//! cancellations, resale, and payment-window extension.

use std::collections::HashSet;
use std::time::Duration;

use futures::future::join_all;
use redis::AsyncCommands;
use reqwest::Method;
use serde_json::json;
use sqlx::PgPool;

use crate::app::TestApp;

#[sqlx::test(migrations = "../migrations")]
async fn a_webhook_storm_with_a_failure_out_of_order_makes_one_paid_transition(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    let seats = app.seats_on_sale().await;
    let (order, token) = app.reserve("fan-a", &seats[..2]).await;
    let ok = app.payment_event("evt_ok", "payment.succeeded", &order).await;
    // An earlier attempt that failed, delivered late, in the same storm.
    let failed = app.payment_event("evt_failed_first_attempt", "payment.failed", &order).await;
    let mut bodies = vec![ok.clone(); 5];
    bodies.push(failed.clone());
    bodies.push(failed);
    let answers = join_all(bodies.into_iter().map(|b| app.deliver(b))).await;
    assert!(answers.iter().all(|r| r.status == 200), "{:?}", answers.iter().map(|r| &r.body).collect::<Vec<_>>());
    let fresh_ok: Vec<_> = answers[..5].iter().filter(|r| r.body["duplicate"] == false).collect();
    assert_eq!(fresh_ok.len(), 1, "one delivery of evt_ok applies, four are duplicates");
    assert!(
        answers[..5].iter().all(|r| r.body["outcome"] == "paid"),
        "duplicates say what it did: {:?}",
        answers.iter().map(|r| &r.body).collect::<Vec<_>>()
    );

    let now = app.order("fan-a", &order).await;
    assert_eq!(now.str("status"), "paid", "{}", now.body);
    let events = app.order_events(&order).await;
    assert_eq!(events.iter().filter(|k| *k == "order.paid").count(), 1, "{events:?}");
    assert_eq!(events.first().map(String::as_str), Some("order.reserved"));
    // Whichever came first, the seats are the order's, for good, in both stores.
    for &seat in &seats[..2] {
        assert_eq!(app.active_orders_for_seat(seat).await, 1);
        assert_eq!(app.seat_value(seat).await, Some(format!("sold:{token}")));
        let key = app.seat_key(seat);
        let ttl: i64 = app.redis.pttl(key).await.expect("PTTL");
        assert_eq!(ttl, -1, "a paid seat's marker never lapses");
    }
    let applied: i64 =
        sqlx::query_scalar("SELECT count(*) FROM payment_events").fetch_one(&app.pool).await.expect("count");
    assert_eq!(applied, 2, "each event id recorded once");
    app.assert_invariants().await;
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_failure_delivered_after_the_success_changes_nothing(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let seat = app.seats_on_sale().await[3];
    let (order, _) = app.reserve("fan-a", &[seat]).await;
    assert_eq!(app.pay(&order, "payment.succeeded").await.body["outcome"], "paid");
    let late = app.pay(&order, "payment.failed").await;
    assert_eq!((late.status, late.body["outcome"].as_str()), (200, Some("ignored")), "{}", late.body);
    assert_eq!(app.order("fan-a", &order).await.str("status"), "paid");
    assert_eq!(app.order_events(&order).await, ["order.reserved", "order.paid"]);
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn bad_signatures_unknown_orders_and_wrong_amounts_are_refused_and_change_nothing(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let seat = app.seats_on_sale().await[0];
    let (order, _) = app.reserve("fan-a", &[seat]).await;
    let body = app.payment_event("evt_1", "payment.succeeded", &order).await;
    let now = i64::try_from(tokens::unix_now()).expect("time");
    let sign = |secret: &str, t: i64, b: &[u8]| booking::provider::signature::sign(secret.as_bytes(), t, b);

    let signed = sign(crate::app::WEBHOOK_SECRET, now, &body);
    let v1 = signed.split_once("v1=").map(|(_, v)| v.to_owned()).expect("v1");
    // The probe that cost booking a full MAC per value: 100 KB of signatures is refused before any is computed.
    let flood = format!("t={now}{}", format!(",v1={v1}").repeat(1500));
    let mut changed = body.clone();
    changed.push(b' ');
    let cases: Vec<(Vec<u8>, Option<String>, u16, &str)> = vec![
        (body.clone(), None, 401, "signature_missing"),
        (body.clone(), Some("v1=abc".into()), 401, "signature_malformed"),
        (body.clone(), Some(flood), 401, "signature_malformed"),
        (body.clone(), Some(sign("not-the-secret", now, &body)), 401, "signature_mismatch"),
        (changed, Some(signed.clone()), 401, "signature_mismatch"),
        (body.clone(), Some(sign(crate::app::WEBHOOK_SECRET, now - 3600, &body)), 401, "signature_stale"),
        // Near i64::MIN the distance to now wrapped (release) or panicked (debug).
        (body.clone(), Some(sign(crate::app::WEBHOOK_SECRET, i64::MIN + 5, &body)), 401, "signature_stale"),
        (b"{not json".to_vec(), Some(sign(crate::app::WEBHOOK_SECRET, now, b"{not json")), 422, "invalid_event"),
    ];
    for (b, sig, status, code) in cases {
        let r = app.deliver_signed(b, sig).await;
        assert_eq!((r.status, r.code()), (status, code), "{}", r.body);
    }
    // Signed, but for an order nobody has.
    let mut nobody: serde_json::Value = serde_json::from_slice(&body).expect("json");
    nobody["data"]["order_id"] = json!(uuid::Uuid::new_v4());
    let unknown = app.deliver(serde_json::to_vec(&nobody).expect("json")).await;
    assert_eq!((unknown.status, unknown.code()), (404, "order_not_found"));
    // Signed, for the order, with another amount.
    let mut wrong: serde_json::Value = serde_json::from_slice(&body).expect("json");
    wrong["data"]["amount_cents"] = json!(1);
    let r = app.deliver(serde_json::to_vec(&wrong).expect("json")).await;
    assert_eq!((r.status, r.code()), (422, "amount_mismatch"));
    // Signed, for the order and its amount, naming a payment booking never opened for it.
    let mut forged: serde_json::Value = serde_json::from_slice(&body).expect("json");
    forged["data"]["payment_id"] = json!("pay_someone_elses");
    let r = app.deliver(serde_json::to_vec(&forged).expect("json")).await;
    assert_eq!((r.status, r.code()), (422, "payment_mismatch"), "{}", r.body);

    assert_eq!(app.order("fan-a", &order).await.str("status"), "reserved");
    let applied: i64 =
        sqlx::query_scalar("SELECT count(*) FROM payment_events").fetch_one(&app.pool).await.expect("count");
    assert_eq!(applied, 0);
    assert_eq!(app.order_events(&order).await, ["order.reserved"]);
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_late_payment_completes_the_order_when_its_seats_are_still_free(pool: PgPool) {
    let mut app = TestApp::spawn_with(pool, &["--sweep-interval-ms", "0"]).await;
    let seats = app.seats_on_sale().await;
    let (order, token) = app.reserve("fan-a", &seats[..2]).await;
    app.pass_deadline(&order).await;
    let seen = app.order("fan-a", &order).await;
    assert_eq!((seen.str("status"), seen.str("cancel_reason")), ("cancelled".into(), "expired".into()));
    assert_eq!(booking::store::lifecycle::sweep(&app.pool, 100, &[]).await.expect("sweep"), 1);

    let late = app.pay(&order, "payment.succeeded").await;
    assert_eq!((late.status, late.body["outcome"].as_str()), (200, Some("paid")), "{}", late.body);
    assert_eq!(app.order("fan-a", &order).await.str("status"), "paid");
    assert_eq!(app.order_events(&order).await, ["order.reserved", "order.cancelled", "order.paid"]);
    for &seat in &seats[..2] {
        assert_eq!(app.active_orders_for_seat(seat).await, 1);
        assert_eq!(app.seat_value(seat).await, Some(format!("sold:{token}")), "Redis marks the seat sold again");
    }
    let refused = app.hold("fan-b", &seats[..1]).await;
    assert_eq!(refused.status, 409);
    app.assert_invariants().await;
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_late_payment_after_the_seats_resold_is_refund_due_never_a_second_sale(pool: PgPool) {
    let mut app = TestApp::spawn_with(pool, &["--sweep-interval-ms", "0"]).await;
    let seats = app.seats_on_sale().await;
    let (first, _) = app.reserve("fan-a", &seats[..2]).await;
    app.pass_deadline(&first).await;
    // No sweeper ran: the deadline alone lets fan-b buy one of the seats.
    let (second, _) = app.reserve("fan-b", &seats[1..3]).await;
    assert_eq!(app.order_events(&first).await, ["order.reserved", "order.cancelled"], "freed by the checkout");

    let late = app.pay(&first, "payment.succeeded").await;
    assert_eq!((late.status, late.body["outcome"].as_str()), (200, Some("refund_due")), "{}", late.body);
    assert_eq!(app.order("fan-a", &first).await.str("status"), "refund_due");
    assert_eq!(app.order("fan-b", &second).await.str("status"), "reserved");
    for &seat in &seats[..3] {
        let want = i64::from(seat != seats[0]);
        assert_eq!(app.active_orders_for_seat(seat).await, want, "seat {seat}");
    }
    // The operator settles it.
    let refunded = app.admin(Method::POST, &format!("/admin/orders/{first}/refund")).await;
    assert_eq!(refunded.status, 200, "{}", refunded.body);
    assert_eq!(refunded.body["order"]["status"], "refunded");
    let kinds: Vec<&str> =
        refunded.body["history"].as_array().expect("history").iter().filter_map(|h| h["kind"].as_str()).collect();
    assert_eq!(kinds, ["order.reserved", "order.cancelled", "order.refund_due", "order.refunded"]);
    app.assert_invariants().await;
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_late_payment_never_takes_a_seat_from_under_another_fan_s_live_hold(pool: PgPool) {
    // The attack: paying an expired order late re-sold its seats on Postgres's word alone, taking one from under
    // another fan's live hold (whose checkout then got 409 hold_expired). Redis is asked first now, as a
    // checkout's hold would be.
    let mut app = TestApp::spawn_with(pool, &["--sweep-interval-ms", "0"]).await;
    let seats = app.seats_on_sale().await;
    let (order, token) = app.reserve("fan-a", &seats[..2]).await;
    app.pass_deadline(&order).await;
    let held = app.hold("fan-b", &seats[1..2]).await;
    assert_eq!(held.status, 201, "{}", held.body);
    let late = app.pay(&order, "payment.succeeded").await;
    assert_eq!((late.status, late.body["outcome"].as_str()), (200, Some("refund_due")), "{}", late.body);
    // Nothing of the order's claim is left: its other seat is free again, in Redis and in Postgres.
    assert_ne!(app.seat_value(seats[0]).await, Some(format!("sold:{token}")));
    assert_eq!(app.active_orders_for_seat(seats[0]).await, 0);
    assert_eq!(app.hold("fan-c", &seats[..1]).await.status, 201, "the order's other seat is on sale");
    let checkout = app.checkout("fan-b", &held.str("hold_token"), "late-1").await;
    assert_eq!(checkout.status, 201, "the fan who held the seat buys it: {}", checkout.body);
    app.assert_invariants().await;
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_late_payment_is_held_to_the_account_s_cap_as_a_checkout_is(pool: PgPool) {
    // The attack: an account paid an expired order late after buying more seats, and ended with 10 paid seats
    // against a cap of 8.
    let mut app = TestApp::spawn_with(pool, &["--max-seats-per-account", "4", "--sweep-interval-ms", "0"]).await;
    let seats = app.seats_on_sale().await;
    let (first, token) = app.reserve("fan-a", &seats[..2]).await;
    app.pass_deadline(&first).await;
    let (second, _) = app.reserve("fan-a", &seats[2..5]).await;
    assert_eq!(app.pay(&second, "payment.succeeded").await.body["outcome"], "paid");
    let late = app.pay(&first, "payment.succeeded").await;
    assert_eq!((late.status, late.body["outcome"].as_str()), (200, Some("refund_due")), "{}", late.body);
    let paid: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders o JOIN order_seats os ON os.order_id = o.id
         WHERE o.account_id = 'fan-a' AND o.status = 'paid' AND os.active",
    )
    .fetch_one(&app.pool)
    .await
    .expect("count");
    assert_eq!(paid, 3, "the account keeps what its cap allows");
    for &seat in &seats[..2] {
        assert_ne!(app.seat_value(seat).await, Some(format!("sold:{token}")), "the claim was given back");
        assert_eq!(app.active_orders_for_seat(seat).await, 0);
    }
    app.assert_invariants().await;
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn two_sweepers_at_once_expire_each_order_exactly_once(pool: PgPool) {
    let mut app = TestApp::spawn_with(pool, &["--sweep-interval-ms", "0"]).await;
    let seats = app.seats_on_sale().await;
    let mut orders = Vec::new();
    for (i, &seat) in seats.iter().take(24).enumerate() {
        let (order, _) = app.reserve(&format!("fan-{i}"), &[seat]).await;
        orders.push(order);
    }
    for order in &orders {
        app.pass_deadline(order).await;
    }
    // Two sweepers, each on its own connection, in small batches so they meet on the same rows.
    let sweeper = |pool: PgPool| async move {
        let mut total = 0;
        for _ in 0..50 {
            let n = booking::store::lifecycle::sweep(&pool, 3, &[]).await.expect("sweep");
            total += n;
            if n == 0 {
                break;
            }
        }
        total
    };
    let counts = join_all([sweeper(app.pool.clone()), sweeper(app.pool.clone())]).await;
    assert_eq!(counts.iter().sum::<u64>(), 24, "together they expired every order once: {counts:?}");
    for order in &orders {
        assert_eq!(app.order_events(order).await, ["order.reserved", "order.cancelled"], "order {order}");
    }
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM order_seats WHERE active").fetch_one(&app.pool).await.expect("count");
    assert_eq!(left, 0);
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn the_running_sweeper_cancels_an_unpaid_order_past_its_deadline(pool: PgPool) {
    let mut app = TestApp::spawn_with(pool, &["--sweep-interval-ms", "100"]).await;
    let seat = app.seats_on_sale().await[7];
    let (order, _) = app.reserve("fan-a", &[seat]).await;
    app.pass_deadline(&order).await;
    crate::app::eventually(Duration::from_secs(5), async || app.order_events(&order).await.len() >= 2).await;
    assert_eq!(app.order_events(&order).await, ["order.reserved", "order.cancelled"]);
    let status: String = sqlx::query_scalar("SELECT status FROM orders WHERE id = $1::uuid")
        .bind(&order)
        .fetch_one(&app.pool)
        .await
        .expect("status");
    assert_eq!(status, "cancelled");
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn an_operator_cancels_a_paid_order_and_its_seats_resell(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let seats = app.seats_on_sale().await;
    let (order, _) = app.reserve("fan-a", &seats[10..12]).await;
    assert_eq!(app.pay(&order, "payment.succeeded").await.body["outcome"], "paid");
    assert_eq!(app.hold("fan-b", &seats[10..11]).await.status, 409, "sold");

    let cancelled = app.admin(Method::POST, &format!("/admin/orders/{order}/cancel")).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    assert_eq!(cancelled.body["order"]["status"], "refund_due", "a paid order cancelled owes its money back");
    let again = app.admin(Method::POST, &format!("/admin/orders/{order}/cancel")).await;
    assert_eq!((again.status, again.code()), (409, "order_not_cancellable"));

    // Resale works: the seats are free in Redis and in Postgres.
    let (resold, _) = app.reserve("fan-b", &seats[10..12]).await;
    assert_eq!(app.pay(&resold, "payment.succeeded").await.body["outcome"], "paid");
    assert_eq!(app.admin(Method::POST, &format!("/admin/orders/{order}/refund")).await.status, 200);
    let summary = app.admin(Method::GET, &format!("/admin/events/{}/orders", app.event)).await;
    assert_eq!(summary.status, 200, "{}", summary.body);
    let by_status: Vec<(String, i64)> = summary.body["by_status"]
        .as_array()
        .expect("by_status")
        .iter()
        .map(|c| (c["status"].as_str().unwrap_or_default().to_owned(), c["orders"].as_i64().unwrap_or(-1)))
        .collect();
    assert_eq!(by_status, [("paid".to_owned(), 1), ("refunded".to_owned(), 1)]);
    app.assert_invariants().await;
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn an_operator_cancels_a_reserved_order_and_a_payment_after_that_is_refund_due(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let seat = app.seats_on_sale().await[20];
    let (order, _) = app.reserve("fan-a", &[seat]).await;
    let r = app.admin(Method::POST, &format!("/admin/orders/{order}/cancel")).await;
    assert_eq!(
        (r.body["order"]["status"].as_str(), r.body["order"]["cancel_reason"].as_str()),
        (Some("cancelled"), Some("operator"))
    );
    assert_eq!(app.hold("fan-b", &[seat]).await.status, 201, "back on sale at once");
    let late = app.pay(&order, "payment.succeeded").await;
    assert_eq!(late.body["outcome"], "refund_due", "{}", late.body);
    assert_eq!(app.active_orders_for_seat(seat).await, 0);
    let refuse = app.admin(Method::POST, &format!("/admin/orders/{order}/cancel")).await;
    assert_eq!((refuse.status, refuse.code()), (409, "order_not_cancellable"));
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn operator_routes_need_the_admin_token(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let seat = app.seats_on_sale().await[0];
    let (order, _) = app.reserve("fan-a", &[seat]).await;
    let path = format!("/admin/orders/{order}/refund");
    let none = app.send(app.client.post(app.url(&path))).await;
    assert_eq!((none.status, none.code()), (401, "admin_token_invalid"));
    let wrong = app.send(app.client.post(app.url(&path)).bearer_auth("admin-integration-test-token-0002")).await;
    assert_eq!((wrong.status, wrong.code()), (401, "admin_token_invalid"));
    // An admission proof is not an operator's token.
    let fan = app.send(app.client.post(app.url(&path)).bearer_auth(app.proof("fan-a"))).await;
    assert_eq!(fan.status, 401);
    let not_paid = app.admin(Method::POST, &path).await;
    assert_eq!((not_paid.status, not_paid.code()), (409, "order_not_refundable"));
    assert_eq!(app.admin(Method::GET, "/admin/orders/not-a-uuid").await.code(), "invalid_order_id");
    assert_eq!(app.order_events(&order).await, ["order.reserved"]);
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn paying_through_the_provider_is_real_http_both_ways(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let seat = app.seats_on_sale().await[30];
    let (order, _) = app.reserve("fan-a", &[seat]).await;
    let started = app.start_payment("fan-a", &order).await;
    assert_eq!(started.status, 201, "{}", started.body);
    let again = app.start_payment("fan-a", &order).await;
    assert_eq!(again.str("payment_id"), started.str("payment_id"), "one payment per order");
    assert_eq!(app.start_payment("fan-b", &order).await.status, 404, "another account's order is not found");

    // The payment's id alone (which the fan's order shows) pays nothing, nor does a wrong token.
    let by_id = format!("{}/v1/payments/{}/complete", app.provider, started.str("payment_id"));
    for url in [by_id.clone(), format!("{by_id}?token=00000000000000000000000000000000")] {
        let refused = app.send(app.client.post(url).json(&json!({"outcome": "succeeded"}))).await;
        assert_eq!((refused.status, refused.code()), (404, "unknown_payment"));
    }
    assert_eq!(app.order("fan-a", &order).await.str("status"), "reserved");
    // The fan pays on the provider's page; the provider calls booking back, signed.
    let paid = app.send(app.client.post(started.str("pay_url")).json(&json!({"outcome": "succeeded"}))).await;
    assert_eq!(paid.body["delivered"], true, "{}", paid.body);
    assert_eq!(paid.body["webhook_answer"]["outcome"], "paid");
    let seen = app.order("fan-a", &order).await;
    assert_eq!((seen.str("status"), seen.str("payment_id")), ("paid".into(), started.str("payment_id")));
    assert!(!seen.str("paid_at").is_empty());

    // The provider redelivers the same event, for its account holder only: nothing changes.
    let url = format!("{}/v1/payments/{}/redeliver", app.provider, started.str("payment_id"));
    assert_eq!(app.send(app.client.post(&url)).await.status, 401);
    let redelivered = app.send(app.client.post(url).bearer_auth(crate::app::WEBHOOK_SECRET)).await;
    assert_eq!(redelivered.body["webhook_answer"]["duplicate"], true, "{}", redelivered.body);
    assert_eq!(app.order_events(&order).await, ["order.reserved", "order.paid"]);
    let late = app.start_payment("fan-a", &order).await;
    assert_eq!((late.status, late.code()), (409, "order_not_reserved"));
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn the_provider_s_checkout_page_is_no_open_redirect_runs_no_inline_script_and_is_never_framed(pool: PgPool) {
    // The attack: `?return=` sent the buyer anywhere, the page could be framed and allowed inline script, and
    // the payment id alone paid or redelivered.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let provider = format!("http://{}", listener.local_addr().expect("addr"));
    let app = TestApp::spawn_with(pool, &["--payment-provider-url", &provider]).await;
    let options = booking::provider::Options {
        attempts: 1,
        return_origins: vec!["https://tickets.example".into()],
        ..Default::default()
    };
    let router =
        booking::provider::router_with(crate::app::WEBHOOK_SECRET.as_bytes(), &app.url("/webhooks/payments"), options);
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let seat = app.seats_on_sale().await[9];
    let (order, _) = app.reserve("fan-a", &[seat]).await;
    let started = app.start_payment("fan-a", &order).await;
    let checkout = started.str("checkout_url");
    let page = |back: &str| {
        let url = format!("{checkout}&return={}", back.replace('&', "%26").replace('#', "%23"));
        let client = app.client.clone();
        async move { client.get(url).send().await.expect("the page") }
    };
    let shown = page("https://tickets.example/events/1/buy?order=1").await;
    assert_eq!(shown.status(), 200);
    let policy = shown.headers()["content-security-policy"].to_str().expect("ascii").to_owned();
    assert!(policy.contains("frame-ancestors 'none'") && policy.contains("script-src 'self'"), "{policy}");
    assert!(!policy.contains("unsafe-inline"), "{policy}");
    assert_eq!(shown.headers()["x-frame-options"], "DENY");
    let html = shown.text().await.expect("html");
    assert!(html.contains(r#"data-return="https://tickets.example/events/1/buy?order=1""#), "{html}");
    assert!(!html.contains("<script>") && !html.contains("<style>"), "no inline script or style");
    for elsewhere in [
        "https://evil.example/phish",
        "https://tickets.example.evil.example/x",
        "https://tickets.example@evil.example/x",
        "javascript:alert(1)",
        "//evil.example/x",
    ] {
        let html = page(elsewhere).await.text().await.expect("html");
        assert!(html.contains(r#"data-return="""#), "{elsewhere} is not a way back: {html}");
    }
    // Without its pay token the page is as unknown as a payment that does not exist.
    let bare = checkout.split('?').next().unwrap_or_default().to_owned();
    assert_eq!(app.client.get(bare).send().await.expect("answer").status(), 404);
    let script = app.client.get(format!("{provider}/v1/checkout.js")).send().await.expect("script");
    assert_eq!(script.status(), 200);
    server.abort();
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn the_payment_window_extends_up_to_its_cap_and_redis_follows(pool: PgPool) {
    let mut app = TestApp::spawn_with(pool, &["--payment-window-seconds", "2", "--payment-max-seconds", "3"]).await;
    let seat = app.seats_on_sale().await[40];
    let (order, token) = app.reserve("fan-a", &[seat]).await;
    let key = app.seat_key(seat);
    let before: i64 = app.redis.pttl(&key).await.expect("PTTL");
    assert!((1..=2_100).contains(&before), "the marker lapses with the deadline: {before} ms");
    let due = app.order("fan-a", &order).await.str("payment_due_at");
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    let extended = app.extend_order("fan-a", &order).await;
    assert_eq!(extended.status, 200, "{}", extended.body);
    assert!(extended.str("payment_due_at") > due, "{} > {due}", extended.str("payment_due_at"));
    let after: i64 = app.redis.pttl(&key).await.expect("PTTL");
    assert!(after > 1_000 && after <= 1_900, "now + 2 s capped at creation + 3 s: {after} ms");
    assert_eq!(app.seat_value(seat).await, Some(format!("sold:{token}")));
    let capped = app.extend_order("fan-a", &order).await;
    assert_eq!((capped.status, capped.code()), (409, "payment_window_at_cap"));
    assert_eq!(app.extend_order("fan-b", &order).await.status, 404);
    assert_eq!(app.order_events(&order).await, ["order.reserved", "order.extended"]);
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn an_order_past_its_deadline_frees_its_seats_in_the_map_and_the_count(pool: PgPool) {
    let mut app = TestApp::spawn_with(pool, &["--sweep-interval-ms", "0"]).await;
    let seats = app.seats_on_sale().await;
    let (order, _) = app.reserve("fan-a", &seats[..3]).await;
    let sold = |map: &serde_json::Value| -> HashSet<i64> {
        map["seats"]
            .as_array()
            .expect("seats")
            .iter()
            .filter(|s| s["status"] == "sold")
            .filter_map(|s| s["seat_id"].as_i64())
            .collect()
    };
    assert_eq!(sold(&app.seat_map("fan-c").await.body).len(), 3);
    app.pass_deadline(&order).await;
    assert!(sold(&app.seat_map("fan-c").await.body).is_empty(), "no sweeper ran, yet the seats are on sale");
    let availability = app
        .send(app.client.get(app.url(&format!("/events/{}/availability", app.event))).bearer_auth(app.proof("fan-c")))
        .await;
    assert_eq!(availability.body["seats_sold"], 0, "{}", availability.body);
    app.stop().await;
}

/// The sweep cancels an order whose fan started paying only once the provider was asked about it. Before, the
/// sweeper listed the due orders with a payment, asked about them, then cancelled every due order: one whose
/// deadline passed in between was cancelled unasked, and a payment whose webhook was lost stayed lost (the test
/// below failed that way once, under load).
#[sqlx::test(migrations = "../migrations")]
async fn the_sweep_cancels_an_order_with_a_payment_only_after_the_provider_was_asked(pool: PgPool) {
    let mut app = TestApp::spawn_with(pool, &["--sweep-interval-ms", "0"]).await;
    let seats = app.seats_on_sale().await;
    let (paying, _) = app.reserve("fan-a", &seats[..1]).await;
    let (idle, _) = app.reserve("fan-b", &seats[1..2]).await;
    assert_eq!(app.start_payment("fan-a", &paying).await.status, 201);
    app.pass_deadline(&paying).await;
    app.pass_deadline(&idle).await;
    let stored = async |id: &str| -> String {
        sqlx::query_scalar("SELECT status FROM orders WHERE id = $1::uuid")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .expect("status")
    };

    // Not asked about: only the order without a payment is cancelled.
    assert_eq!(booking::store::lifecycle::sweep(&app.pool, 100, &[]).await.expect("sweep"), 1);
    assert_eq!((stored(&paying).await, stored(&idle).await), ("reserved".into(), "cancelled".into()));
    // Asked about (and not paid): cancelled.
    let asked = [booking::domain::OrderId(paying.parse().expect("uuid"))];
    assert_eq!(booking::store::lifecycle::sweep(&app.pool, 100, &asked).await.expect("sweep"), 1);
    assert_eq!(stored(&paying).await, "cancelled");
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn the_sweeper_asks_the_provider_and_a_payment_whose_webhook_was_lost_is_paid_not_cancelled(pool: PgPool) {
    // The provider cannot reach booking: every delivery fails (connection refused on the discard port).
    let mut app = TestApp::spawn_with(
        pool,
        &["--payment-webhook-url", "http://127.0.0.1:9/webhooks/payments", "--sweep-interval-ms", "100"],
    )
    .await;
    let seats = app.seats_on_sale().await;
    let (paid, token) = app.reserve("fan-a", &seats[50..52]).await;
    let (unpaid, _) = app.reserve("fan-b", &seats[52..53]).await;
    let started = app.start_payment("fan-a", &paid).await;
    assert_eq!(app.start_payment("fan-b", &unpaid).await.status, 201, "fan-b opens a payment and never pays");
    let sent = app.send(app.client.post(started.str("pay_url")).json(&json!({"outcome": "succeeded"}))).await;
    assert_eq!(sent.body["delivered"], false, "the webhook was lost: {}", sent.body);
    assert_eq!(app.order("fan-a", &paid).await.str("status"), "reserved");

    app.pass_deadline(&paid).await;
    app.pass_deadline(&unpaid).await;
    let settled = crate::app::eventually(Duration::from_secs(10), async || {
        app.order_events(&paid).await.len() >= 2 && app.order_events(&unpaid).await.len() >= 2
    })
    .await;
    assert!(settled, "the sweeper settled both orders");
    assert_eq!(app.order_events(&paid).await, ["order.reserved", "order.paid"], "paid, never cancelled");
    assert_eq!(app.order_events(&unpaid).await, ["order.reserved", "order.cancelled"]);
    let recorded: Vec<String> =
        sqlx::query_scalar("SELECT id FROM payment_events").fetch_all(&app.pool).await.expect("payment events");
    assert_eq!(recorded, [format!("reconcile:{}", started.str("payment_id"))]);
    for &seat in &seats[50..52] {
        assert_eq!(app.seat_value(seat).await, Some(format!("sold:{token}")), "Redis marks the seats sold again");
        assert_eq!(app.active_orders_for_seat(seat).await, 1);
    }
    assert_eq!(app.hold("fan-c", &seats[52..53]).await.status, 201, "the unpaid order's seat is back on sale");
    app.assert_invariants().await;
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn with_the_provider_down_payments_cannot_open_and_due_orders_still_expire(pool: PgPool) {
    let mut app =
        TestApp::spawn_with(pool, &["--payment-provider-url", "http://127.0.0.1:9", "--sweep-interval-ms", "100"])
            .await;
    let seat = app.seats_on_sale().await[60];
    let (order, _) = app.reserve("fan-a", &[seat]).await;
    let refused = app.start_payment("fan-a", &order).await;
    assert_eq!((refused.status, refused.code()), (503, "payment_provider_unavailable"), "{}", refused.body);
    assert!(refused.headers.contains_key("retry-after"));
    // A payment opened while the provider was still up.
    sqlx::query("UPDATE orders SET payment_id = 'pay_opened_earlier' WHERE id = $1::uuid")
        .bind(&order)
        .execute(&app.pool)
        .await
        .expect("attach");
    app.pass_deadline(&order).await;
    let expired =
        crate::app::eventually(Duration::from_secs(10), async || app.order_events(&order).await.len() >= 2).await;
    assert!(expired, "the deadline decides even when the provider cannot be asked");
    assert_eq!(app.order_events(&order).await, ["order.reserved", "order.cancelled"]);
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn the_sweeper_repairs_redis_when_a_commit_s_follow_up_never_ran(pool: PgPool) {
    let mut app = TestApp::spawn_with(pool, &["--sweep-interval-ms", "100"]).await;
    let seats = app.seats_on_sale().await;
    let (refunded, _) = app.reserve("fan-a", &seats[70..71]).await;
    assert_eq!(app.pay(&refunded, "payment.succeeded").await.body["outcome"], "paid");
    let (paid, token) = app.reserve("fan-b", &seats[71..72]).await;
    // Two commits after which booking dies before it tells Redis: a refund (the paid marker, which never
    // lapses, stays) and a payment (the reserved marker lapses at the deadline, here at once).
    for (order, from, to) in [(&refunded, "paid", "refunded"), (&paid, "reserved", "paid")] {
        let moved: bool = sqlx::query_scalar("SELECT transition_order($1::uuid, $2, $3, NULL, 'order.' || $3)")
            .bind(order)
            .bind(from)
            .bind(to)
            .fetch_one(&app.pool)
            .await
            .expect("a change in Postgres only");
        assert!(moved);
    }
    let key = app.seat_key(seats[71]);
    let _: () = app.redis.del(&key).await.expect("the reserved marker lapses");

    let back =
        crate::app::eventually(Duration::from_secs(10), async || app.hold("fan-c", &seats[70..71]).await.status == 201)
            .await;
    assert!(back, "the sweeper put the refunded seat back on sale in Redis");
    let marked = crate::app::eventually(Duration::from_secs(10), async || {
        app.seat_value(seats[71]).await == Some(format!("sold:{token}"))
    })
    .await;
    assert!(marked, "the sweeper marked the paid seat sold again");
    let ttl: i64 = app.redis.pttl(&key).await.expect("PTTL");
    assert_eq!(ttl, -1, "for good");
    app.assert_invariants().await;
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn the_provider_opens_payments_only_for_booking_and_calls_back_only_booking(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let seat = app.seats_on_sale().await[5];
    let (order, _) = app.reserve("fan-a", &[seat]).await;
    let url = format!("{}/v1/payments", app.provider);
    let new = |webhook_url: &str| json!({"order_id": order, "amount_cents": 100, "currency": "EUR", "webhook_url": webhook_url});
    let ours = app.url("/webhooks/payments");
    // Whoever knows an order id cannot learn its payment (and so pay or fail it) without the account's secret.
    let anonymous = app.send(app.client.post(&url).json(&new(&ours))).await;
    assert_eq!((anonymous.status, anonymous.code()), (401, "unauthenticated"), "{}", anonymous.body);
    let guessed = app.send(app.client.post(&url).bearer_auth("not-the-secret").json(&new(&ours))).await;
    assert_eq!((guessed.status, guessed.code()), (401, "unauthenticated"));
    // The account holder cannot aim the provider's signed POSTs elsewhere either.
    let elsewhere = app.client.post(&url).bearer_auth(crate::app::WEBHOOK_SECRET).json(&new("http://127.0.0.1:9/x"));
    let elsewhere = app.send(elsewhere).await;
    assert_eq!((elsewhere.status, elsewhere.code()), (422, "webhook_url_refused"), "{}", elsewhere.body);
    // Booking's own request, through its client, opens the payment.
    let started = app.start_payment("fan-a", &order).await;
    assert_eq!(started.status, 201, "{}", started.body);
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_provider_that_settles_by_itself_pays_the_order_with_nobody_pressing_pay(pool: PgPool) {
    // The provider is bound first, so booking can be told where it is; it learns booking's webhook URL after.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let provider = format!("http://{}", listener.local_addr().expect("addr"));
    let app = TestApp::spawn_with(pool, &["--payment-provider-url", &provider]).await;
    let options = booking::provider::Options {
        attempts: 3,
        auto_settle: Some(std::time::Duration::from_millis(100)),
        ..Default::default()
    };
    let settling =
        booking::provider::router_with(crate::app::WEBHOOK_SECRET.as_bytes(), &app.url("/webhooks/payments"), options);
    let server = tokio::spawn(async move { axum::serve(listener, settling).await });
    let seat = app.seats_on_sale().await[7];
    let (order, _) = app.reserve("fan-a", &[seat]).await;
    let started = app.start_payment("fan-a", &order).await;
    assert_eq!(started.status, 201, "{}", started.body);
    let paid =
        testkit::eventually(Duration::from_secs(5), async || app.order("fan-a", &order).await.str("status") == "paid");
    assert!(paid.await, "the order is paid without anybody completing the payment");
    let seen = app.order("fan-a", &order).await;
    assert_eq!(seen.str("payment_id"), started.str("payment_id"));
    assert_eq!(app.order_events(&order).await, ["order.reserved", "order.paid"]);
    server.abort();
    app.stop().await;
}

/// Availability tells apart the seats that may come back: held ones (until the hold's end) and ones awaiting
/// payment (until the payment window's end); a paid seat is neither.
#[sqlx::test(migrations = "../migrations")]
async fn availability_says_which_seats_may_come_back_and_when(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let seats = app.seats_on_sale().await;
    let availability = || async {
        let url = app.url(&format!("/events/{}/availability", app.event));
        let res = app.send(app.client.get(url).bearer_auth(app.proof("fan-z"))).await;
        assert_eq!(res.status, 200, "{}", res.body);
        res.body
    };
    let at = |v: &serde_json::Value| {
        let raw = v.as_str().unwrap_or_else(|| panic!("an instant: {v}"));
        time::OffsetDateTime::parse(raw, &time::format_description::well_known::Rfc3339).expect("RFC 3339")
    };
    let none = availability().await;
    assert_eq!((none["seats_held"].as_u64(), none["seats_awaiting_payment"].as_u64()), (Some(0), Some(0)));
    assert!(none.get("next_release_at").is_none(), "nothing can come back: {none}");

    let hold = app.hold("fan-a", &seats[..2]).await;
    assert_eq!(hold.status, 201, "{}", hold.body);
    let held = availability().await;
    assert_eq!((held["seats_held"].as_u64(), held["seats_awaiting_payment"].as_u64()), (Some(2), Some(0)));
    let gap = at(&held["next_release_at"]) - at(&hold.body["expires_at"]);
    assert!(gap.abs() <= time::Duration::seconds(1), "the hold's end: {held} against {}", hold.body);

    let (order, _) = app.reserve("fan-b", &seats[2..5]).await;
    let reserved = availability().await;
    assert_eq!((reserved["seats_held"].as_u64(), reserved["seats_awaiting_payment"].as_u64()), (Some(2), Some(3)));
    assert_eq!(reserved["seats_sold"], 3, "{reserved}");
    // The hold was made first and ends first (a hold is shorter than a payment window).
    assert_eq!(reserved["next_release_at"], held["next_release_at"], "{reserved}");

    let released = app.release("fan-a", &hold.str("hold_token")).await;
    assert!(released.status < 300, "{}", released.body);
    let unpaid = availability().await;
    let due = app.order("fan-b", &order).await;
    let gap = at(&unpaid["next_release_at"]) - at(&due.body["payment_due_at"]);
    assert!(gap.abs() <= time::Duration::seconds(1), "the payment window's end: {unpaid} against {}", due.body);

    assert_eq!(app.pay(&order, "payment.succeeded").await.body["outcome"], "paid");
    let paid = availability().await;
    assert_eq!((paid["seats_held"].as_u64(), paid["seats_awaiting_payment"].as_u64()), (Some(0), Some(0)));
    assert_eq!(paid["seats_sold"], 3, "{paid}");
    assert!(paid.get("next_release_at").is_none(), "a paid seat does not come back: {paid}");
    app.stop().await;
}
