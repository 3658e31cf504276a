//! The seat map in two halves a CDN can cache, the same bytes for every fan and readable without an admission
//! proof (availability is public; holding a seat still needs one):
//! - `GET /events/{id}/seats/layout/{catalogue_version}`: where every seat is, its label and price. It changes
//!   only with the catalogue, whose version is in the URL, so it is immutable.
//! - `GET /events/{id}/seats/status`: every seat's status, two bits each in the layout's order, with the map
//!   version it shows. The log's deltas (`/events/{id}/seats/stream`, served by the gateway) carry a fan from
//!   there.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, ApiPath};
use super::events::{TicketTypeView, catalogue, snapshot};
use super::seat_maps::{Encoded, Part, accepts_gzip, not_modified};
use crate::domain::{Catalogue, EventId, SeatStatus};

/// How long a status may be served from a cache (the CDN's or the browser's) before it is asked for again.
const STATUS_MAX_AGE_SECONDS: u32 = 1;

/// The seats of a layout, one array per field, all in the same order (the order of the status's entries).
#[derive(Debug, Serialize, ToSchema)]
pub struct LayoutSeats {
    pub seat_id: Vec<i64>,
    /// e.g. "Block 101 Row C Seat 12".
    pub label: Vec<String>,
    /// Index into the layout's `sections`.
    pub section: Vec<u32>,
    pub row: Vec<String>,
    pub number: Vec<i32>,
    pub x: Vec<i32>,
    pub y: Vec<i32>,
    pub accessible: Vec<bool>,
    /// The seat's ticket type, which sets its price (see `ticket_types`).
    pub ticket_type_id: Vec<i64>,
}

/// Where every seat on sale is, for one catalogue version.
#[derive(Debug, Serialize, ToSchema)]
pub struct Layout {
    pub event_id: i64,
    pub catalogue_version: i64,
    /// ISO 4217 code of every price.
    pub currency: String,
    pub ticket_types: Vec<TicketTypeView>,
    pub sections: Vec<String>,
    pub seats: LayoutSeats,
}

/// Every seat's status at one map version.
#[derive(Debug, Serialize, ToSchema)]
pub struct SeatStatuses {
    pub event_id: i64,
    /// The map version this shows: every change up to it and none after. The stream's deltas with a higher
    /// version carry a fan on from here.
    pub version: u64,
    /// The layout these entries follow, and its URL.
    pub catalogue_version: i64,
    pub layout: String,
    /// How many seats `statuses` holds.
    pub seats: usize,
    /// Base64 (standard, padded) of two bits per seat, in the layout's order, four seats per byte from the
    /// lowest bits: 0 available, 1 held, 2 sold.
    pub statuses: String,
}

/// The two-bit code of a status.
fn code(status: SeatStatus) -> u8 {
    match status {
        SeatStatus::Available => 0,
        SeatStatus::Held => 1,
        SeatStatus::Sold => 2,
    }
}

/// Packs statuses two bits each, four per byte from the lowest bits, and encodes them in base64.
pub fn pack(statuses: impl ExactSizeIterator<Item = SeatStatus>) -> String {
    let mut bytes = vec![0u8; statuses.len().div_ceil(4)];
    for (i, status) in statuses.enumerate() {
        bytes[i / 4] |= code(status) << ((i % 4) * 2);
    }
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The URL of an event's layout for a catalogue version.
pub fn layout_url(event: i64, catalogue_version: i64) -> String {
    format!("/events/{event}/seats/layout/{catalogue_version}")
}

/// The layout of the event's seats for `catalogue_version`. Immutable: a catalogue change gives a new URL (the
/// status names it), and an old one answers 404 `layout_not_current` with the current one.
#[utoipa::path(get, path = "/events/{event_id}/seats/layout/{catalogue_version}", tag = "events",
    params(
        ("event_id" = i64, Path, minimum = 1, description = "event id"),
        ("catalogue_version" = i64, Path, description = "the catalogue version, as the status names it"),
    ),
    responses(
        (status = 200, body = Layout, headers(
            ("Cache-Control" = String, description = "`public, max-age=31536000, immutable`"),
            ("ETag" = String, description = "a digest of the layout"),
            ("Content-Encoding" = String, description = "`gzip` when the request's Accept-Encoding accepts it"),
            ("Vary" = String, description = "`accept-encoding`"),
        )),
        (status = 304, description = "the If-None-Match tag is current"),
        (status = 400, body = super::ErrorBody),
        (status = 404, body = super::ErrorBody, description = "no such event (`event_not_found`), or the \
            catalogue has moved on (`layout_not_current`, with `layout`: the current URL)"),
        (status = 503, body = super::ErrorBody),
    ))]
pub async fn get_layout(
    State(state): State<AppState>,
    ApiPath((event_id, version)): ApiPath<(i64, i64)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let cat = catalogue(&state, event_id).await?;
    if version != cat.version {
        return Err(ApiError::not_found(
            "layout_not_current",
            format!("the event's catalogue is at version {}, not {version}", cat.version),
        )
        .with("layout", layout_url(event_id, cat.version)));
    }
    let event = EventId(event_id);
    let gzip = accepts_gzip(&headers);
    let built = state.seat_maps.get(event, Part::Layout(version), gzip, || async { layout(&cat) }).await?;
    Ok(cacheable(built, &headers, "public, max-age=31536000, immutable"))
}

