//! Checkout: `POST /events/{id}/orders` with an `Idempotency-Key`.
//!
//! Two gates. Redis first: every seat of the hold must still carry its token (a cheap refusal of an expired
//! hold). Then one Postgres transaction writes the order and its seats; the unique index on active order seats
//! is the guarantee, and its violation is a 409 `seat_sold`, never a 500. The answer is recorded under the
//! idempotency key, so a retry gets the same answer and never a second order.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::AppState;
use super::auth::Proof;
use super::error::{ApiError, ApiJson, ApiPath};
use super::events::catalogue;
use super::hold_views::{PricedSeat, hold_expired, hold_not_yours, priced, seat_unavailable};
use super::idempotency::{idempotency_key, in_flight, key_reused};
use crate::domain::order::CancelReason;
use crate::domain::{Catalogue, EventId, HoldToken, SeatId};
use crate::store::holds::{HoldCheck, HoldRecord};
use crate::store::orders::{self, Answer, Checkout, CheckoutError, NewOrder, Order, Recorded};
use tokens::times::rfc3339;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderRequest {
    /// The hold to check out, as returned by `POST /events/{id}/holds`.
    #[schema(format = Uuid)]
    pub hold_token: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OrderView {
    pub order_id: Uuid,
    pub event_id: i64,
    /// `reserved` until paid (the payment window ends at `payment_due_at`), then `paid`; or `cancelled` (see
    /// `cancel_reason`), `refund_due` or `refunded`.
    pub status: String,
    /// Why a cancelled order was cancelled: `expired`, `payment_failed` or `operator`.
    pub cancel_reason: Option<CancelReason>,
    pub hold_token: Uuid,
    pub seats: Vec<PricedSeat>,
    /// Sum of the seats' prices at checkout, from their allocations.
    pub total_cents: i64,
    pub currency: String,
    pub payment_due_at: String,
    /// The provider's payment, once the fan started paying.
    pub payment_id: Option<String>,
    pub paid_at: Option<String>,
    pub created_at: String,
}

fn view(order: &Order, cat: &Catalogue) -> OrderView {
    let ids: Vec<SeatId> = order.seats.iter().map(|s| s.0).collect();
    let mut seats = priced(cat, &ids);
    // The price charged is the one Postgres wrote, whatever the cached catalogue says.
    for (view, (_, _, price)) in seats.iter_mut().zip(&order.seats) {
        view.price_cents = *price;
    }
    OrderView {
        order_id: order.id.0,
        event_id: order.event.0,
        status: order.status.clone(),
        cancel_reason: None,
        hold_token: order.hold.0,
        seats,
        total_cents: order.total_cents,
        currency: order.currency.clone(),
        payment_due_at: rfc3339(order.payment_due_at),
        payment_id: None,
        paid_at: None,
        created_at: rfc3339(order.created_at),
    }
}

/// Check out a hold: creates a `reserved` order for all of its seats, or nothing.
#[utoipa::path(post, path = "/events/{event_id}/orders", tag = "orders",
    params(
        ("event_id" = i64, Path, minimum = 1, description = "event id"),
        ("Idempotency-Key" = String, Header, min_length = 1, max_length = 255, pattern = "^[!-~]+$",
            description = "client-chosen key of 1 to 255 visible ASCII characters; the same key and body replay the same answer"),
    ),
    request_body = OrderRequest,
    security(("admission" = [])),
    responses(
        (status = 201, body = OrderView, description = "the order (also replayed for a retried key, with `Idempotent-Replayed: true`)"),
        (status = 409, body = super::ErrorBody, description = "`hold_expired`, `seat_sold` (with `seat_id` and `label`), `hold_already_checked_out`, `account_limit_reached`, `request_in_flight`"),
        (status = 422, body = super::ErrorBody, description = "`invalid_hold_token`, `idempotency_key_reused`, `invalid_body`"),
        (status = 400, body = super::ErrorBody), (status = 401, body = super::ErrorBody),
        (status = 403, body = super::ErrorBody), (status = 404, body = super::ErrorBody),
        (status = 415, body = super::ErrorBody), (status = 503, body = super::ErrorBody),
    ))]
