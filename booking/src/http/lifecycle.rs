//! An order after checkout, for its fan: read it, start paying (a payment at the provider), and extend the
//! payment window within its cap. Also what every lifecycle route shares: the order's view, and the Redis
//! follow-up once Postgres committed a change.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::AppState;
use super::auth::Proof;
use super::error::{ApiError, ApiPath};
use super::events::catalogue;
use super::hold_views::priced;
use super::orders::OrderView;
use crate::domain::order::{Command, Status};
use crate::domain::{Catalogue, EventId, OrderId};
use crate::provider::NewPayment;
use crate::store::lifecycle::{self, OrderRow, Outcome, Scope, SeatsEffect};
use tokens::times::rfc3339;

/// The order as it is now (a reserved order past its deadline shows as cancelled, `expired`).
pub(super) fn view(order: &OrderRow, cat: &Catalogue) -> OrderView {
    let mut seats = priced(cat, &order.seat_ids());
    for (view, (_, price)) in seats.iter_mut().zip(&order.seats) {
        view.price_cents = *price;
    }
    let (status, reason) = order.state().effective();
    OrderView {
        order_id: order.id.0,
        event_id: order.event.0,
        status: status.as_str().to_owned(),
        cancel_reason: reason,
        hold_token: order.hold.0,
        seats,
        total_cents: order.total_cents,
        currency: order.currency.clone(),
        payment_due_at: rfc3339(order.payment_due_at),
        payment_id: order.payment_id.clone(),
        paid_at: order.paid_at.map(rfc3339),
        created_at: rfc3339(order.created_at),
    }
}

/// After Postgres committed a change: bring Redis's markers in line (best effort; Postgres is the guarantee,
/// and a marker left behind only refuses a hold that checkout would refuse anyway, until it lapses).
pub(super) async fn follow_up(state: &AppState, order: &OrderRow, effect: SeatsEffect) {
    if let Err(e) = state.holds.after_change(order, effect).await {
        tracing::warn!(error = %e, order = %order.id, ?effect, "order committed but Redis was not updated");
    }
}

pub(super) fn order_not_found() -> ApiError {
    ApiError::not_found("order_not_found", "no such order")
}

pub(super) fn parse_order_id(raw: &str) -> Result<OrderId, ApiError> {
    Uuid::parse_str(raw).map(OrderId).map_err(|_| ApiError::bad_request("invalid_order_id", "order_id must be a UUID"))
}

/// A refusal that names the order's current status.
pub(super) fn refused(code: &'static str, order: &OrderRow) -> ApiError {
    let (status, _) = order.state().effective();
    ApiError::conflict(code, format!("not possible while the order is {}", status.as_str()))
        .with("status", status.as_str())
}

/// The fan's order, after checking the path and the proof.
async fn fan_order(
    state: &AppState,
    proof: &Proof,
    event_id: i64,
    order_id: &str,
) -> Result<(OrderRow, std::sync::Arc<Catalogue>), ApiError> {
    let event = EventId(event_id);
    let account = proof.account_for(event)?.as_str();
    let id = parse_order_id(order_id)?;
    let cat = catalogue(state, event_id).await?;
    let order = lifecycle::get(&state.pool, id, Scope::Fan { event, account }).await?.ok_or_else(order_not_found)?;
    Ok((order, cat))
}

/// One of the fan's orders, with its status now.
#[utoipa::path(get, path = "/events/{event_id}/orders/{order_id}", tag = "orders",
    params(("event_id" = i64, Path, minimum = 1), ("order_id" = String, Path, format = Uuid)),
    security(("admission" = [])),
    responses(
        (status = 200, body = OrderView),
        (status = 404, body = super::ErrorBody, description = "`order_not_found` (also another account's order)"),
        (status = 400, body = super::ErrorBody), (status = 401, body = super::ErrorBody),
        (status = 403, body = super::ErrorBody), (status = 503, body = super::ErrorBody),
    ))]
