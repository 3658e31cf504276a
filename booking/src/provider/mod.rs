//! A small fake payment provider, so the payment step is real HTTP end to end: booking creates a payment here,
//! the fan "pays" (`POST /v1/payments/{id}/complete`), and the provider calls booking back with a signed
//! webhook, retrying on failure like a real one. Payments live in memory; the `payments` binary serves it.
//!
//! Like a real provider, it creates payments only for its account holder: booking authenticates with the
//! account's secret (the one that also signs webhooks), and the provider calls back only the account's webhook
//! URL. A payment's id is the capability to pay it, as a hosted checkout's URL is.
//!
//! Also the client booking uses to talk to it ([`Client`]).

pub mod signature;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

/// A payment as the provider keeps and shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Payment {
    pub payment_id: String,
    pub order_id: Uuid,
    pub amount_cents: i64,
    pub currency: String,
    /// `pending`, `succeeded` or `failed`.
    pub status: String,
    #[serde(skip_serializing, default)]
    pub webhook_url: String,
}

/// What booking asks for.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NewPayment {
    pub order_id: Uuid,
    pub amount_cents: i64,
    pub currency: String,
    /// Where the provider posts the signed events of this payment.
    pub webhook_url: String,
}

/// The body of a webhook delivery.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WebhookEvent {
    /// Unique per event; a redelivery carries the same id.
    pub id: String,
    /// `payment.succeeded` or `payment.failed`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Unix seconds.
    pub created: i64,
    pub data: WebhookData,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WebhookData {
    pub payment_id: String,
    pub order_id: Uuid,
    pub amount_cents: i64,
    pub currency: String,
}

#[derive(Debug, Deserialize)]
struct Complete {
    /// `succeeded` or `failed`.
    outcome: String,
}

#[derive(Clone)]
struct Provider {
    payments: Arc<Mutex<HashMap<String, Payment>>>,
    /// The last event of each payment, for redelivery.
    events: Arc<Mutex<HashMap<String, WebhookEvent>>>,
    secret: Arc<[u8]>,
    /// The only URL events are posted to.
    webhook_url: Arc<str>,
    http: reqwest::Client,
    attempts: u32,
    auto_settle: Option<Duration>,
}

/// The provider's routes. `secret` authenticates booking and signs webhooks, which go to `webhook_url` only;
/// `attempts` bounds deliveries of one event.
pub fn router(secret: &[u8], webhook_url: &str, attempts: u32) -> Router {
    router_settling(secret, webhook_url, attempts, None)
}

/// [`router`], and with `auto_settle` every new payment succeeds that long after it is created, as with a test
/// card that always pays: for tools that drive booking's API alone, with nobody to press Pay.
pub fn router_settling(secret: &[u8], webhook_url: &str, attempts: u32, auto_settle: Option<Duration>) -> Router {
    let provider = Provider {
        payments: Arc::default(),
        events: Arc::default(),
        secret: secret.into(),
        webhook_url: webhook_url.into(),
        http: reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap_or_default(),
        attempts: attempts.max(1),
        auto_settle,
    };
    Router::new()
        .route("/v1/payments", post(create))
        .route("/v1/payments/{id}", get(show))
        .route("/v1/payments/{id}/complete", post(complete))
        .route("/v1/payments/{id}/checkout", get(checkout_page))
        .route("/v1/payments/{id}/redeliver", post(redeliver))
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .with_state(provider)
}

fn refuse(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(json!({"error": code, "message": message}))).into_response()
}

