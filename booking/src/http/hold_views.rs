//! What booking answers about held seats, shared by the routes that hold, pick, check out and show orders: the
//! priced seats, the hold's view, and the refusals that name a seat or a hold.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::error::ApiError;
use crate::domain::{Catalogue, HoldToken, SeatId};
use tokens::times::rfc3339_ms;

#[derive(Debug, Serialize, ToSchema)]
pub struct PricedSeat {
    pub seat_id: i64,
    pub label: String,
    pub ticket_type: String,
    pub price_cents: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct HoldView {
    /// Secret handle of the hold: needed to release, extend or check it out.
    pub hold_token: Uuid,
    /// RFC 3339, by Redis's clock.
    pub expires_at: String,
    pub seats: Vec<PricedSeat>,
    pub total_cents: i64,
    pub currency: String,
    /// The seat map version whose change (on the map's stream) shows this hold's seats as held.
    pub version: u64,
    /// For `best_available`: how good the seats are. Absent for named seats and in a replayed answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_available: Option<PickView>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PickView {
    /// `-(1,000,000 × section rank + 1,000 × row rank + twice the seats between the block's centre and its
    /// row's)`, ranks from 0 in the venue's order: 0 is the best block, higher is better. For seats in several
    /// blocks, the lowest of theirs.
    pub score: i64,
    /// Whether the seats are one block side by side (false only with `allow_split`).
    pub side_by_side: bool,
}

/// Free seats offered instead of a seat that went: one block side by side, as many seats as the basket.
#[derive(Debug, Serialize, ToSchema)]
pub struct Alternative {
    pub seat_ids: Vec<i64>,
    pub labels: Vec<String>,
    pub total_cents: i64,
}

/// Priced seats of a basket, in its order.
pub(super) fn priced(cat: &Catalogue, seats: &[SeatId]) -> Vec<PricedSeat> {
    seats
        .iter()
        .map(|&id| match cat.seat(id) {
            Some(s) => PricedSeat {
                seat_id: id.0,
                label: s.label.clone(),
                ticket_type: cat.ticket_type_name(s.ticket_type_id).to_owned(),
                price_cents: s.price_cents,
            },
            None => PricedSeat { seat_id: id.0, label: cat.label(id), ticket_type: String::new(), price_cents: 0 },
        })
        .collect()
}

/// 409 naming the seat that went, so the page can say which.
pub(super) fn seat_unavailable(cat: &Catalogue, seat: SeatId) -> ApiError {
    let label = cat.label(seat);
    ApiError::conflict("seat_unavailable", format!("{label} is no longer available"))
        .with("seat_id", seat.0)
        .with("label", label)
}

pub(super) fn hold_not_yours() -> ApiError {
    ApiError::forbidden("hold_not_yours", "this hold belongs to another account")
}

/// 201 with a hold just granted.
pub(super) fn granted(hold: HoldView) -> Response {
    metrics::counter!("booking_holds_total", "outcome" => "granted").increment(1);
    (StatusCode::CREATED, Json(hold)).into_response()
}

pub(super) fn view(
    cat: &Catalogue,
    token: HoldToken,
    seats: &[SeatId],
    expires_at_ms: i64,
    version: u64,
    best_available: Option<PickView>,
) -> HoldView {
    let seats = priced(cat, seats);
    HoldView {
        hold_token: token.0,
        expires_at: rfc3339_ms(expires_at_ms),
        total_cents: seats.iter().map(|s| s.price_cents).sum(),
        seats,
        currency: cat.event.currency.clone(),
        version,
        best_available,
    }
}

pub(super) fn account_limit(max: usize, counted: i64) -> ApiError {
    metrics::counter!("booking_holds_total", "outcome" => "account_limit").increment(1);
    ApiError::conflict(
        "account_limit_reached",
        format!("an account may hold and buy at most {max} seats for this event; it has {counted}"),
    )
    .with("max", max)
    .with("counted", counted)
}

pub(super) fn hold_expired() -> ApiError {
    ApiError::conflict("hold_expired", "this hold has expired; its seats may have gone to someone else")
}