pub async fn get_order(
    State(state): State<AppState>,
    ApiPath((event_id, order_id)): ApiPath<(i64, String)>,
    proof: Proof,
) -> Result<Json<OrderView>, ApiError> {
    let (order, cat) = fan_order(&state, &proof, event_id, &order_id).await?;
    Ok(Json(view(&order, &cat)))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PaymentView {
    pub order_id: Uuid,
    /// The provider's payment id (one per order: asking again returns the same payment).
    pub payment_id: String,
    pub amount_cents: i64,
    pub currency: String,
    /// Where a program settles the payment at the fake provider (`POST {"outcome": "succeeded"}`).
    pub pay_url: String,
    /// The provider's page where a person pays; `?return=<url>` brings them back afterwards.
    pub checkout_url: String,
    /// Pay before this, RFC 3339.
    pub payment_due_at: String,
}

/// Start paying for a reserved order: creates (or returns) its payment at the provider.
#[utoipa::path(post, path = "/events/{event_id}/orders/{order_id}/payment", tag = "orders",
    params(("event_id" = i64, Path, minimum = 1), ("order_id" = String, Path, format = Uuid)),
    security(("admission" = [])),
    responses(
        (status = 201, body = PaymentView),
        (status = 409, body = super::ErrorBody, description = "`order_not_reserved` (paid, cancelled or expired)"),
        (status = 404, body = super::ErrorBody), (status = 400, body = super::ErrorBody),
        (status = 401, body = super::ErrorBody), (status = 403, body = super::ErrorBody),
        (status = 503, body = super::ErrorBody, description = "`payment_provider_unavailable`"),
    ))]
pub async fn start_payment(
    State(state): State<AppState>,
    ApiPath((event_id, order_id)): ApiPath<(i64, String)>,
    proof: Proof,
) -> Result<(StatusCode, Json<PaymentView>), ApiError> {
    let (order, _) = fan_order(&state, &proof, event_id, &order_id).await?;
    if order.state().effective().0 != Status::Reserved {
        return Err(refused("order_not_reserved", &order));
    }
    let new = NewPayment {
        order_id: order.id.0,
        amount_cents: order.total_cents,
        currency: order.currency.clone(),
        webhook_url: state.payments.webhook_url.clone(),
    };
    let payment = state.payments.provider.create_payment(&new).await.map_err(|e| {
        tracing::warn!(error = %e, "payment provider");
        let mut err = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "payment_provider_unavailable",
            "the payment provider is not answering; retry shortly",
        );
        err.retry_after_seconds = Some(2);
        err
    })?;
    let payment_id = lifecycle::attach_payment(&state.pool, order.id, &payment.payment_id)
        .await?
        .unwrap_or_else(|| payment.payment_id.clone());
    if payment_id != payment.payment_id {
        // The provider keeps one payment per order: it answered with another than the one attached.
        tracing::warn!(order = %order.id, attached = %payment_id, answered = %payment.payment_id, "payment ids differ");
        return Err(ApiError::from(crate::store::StoreError::Unexpected(
            "the provider answered another payment".into(),
        )));
    }
    Ok((
        StatusCode::CREATED,
        Json(PaymentView {
            order_id: order.id.0,
            pay_url: state.payments.provider.pay_url(&payment),
            checkout_url: state.payments.provider.checkout_url(&payment),
            payment_id,
            amount_cents: order.total_cents,
            currency: order.currency.clone(),
            payment_due_at: rfc3339(order.payment_due_at),
        }),
    ))
}

/// More time to pay: the deadline moves to now + the payment window, never past the order's absolute cap.
#[utoipa::path(post, path = "/events/{event_id}/orders/{order_id}/extend", tag = "orders",
    params(("event_id" = i64, Path, minimum = 1), ("order_id" = String, Path, format = Uuid)),
    security(("admission" = [])),
    responses(
        (status = 200, body = OrderView, description = "the order with its new `payment_due_at`"),
        (status = 409, body = super::ErrorBody, description = "`order_not_reserved`, `payment_window_at_cap`"),
        (status = 404, body = super::ErrorBody), (status = 400, body = super::ErrorBody),
        (status = 401, body = super::ErrorBody), (status = 403, body = super::ErrorBody),
        (status = 503, body = super::ErrorBody),
    ))]
pub async fn extend_order(
    State(state): State<AppState>,
    ApiPath((event_id, order_id)): ApiPath<(i64, String)>,
    proof: Proof,
) -> Result<Json<OrderView>, ApiError> {
    let (order, cat) = fan_order(&state, &proof, event_id, &order_id).await?;
    let scope = Scope::Fan { event: order.event, account: &order.account };
    match lifecycle::apply(&state.pool, order.id, scope, Command::Extend, None, state.payments.window).await? {
        Outcome::Changed { order, effect, .. } => {
            follow_up(&state, &order, effect).await;
            Ok(Json(view(&order, &cat)))
        }
        Outcome::Refused { order, code } => Err(refused(code, &order)),
        Outcome::Unchanged(order) | Outcome::Duplicate { order, .. } => Ok(Json(view(&order, &cat))),
        Outcome::NotFound => Err(order_not_found()),
    }
}
