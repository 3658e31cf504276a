//! `TestApp`: a real booking server on an ephemeral port, over a fresh migrated database (from
//! `#[sqlx::test]`) and the stack's real Redis under a key prefix of its own. One method per endpoint.

use std::time::Duration;

use booking::config::{Cli, Command};
use booking::http::{self, AppState};
use clap::Parser;
use redis::AsyncCommands;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokens::{AccountId, AdmissionClaims, Keyring, unix_now};
use tokio::sync::oneshot;
use uuid::Uuid;

pub const KEYS: &str = "test1:integration-test-admission-secret-0001";
pub const OTHER_KEYS: &str = "test1:some-other-secret-that-nobody-trusts-02";
pub const WEBHOOK_SECRET: &str = "whsec-integration-test-0001";
pub const ADMIN_TOKEN: &str = "admin-integration-test-token-0001";

/// A response, read whole.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub body: Value,
    pub headers: reqwest::header::HeaderMap,
}

impl Resp {
    pub fn code(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }
    pub fn str(&self, field: &str) -> String {
        self.body[field].as_str().unwrap_or_default().to_owned()
    }
}

pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    pub pool: PgPool,
    pub redis: redisconn::Conn,
    pub prefix: String,
    pub event: i64,
    pub ring: Keyring,
    /// Base URL of this app's fake payment provider (a real HTTP server of its own).
    pub provider: String,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    provider_server: tokio::task::JoinHandle<()>,
}

pub use testkit::{eventually, redis_url};

impl TestApp {
    /// A server with default settings over a 400-seat venue.
    pub async fn spawn(pool: PgPool) -> Self {
        Self::spawn_with(pool, &[]).await
    }

    /// A server with extra `booking serve` flags (e.g. `["--hold-ttl-ms", "1000"]`).
    pub async fn spawn_with(pool: PgPool, extra: &[&str]) -> Self {
        Self::spawn_venue(pool, 400, extra).await
    }

    /// A server over a venue of `seats` seats (500 a section, 25 a row; the first 50 held back; the last row of
    /// each section has two accessible seats), with extra `booking serve` flags.
    pub async fn spawn_venue(pool: PgPool, seats: u32, extra: &[&str]) -> Self {
        let seeded =
            booking::seed::seed(&pool, &booking::seed::SeedOptions { seats, sponsor_seats: 50, ..Default::default() })
                .await
                .expect("seed");
        let prefix = format!("test-{}:", Uuid::new_v4().simple());
        let url = redis_url();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let provider_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let provider = format!("http://{}", provider_listener.local_addr().expect("addr"));
        let webhook_url = match extra.iter().position(|a| *a == "--payment-webhook-url") {
            Some(i) => extra[i + 1].to_owned(),
            None => format!("{base}/webhooks/payments"),
        };
        let provider_app = booking::provider::router(WEBHOOK_SECRET.as_bytes(), &webhook_url, 3);
        let provider_server = tokio::spawn(async move {
            let _ = axum::serve(provider_listener, provider_app).await;
        });
        let mut args = vec![
            "booking",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            "postgres://unused-the-pool-is-given",
            "--redis-key-prefix",
            &prefix,
            "--admission-keys",
            KEYS,
            "--payment-webhook-secret",
            WEBHOOK_SECRET,
            "--admin-token",
            ADMIN_TOKEN,
        ];
        // Defaults a test may override with its own flag.
        let defaults = [
            ("--redis-url", url.as_str()),
            ("--payment-provider-url", provider.as_str()),
            ("--payment-webhook-url", webhook_url.as_str()),
            // Tests read the seat map right after changing it: no caching unless a test asks for it.
            ("--seat-map-cache-ms", "0"),
        ];
        for (flag, value) in defaults {
            if !extra.contains(&flag) {
                args.extend_from_slice(&[flag, value]);
            }
        }
        args.extend_from_slice(extra);
        let Command::Serve(cfg) = Cli::try_parse_from(args).expect("config").command else {
            unreachable!("serve was asked for")
        };
        let state = AppState::build(&cfg, pool.clone()).await.expect("state");
        let (tx, rx) = oneshot::channel::<()>();
        let unix = cfg.listen_unix().map(|path| http::bind_unix(path).expect("bind the Unix socket"));
        let server = tokio::spawn(http::serve(listener, unix, state, async {
            let _ = rx.await;
        }));
        let redis = match extra.iter().position(|a| *a == "--redis-url") {
            Some(i) => redisconn::Target::parse(extra[i + 1])
                .expect("a Redis URL")
                .connected(redisconn::Options::default())
                .await
                .expect("the test's Redis answers"),
            None => testkit::redis().await,
        };
        Self {
            base,
            client: reqwest::Client::new(),
            pool,
            redis,
            prefix,
            event: seeded.event_id,
            ring: Keyring::parse(KEYS).expect("keys"),
            provider,
            shutdown: Some(tx),
            server: Some(server),
            provider_server,
        }
    }