pub async fn create_order(
    State(state): State<AppState>,
    ApiPath(event_id): ApiPath<i64>,
    proof: Proof,
    headers: HeaderMap,
    ApiJson(req): ApiJson<OrderRequest>,
) -> Result<Response, ApiError> {
    let event = EventId(event_id);
    let account = proof.account_for(event)?.as_str();
    let key = idempotency_key(&headers)?;
    let token = Uuid::parse_str(&req.hold_token)
        .map(HoldToken)
        .map_err(|_| ApiError::unprocessable("invalid_hold_token", "hold_token must be a UUID"))?;
    let cat = catalogue(&state, event_id).await?;

    // From here the checkout counts as on its way to Postgres: a batch about to go waits for it.
    let announced = state.checkouts.announce();
    let fingerprint = format!("POST /events/{event_id}/orders hold_token={token}");
    let answer = Answers { state: &state, cat: &cat, event, account, key, fingerprint: &fingerprint };

    // Gate 1, Redis: the hold must be this account's and every seat still its own. A retry of a checkout that
    // succeeded fails here (its seats are sold now) and is answered from its idempotency key.
    let rec = match gate(&state, event, account, token).await {
        Ok(rec) => rec,
        Err(Gate::Never(e)) => return answer.refused_unrecorded(e).await,
        Err(Gate::Refused(e)) => return answer.refused(e).await,
    };

    // Gate 2, Postgres: idempotency, the account cap, the order and all its seats, or nothing.
    let new = NewOrder {
        event,
        account: account.to_owned(),
        hold: token,
        seats: rec.seats.clone(),
        currency: cat.event.currency.clone(),
        payment_window_seconds: state.limits.payment_window_seconds,
        max_seats_per_account: state.limits.max_seats_per_account,
        idempotency_key: key.to_owned(),
        fingerprint: fingerprint.clone(),
    };
    let max = state.limits.max_seats_per_account;
    let order = match announced.checkout(new).await {
        Ok(Checkout::Created(order)) => order,
        Ok(Checkout::Replay(previous)) => return Ok(answer.replay(previous)),
        Ok(Checkout::InFlight) | Err(CheckoutError::KeyAnswered) => return Err(in_flight()),
        Ok(Checkout::Mismatch) => return Err(key_reused()),
        Ok(Checkout::AccountCap { owned }) => return answer.refused(account_limit(max, owned)).await,
        Ok(Checkout::NotOnSale(seat)) | Err(CheckoutError::Withdrawn(seat)) => {
            return answer.refused(seat_unavailable(&cat, seat)).await;
        }
        Err(CheckoutError::SeatSold(seat)) => {
            metrics::counter!("booking_checkouts_total", "outcome" => "seat_sold").increment(1);
            let label = cat.label(seat);
            let e = ApiError::conflict("seat_sold", format!("{label} was sold to someone else"))
                .with("seat_id", seat.0)
                .with("label", label);
            return answer.refused(e).await;
        }
        Err(CheckoutError::HoldUsed) => {
            let e = ApiError::conflict("hold_already_checked_out", "this hold was already checked out");
            return answer.refused(e).await;
        }
        Err(CheckoutError::Store(e)) => return Err(e.into()),
    };
    metrics::counter!("booking_checkouts_total", "outcome" => "created").increment(1);

    // The seats were marked sold in Redis before the batch answered (store/batcher.rs).
    Ok((StatusCode::CREATED, Json(view(&order, &cat))).into_response())
}

fn account_limit(max: usize, owned: i64) -> ApiError {
    ApiError::conflict(
        "account_limit_reached",
        format!("an account may buy at most {max} seats for this event; it has {owned}"),
    )
    .with("max", max)
    .with("counted", owned)
}

/// Answers under one idempotency key: refusals are recorded so a retry gets the same answer, and a key that
/// already answered is answered again.
struct Answers<'a> {
    state: &'a AppState,
    cat: &'a Catalogue,
    event: EventId,
    account: &'a str,
    key: &'a str,
    fingerprint: &'a str,
}

impl Answers<'_> {
    /// Sends a refusal, recording it under the key first; if the key already answered this request, sends
    /// that answer instead. A server error is never recorded, so a retry is served anew.
    async fn refused(&self, e: ApiError) -> Result<Response, ApiError> {
        if e.status.is_server_error() {
            return Err(e);
        }
        let recorded = orders::record_refusal(
            &self.state.pool,
            self.event,
            self.account,
            self.key,
            self.fingerprint,
            e.status.as_u16(),
            &e.body(),
        )
        .await;
        match recorded {
            Ok(Recorded::Stored) => Err(e),
            Ok(Recorded::Existing(previous)) => Ok(self.replay(previous)),
            Ok(Recorded::Mismatch) => Err(key_reused()),
            Ok(Recorded::InFlight) => Err(in_flight()),
            Err(err) => {
                tracing::warn!(error = %err, "could not record a refused checkout under its idempotency key");
                Err(e)
            }
        }
    }

    /// Sends a refusal without recording it; if the key already answered this request, sends that answer.
    async fn refused_unrecorded(&self, e: ApiError) -> Result<Response, ApiError> {
        if e.status.is_server_error() {
            return Err(e);
        }
        match orders::answered(&self.state.pool, self.event, self.account, self.key, self.fingerprint).await {
            Ok(Some(Recorded::Existing(previous))) => Ok(self.replay(previous)),
            Ok(Some(Recorded::Mismatch)) => Err(key_reused()),
            Ok(Some(Recorded::InFlight)) => Err(in_flight()),
            Ok(Some(Recorded::Stored) | None) => Err(e),
            Err(err) => {
                tracing::warn!(error = %err, "could not read a refused checkout's idempotency key");
                Err(e)
            }
        }
    }

    fn replay(&self, previous: Answer) -> Response {
        let mut res = match previous {
            Answer::Order(order) => (StatusCode::CREATED, Json(view(&order, self.cat))).into_response(),
            Answer::Refusal { status, body } => {
                (StatusCode::from_u16(status).unwrap_or(StatusCode::CONFLICT), Json(body)).into_response()
            }
        };
        res.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
        res
    }
}

/// Why gate 1 refused.
enum Gate {
    /// No such hold (made up, or gone long ago): not worth a row under the key.
    Never(ApiError),
    Refused(ApiError),
}

/// Gate 1: the hold exists, is this account's, and every seat still carries its token.
async fn gate(state: &AppState, event: EventId, account: &str, token: HoldToken) -> Result<HoldRecord, Gate> {
    match state.holds.verify(event, account, token).await.map_err(|e| Gate::Refused(e.into()))? {
        Ok(rec) => Ok(rec),
        Err(HoldCheck::NotYours) => Err(Gate::Refused(hold_not_yours())),
        Err(HoldCheck::NotFound) => Err(Gate::Never(hold_expired())),
        Err(_) => Err(Gate::Refused(hold_expired())),
    }
}
