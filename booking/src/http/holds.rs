//! Holds: create a basket hold (all or nothing), release it, extend it.

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
use super::hold_views::{HoldView, account_limit, granted, hold_expired, hold_not_yours, seat_unavailable, view};
use super::idempotency::{in_flight, key_reused, optional_idempotency_key};
use super::picking;
use crate::domain::best::Want;
use crate::domain::{Basket, BasketError, Catalogue, EventId, HoldToken, join_seats};
use crate::store::holds::{Acquired, Ask, Claim, HoldCheck, HoldKey, HoldRecord};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(min_properties = 1, max_properties = 1)]
pub struct HoldRequest {
    /// The seats to hold, all or none. At most the basket cap (default 8), no duplicates. Give this or
    /// `best_available`, not both.
    #[schema(min_items = 1, value_type = Option<std::collections::BTreeSet<i64>>, nullable = false)]
    #[serde(default)]
    pub seat_ids: Option<Vec<Whole>>,
    /// Let booking pick the seats: the best block of side-by-side free seats (see `score` in the answer).
    #[schema(nullable = false)]
    #[serde(default)]
    pub best_available: Option<BestAvailable>,
}

/// What to pick: `quantity` side-by-side seats in the best free block, by section (the venue's order), then row,
/// then distance from the row's centre.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BestAvailable {
    /// How many seats, 1 to the basket cap.
    #[schema(value_type = i64, minimum = 1)]
    pub quantity: Whole,
    /// Only seats of this ticket type.
    #[schema(value_type = Option<i64>)]
    #[serde(default)]
    pub ticket_type_id: Option<Whole>,
    /// Only seats of this section (its name, as in the layout's `sections`).
    #[serde(default)]
    pub section: Option<String>,
    /// Only accessible seats.
    #[serde(default)]
    pub accessible: bool,
    /// When no block of `quantity` side-by-side seats is free, take the seats in the fewest blocks instead.
    /// Never fewer seats than asked.
    #[serde(default)]
    pub allow_split: bool,
}

/// A JSON integer; a number with a zero fraction (`12.0`) is the same integer, as JSON Schema says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Whole(pub i64);

impl<'de> Deserialize<'de> for Whole {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let n = serde_json::Number::deserialize(d)?;
        n.as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15).map(|f| f as i64))
            .map(Whole)
            .ok_or_else(|| D::Error::custom(format!("{n} is not a 64-bit integer")))
    }
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

/// Hold seats, every one or none: the seats named, or the best free block booking picks.
#[utoipa::path(post, path = "/events/{event_id}/holds", tag = "holds",
    params(
        ("event_id" = i64, Path, minimum = 1, description = "event id"),
        ("Idempotency-Key" = Option<String>, Header, nullable = false, min_length = 1, max_length = 255, pattern = "^[!-~]+$",
            description = "client-chosen key of 1 to 255 visible ASCII characters: a retry with the same key and body gets the same hold (`Idempotent-Replayed: true`) and never a second one"),
    ),
    request_body = HoldRequest,
    security(("admission" = [])),
    responses(
        (status = 201, body = HoldView, description = "every seat is held for this token"),
        (status = 409, body = super::ErrorBody, description = "`seat_unavailable` (with `seat_id`, `label` and `alternatives`: up to 3 free blocks of the basket's size, nearest first), `no_seats_together` (with `available` and `largest_block`), `best_available_contended`, `account_limit_reached`, `request_in_flight`, `hold_expired` (a replayed key whose hold ended)"),
        (status = 422, body = super::ErrorBody, description = "`empty_basket`, `duplicate_seat`, `too_many_seats`, `seat_not_on_sale`, `unknown_ticket_type`, `unknown_section`, `idempotency_key_reused`, `invalid_body`"),
        (status = 400, body = super::ErrorBody), (status = 401, body = super::ErrorBody),
        (status = 403, body = super::ErrorBody), (status = 404, body = super::ErrorBody),
        (status = 413, body = super::ErrorBody), (status = 415, body = super::ErrorBody),
        (status = 503, body = super::ErrorBody),
    ))]
pub async fn create_hold(
    State(state): State<AppState>,
    ApiPath(event_id): ApiPath<i64>,
    proof: Proof,
    headers: HeaderMap,
    ApiJson(req): ApiJson<HoldRequest>,
) -> Result<Response, ApiError> {
    let event = EventId(event_id);
    let account = proof.account_for(event)?;
    let key = optional_idempotency_key(&headers)?;
    let cat = catalogue(&state, event_id).await?;
    let asked = Asked::parse(req, state.limits.max_seats_per_basket, &cat)?;
    let Some(key) = key else {
        return hold(&state, &cat, event, account.as_str(), &asked, None).await;
    };
    let fingerprint = asked.fingerprint(event);
    let claim = match state.holds.claim_key(event, account.as_str(), key, &fingerprint).await? {
        (Claim::New, claim) => claim,
        (Claim::InFlight, _) => return Err(in_flight()),
        (Claim::Reused, _) => return Err(key_reused()),
        (Claim::Granted(token), _) => return replay(&state, &cat, event, account.as_str(), token).await,
    };
    let answer = hold(&state, &cat, event, account.as_str(), &asked, Some(&claim)).await;
    // A request that made no hold gives its key back, so a retry is served anew (a hold, once made, is recorded
    // under the key by the same script that made it).
    if answer.is_err()
        && let Err(e) = state.holds.unclaim(&claim).await
    {
        tracing::warn!(error = %e, "could not give back an idempotency key; it frees itself shortly");
    }
    answer
}

