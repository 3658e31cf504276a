//! Operator routes (`/admin/...`, bearer `BOOKING_ADMIN_TOKEN`): an order with its history, refund and cancel,
//! and an event's orders counted by status. Not forwarded by the gateway (it forwards only `/events/...`).

use axum::Json;
use axum::extract::{FromRequestParts, State};
use axum::http::header;
use axum::http::request::Parts;
use secrecy::ExposeSecret;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, ApiPath};
use super::events::catalogue;
use super::lifecycle::{follow_up, order_not_found, parse_order_id, refused, view};
use super::orders::OrderView;
use crate::domain::order::{Command, Status};
use crate::domain::{EventId, OrderId};
use crate::store::lifecycle::{self, Outcome, Scope};
use crate::store::outbox;
use tokens::times::rfc3339;

/// A request that carried the operator's bearer token.
pub struct Operator;

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Some(expected) = state.admin_token.as_ref() else {
            return Err(ApiError::forbidden("admin_disabled", "this service has no BOOKING_ADMIN_TOKEN"));
        };
        let same = crate::bearer_is(parts.headers.get(header::AUTHORIZATION), expected.expose_secret().as_bytes());
        if same {
            Ok(Operator)
        } else {
            Err(ApiError::unauthorized("admin_token_invalid", "a valid admin bearer token is needed"))
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct HistoryView {
    /// The outbox row's id: the `id` field of the stream entry it was published as.
    pub id: i64,
    /// `order.reserved`, `order.paid`, `order.cancelled`, `order.refund_due`, `order.refunded`, `order.extended`
    pub kind: String,
    pub from: Option<String>,
    pub to: String,
    pub at: String,
    /// Published to the Redis Stream yet.
    pub published: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AdminOrderView {
    pub order: OrderView,
    pub account_id: String,
    pub history: Vec<HistoryView>,
}

async fn admin_view(state: &AppState, id: OrderId) -> Result<AdminOrderView, ApiError> {
    let order = lifecycle::get(&state.pool, id, Scope::Any).await?.ok_or_else(order_not_found)?;
    let cat = catalogue(state, order.event.0).await?;
    let history = lifecycle::history(&state.pool, id)
        .await?
        .into_iter()
        .map(|h| HistoryView {
            id: h.id,
            kind: h.kind,
            from: h.from,
            to: h.to,
            at: rfc3339(h.at),
            published: h.published,
        })
        .collect();
    Ok(AdminOrderView { order: view(&order, &cat), account_id: order.account, history })
}

/// An order with its history (every change of state, oldest first).
#[utoipa::path(get, path = "/admin/orders/{order_id}", tag = "admin", operation_id = "admin_get_order",
    params(("order_id" = String, Path, format = Uuid)),
    security(("admin" = [])),
    responses(
        (status = 200, body = AdminOrderView),
        (status = 404, body = super::ErrorBody), (status = 400, body = super::ErrorBody),
        (status = 401, body = super::ErrorBody), (status = 403, body = super::ErrorBody),
        (status = 503, body = super::ErrorBody),
    ))]
pub async fn get_order(
    State(state): State<AppState>,
    _: Operator,
    ApiPath(order_id): ApiPath<String>,
) -> Result<Json<AdminOrderView>, ApiError> {
    Ok(Json(admin_view(&state, parse_order_id(&order_id)?).await?))
}

async fn operate(state: &AppState, order_id: &str, command: Command) -> Result<Json<AdminOrderView>, ApiError> {
    let id = parse_order_id(order_id)?;
    match lifecycle::apply(&state.pool, id, Scope::Any, command, None, state.payments.window).await? {
        Outcome::Changed { order, effect, .. } => follow_up(state, &order, effect).await,
        Outcome::Refused { order, code } => return Err(refused(code, &order)),
        Outcome::Unchanged(_) | Outcome::Duplicate { .. } => {}
        Outcome::NotFound => return Err(order_not_found()),
    }
    Ok(Json(admin_view(state, id).await?))
}

/// Cancel an order: a reserved one is cancelled (`operator`); a paid one becomes `refund_due`. Its seats go
/// back on sale.
#[utoipa::path(post, path = "/admin/orders/{order_id}/cancel", tag = "admin",
    params(("order_id" = String, Path, format = Uuid)),
    security(("admin" = [])),
    responses(
        (status = 200, body = AdminOrderView),
        (status = 409, body = super::ErrorBody, description = "`order_not_cancellable`"),
        (status = 404, body = super::ErrorBody), (status = 400, body = super::ErrorBody),
        (status = 401, body = super::ErrorBody), (status = 403, body = super::ErrorBody),
        (status = 503, body = super::ErrorBody),
    ))]
pub async fn cancel_order(
    State(state): State<AppState>,
    _: Operator,
    ApiPath(order_id): ApiPath<String>,
) -> Result<Json<AdminOrderView>, ApiError> {
    operate(&state, &order_id, Command::Cancel).await
}

/// Refund a paid (or refund_due) order: it becomes `refunded`, and a paid order's seats go back on sale. The
/// money itself moves downstream, from the `order.refunded` event on the stream.
#[utoipa::path(post, path = "/admin/orders/{order_id}/refund", tag = "admin",
    params(("order_id" = String, Path, format = Uuid)),
    security(("admin" = [])),
    responses(
        (status = 200, body = AdminOrderView),
        (status = 409, body = super::ErrorBody, description = "`order_not_refundable`"),
        (status = 404, body = super::ErrorBody), (status = 400, body = super::ErrorBody),
        (status = 401, body = super::ErrorBody), (status = 403, body = super::ErrorBody),
        (status = 503, body = super::ErrorBody),
    ))]
pub async fn refund_order(
    State(state): State<AppState>,
    _: Operator,
    ApiPath(order_id): ApiPath<String>,
) -> Result<Json<AdminOrderView>, ApiError> {
    operate(&state, &order_id, Command::Refund).await
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StatusCountView {
    pub status: Status,
    pub orders: i64,
    pub seats: i64,
    pub total_cents: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EventOrdersView {
    pub event_id: i64,
    /// By status now (a reserved order past its deadline counts as cancelled); statuses with no order are left
    /// out.
    pub by_status: Vec<StatusCountView>,
    /// Order events not yet published to the stream (all events, not only this one's).
    pub outbox_backlog: i64,
}

/// An event's orders counted by status.
#[utoipa::path(get, path = "/admin/events/{event_id}/orders", tag = "admin",
    params(("event_id" = i64, Path, minimum = 1)),
    security(("admin" = [])),
    responses(
        (status = 200, body = EventOrdersView),
        (status = 404, body = super::ErrorBody), (status = 400, body = super::ErrorBody),
        (status = 401, body = super::ErrorBody), (status = 403, body = super::ErrorBody),
        (status = 503, body = super::ErrorBody),
    ))]
pub async fn event_orders(
    State(state): State<AppState>,
    _: Operator,
    ApiPath(event_id): ApiPath<i64>,
) -> Result<Json<EventOrdersView>, ApiError> {
    catalogue(&state, event_id).await?;
    let by_status = lifecycle::counts(&state.pool, EventId(event_id))
        .await?
        .into_iter()
        .map(|c| StatusCountView { status: c.status, orders: c.orders, seats: c.seats, total_cents: c.total_cents })
        .collect();
    Ok(Json(EventOrdersView { event_id, by_status, outbox_backlog: outbox::backlog(&state.pool).await? }))
}