/// Creates the order's payment, or returns the one it has (one payment per order).
async fn create(State(p): State<Provider>, headers: HeaderMap, Json(new): Json<NewPayment>) -> Response {
    if !crate::bearer_is(headers.get(header::AUTHORIZATION), &p.secret) {
        return refuse(StatusCode::UNAUTHORIZED, "unauthenticated", "creating a payment needs the account's secret");
    }
    if new.amount_cents < 0 || new.currency.len() != 3 {
        return refuse(StatusCode::UNPROCESSABLE_ENTITY, "invalid_payment", "amount or currency is invalid");
    }
    if new.webhook_url != *p.webhook_url {
        return refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            "webhook_url_refused",
            "events go only to the account's configured webhook URL",
        );
    }
    let mut payments = p.payments.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(existing) = payments.values().find(|pay| pay.order_id == new.order_id) {
        return (StatusCode::OK, Json(existing.clone())).into_response();
    }
    let payment = Payment {
        payment_id: format!("pay_{}", Uuid::new_v4().simple()),
        order_id: new.order_id,
        amount_cents: new.amount_cents,
        currency: new.currency,
        status: "pending".into(),
        webhook_url: new.webhook_url,
    };
    payments.insert(payment.payment_id.clone(), payment.clone());
    if let Some(after) = p.auto_settle {
        let (p, id) = (p.clone(), payment.payment_id.clone());
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            settle(&p, &id, "succeeded").await;
        });
    }
    (StatusCode::CREATED, Json(payment)).into_response()
}

async fn show(State(p): State<Provider>, Path(id): Path<String>) -> Response {
    match p.payments.lock().unwrap_or_else(|e| e.into_inner()).get(&id) {
        Some(pay) => Json(pay.clone()).into_response(),
        None => refuse(StatusCode::NOT_FOUND, "unknown_payment", "no such payment"),
    }
}

/// The page where a person pays: the amount, Pay and Decline. Either settles the payment (`complete`) and then
/// goes to `?return=` (an absolute http(s) URL), as a provider's hosted checkout sends the buyer back to the shop.
async fn checkout_page(State(p): State<Provider>, Path(id): Path<String>) -> Response {
    let Some(pay) = p.payments.lock().unwrap_or_else(|e| e.into_inner()).get(&id).cloned() else {
        return refuse(StatusCode::NOT_FOUND, "unknown_payment", "no such payment");
    };
    let amount = format!("{}.{:02} {}", pay.amount_cents / 100, pay.amount_cents % 100, pay.currency);
    // Every value put in the page is made of ASCII letters, digits, '_', '.', '-' and ' ' (ids the provider
    // made, an amount, a currency booking checked), so none needs escaping.
    let safe = |v: &str| v.chars().all(|c| c.is_ascii_alphanumeric() || "_.- ".contains(c));
    if !safe(&pay.payment_id) || !safe(&amount) {
        return refuse(StatusCode::INTERNAL_SERVER_ERROR, "unprintable_payment", "this payment cannot be shown");
    }
    let page = CHECKOUT_PAGE
        .replace("{amount}", &amount)
        .replace("{payment_id}", &pay.payment_id)
        .replace("{status}", &pay.status);
    let mut res = axum::response::Html(page).into_response();
    res.headers_mut().insert(
        axum::http::header::CONTENT_SECURITY_POLICY,
        axum::http::HeaderValue::from_static(
            "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'",
        ),
    );
    res
}

const CHECKOUT_PAGE: &str = include_str!("checkout.html");

/// The fan's card page, reduced to its outcome: settles the payment and delivers the signed event.
async fn complete(State(p): State<Provider>, Path(id): Path<String>, Json(c): Json<Complete>) -> Response {
    if c.outcome != "succeeded" && c.outcome != "failed" {
        return refuse(StatusCode::UNPROCESSABLE_ENTITY, "invalid_outcome", "outcome is `succeeded` or `failed`");
    }
    settle(&p, &id, &c.outcome).await
}

/// Settles the payment with `outcome` and delivers its signed event.
async fn settle(p: &Provider, id: &str, outcome: &str) -> Response {
    let payment = {
        let mut payments = p.payments.lock().unwrap_or_else(|e| e.into_inner());
        let Some(pay) = payments.get_mut(id) else {
            return refuse(StatusCode::NOT_FOUND, "unknown_payment", "no such payment");
        };
        pay.status = outcome.to_owned();
        pay.clone()
    };
    let event = WebhookEvent {
        id: format!("evt_{}", Uuid::new_v4().simple()),
        kind: format!("payment.{outcome}"),
        created: unix_now(),
        data: WebhookData {
            payment_id: payment.payment_id.clone(),
            order_id: payment.order_id,
            amount_cents: payment.amount_cents,
            currency: payment.currency.clone(),
        },
    };
    p.events.lock().unwrap_or_else(|e| e.into_inner()).insert(id.to_owned(), event.clone());
    deliver(p, &payment.webhook_url, &event).await
}

