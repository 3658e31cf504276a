//! A small fake payment provider, so the payment step is real HTTP end to end: booking creates a payment here,
//! the fan "pays" (`POST /v1/payments/{id}/complete`), and the provider calls booking back with a signed
//! webhook, retrying on failure like a real one. Payments live in memory; the `payments` binary serves it.
//!
//! Like a real provider, it serves its account holder only: booking authenticates with the account's secret
//! (the one that also signs webhooks) to create, read and redeliver payments, and the provider calls back only
//! the account's webhook URL. Paying takes the payment's own token, which only booking is given, in the URLs it
//! hands the fan (a payment's id alone, which the fan's order shows, pays nothing). The checkout page sends the
//! buyer back only to an origin the account named (`PROVIDER_RETURN_ORIGINS`), runs no inline script and is
//! never framed.
//!
//! Also the client booking uses to talk to it ([`Client`]).

pub mod signature;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
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
    /// The capability to pay it (in the `pay_url` and `checkout_url` booking hands the fan); only the account
    /// holder is shown it.
    #[serde(default)]
    pub pay_token: String,
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
    /// Origins (`scheme://host[:port]`) the checkout page may send the buyer back to.
    return_origins: Arc<[String]>,
}

/// How the provider runs, beyond its account's secret and webhook URL.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Deliveries of one event at most.
    pub attempts: u32,
    /// Settle every new payment as succeeded this long after it is created (a test card that always pays).
    pub auto_settle: Option<Duration>,
    /// Origins the checkout page may send the buyer back to (`?return=`); any other is ignored.
    pub return_origins: Vec<String>,
}

/// The provider's routes. `secret` authenticates booking and signs webhooks, which go to `webhook_url` only;
/// `attempts` bounds deliveries of one event.
pub fn router(secret: &[u8], webhook_url: &str, attempts: u32) -> Router {
    router_with(secret, webhook_url, Options { attempts, ..Options::default() })
}

/// [`router`] with every option.
pub fn router_with(secret: &[u8], webhook_url: &str, options: Options) -> Router {
    let provider = Provider {
        payments: Arc::default(),
        events: Arc::default(),
        secret: secret.into(),
        webhook_url: webhook_url.into(),
        http: reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap_or_default(),
        attempts: options.attempts.max(1),
        auto_settle: options.auto_settle,
        return_origins: options.return_origins.into(),
    };
    Router::new()
        .route("/v1/payments", post(create))
        .route("/v1/payments/{id}", get(show))
        .route("/v1/payments/{id}/complete", post(complete))
        .route("/v1/payments/{id}/checkout", get(checkout_page))
        .route("/v1/payments/{id}/redeliver", post(redeliver))
        .route("/v1/checkout.js", get(|| async { asset("text/javascript", CHECKOUT_SCRIPT) }))
        .route("/v1/checkout.css", get(|| async { asset("text/css", CHECKOUT_STYLE) }))
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .with_state(provider)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "public, max-age=300")], body).into_response()
}

/// Whether the request carries the account's secret.
fn account(p: &Provider, headers: &HeaderMap) -> bool {
    crate::bearer_is(headers.get(header::AUTHORIZATION), &p.secret)
}

fn unauthenticated() -> Response {
    refuse(StatusCode::UNAUTHORIZED, "unauthenticated", "this needs the account's secret")
}

/// The payment `id`, if `token` is its pay token (compared in constant time; a wrong one is as unknown).
fn payable(p: &Provider, id: &str, token: Option<&str>) -> Option<Payment> {
    let payments = p.payments.lock().unwrap_or_else(|e| e.into_inner());
    let pay = payments.get(id)?;
    tokens::same_secret(token.unwrap_or_default().as_bytes(), pay.pay_token.as_bytes()).then(|| pay.clone())
}

#[derive(Debug, Deserialize)]
struct PayQuery {
    token: Option<String>,
    #[serde(rename = "return")]
    back: Option<String>,
}

fn refuse(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(json!({"error": code, "message": message}))).into_response()
}

