//! Holds: create a basket hold (all or nothing), release it, extend it.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use super::AppState;
use super::auth::Proof;
use super::error::{ApiError, ApiJson, ApiPath};
use super::events::catalogue;
use crate::domain::{Basket, BasketError, Catalogue, EventId, HoldToken, SeatId};
use crate::store::holds::{Acquired, HoldCheck, HoldRecord};
use crate::store::orders::rfc3339;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HoldRequest {
    /// The seats to hold, all or none. At most the basket cap (default 8), no duplicates.
    #[schema(min_items = 1, value_type = std::collections::BTreeSet<i64>)]
    #[serde(deserialize_with = "whole_numbers")]
    pub seat_ids: Vec<i64>,
}

/// Seat ids as JSON integers; a number with a zero fraction (`12.0`) is the same integer, as JSON Schema says.
fn whole_numbers<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<i64>, D::Error> {
    use serde::de::Error;
    let raw: Vec<serde_json::Number> = Vec::deserialize(d)?;
    raw.iter()
        .map(|n| {
            n.as_i64()
                .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15).map(|f| f as i64))
                .ok_or_else(|| D::Error::custom(format!("seat id {n} is not a 64-bit integer")))
        })
        .collect()
}

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
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReleaseView {
    pub hold_token: Uuid,
    /// Seats that were still held by this token and are now free.
    pub released: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ExtendView {
    pub hold_token: Uuid,
    /// The new expiry, RFC 3339; never later than the hold's absolute cap.
    pub expires_at: String,
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

pub(super) fn ms_to_rfc3339(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).map(rfc3339).unwrap_or_default()
}

/// 409 naming the seat that went, so the page can say which.
pub(super) fn seat_unavailable(cat: &Catalogue, seat: SeatId) -> ApiError {
    let label = cat.label(seat);
    ApiError::conflict("seat_unavailable", format!("{label} is no longer available"))
        .with("seat_id", seat.0)
        .with("label", label)
}

fn basket_error(e: BasketError) -> ApiError {
    let message = e.to_string();
    match e {
        BasketError::Empty => ApiError::unprocessable("empty_basket", message),
        BasketError::Duplicate(seat) => ApiError::unprocessable("duplicate_seat", message).with("seat_id", seat.0),
        BasketError::TooMany { max } => ApiError::unprocessable("too_many_seats", message).with("max", max),
        BasketError::NotOnSale(seat) => ApiError::unprocessable("seat_not_on_sale", message).with("seat_id", seat.0),
    }
}

/// Parses a hold token from the path.
pub(super) fn parse_hold_token(raw: &str) -> Result<HoldToken, ApiError> {
    Uuid::parse_str(raw)
        .map(HoldToken)
        .map_err(|_| ApiError::bad_request("invalid_hold_token", "hold_token must be a UUID"))
}

/// Reads a hold's record and checks it belongs to `account`.
pub(super) async fn own_record(
    state: &AppState,
    event: EventId,
    account: &str,
    token: HoldToken,
) -> Result<HoldRecord, ApiError> {
    let rec = state.holds.record(event, token).await?.ok_or_else(|| {
        ApiError::not_found("hold_not_found", "no such hold (released, expired long ago, or never made)")
    })?;
    if rec.account != account {
        return Err(hold_not_yours());
    }
    Ok(rec)
}

pub(super) fn hold_not_yours() -> ApiError {
    ApiError::forbidden("hold_not_yours", "this hold belongs to another account")
}

/// Hold a basket of seats: every seat or none.
#[utoipa::path(post, path = "/events/{event_id}/holds", tag = "holds",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    request_body = HoldRequest,
    security(("admission" = [])),
    responses(
        (status = 201, body = HoldView, description = "every seat is held for this token"),
        (status = 409, body = super::ErrorBody, description = "`seat_unavailable` (with `seat_id` and `label`) or `account_limit_reached`"),
        (status = 422, body = super::ErrorBody, description = "`empty_basket`, `duplicate_seat`, `too_many_seats`, `seat_not_on_sale`, `invalid_body`"),
        (status = 400, body = super::ErrorBody), (status = 401, body = super::ErrorBody),
        (status = 403, body = super::ErrorBody), (status = 404, body = super::ErrorBody),
        (status = 413, body = super::ErrorBody), (status = 415, body = super::ErrorBody),
        (status = 503, body = super::ErrorBody),
    ))]