/// Sends the payment's last event again, with the same id.
async fn redeliver(State(p): State<Provider>, Path(id): Path<String>) -> Response {
    let found = {
        let events = p.events.lock().unwrap_or_else(|e| e.into_inner());
        let payments = p.payments.lock().unwrap_or_else(|e| e.into_inner());
        events.get(&id).cloned().zip(payments.get(&id).map(|pay| pay.webhook_url.clone()))
    };
    match found {
        Some((event, url)) => deliver(&p, &url, &event).await,
        None => refuse(StatusCode::NOT_FOUND, "no_event", "this payment has no event to redeliver"),
    }
}

/// Posts the event until the receiver answers 2xx or 4xx (a refusal retrying cannot fix), at most
/// `attempts` times with doubling pauses; says how it went.
async fn deliver(p: &Provider, url: &str, event: &WebhookEvent) -> Response {
    let body = match serde_json::to_vec(event) {
        Ok(b) => b,
        Err(e) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, "encode", &e.to_string()),
    };
    let mut pause = Duration::from_millis(100);
    let mut last = json!(null);
    for attempt in 1..=p.attempts {
        let sent = p
            .http
            .post(url)
            .header("content-type", "application/json")
            .header(signature::HEADER, signature::sign(&p.secret, unix_now(), &body))
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(res) if res.status().is_success() || res.status().is_client_error() => {
                let status = res.status().as_u16();
                let answer: serde_json::Value = res.json().await.unwrap_or(json!(null));
                return Json(json!({
                    "event_id": event.id, "type": event.kind, "delivered": status < 300,
                    "attempts": attempt, "webhook_status": status, "webhook_answer": answer,
                }))
                .into_response();
            }
            Ok(res) => last = json!(res.status().as_u16()),
            Err(e) => last = json!(e.to_string()),
        }
        if attempt < p.attempts {
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }
    Json(json!({"event_id": event.id, "type": event.kind, "delivered": false, "attempts": p.attempts, "last_error": last}))
        .into_response()
}

fn unix_now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Why the provider could not create a payment.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("the payment provider did not answer: {0}")]
    Unreachable(#[from] reqwest::Error),
    #[error("the payment provider refused: {status} {body}")]
    Refused { status: u16, body: String },
}

/// Booking's client of the provider.
#[derive(Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
    /// The account's secret, sent as the bearer token that creates payments.
    secret: Option<secrecy::SecretString>,
}

impl Client {
    pub fn new(base: &str, timeout: Duration, secret: Option<secrecy::SecretString>) -> Self {
        Self {
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::builder().timeout(timeout).build().unwrap_or_default(),
            secret,
        }
    }

    /// Creates the order's payment (or gets the one it has).
    pub async fn create_payment(&self, new: &NewPayment) -> Result<Payment, ProviderError> {
        let mut req = self.http.post(format!("{}/v1/payments", self.base)).json(new);
        if let Some(secret) = &self.secret {
            req = req.bearer_auth(secrecy::ExposeSecret::expose_secret(secret));
        }
        let res = req.send().await?;
        if !res.status().is_success() {
            let status = res.status().as_u16();
            return Err(ProviderError::Refused { status, body: res.text().await.unwrap_or_default() });
        }
        Ok(res.json().await?)
    }

    /// A payment as the provider has it now.
    pub async fn payment(&self, payment_id: &str) -> Result<Payment, ProviderError> {
        let res = self.http.get(format!("{}/v1/payments/{payment_id}", self.base)).send().await?;
        if !res.status().is_success() {
            let status = res.status().as_u16();
            return Err(ProviderError::Refused { status, body: res.text().await.unwrap_or_default() });
        }
        Ok(res.json().await?)
    }

    /// Where a program completes a payment (`POST {"outcome"}`).
    pub fn pay_url(&self, payment_id: &str) -> String {
        format!("{}/v1/payments/{payment_id}/complete", self.base)
    }

    /// The page where a person pays.
    pub fn checkout_url(&self, payment_id: &str) -> String {
        format!("{}/v1/payments/{payment_id}/checkout", self.base)
    }
}