/// Creates the order's payment, or returns the one it has (one payment per order).
async fn create(State(p): State<Provider>, headers: HeaderMap, Json(new): Json<NewPayment>) -> Response {
    if !account(&p, &headers) {
        return unauthenticated();
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
        pay_token: Uuid::new_v4().simple().to_string(),
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

async fn show(State(p): State<Provider>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if !account(&p, &headers) {
        return unauthenticated();
    }
    match p.payments.lock().unwrap_or_else(|e| e.into_inner()).get(&id) {
        Some(pay) => Json(pay.clone()).into_response(),
        None => refuse(StatusCode::NOT_FOUND, "unknown_payment", "no such payment"),
    }
}

/// The page where a person pays (`?token=`, the payment's pay token): the amount, Pay and Decline. Either settles
/// the payment (`complete`) and then goes to `?return=` when its origin is one the account named, as a
/// provider's hosted checkout sends the buyer back to the shop; any other is ignored (no open redirect).
async fn checkout_page(State(p): State<Provider>, Path(id): Path<String>, Query(q): Query<PayQuery>) -> Response {
    let Some(pay) = payable(&p, &id, q.token.as_deref()) else {
        return refuse(StatusCode::NOT_FOUND, "unknown_payment", "no such payment");
    };
    let amount = format!("{}.{:02} {}", pay.amount_cents / 100, pay.amount_cents % 100, pay.currency);
    // Every value put in the page is made of ASCII letters, digits, '_', '.', '-' and ' ' (ids the provider
    // made, an amount, a currency booking checked), so none needs escaping; the return URL is escaped.
    let safe = |v: &str| v.chars().all(|c| c.is_ascii_alphanumeric() || "_.- ".contains(c));
    if !safe(&pay.payment_id) || !safe(&amount) {
        return refuse(StatusCode::UNPROCESSABLE_ENTITY, "unprintable_payment", "this payment cannot be shown");
    }
    let back = q.back.filter(|url| returns_to(&p.return_origins, url)).unwrap_or_default();
    let page = CHECKOUT_PAGE
        .replace("{amount}", &amount)
        .replace("{payment_id}", &pay.payment_id)
        .replace("{status}", &pay.status)
        .replace("{return}", &html_attribute(&back));
    let headers = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; base-uri 'none'; \
             form-action 'none'; frame-ancestors 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        // The page's URL carries the pay token: no page it leads to is told it.
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ];
    (headers, axum::response::Html(page)).into_response()
}

/// Whether `url` is an absolute http(s) URL on one of `origins`.
fn returns_to(origins: &[String], url: &str) -> bool {
    let Some((scheme, rest)) = url.split_once("://") else { return false };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let origin = format!("{scheme}://{authority}");
    matches!(scheme, "http" | "https")
        && !authority.is_empty()
        && !authority.contains(['@', '\\'])
        && origins.iter().any(|o| o.trim_end_matches('/').eq_ignore_ascii_case(&origin))
}

/// `value` escaped for a double-quoted HTML attribute.
fn html_attribute(value: &str) -> String {
    value.replace('&', "&amp;").replace('"', "&quot;").replace('<', "&lt;").replace('>', "&gt;").replace('\'', "&#39;")
}

const CHECKOUT_PAGE: &str = include_str!("checkout.html");
const CHECKOUT_SCRIPT: &str = include_str!("checkout.js");
const CHECKOUT_STYLE: &str = include_str!("checkout.css");

/// The fan's card page, reduced to its outcome (`?token=`, the payment's pay token): settles the payment and
/// delivers the signed event.
async fn complete(
    State(p): State<Provider>,
    Path(id): Path<String>,
    Query(q): Query<PayQuery>,
    Json(c): Json<Complete>,
) -> Response {
    if payable(&p, &id, q.token.as_deref()).is_none() {
        return refuse(StatusCode::NOT_FOUND, "unknown_payment", "no such payment");
    }
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

/// Sends the payment's last event again, with the same id (the account holder asks).
async fn redeliver(State(p): State<Provider>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    if !account(&p, &headers) {
        return unauthenticated();
    }
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
        let mut req = self.http.get(format!("{}/v1/payments/{payment_id}", self.base));
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

    /// Where a program completes a payment (`POST {"outcome"}`).
    pub fn pay_url(&self, payment: &Payment) -> String {
        format!("{}/v1/payments/{}/complete?token={}", self.base, payment.payment_id, payment.pay_token)
    }

    /// The page where a person pays (a shop adds `&return=<url>`).
    pub fn checkout_url(&self, payment: &Payment) -> String {
        format!("{}/v1/payments/{}/checkout?token={}", self.base, payment.payment_id, payment.pay_token)
    }
}