    /// Stops the server (awaiting it) and deletes this test's Redis keys.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.expect("server task").expect("server");
        }
        self.provider_server.abort();
        self.forget_redis().await;
    }

    /// Deletes every Redis key of this test: what a FLUSHALL, restart or failover does to the event.
    pub async fn forget_redis(&mut self) {
        let keys: Vec<String> = self.redis.keys(format!("{}*", self.prefix)).await.expect("KEYS");
        if !keys.is_empty() {
            let _: () = self.redis.del(keys).await.expect("DEL");
        }
    }

    /// This test's Redis keys, but those the sweeper writes by itself (which server keeps each event's keys).
    pub async fn redis_keys(&mut self) -> Vec<String> {
        let keys: Vec<String> = self.redis.keys(format!("{}*", self.prefix)).await.expect("KEYS");
        let server = self.keys().server(booking::domain::EventId(0));
        let (head, tail) = server.split_once("{ev0}").expect("the key names the event");
        keys.into_iter().filter(|k| !(k.starts_with(head) && k.ends_with(tail))).collect()
    }

    /// Booking's key builder, under this test's prefix.
    pub fn keys(&self) -> booking::store::holds::Keys {
        booking::store::holds::Keys::new(&self.prefix).expect("prefix")
    }

    /// A seat's Redis key for this app's event.
    pub fn seat_key(&self, seat: i64) -> String {
        self.keys().seat(booking::domain::EventId(self.event), booking::domain::SeatId(seat))
    }

    /// The Redis value of a seat key (hold token, "sold", or none).
    pub async fn seat_value(&mut self, seat: i64) -> Option<String> {
        let key = self.seat_key(seat);
        self.redis.get(key).await.expect("GET")
    }

    /// An admission proof for `account` to this app's event.
    pub fn proof(&self, account: &str) -> String {
        self.proof_for(account, self.event)
    }

    pub fn proof_for(&self, account: &str, event: i64) -> String {
        let claims = AdmissionClaims::new(AccountId::parse(account).expect("account"), event, unix_now(), 600);
        self.ring.sign(&claims)
    }

    /// Seats on sale for the app's event, in map order.
    pub async fn seats_on_sale(&self) -> Vec<i64> {
        sqlx::query_scalar("SELECT seat_id FROM seat_allocations WHERE event_id = $1 ORDER BY seat_id")
            .bind(self.event)
            .fetch_all(&self.pool)
            .await
            .expect("allocations")
    }

    /// Seats of the venue held back (no allocation for the event).
    pub async fn held_back_seats(&self) -> Vec<i64> {
        sqlx::query_scalar(
            "SELECT s.id FROM seats s JOIN sections sec ON sec.id = s.section_id
             JOIN events e ON e.venue_id = sec.venue_id AND e.id = $1
             WHERE NOT EXISTS (SELECT 1 FROM seat_allocations a WHERE a.event_id = e.id AND a.seat_id = s.id)
             ORDER BY s.id",
        )
        .bind(self.event)
        .fetch_all(&self.pool)
        .await
        .expect("held back")
    }

    pub async fn send(&self, req: reqwest::RequestBuilder) -> Resp {
        let res = req.send().await.expect("request reached the server");
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let bytes = res.bytes().await.expect("body");
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| panic!("status {status}: body is not JSON: {}", String::from_utf8_lossy(&bytes)));
        Resp { status, body, headers }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn get_event(&self, account: &str) -> Resp {
        self.send(self.client.get(self.url(&format!("/events/{}", self.event))).bearer_auth(self.proof(account))).await
    }

    pub async fn seat_map(&self, account: &str) -> Resp {
        let url = self.url(&format!("/events/{}/seats", self.event));
        self.send(self.client.get(url).bearer_auth(self.proof(account))).await
    }

    pub async fn hold(&self, account: &str, seats: &[i64]) -> Resp {
        let url = self.url(&format!("/events/{}/holds", self.event));
        self.send(self.client.post(url).bearer_auth(self.proof(account)).json(&json!({ "seat_ids": seats }))).await
    }

    /// `POST /holds` with any body and, if given, an `Idempotency-Key`.
    pub async fn hold_with(&self, account: &str, body: Value, key: Option<&str>) -> Resp {
        let url = self.url(&format!("/events/{}/holds", self.event));
        let mut req = self.client.post(url).bearer_auth(self.proof(account)).json(&body);
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        self.send(req).await
    }

    /// `hold` with owned arguments, for building many futures at once.
    pub async fn hold_owned(&self, account: String, seats: Vec<i64>) -> Resp {
        self.hold(&account, &seats).await
    }

    pub async fn release(&self, account: &str, hold_token: &str) -> Resp {
        let url = self.url(&format!("/events/{}/holds/{hold_token}", self.event));
        self.send(self.client.delete(url).bearer_auth(self.proof(account))).await
    }

    pub async fn extend(&self, account: &str, hold_token: &str) -> Resp {
        let url = self.url(&format!("/events/{}/holds/{hold_token}/extend", self.event));
        self.send(self.client.post(url).bearer_auth(self.proof(account))).await
    }

    pub async fn checkout(&self, account: &str, hold_token: &str, key: &str) -> Resp {
        let url = self.url(&format!("/events/{}/orders", self.event));
        let req = self
            .client
            .post(url)
            .bearer_auth(self.proof(account))
            .header("Idempotency-Key", key)
            .json(&json!({ "hold_token": hold_token }));
        self.send(req).await
    }

    /// Holds `seats` for `account` and checks the hold out: the new order's id and hold token.
    pub async fn reserve(&self, account: &str, seats: &[i64]) -> (String, String) {
        let hold = self.hold(account, seats).await;
        assert_eq!(hold.status, 201, "hold: {}", hold.body);
        let token = hold.str("hold_token");
        let order = self.checkout(account, &token, &format!("key-{token}")).await;
        assert_eq!(order.status, 201, "checkout: {}", order.body);
        (order.str("order_id"), token)
    }

    pub async fn order(&self, account: &str, order_id: &str) -> Resp {
        let url = self.url(&format!("/events/{}/orders/{order_id}", self.event));
        self.send(self.client.get(url).bearer_auth(self.proof(account))).await
    }

    pub async fn start_payment(&self, account: &str, order_id: &str) -> Resp {
        let url = self.url(&format!("/events/{}/orders/{order_id}/payment", self.event));
        self.send(self.client.post(url).bearer_auth(self.proof(account))).await
    }

    pub async fn extend_order(&self, account: &str, order_id: &str) -> Resp {
        let url = self.url(&format!("/events/{}/orders/{order_id}/extend", self.event));
        self.send(self.client.post(url).bearer_auth(self.proof(account))).await
    }

    /// The provider's event body for `order_id`, priced as the order is.
    pub async fn payment_event(&self, event_id: &str, kind: &str, order_id: &str) -> Vec<u8> {
        let (total, currency, payment): (i64, String, Option<String>) =
            sqlx::query_as("SELECT total_cents, currency::text, payment_id FROM orders WHERE id = $1::uuid")
                .bind(order_id)
                .fetch_one(&self.pool)
                .await
                .expect("order");
        // The payment booking opened, or one opened now as booking does (without asking the provider).
        let payment = match payment {
            Some(p) => p,
            None => {
                let id = booking::domain::OrderId(order_id.parse().expect("uuid"));
                let opened = format!("pay_test_{order_id}");
                let attached = booking::store::lifecycle::attach_payment(&self.pool, id, &opened).await;
                attached.expect("attach").expect("the order exists")
            }
        };
        serde_json::to_vec(&json!({
            "id": event_id, "type": kind, "created": unix_now(),
            "data": {"payment_id": payment, "order_id": order_id, "amount_cents": total, "currency": currency},
        }))
        .expect("json")
    }

    /// Delivers a webhook body signed with the shared secret, as the provider does.
    pub async fn deliver(&self, body: Vec<u8>) -> Resp {
        let t = i64::try_from(unix_now()).expect("time");
        let sig = booking::provider::signature::sign(WEBHOOK_SECRET.as_bytes(), t, &body);
        self.deliver_signed(body, Some(sig)).await
    }

    pub async fn deliver_signed(&self, body: Vec<u8>, signature: Option<String>) -> Resp {
        let mut req = self.client.post(self.url("/webhooks/payments")).header("content-type", "application/json");
        if let Some(sig) = signature {
            req = req.header("Payment-Signature", sig);
        }
        self.send(req.body(body)).await
    }

    /// A signed `payment.<kind>` event for the order, with a fresh event id.
    pub async fn pay(&self, order_id: &str, kind: &str) -> Resp {
        let body = self.payment_event(&format!("evt_{}", Uuid::new_v4().simple()), kind, order_id).await;
        self.deliver(body).await
    }

    pub async fn admin(&self, method: reqwest::Method, path: &str) -> Resp {
        self.send(self.client.request(method, self.url(path)).bearer_auth(ADMIN_TOKEN)).await
    }

    /// What the passage of time past an order's payment deadline does: the deadline is behind us in
    /// Postgres, and the order's Redis markers lapse (as their expiry at the deadline makes them).
    pub async fn pass_deadline(&mut self, order_id: &str) {
        let (token, account, seats): (Uuid, String, Vec<i64>) = sqlx::query_as(
            "UPDATE orders SET payment_due_at = now() - interval '1 second'
             WHERE id = $1::uuid
             RETURNING hold_token, account_id, array(SELECT seat_id FROM order_seats WHERE order_id = $1::uuid)",
        )
        .bind(order_id)
        .fetch_one(&self.pool)
        .await
        .expect("backdate order");
        sqlx::query("UPDATE order_seats SET expires_at = now() - interval '1 second' WHERE order_id = $1::uuid AND expires_at IS NOT NULL")
            .bind(order_id)
            .execute(&self.pool)
            .await
            .expect("backdate seats");
        let marker = format!("sold:{token}");
        for seat in &seats {
            if self.seat_value(*seat).await.as_deref() == Some(marker.as_str()) {
                let key = self.seat_key(*seat);
                let _: () = self.redis.del(key).await.expect("DEL");
            }
        }
        let account_key = self.keys().account(booking::domain::EventId(self.event), &account);
        let member = format!("{token}:{}", seats.len());
        let _: () = redis::cmd("ZADD")
            .arg(&account_key)
            .arg("XX")
            .arg(1)
            .arg(member)
            .query_async(&mut self.redis)
            .await
            .expect("ZADD");
    }

    /// Every outbox row's kind for an order, oldest first.
    pub async fn order_events(&self, order_id: &str) -> Vec<String> {
        sqlx::query_scalar("SELECT kind FROM order_events WHERE order_id = $1::uuid ORDER BY id")
            .bind(order_id)
            .fetch_all(&self.pool)
            .await
            .expect("events")
    }

    /// Active order rows holding `seat` for this event.
    pub async fn active_orders_for_seat(&self, seat: i64) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM order_seats WHERE event_id = $1 AND seat_id = $2 AND active")
            .bind(self.event)
            .bind(seat)
            .fetch_one(&self.pool)
            .await
            .expect("count")
    }

    pub async fn order_count(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(&self.pool).await.expect("count")
    }

    /// The promises the database must keep whatever happened: at most one active order per (event, seat);
    /// every order's total is the sum of its seats; every seat was priced from its allocation; every order has
    /// seats and every order seat its order.
    pub async fn assert_invariants(&self) {
        let doubles: Vec<(i64, i64, i64)> = sqlx::query_as(
            "SELECT event_id, seat_id, count(*) FROM order_seats WHERE active
             GROUP BY event_id, seat_id HAVING count(*) > 1",
        )
        .fetch_all(&self.pool)
        .await
        .expect("doubles");
        assert!(doubles.is_empty(), "seats sold twice: {doubles:?}");
        let bad_totals: Vec<(Uuid, i64, i64)> = sqlx::query_as(
            "SELECT o.id, o.total_cents, coalesce(sum(os.price_cents), 0)::bigint FROM orders o
             LEFT JOIN order_seats os ON os.order_id = o.id
             GROUP BY o.id HAVING o.total_cents <> coalesce(sum(os.price_cents), 0)",
        )
        .fetch_all(&self.pool)
        .await
        .expect("totals");
        assert!(bad_totals.is_empty(), "orders whose total is not the sum of their seats: {bad_totals:?}");
        let mispriced: Vec<(Uuid, i64)> = sqlx::query_as(
            "SELECT os.order_id, os.seat_id FROM order_seats os
             JOIN seat_allocations a ON a.event_id = os.event_id AND a.seat_id = os.seat_id
             JOIN ticket_types t ON t.id = a.ticket_type_id
             WHERE os.price_cents <> t.price_cents",
        )
        .fetch_all(&self.pool)
        .await
        .expect("prices");
        assert!(mispriced.is_empty(), "seats not priced from their allocation: {mispriced:?}");
        let empty: Vec<(Uuid,)> = sqlx::query_as(
            "SELECT o.id FROM orders o WHERE NOT EXISTS (SELECT 1 FROM order_seats os WHERE os.order_id = o.id)",
        )
        .fetch_all(&self.pool)
        .await
        .expect("empty orders");
        assert!(empty.is_empty(), "orders without seats: {empty:?}");
        let orphans: Vec<(Uuid, i64)> = sqlx::query_as(
            "SELECT os.order_id, os.seat_id FROM order_seats os
             WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = os.order_id)",
        )
        .fetch_all(&self.pool)
        .await
        .expect("orphan seats");
        assert!(orphans.is_empty(), "order seats without their order: {orphans:?}");
    }
}

/// Waits (bounded) until `hold` of `seats` by `account` succeeds, e.g. after another hold expired.
pub async fn hold_when_free(app: &TestApp, account: &str, seats: &[i64], within: Duration) -> Resp {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let r = app.hold(account, seats).await;
        if r.status != 409 || tokio::time::Instant::now() >= deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
