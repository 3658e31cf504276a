//! `GET /events/{id}` and the live seat map `GET /events/{id}/seats`.

use std::collections::HashSet;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::auth::Proof;
use super::error::{ApiError, ApiPath};
use super::seat_maps::{Part, Snapshot, accepts_gzip};
use crate::domain::{Catalogue, EventId, MapVersion, SeatId, SeatStatus, TicketType};
use crate::store::orders;

#[derive(Debug, Serialize, ToSchema)]
pub struct TicketTypeView {
    pub ticket_type_id: i64,
    pub name: String,
    /// Price in minor units of the event's currency.
    pub price_cents: i64,
}

impl From<&TicketType> for TicketTypeView {
    fn from(t: &TicketType) -> Self {
        Self { ticket_type_id: t.id, name: t.name.clone(), price_cents: t.price_cents }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EventView {
    pub event_id: i64,
    pub name: String,
    pub venue: String,
    /// RFC 3339.
    pub starts_at: String,
    /// ISO 4217 code of every price of the event.
    pub currency: String,
    pub ticket_types: Vec<TicketTypeView>,
    /// Seats allocated to the event (held-back seats are not on sale and not counted).
    pub seats_on_sale: usize,
}

/// A seat as the map lists it. The document calls it `Seat`: the resource a hold's `seat_ids` name, so that
/// tools which follow resources from one operation to the next (schemathesis's stateful phase) see the map as
/// where seats come from.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Seat)]
pub struct SeatView {
    pub seat_id: i64,
    /// e.g. "Block 101 Row C Seat 12".
    pub label: String,
    pub section: String,
    pub row: String,
    pub number: i32,
    pub x: i32,
    pub y: i32,
    pub accessible: bool,
    pub ticket_type_id: i64,
    pub ticket_type: String,
    pub price_cents: i64,
    pub status: SeatStatus,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SeatMap {
    pub event_id: i64,
    /// Grows every time a seat of the event changes state; compare to skip redrawing an unchanged map.
    pub version: u64,
    pub seats: Vec<SeatView>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Availability {
    pub event_id: i64,
    /// Seats allocated to the event.
    pub seats_on_sale: usize,
    /// Seats in an active (reserved or paid) order.
    pub seats_sold: usize,
    /// On sale and not sold (some may be held right now and come back when the hold lapses).
    pub seats_remaining: usize,
    /// On sale, and neither sold nor held right now: what a fan could hold. When it is 0 but seats remain, they
    /// are all held: the waiting room stops admitting until some come back.
    pub seats_available: usize,
    /// Of the sold seats, those in an order still inside its payment window: they come back if it ends unpaid.
    pub seats_awaiting_payment: usize,
    /// Seats held right now without an order: they come back if the hold runs out or is released.
    pub seats_held: usize,
    /// When the earliest hold or payment window ends (RFC 3339): the first moment a held or unpaid seat may
    /// come back. Absent when none can.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_release_at: Option<String>,
    /// Every seat on sale is sold (paid or awaiting payment). The waiting room tells waiting fans the event is
    /// sold out once none is awaiting payment either; until then, that every seat left is held.
    pub sold_out: bool,
}

/// Parses a path event id and finds its catalogue: 400 for a malformed id, 404 for an unknown event.
pub(super) async fn catalogue(state: &AppState, raw: i64) -> Result<Arc<Catalogue>, ApiError> {
    if raw <= 0 {
        return Err(ApiError::bad_request("invalid_path", "event_id must be a positive integer"));
    }
    state
        .catalogues
        .get(EventId(raw))
        .await?
        .ok_or_else(|| ApiError::not_found("event_not_found", format!("there is no event {raw}")))
}

/// The event, its ticket types and prices.
#[utoipa::path(get, path = "/events/{event_id}", tag = "events",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    security(("admission" = [])),
    responses(
        (status = 200, body = EventView),
        (status = 400, body = super::ErrorBody), (status = 401, body = super::ErrorBody),
        (status = 403, body = super::ErrorBody), (status = 404, body = super::ErrorBody),
    ))]
pub async fn get_event(
    State(state): State<AppState>,
    ApiPath(event_id): ApiPath<i64>,
    proof: Proof,
) -> Result<Json<EventView>, ApiError> {
    proof.account_for(EventId(event_id))?;
    let cat = catalogue(&state, event_id).await?;
    Ok(Json(EventView {
        event_id,
        name: cat.event.name.clone(),
        venue: cat.event.venue.clone(),
        starts_at: cat.event.starts_at.clone(),
        currency: cat.event.currency.clone(),
        ticket_types: cat.ticket_types.iter().map(TicketTypeView::from).collect(),
        seats_on_sale: cat.seats().len(),
    }))
}

/// How many seats are left: sold from Postgres (the truth), held from the seat map's log. The gateway polls it to
/// know when an event sells out, and when every seat left is held.
#[utoipa::path(get, path = "/events/{event_id}/availability", tag = "events",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    security(("admission" = [])),
    responses(
        (status = 200, body = Availability),
        (status = 400, body = super::ErrorBody), (status = 401, body = super::ErrorBody),
        (status = 403, body = super::ErrorBody), (status = 404, body = super::ErrorBody),
        (status = 503, body = super::ErrorBody),
    ))]
