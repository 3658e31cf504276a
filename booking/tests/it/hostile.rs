//! What an attacker probing the running service tried, each kept as a test: slow heads and bodies, personal
//! answers a shared cache could keep, and credentials read two ways.

use std::time::Duration;

use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::app::TestApp;

#[sqlx::test(migrations = "../migrations")]
async fn personal_answers_are_never_cacheable_and_only_the_public_map_is(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let seats = app.seats_on_sale().await;
    let hold = app.hold("fan-a", &seats[..1]).await;
    let (order, _) = app.reserve("fan-b", &seats[1..2]).await;
    let refused = app.send(app.client.get(app.url(&format!("/events/{}", app.event)))).await;
    assert_eq!(refused.status, 401);
    for (what, res) in [
        ("event", app.get_event("fan-a").await),
        ("hold", hold),
        ("order", app.order("fan-b", &order).await),
        ("refusal", refused),
    ] {
        assert_eq!(
            res.headers.get("cache-control").map(|v| v.to_str().ok()),
            Some(Some("private, no-store")),
            "{what}"
        );
    }
    let status = app.send(app.client.get(app.url(&format!("/events/{}/seats/status", app.event)))).await;
    let cache = status.headers["cache-control"].to_str().expect("ascii");
    assert!(cache.starts_with("public"), "{cache}");
    app.stop().await;
}

/// The head of a request, then one byte every 100 ms for 3 s: each read is quick, only the whole is slow.
/// Returns whether booking closed the connection while the client was still sending, and what it answered.
async fn trickle(addr: &str, head: &str) -> (bool, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("write");
    let (mut reader, mut writer) = stream.into_split();
    let trickler = tokio::spawn(async move {
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if writer.write_all(b"x").await.is_err() {
                return;
            }
        }
    });
    let mut answer = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), reader.read_to_end(&mut answer)).await.is_ok();
    let early = closed && !trickler.is_finished();
    trickler.abort();
    (early, String::from_utf8_lossy(&answer).into_owned())
}

#[sqlx::test(migrations = "../migrations")]
async fn slow_heads_and_trickling_bodies_are_cut_off_at_their_deadlines(pool: PgPool) {
    let app = TestApp::spawn_with(pool, &["--http-head-timeout-ms", "300", "--http-body-timeout-ms", "300"]).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let hold = format!("POST /events/{}/holds HTTP/1.1\r\nHost: x\r\n", app.event);
    // Many at once, as the probe did: none may outlive the head deadline.
    let slow_head = format!("{hold}X-Slow: ");
    let heads = futures::future::join_all((0..50).map(|_| trickle(&addr, &slow_head))).await;
    for (early, answer) in &heads {
        assert!(*early, "a slow head kept its connection: {answer}");
        assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer}");
    }
    let body = format!("{hold}Content-Type: application/json\r\nContent-Length: 200\r\n\r\n");
    let (early, answer) = trickle(&addr, &body).await;
    assert!(early, "a trickling body kept its connection: {answer}");
    assert!(answer.starts_with("HTTP/1.1 408") && answer.contains("request_timeout"), "{answer}");
    // The service itself is untouched.
    assert_eq!(app.get_event("fan-a").await.status, 200);
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_credential_that_is_not_plain_ascii_is_refused_not_skipped_for_the_cookie(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let url = app.url(&format!("/events/{}", app.event));
    let odd = format!("Bearer {}\u{a0}", app.proof("fan-a"));
    let odd = reqwest::header::HeaderValue::from_bytes(odd.as_bytes()).expect("header bytes");
    let cookie = format!("wr_admission={}", app.proof("fan-b"));
    let r = app.send(app.client.get(&url).header("authorization", odd).header("cookie", &cookie)).await;
    assert_eq!((r.status, r.code()), (401, "admission_invalid"), "{}", r.body);
    // The cookie alone is a proof; a header and a cookie that disagree: the header decides.
    assert_eq!(app.send(app.client.get(&url).header("cookie", &cookie)).await.status, 200);
    let both = app.client.get(&url).header("cookie", &cookie).bearer_auth("not-a-proof");
    assert_eq!(app.send(both).await.code(), "admission_invalid");
    app.stop().await;
}