pub async fn create_hold(
    State(state): State<AppState>,
    ApiPath(event_id): ApiPath<i64>,
    proof: Proof,
    ApiJson(req): ApiJson<HoldRequest>,
) -> Result<(StatusCode, Json<HoldView>), ApiError> {
    let event = EventId(event_id);
    let account = proof.account_for(event)?;
    let cat = catalogue(&state, event_id).await?;
    let basket = Basket::parse(&req.seat_ids, state.limits.max_seats_per_basket, &cat).map_err(basket_error)?;
    let token = HoldToken::generate();
    let max = state.limits.max_seats_per_account;
    match state.holds.acquire(event, account.as_str(), token, basket.seats(), max).await? {
        Acquired::Granted { expires_at_ms } => {
            metrics::counter!("booking_holds_total", "outcome" => "granted").increment(1);
            let seats = priced(&cat, basket.seats());
            let total_cents = seats.iter().map(|s| s.price_cents).sum();
            Ok((
                StatusCode::CREATED,
                Json(HoldView {
                    hold_token: token.0,
                    expires_at: ms_to_rfc3339(expires_at_ms),
                    seats,
                    total_cents,
                    currency: cat.event.currency.clone(),
                }),
            ))
        }
        Acquired::SeatTaken { index } => {
            metrics::counter!("booking_holds_total", "outcome" => "seat_unavailable").increment(1);
            Err(seat_unavailable(&cat, basket.seats()[index]))
        }
        Acquired::AccountCap { counted } => {
            metrics::counter!("booking_holds_total", "outcome" => "account_limit").increment(1);
            Err(ApiError::conflict(
                "account_limit_reached",
                format!("an account may hold and buy at most {max} seats for this event; it has {counted}"),
            )
            .with("max", max)
            .with("counted", counted))
        }
    }
}

/// Release a hold: frees only the seats still held by this token.
#[utoipa::path(delete, path = "/events/{event_id}/holds/{hold_token}", tag = "holds",
    params(("event_id" = i64, Path, minimum = 1, description = "event id"), ("hold_token" = Uuid, Path, description = "hold token")),
    security(("admission" = [])),
    responses(
        (status = 200, body = ReleaseView),
        (status = 403, body = super::ErrorBody, description = "`hold_not_yours`"),
        (status = 404, body = super::ErrorBody, description = "`hold_not_found`"),
        (status = 400, body = super::ErrorBody), (status = 401, body = super::ErrorBody),
        (status = 503, body = super::ErrorBody),
    ))]
pub async fn release_hold(
    State(state): State<AppState>,
    ApiPath((event_id, raw_token)): ApiPath<(i64, String)>,
    proof: Proof,
) -> Result<Json<ReleaseView>, ApiError> {
    let event = EventId(event_id);
    let account = proof.account_for(event)?;
    let token = parse_hold_token(&raw_token)?;
    catalogue(&state, event_id).await?;
    let rec = own_record(&state, event, account.as_str(), token).await?;
    match state.holds.release(event, account.as_str(), token, &rec).await? {
        HoldCheck::Released { seats } => Ok(Json(ReleaseView { hold_token: token.0, released: seats })),
        HoldCheck::NotYours => Err(hold_not_yours()),
        _ => Err(ApiError::not_found("hold_not_found", "no such hold")),
    }
}

/// Extend a live hold by the hold time, never past its absolute cap.
#[utoipa::path(post, path = "/events/{event_id}/holds/{hold_token}/extend", tag = "holds",
    params(("event_id" = i64, Path, minimum = 1, description = "event id"), ("hold_token" = Uuid, Path, description = "hold token")),
    security(("admission" = [])),
    responses(
        (status = 200, body = ExtendView),
        (status = 409, body = super::ErrorBody, description = "`hold_expired`"),
        (status = 403, body = super::ErrorBody, description = "`hold_not_yours`"),
        (status = 404, body = super::ErrorBody, description = "`hold_not_found`"),
        (status = 400, body = super::ErrorBody), (status = 401, body = super::ErrorBody),
        (status = 503, body = super::ErrorBody),
    ))]
pub async fn extend_hold(
    State(state): State<AppState>,
    ApiPath((event_id, raw_token)): ApiPath<(i64, String)>,
    proof: Proof,
) -> Result<Json<ExtendView>, ApiError> {
    let event = EventId(event_id);
    let account = proof.account_for(event)?;
    let token = parse_hold_token(&raw_token)?;
    catalogue(&state, event_id).await?;
    let rec = own_record(&state, event, account.as_str(), token).await?;
    match state.holds.extend(event, account.as_str(), token, &rec).await? {
        HoldCheck::Live { expires_at_ms } => {
            Ok(Json(ExtendView { hold_token: token.0, expires_at: ms_to_rfc3339(expires_at_ms) }))
        }
        HoldCheck::Lost { .. } => Err(hold_expired()),
        HoldCheck::NotYours => Err(hold_not_yours()),
        _ => Err(ApiError::not_found("hold_not_found", "no such hold")),
    }
}

pub(super) fn hold_expired() -> ApiError {
    ApiError::conflict("hold_expired", "this hold has expired; its seats may have gone to someone else")
}
