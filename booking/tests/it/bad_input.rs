//! Bad input: every case gets its documented 4xx with a stable JSON code, and nothing is written.

use serde_json::json;
use sqlx::PgPool;
use tokens::{AccountId, AdmissionClaims, Keyring, unix_now};

use crate::app::{OTHER_KEYS, TestApp};

struct Case {
    name: &'static str,
    req: reqwest::RequestBuilder,
    status: u16,
    code: &'static str,
}

async fn check(app: &TestApp, cases: Vec<Case>) {
    let mut failures = Vec::new();
    for case in cases {
        let r = app.send(case.req).await;
        if r.status != case.status || r.code() != case.code {
            failures
                .push(format!("{}: expected {} {}, got {} {}", case.name, case.status, case.code, r.status, r.body));
        }
        assert!(r.body["message"].is_string(), "{}: every error has a message", case.name);
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[sqlx::test(migrations = "../migrations")]
async fn bad_input_gets_a_clear_4xx_and_writes_nothing(pool: PgPool) {
    let mut app = TestApp::spawn_with(pool, &["--body-limit-bytes", "4096"]).await;
    let seats = app.seats_on_sale().await;
    let held_back = app.held_back_seats().await[0];
    let other_event = booking::seed::seed(
        &app.pool,
        &booking::seed::SeedOptions {
            seats: 30,
            sponsor_seats: 0,
            venue_name: "Other Hall".into(),
            ..Default::default()
        },
    )
    .await
    .expect("second event");
    let other_seat: i64 = sqlx::query_scalar("SELECT seat_id FROM seat_allocations WHERE event_id = $1 LIMIT 1")
        .bind(other_event.event_id)
        .fetch_one(&app.pool)
        .await
        .expect("other seat");

    let e = app.event;
    let c = &app.client;
    let proof = app.proof("fan-a");
    let holds = app.url(&format!("/events/{e}/holds"));
    let orders = app.url(&format!("/events/{e}/orders"));
    let post_hold = |body: serde_json::Value| c.post(&holds).bearer_auth(&proof).json(&body);
    let now = unix_now();
    let account = AccountId::parse("fan-a").expect("account");
    let expired = app.ring.sign(&AdmissionClaims::new(account.clone(), e, now - 3600, 60));
    let forged = Keyring::parse(OTHER_KEYS).expect("keys").sign(&AdmissionClaims::new(account.clone(), e, now, 600));
    let other_event_proof = app.proof_for("fan-a", other_event.event_id);
    let too_many: Vec<i64> = seats[..9].to_vec();

    let cases = vec![
        Case {
            name: "malformed json",
            req: c
                .post(&holds)
                .bearer_auth(&proof)
                .header("content-type", "application/json")
                .body("{\"seat_ids\": [1,"),
            status: 400,
            code: "malformed_json",
        },
        Case {
            name: "not json",
            req: c.post(&holds).bearer_auth(&proof).body("seat_ids=1"),
            status: 415,
            code: "unsupported_media_type",
        },
        Case {
            name: "seat ids as strings",
            req: post_hold(json!({"seat_ids": ["one"]})),
            status: 422,
            code: "invalid_body",
        },
        Case { name: "missing seat_ids", req: post_hold(json!({})), status: 422, code: "invalid_body" },
        Case {
            name: "unknown field",
            req: post_hold(json!({"seat_ids": [seats[0]], "price_cents": 1})),
            status: 422,
            code: "invalid_body",
        },
        Case {
            name: "seat id beyond i64",
            req: c
                .post(&holds)
                .bearer_auth(&proof)
                .header("content-type", "application/json")
                .body("{\"seat_ids\": [99999999999999999999999]}"),
            status: 422,
            code: "invalid_body",
        },
        Case { name: "empty basket", req: post_hold(json!({"seat_ids": []})), status: 422, code: "empty_basket" },
        Case {
            name: "duplicate seat",
            req: post_hold(json!({"seat_ids": [seats[0], seats[1], seats[0]]})),
            status: 422,
            code: "duplicate_seat",
        },
        Case {
            name: "unknown seat",
            req: post_hold(json!({"seat_ids": [seats[0], 987654321]})),
            status: 422,
            code: "seat_not_on_sale",
        },
        Case {
            name: "negative seat",
            req: post_hold(json!({"seat_ids": [-4]})),
            status: 422,
            code: "seat_not_on_sale",
        },
        Case {
            name: "another event's seat",
            req: post_hold(json!({"seat_ids": [other_seat]})),
            status: 422,
            code: "seat_not_on_sale",
        },
        Case {
            name: "held-back seat",
            req: post_hold(json!({"seat_ids": [held_back]})),
            status: 422,
            code: "seat_not_on_sale",
        },
        Case {
            name: "basket over the cap",
            req: post_hold(json!({"seat_ids": too_many})),
            status: 422,
            code: "too_many_seats",
        },
        Case {
            name: "huge body",
            req: c
                .post(&holds)
                .bearer_auth(&proof)
                .header("content-type", "application/json")
                .body(format!("{{\"seat_ids\": [{}]}}", "1,".repeat(50_000) + "1")),
            status: 413,
            code: "body_too_large",
        },
        Case {
            name: "non-numeric event id",
            req: c.post(app.url("/events/abc/holds")).bearer_auth(&proof).json(&json!({"seat_ids": [1]})),
            status: 400,
            code: "invalid_path",
        },
        Case {
            name: "zero event id",
            req: c.get(app.url("/events/0")).bearer_auth(app.proof_for("fan-a", 0)),
            status: 400,
            code: "invalid_path",
        },
        Case {
            name: "negative event id, with a proof for a real event",
            req: c.post(app.url("/events/-1/holds")).bearer_auth(&proof).json(&json!({"seat_ids": [1]})),
            status: 400,
            code: "invalid_path",
        },
        Case {
            name: "event id beyond i64",
            req: c.get(app.url("/events/99999999999999999999")).bearer_auth(&proof),
            status: 400,
            code: "invalid_path",
        },
        Case {
            name: "non-uuid hold token",
            req: c.delete(app.url(&format!("/events/{e}/holds/12"))).bearer_auth(&proof),
            status: 400,
            code: "invalid_hold_token",
        },
        Case {
            name: "unknown event",
            req: c.get(app.url("/events/424242")).bearer_auth(app.proof_for("fan-a", 424242)),
            status: 404,
            code: "event_not_found",
        },
        Case {
            name: "no admission proof",
            req: c.post(&holds).json(&json!({"seat_ids": [seats[0]]})),
            status: 401,
            code: "admission_required",
        },
        Case {
            name: "basic auth instead",
            req: c.post(&holds).basic_auth("fan", Some("pw")).json(&json!({"seat_ids": [seats[0]]})),
            status: 401,
            code: "admission_required",
        },
        Case {
            name: "garbage proof",
            req: c.post(&holds).bearer_auth("not.a.jwt").json(&json!({"seat_ids": [seats[0]]})),
            status: 401,
            code: "admission_invalid",
        },
        Case {
            name: "forged proof",
            req: c.post(&holds).bearer_auth(&forged).json(&json!({"seat_ids": [seats[0]]})),
            status: 401,
            code: "admission_invalid",
        },
        Case {
            name: "expired proof",
            req: c.post(&holds).bearer_auth(&expired).json(&json!({"seat_ids": [seats[0]]})),
            status: 401,
            code: "admission_expired",
        },
        Case {
            name: "other event's proof",
            req: c.post(&holds).bearer_auth(&other_event_proof).json(&json!({"seat_ids": [seats[0]]})),
            status: 403,
            code: "admission_wrong_event",
        },
        Case {
            name: "oversized proof",
            req: c.post(&holds).bearer_auth("x".repeat(3000)).json(&json!({"seat_ids": [seats[0]]})),
            status: 401,
            code: "admission_invalid",
        },
        Case {
            name: "proof in cookie of another event",
            req: c.get(app.url(&format!("/events/{e}"))).header("cookie", format!("wr_admission={other_event_proof}")),
            status: 403,
            code: "admission_wrong_event",
        },
        Case {
            name: "checkout without idempotency key",
            req: c.post(&orders).bearer_auth(&proof).json(&json!({"hold_token": uuid::Uuid::new_v4()})),
            status: 400,
            code: "idempotency_key_missing",
        },
        // The bounds booking/openapi.json documents for the key: 1 to 255 visible ASCII characters.
        Case {
            name: "checkout with a key one character too long",
            req: c
                .post(&orders)
                .bearer_auth(&proof)
                .header("Idempotency-Key", "k".repeat(256))
                .json(&json!({"hold_token": uuid::Uuid::new_v4()})),
            status: 400,
            code: "idempotency_key_invalid",
        },
        Case {
            name: "checkout with a key holding a space",
            req: c
                .post(&orders)
                .bearer_auth(&proof)
                .header("Idempotency-Key", "two words")
                .json(&json!({"hold_token": uuid::Uuid::new_v4()})),
            status: 400,
            code: "idempotency_key_invalid",
        },
        Case {
            name: "checkout with the longest key, for a hold that does not exist",
            req: c
                .post(&orders)
                .bearer_auth(&proof)
                .header("Idempotency-Key", "!~".repeat(127) + "k")
                .json(&json!({"hold_token": uuid::Uuid::new_v4()})),
            status: 409,
            code: "hold_expired",
        },
        Case {
            name: "checkout with non-uuid hold",
            req: c
                .post(&orders)
                .bearer_auth(&proof)
                .header("Idempotency-Key", "x1")
                .json(&json!({"hold_token": "abc"})),
            status: 422,
            code: "invalid_hold_token",
        },
        Case {
            name: "checkout with numeric hold",
            req: c.post(&orders).bearer_auth(&proof).header("Idempotency-Key", "x2").json(&json!({"hold_token": 5})),
            status: 422,
            code: "invalid_body",
        },
        Case {
            name: "extend unknown hold",
            req: c.post(app.url(&format!("/events/{e}/holds/{}/extend", uuid::Uuid::new_v4()))).bearer_auth(&proof),
            status: 404,
            code: "hold_not_found",
        },
        Case { name: "unknown route", req: c.get(app.url("/nope")), status: 404, code: "not_found" },
        Case { name: "wrong method", req: c.put(&holds).bearer_auth(&proof), status: 405, code: "method_not_allowed" },
    ];
    check(&app, cases).await;

    // Nothing was written: no order, no idempotency claim left behind but the refused ones, no hold in Redis.
    assert_eq!(app.order_count().await, 0);
    let keys = app.redis_keys().await;
    assert!(keys.is_empty(), "bad input left Redis keys: {keys:?}");
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn the_account_comes_from_the_proof_not_the_request(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let seat = app.seats_on_sale().await[0];
    let hold = app.hold("fan-a", &[seat]).await;
    assert_eq!(hold.status, 201);
    let order = app.checkout("fan-a", &hold.str("hold_token"), "k").await;
    let owner: String = sqlx::query_scalar("SELECT account_id FROM orders WHERE id = $1::uuid")
        .bind(order.str("order_id"))
        .fetch_one(&app.pool)
        .await
        .expect("order");
    assert_eq!(owner, "fan-a");
    app.stop().await;
}