async fn stored_keys(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idempotency_keys").fetch_one(&app.pool).await.expect("count")
}

#[sqlx::test(migrations = "../migrations")]
async fn checkouts_of_made_up_holds_store_nothing_and_keys_are_forgotten_after_a_day(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // A thousand made-up hold tokens under a thousand keys used to be a thousand rows kept forever.
    let made_up = futures::future::join_all((0..20).map(|i| {
        let token = uuid::Uuid::new_v4().to_string();
        let app = &app;
        async move { app.checkout("fan-a", &token, &format!("junk-{i}")).await }
    }))
    .await;
    assert!(made_up.iter().all(|r| (r.status, r.code()) == (409, "hold_expired")), "{:?}", made_up[0].body);
    assert_eq!(stored_keys(&app).await, 0);

    // A real checkout's key still answers its retry, after the hold is gone, with the same order.
    let seats = app.seats_on_sale().await;
    let hold = app.hold("fan-a", &seats[..1]).await.str("hold_token");
    let first = app.checkout("fan-a", &hold, "real").await;
    assert_eq!(first.status, 201, "{}", first.body);
    let again = app.checkout("fan-a", &hold, "real").await;
    assert_eq!((again.status, again.str("order_id")), (201, first.str("order_id")));
    assert_eq!(again.headers.get("idempotent-replayed").map(|v| v.to_str().ok()), Some(Some("true")));
    let other_body = app.checkout("fan-a", &uuid::Uuid::new_v4().to_string(), "real").await;
    assert_eq!((other_body.status, other_body.code()), (422, "idempotency_key_reused"));
    assert_eq!(stored_keys(&app).await, 1);

    // A day later the key is forgotten; a younger one stays.
    sqlx::query("UPDATE idempotency_keys SET created_at = now() - interval '25 hours'")
        .execute(&app.pool)
        .await
        .expect("age");
    let hold = app.hold("fan-b", &seats[1..2]).await.str("hold_token");
    assert_eq!(app.checkout("fan-b", &hold, "young").await.status, 201);
    assert_eq!(booking::store::orders::forget_old_keys(&app.pool, 100).await.expect("forget"), 1);
    let left: Vec<String> =
        sqlx::query_scalar("SELECT key FROM idempotency_keys").fetch_all(&app.pool).await.expect("keys");
    assert_eq!(left, ["young"]);
    app.stop().await;
}