/// What a hold request asks for, checked against the catalogue.
#[derive(Debug)]
enum Asked {
    Seats(Basket),
    Best { want: Want, allow_split: bool },
}

impl Asked {
    fn parse(req: HoldRequest, max_seats: usize, cat: &Catalogue) -> Result<Self, ApiError> {
        match (req.seat_ids, req.best_available) {
            (Some(ids), None) => {
                let ids: Vec<i64> = ids.iter().map(|w| w.0).collect();
                Ok(Self::Seats(Basket::parse(&ids, max_seats, cat).map_err(basket_error)?))
            }
            (None, Some(best)) => {
                let quantity = usize::try_from(best.quantity.0).unwrap_or(0);
                if quantity == 0 {
                    return Err(basket_error(BasketError::Empty));
                }
                if quantity > max_seats {
                    return Err(basket_error(BasketError::TooMany { max: max_seats }));
                }
                let ticket_type_id = best.ticket_type_id.map(|w| w.0);
                if let Some(id) = ticket_type_id
                    && !cat.ticket_types.iter().any(|t| t.id == id)
                {
                    return Err(ApiError::unprocessable(
                        "unknown_ticket_type",
                        format!("no ticket type {id} for this event"),
                    )
                    .with("ticket_type_id", id));
                }
                if let Some(name) = &best.section
                    && !cat.seats().iter().any(|s| &s.section == name)
                {
                    return Err(ApiError::unprocessable(
                        "unknown_section",
                        format!("no section {name:?} has seats on sale"),
                    )
                    .with("section", name.clone()));
                }
                let want = Want { quantity, ticket_type_id, section: best.section, accessible: best.accessible };
                Ok(Self::Best { want, allow_split: best.allow_split })
            }
            _ => Err(ApiError::unprocessable("invalid_body", "give either `seat_ids` or `best_available`")),
        }
    }

    /// What makes two requests the same, for an idempotency key.
    fn fingerprint(&self, event: EventId) -> String {
        use sha2::Digest;
        let text = match self {
            Self::Seats(basket) => format!("{event} seats {}", join_seats(basket.seats())),
            Self::Best { want, allow_split } => format!(
                "{event} best {} {:?} {:?} {} {allow_split}",
                want.quantity, want.ticket_type_id, want.section, want.accessible
            ),
        };
        hex::encode(&sha2::Sha256::digest(text.as_bytes())[..16])
    }
}

/// Makes the hold (recorded under `claim` if given).
async fn hold(
    state: &AppState,
    cat: &Catalogue,
    event: EventId,
    account: &str,
    asked: &Asked,
    claim: Option<&HoldKey>,
) -> Result<Response, ApiError> {
    let basket = match asked {
        Asked::Seats(basket) => basket,
        Asked::Best { want, allow_split } => {
            return picking::best_available(state, cat, event, account, want, *allow_split, claim).await;
        }
    };
    let token = HoldToken::generate();
    let max = state.limits.max_seats_per_account;
    let seats = basket.seats();
    let ask =
        Ask { account, token, seats, blocks: &[0], block_size: seats.len(), max_per_account: max, idempotency: claim };
    match state.holds.acquire(event, &ask).await? {
        Acquired::Granted { expires_at_ms, version, .. } => {
            Ok(granted(view(cat, token, seats, expires_at_ms, version, None)))
        }
        Acquired::SeatTaken { index } => {
            metrics::counter!("booking_holds_total", "outcome" => "seat_unavailable").increment(1);
            let alternatives = picking::alternatives(state, cat, event, seats).await;
            Err(seat_unavailable(cat, seats[index]).with("alternatives", alternatives))
        }
        Acquired::AccountCap { counted } => Err(account_limit(max, counted)),
        Acquired::NoneFree => Err(ApiError::internal(&"acquire_hold named several blocks for a basket")),
    }
}

/// The answer for a key whose request made a hold: the hold as it is now, or `hold_expired` once it ended
/// (released, lapsed or checked out): a retry never makes a second hold.
async fn replay(
    state: &AppState,
    cat: &Catalogue,
    event: EventId,
    account: &str,
    token: HoldToken,
) -> Result<Response, ApiError> {
    let live = match state.holds.verify(event, account, token).await? {
        Ok(rec) => state.holds.expiry(event, token).await?.map(|expires| (rec, expires)),
        Err(_) => None,
    };
    let mut res = match live {
        Some((rec, expires)) => {
            let version = state.holds.map_version(event).await?;
            (StatusCode::CREATED, Json(view(cat, token, &rec.seats, expires, version, None))).into_response()
        }
        None => hold_expired().into_response(),
    };
    res.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
    Ok(res)
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
            Ok(Json(ExtendView { hold_token: token.0, expires_at: tokens::times::rfc3339_ms(expires_at_ms) }))
        }
        HoldCheck::Lost { .. } => Err(hold_expired()),
        HoldCheck::NotYours => Err(hold_not_yours()),
        _ => Err(ApiError::not_found("hold_not_found", "no such hold")),
    }
}