/// Every seat's status, with the map version it shows. Sold comes from Postgres (the truth), held from Redis.
#[utoipa::path(get, path = "/events/{event_id}/seats/status", tag = "events",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    responses(
        (status = 200, body = SeatStatuses, headers(
            ("Cache-Control" = String, description = "`public, max-age=1`"),
            ("ETag" = String, description = "a digest of the answer"),
            ("Content-Encoding" = String, description = "`gzip` when the request's Accept-Encoding accepts it"),
            ("Vary" = String, description = "`accept-encoding`"),
        )),
        (status = 304, description = "the If-None-Match tag is current"),
        (status = 400, body = super::ErrorBody), (status = 404, body = super::ErrorBody),
        (status = 503, body = super::ErrorBody),
    ))]
pub async fn get_status(
    State(state): State<AppState>,
    ApiPath(event_id): ApiPath<i64>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let cat = catalogue(&state, event_id).await?;
    let event = EventId(event_id);
    let gzip = accepts_gzip(&headers);
    let built = state.seat_maps.get(event, Part::Status, gzip, || status(&state, event, cat)).await?;
    Ok(cacheable(built, &headers, &format!("public, max-age={STATUS_MAX_AGE_SECONDS}")))
}

/// A cacheable answer: 304 when the client's tag is current, else the bytes; with the tag and `cache_control`.
fn cacheable(built: Encoded, headers: &HeaderMap, cache_control: &str) -> Response {
    let mut res = if not_modified(headers, &built.etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut res = ([(header::CONTENT_TYPE, "application/json")], built.body).into_response();
        if built.gzip {
            res.headers_mut().insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        res
    };
    let out = res.headers_mut();
    out.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    if let Ok(tag) = HeaderValue::from_str(&built.etag) {
        out.insert(header::ETAG, tag);
    }
    if let Ok(value) = HeaderValue::from_str(cache_control) {
        out.insert(header::CACHE_CONTROL, value);
    }
    res
}

/// The layout, serialised.
fn layout(cat: &Catalogue) -> Result<Bytes, ApiError> {
    let n = cat.seats().len();
    let mut sections: Vec<String> = Vec::new();
    let mut seats = LayoutSeats {
        seat_id: Vec::with_capacity(n),
        label: Vec::with_capacity(n),
        section: Vec::with_capacity(n),
        row: Vec::with_capacity(n),
        number: Vec::with_capacity(n),
        x: Vec::with_capacity(n),
        y: Vec::with_capacity(n),
        accessible: Vec::with_capacity(n),
        ticket_type_id: Vec::with_capacity(n),
    };
    for s in cat.seats() {
        // Seats come in map order, section by section.
        if sections.last() != Some(&s.section) {
            sections.push(s.section.clone());
        }
        let section = sections.iter().rposition(|name| *name == s.section).unwrap_or(0);
        seats.seat_id.push(s.id.0);
        seats.label.push(s.label.clone());
        seats.section.push(u32::try_from(section).unwrap_or(u32::MAX));
        seats.row.push(s.row.clone());
        seats.number.push(s.number);
        seats.x.push(s.x);
        seats.y.push(s.y);
        seats.accessible.push(s.accessible);
        seats.ticket_type_id.push(s.ticket_type_id);
    }
    let layout = Layout {
        event_id: cat.event.id.0,
        catalogue_version: cat.version,
        currency: cat.event.currency.clone(),
        ticket_types: cat.ticket_types.iter().map(TicketTypeView::from).collect(),
        sections,
        seats,
    };
    serde_json::to_vec(&layout).map(Bytes::from).map_err(|e| ApiError::internal(&e))
}

/// Every seat's status, serialised.
async fn status(state: &AppState, event: EventId, cat: Arc<Catalogue>) -> Result<Bytes, ApiError> {
    let snap = snapshot(state, event, &cat, None).await?;
    let body = SeatStatuses {
        event_id: event.0,
        version: snap.version,
        catalogue_version: cat.version,
        layout: layout_url(event.0, cat.version),
        seats: snap.statuses.len(),
        statuses: pack(snap.statuses.iter().copied()),
    };
    serde_json::to_vec(&body).map(Bytes::from).map_err(|e| ApiError::internal(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_pack_two_bits_each_from_the_lowest() {
        use SeatStatus::*;
        let packed = pack([Available, Held, Sold, Held, Sold].into_iter());
        let bytes = base64::engine::general_purpose::STANDARD.decode(packed).expect("base64");
        assert_eq!(bytes, vec![0b01_10_01_00, 0b10]);
        assert_eq!(pack(std::iter::empty()), "");
    }

    #[test]
    fn twenty_thousand_statuses_fit_in_eight_kilobytes() {
        let statuses = (0..20_000).map(|i| [SeatStatus::Available, SeatStatus::Held, SeatStatus::Sold][i % 3]);
        assert!(pack(statuses).len() <= 8 * 1024 - 200, "leaves room for the other fields");
    }
}