/// The admission proofs booking is shown, and how each is refused.
fn admission(event: i64) -> testkit::forgery::Kind {
    let (kid, secret) = crate::app::KEYS.split_once(':').expect("kid:secret");
    testkit::forgery::Kind {
        kid: kid.into(),
        secret: secret.into(),
        audience: tokens::ADMISSION_AUDIENCE,
        issuer: tokens::ADMISSION_ISSUER.into(),
        event: Some(event),
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn every_forged_tampered_or_misused_credential_is_refused_with_its_code(pool: PgPool) {
    use testkit::forgery::{Forgery, Kind, Refused};
    let app = TestApp::spawn(pool).await;
    let proof = admission(app.event);
    // Tokens of the other kinds, validly signed: a queue ticket, and an account token (under the same key, or
    // under the platform's own, which booking does not know).
    let ticket = Kind { audience: tokens::TICKET_AUDIENCE, ..proof.clone() }.valid("fan-a");
    let account = Kind { audience: tokens::ACCOUNT_AUDIENCE, issuer: "platform".into(), event: None, ..proof.clone() };
    let platform =
        Kind { kid: "a1".into(), secret: "the-platform-account-secret-of-32-bytes".into(), ..account.clone() };
    let mut cases = proof.forgeries("fan-a");
    for (name, token) in [
        ("a queue ticket", ticket),
        ("an account token", account.valid("fan-a")),
        ("the platform's account token", platform.valid("fan-a")),
    ] {
        cases.push(Forgery { name, token, refused: Refused::Invalid });
    }
    let url = app.url(&format!("/events/{}", app.event));
    for case in &cases {
        let (status, code) = match case.refused {
            Refused::Invalid => (401, "admission_invalid"),
            Refused::Expired => (401, "admission_expired"),
            Refused::WrongEvent => (403, "admission_wrong_event"),
        };
        let by_header = app.send(app.client.get(&url).bearer_auth(&case.token)).await;
        assert_eq!((by_header.status, by_header.code()), (status, code), "{} (header): {}", case.name, by_header.body);
        let cookie = format!("wr_admission={}", case.token);
        let by_cookie = app.send(app.client.get(&url).header("cookie", cookie)).await;
        assert_eq!((by_cookie.status, by_cookie.code()), (status, code), "{} (cookie): {}", case.name, by_cookie.body);
    }
    // The same table's valid token is accepted: the refusals above are the forgeries', not the harness's.
    assert_eq!(app.send(app.client.get(&url).bearer_auth(proof.valid("fan-a"))).await.status, 200);
    // A valid proof in the header decides over a forged cookie, and a forged header over a valid cookie.
    let valid = proof.valid("fan-a");
    let forged = &cases[0].token;
    let header_valid = app.client.get(&url).bearer_auth(&valid).header("cookie", format!("wr_admission={forged}"));
    assert_eq!(app.send(header_valid).await.status, 200);
    let header_forged = app.client.get(&url).bearer_auth(forged).header("cookie", format!("wr_admission={valid}"));
    assert_eq!(app.send(header_forged).await.code(), "admission_invalid");
    app.stop().await;
}

/// A JSON value of any shape a client may send, a few levels deep.
fn any_json() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
    use proptest::prelude::*;
    use serde_json::{Value, json};
    let leaf = prop_oneof![
        any::<i64>().prop_map(|n| json!(n)),
        (0i64..500).prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        any::<bool>().prop_map(|b| json!(b)),
        "[ -~]{0,12}".prop_map(|s| json!(s)),
        Just(Value::Null),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        let key = prop_oneof![
            Just("seat_ids".to_owned()),
            Just("best_available".to_owned()),
            Just("quantity".to_owned()),
            Just("section".to_owned()),
            Just("allow_split".to_owned()),
            Just("accessible".to_owned()),
            Just("ticket_type_id".to_owned()),
            Just("hold_token".to_owned()),
            "[a-z_]{1,8}",
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key, inner), 0..5).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

#[sqlx::test(migrations = "../migrations")]
async fn generated_bodies_and_headers_never_get_a_server_error(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let event = app.event;
    let proof = app.proof("fan-a");
    let mut failures = Vec::new();
    let holds = app.url(&format!("/events/{event}/holds"));
    let orders = app.url(&format!("/events/{event}/orders"));
    let seats = app.seats_on_sale().await;
    let (low, high) = (seats[0] - 60, seats[seats.len() - 1] + 5);
    let shaped = {
        use proptest::prelude::*;
        use serde_json::json;
        prop_oneof![
            any_json(),
            prop::collection::vec(prop_oneof![low..high, any::<i64>()], 0..10).prop_map(|ids| json!({"seat_ids": ids})),
            (any::<i64>(), prop_oneof![0i64..12, any::<i64>()], "[A-Za-z0-9 ]{0,12}", any::<bool>(), any::<bool>())
                .prop_map(|(tt, q, section, split, accessible)| json!({"best_available": {"quantity": q,
                    "ticket_type_id": tt, "section": section, "allow_split": split, "accessible": accessible}})),
            (0i64..12).prop_map(|q| json!({"best_available": {"quantity": q}})),
            "[0-9a-f-]{0,40}".prop_map(|t| json!({"hold_token": t})),
        ]
    };
    let mut codes = std::collections::BTreeSet::new();
    for (i, body) in testkit::draw(shaped, 400).into_iter().enumerate() {
        let url = if i % 3 == 0 { &orders } else { &holds };
        let req = app.client.post(url).bearer_auth(&proof).header("idempotency-key", format!("p-{i}")).json(&body);
        let r = app.send(req).await;
        if r.status >= 500 || r.code().is_empty() && r.status >= 400 {
            failures.push(format!("{url} {body}: {} {}", r.status, r.body));
        }
        codes.insert(format!("{} {}", r.status, r.code()));
    }
    // The generator reaches past the body's shape into the checks behind it.
    assert!(codes.len() >= 6 && codes.contains("201 "), "{codes:?}");
    let webhook = serde_json::json!({"id": "evt_prop", "type": "payment.succeeded", "created": 1,
        "data": {"payment_id": "pay_x", "order_id": uuid::Uuid::new_v4(), "amount_cents": 1, "currency": "EUR"}})
    .to_string();
    let header = proptest::prop_oneof![proptest::arbitrary::any::<String>(), "t=[0-9]{0,12}(,v1=[0-9a-f]{0,70}){0,8}",];
    for value in testkit::draw(header, 200) {
        let Ok(value) = reqwest::header::HeaderValue::from_str(&value) else { continue };
        let req = app.client.post(app.url("/webhooks/payments")).header("payment-signature", value.clone());
        let r = app.send(req.header("content-type", "application/json").body(webhook.clone())).await;
        if r.status != 401 {
            failures.push(format!("Payment-Signature {value:?}: {} {}", r.status, r.body));
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn a_checkout_whose_connection_an_operator_terminates_is_a_503_and_its_retry_sells(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let seat = app.seats_on_sale().await[7];
    let hold = app.hold("fan-a", &[seat]).await.str("hold_token");
    // Orders locked against inserts: the checkout waits inside Postgres, where it is terminated (57P01), as the
    // chaos drill's pg_terminate_backend did mid-checkout.
    let mut lock = app.pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE orders IN EXCLUSIVE MODE").execute(&mut *lock).await.expect("lock");
    let checkout = tokio::spawn({
        let app_client = app.client.clone();
        let url = app.url(&format!("/events/{}/orders", app.event));
        let proof = app.proof("fan-a");
        let body = serde_json::json!({ "hold_token": hold });
        async move {
            let res = app_client.post(url).bearer_auth(proof).header("Idempotency-Key", "k-1").json(&body).send().await;
            let res = res.expect("answered");
            let retry_after = res.headers().get("retry-after").is_some();
            (res.status().as_u16(), retry_after, res.json::<serde_json::Value>().await.expect("json"))
        }
    });
    // Every backend waiting on the lock is terminated until the checkout answers: a background step of the
    // server (the sweeper) may be waiting there too, and ending only that one would leave the checkout waiting.
    let waiting = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                   WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()";
    let answered = crate::app::eventually(Duration::from_secs(10), async || {
        sqlx::query_scalar::<_, i64>(waiting).fetch_one(&app.pool).await.expect("terminate");
        checkout.is_finished()
    })
    .await;
    assert!(answered, "the checkout waited on the lock and was never ended");
    let (status, retry_after, body) = checkout.await.expect("join");
    assert_eq!((status, body["error"].as_str(), retry_after), (503, Some("database_unavailable"), true), "{body}");
    lock.rollback().await.expect("rollback");
    // Nothing was half-written: the same request again sells the seat, once.
    let again = app.checkout("fan-a", &hold, "k-1").await;
    assert_eq!(again.status, 201, "{}", again.body);
    assert_eq!(app.active_orders_for_seat(seat).await, 1);
    app.stop().await;
}