pub async fn get_availability(
    State(state): State<AppState>,
    ApiPath(event_id): ApiPath<i64>,
    proof: Proof,
) -> Result<Json<Availability>, ApiError> {
    let event = EventId(event_id);
    proof.account_for(event)?;
    let cat = catalogue(&state, event_id).await?;
    let on_sale = cat.seats().len();
    let (sold, taken, lapse) = tokio::join!(
        orders::sold_counts(&state.pool, event),
        state.holds.taken_count(event),
        state.holds.next_lapse_ms(event)
    );
    let (paid, awaiting) = sold?;
    let count = |n: i64| usize::try_from(n).unwrap_or(0);
    let sold = (count(paid) + count(awaiting)).min(on_sale);
    // Sold seats are taken in Redis too, unless Redis lost them: then Postgres's count is the floor.
    let taken = usize::try_from(taken?).unwrap_or(usize::MAX).max(sold).min(on_sale);
    let awaiting = count(awaiting).min(sold);
    Ok(Json(Availability {
        event_id,
        seats_on_sale: on_sale,
        seats_sold: sold,
        seats_remaining: on_sale - sold,
        seats_available: on_sale - taken,
        seats_awaiting_payment: awaiting,
        seats_held: taken - sold,
        next_release_at: lapse?.filter(|_| taken > sold || awaiting > 0).map(tokens::times::rfc3339_ms),
        sold_out: on_sale > 0 && sold == on_sale,
    }))
}

/// Every seat on sale with its status. Sold comes from Postgres (the truth), held from Redis. Gzipped for a
/// client whose `Accept-Encoding` allows it (a 20,000-seat map: 4.2 MB of JSON, about 370 KB gzipped).
#[utoipa::path(get, path = "/events/{event_id}/seats", tag = "events",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    security(("admission" = [])),
    responses(
        (status = 200, body = SeatMap, headers(
            ("Content-Encoding" = String, description = "`gzip` when the request's Accept-Encoding accepts it"),
            ("Vary" = String, description = "`accept-encoding`"),
        )),
        (status = 400, body = super::ErrorBody), (status = 401, body = super::ErrorBody),
        (status = 403, body = super::ErrorBody), (status = 404, body = super::ErrorBody),
        (status = 503, body = super::ErrorBody),
    ))]
pub async fn get_seats(
    State(state): State<AppState>,
    ApiPath(event_id): ApiPath<i64>,
    proof: Proof,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let event = EventId(event_id);
    proof.account_for(event)?;
    let cat = catalogue(&state, event_id).await?;
    let gzip = accepts_gzip(&headers);
    let map = state.seat_maps.get(event, Part::Whole, gzip, || build_seat_map(&state, event, cat)).await?;
    let mut res = ([(header::CONTENT_TYPE, "application/json")], map.body).into_response();
    let out = res.headers_mut();
    out.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    if map.gzip {
        out.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    Ok(res)
}

/// Every seat's status at a map version, from the cache of the last `SEAT_MAP_CACHE_MS` (read after
/// `newer_than`, if given).
pub(super) async fn snapshot(
    state: &AppState,
    event: EventId,
    cat: &Catalogue,
    newer_than: Option<std::time::Instant>,
) -> Result<Arc<Snapshot>, ApiError> {
    state.seat_maps.snapshot(event, cat.version, newer_than, || seat_statuses(state, event, cat)).await
}

/// Every seat's status at a map version: held from Redis, sold from Postgres (the truth). The version is read
/// first, so the statuses show every change up to it (each was committed to Postgres before it was logged), and
/// maybe some after it, which the deltas past the version carry again.
async fn seat_statuses(
    state: &AppState,
    event: EventId,
    cat: &Catalogue,
) -> Result<(Vec<SeatStatus>, MapVersion), ApiError> {
    let version = state.holds.map_version(event).await?;
    let ids: Vec<SeatId> = cat.seats().iter().map(|s| s.id).collect();
    let (held, sold) = tokio::join!(state.holds.seat_states(event, &ids), orders::sold_seats(&state.pool, event));
    let sold: HashSet<SeatId> = sold?.into_iter().collect();
    let statuses = ids.iter().zip(held?).map(|(id, s)| if sold.contains(id) { SeatStatus::Sold } else { s }).collect();
    Ok((statuses, version))
}

/// The seat map, serialised.
async fn build_seat_map(state: &AppState, event: EventId, cat: Arc<Catalogue>) -> Result<Bytes, ApiError> {
    let snap = snapshot(state, event, &cat, None).await?;
    let (statuses, version) = (&snap.statuses, snap.version);
    let seats = cat
        .seats()
        .iter()
        .zip(statuses.iter().copied())
        .map(|(s, status)| SeatView {
            seat_id: s.id.0,
            label: s.label.clone(),
            section: s.section.clone(),
            row: s.row.clone(),
            number: s.number,
            x: s.x,
            y: s.y,
            accessible: s.accessible,
            ticket_type_id: s.ticket_type_id,
            ticket_type: cat.ticket_type_name(s.ticket_type_id).to_owned(),
            price_cents: s.price_cents,
            status,
        })
        .collect();
    let map = SeatMap { event_id: event.0, version, seats };
    serde_json::to_vec(&map).map(Bytes::from).map_err(|e| ApiError::internal(&e))
}
