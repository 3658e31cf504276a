//! `POST /webhooks/payments`: the payment provider's signed events. Idempotent and order-independent: each
//! event id is applied at most once, under the order's row lock, by the state machine of
//! [`crate::domain::order`]; a redelivery, a failure after a success, or an event for an order already refunded
//! changes nothing and is answered 200, so the provider stops retrying.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use secrecy::ExposeSecret;
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::AppState;
use super::error::ApiError;
use super::lifecycle::{follow_up, order_not_found};
use crate::domain::OrderId;
use crate::domain::order::Command;
use crate::provider::{WebhookEvent, signature};
use crate::store::lifecycle::{self, Delivery, Outcome, Scope};
use crate::store::payments;

#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookAnswer {
    pub event_id: String,
    pub order_id: Uuid,
    /// What this delivery did: `paid`, `cancelled`, `refund_due`, or `ignored` (nothing to do).
    pub outcome: String,
    /// The order's status now.
    pub status: String,
    /// This event id was applied before; `outcome` is what it did then.
    pub duplicate: bool,
}

/// A signed event from the payment provider (`Payment-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "t.body">`).
#[utoipa::path(post, path = "/webhooks/payments", tag = "payments",
    request_body(content = String, description = "the provider's event: `{id, type, created, data: {payment_id, order_id, amount_cents, currency}}`", content_type = "application/json"),
    params(("Payment-Signature" = String, Header, description = "t=<unix seconds>,v1=<hex HMAC-SHA256>")),
    responses(
        (status = 200, body = WebhookAnswer, description = "applied, or nothing to do (also a redelivery)"),
        (status = 401, body = super::ErrorBody, description = "`signature_missing`, `signature_malformed`, `signature_stale`, `signature_mismatch`"),
        (status = 404, body = super::ErrorBody, description = "`order_not_found`"),
        (status = 422, body = super::ErrorBody, description = "`invalid_event`, `amount_mismatch`, `payment_mismatch`"),
        (status = 400, body = super::ErrorBody), (status = 413, body = super::ErrorBody),
        (status = 503, body = super::ErrorBody, description = "`payments_not_configured`, a store is down"),
    ))]
pub async fn payment_webhook(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<WebhookAnswer>), ApiError> {
    let Some(secret) = state.payments.webhook_secret.as_ref() else {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "payments_not_configured",
            "this service has no PAYMENT_WEBHOOK_SECRET",
        );
        e.retry_after_seconds = Some(60);
        return Err(e);
    };
    let header = headers.get(signature::HEADER).and_then(|v| v.to_str().ok());
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    signature::verify(secret.expose_secret().as_bytes(), header, &body, now).map_err(|r| {
        let code = match r {
            signature::Refusal::Missing => "signature_missing",
            signature::Refusal::Malformed => "signature_malformed",
            signature::Refusal::Stale => "signature_stale",
            signature::Refusal::Mismatch => "signature_mismatch",
        };
        ApiError::unauthorized(code, r.to_string())
    })?;
    let event: WebhookEvent = serde_json::from_slice(&body)
        .map_err(|e| ApiError::unprocessable("invalid_event", format!("not a payment event: {e}")))?;
    if event.id.is_empty() || event.id.len() > 255 {
        return Err(ApiError::unprocessable("invalid_event", "the event id must be 1 to 255 bytes"));
    }
    let id = OrderId(event.data.order_id);
    let command = match event.kind.as_str() {
        "payment.succeeded" => Command::PaymentSucceeded,
        "payment.failed" => Command::PaymentFailed,
        // Providers send many kinds; those that concern no order's state are acknowledged and dropped.
        _ => {
            return Ok((
                StatusCode::OK,
                Json(WebhookAnswer {
                    event_id: event.id,
                    order_id: id.0,
                    outcome: "ignored".into(),
                    status: String::new(),
                    duplicate: false,
                }),
            ));
        }
    };
    // Amounts never change after checkout, so a read without the lock is enough to refuse a wrong one.
    let order = lifecycle::get(&state.pool, id, Scope::Any).await?.ok_or_else(order_not_found)?;
    if order.total_cents != event.data.amount_cents || order.currency != event.data.currency {
        return Err(ApiError::unprocessable("amount_mismatch", "the payment's amount or currency is not the order's")
            .with("total_cents", order.total_cents)
            .with("currency", order.currency.clone()));
    }
    // An event is for the payment booking opened for this order, or for none of its business: the order id
    // alone is no proof, since the fan knows it.
    if order.payment_id.as_deref() != Some(event.data.payment_id.as_str()) {
        return Err(ApiError::unprocessable("payment_mismatch", "this order has no payment with that id"));
    }
    let delivery = Delivery { id: &event.id, kind: &event.kind };
    let window = state.payments.window;
    let outcome = match command {
        Command::PaymentSucceeded => {
            let cap = state.limits.max_seats_per_account;
            payments::succeeded(&state.pool, &state.holds, id, delivery, window, cap).await?
        }
        _ => lifecycle::apply(&state.pool, id, Scope::Any, command, Some(delivery), window).await?,
    };
    let (order, outcome, duplicate) = match outcome {
        Outcome::Changed { order, effect, .. } => {
            follow_up(&state, &order, effect).await;
            let done = order.status.as_str().to_owned();
            (order, done, false)
        }
        Outcome::Unchanged(order) => (order, "ignored".to_owned(), false),
        Outcome::Duplicate { order, outcome } => (order, outcome, true),
        Outcome::Refused { order, .. } => (order, "ignored".to_owned(), false),
        Outcome::NotFound => return Err(order_not_found()),
    };
    metrics::counter!("booking_payment_webhooks_total", "outcome" => outcome.clone()).increment(1);
    Ok((
        StatusCode::OK,
        Json(WebhookAnswer {
            event_id: event.id,
            order_id: id.0,
            outcome,
            status: order.state().effective().0.as_str().to_owned(),
            duplicate,
        }),
    ))
}
