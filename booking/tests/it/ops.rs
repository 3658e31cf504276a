//! Health, readiness, metrics and the OpenAPI document.

use sqlx::PgPool;

use crate::app::TestApp;

#[sqlx::test(migrations = "../migrations")]
async fn health_readiness_and_metrics_answer(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let health = app.send(app.client.get(app.url("/healthz"))).await;
    assert_eq!(health.status, 200);
    let ready = app.send(app.client.get(app.url("/readyz"))).await;
    assert_eq!((ready.status, ready.str("postgres"), ready.str("redis")), (200, "ok".into(), "ok".into()));
    assert_eq!(app.get_event("fan-a").await.status, 200);
    let text = app.client.get(app.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert!(text.contains("booking_http_requests_total"), "{text}");
    app.stop().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn event_lists_ticket_types_and_seats_on_sale(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let r = app.get_event("fan-a").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["seats_on_sale"].as_u64(), Some(350), "400 seats less a 50-seat sponsor block");
    assert!(!r.body["ticket_types"].as_array().expect("types").is_empty());
    app.stop().await;
}

#[test]
fn committed_openapi_matches_the_code() {
    let generated = booking::http::openapi::document();
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json")).unwrap_or_default();
    assert!(
        committed.trim() == generated.trim(),
        "booking/openapi.json is stale: regenerate it with `cargo run -p booking -- openapi > booking/openapi.json`"
    );
}
