//! An event's catalogue: which seats are on sale, at what price, under which label. Loaded from Postgres and
//! kept in memory so a hold is validated without a database round trip.

use std::collections::HashMap;

use super::{EventId, SeatId};

/// What an event is, as fans see it.
#[derive(Debug, Clone)]
pub struct EventInfo {
    pub id: EventId,
    pub name: String,
    pub venue: String,
    /// RFC 3339.
    pub starts_at: String,
    pub currency: String,
}

#[derive(Debug, Clone)]
pub struct TicketType {
    pub id: i64,
    pub name: String,
    pub price_cents: i64,
}

/// One seat on sale for the event.
#[derive(Debug, Clone)]
pub struct SeatInfo {
    pub id: SeatId,
    pub label: String,
    pub section: String,
    pub row: String,
    pub number: i32,
    pub x: i32,
    pub y: i32,
    pub accessible: bool,
    pub ticket_type_id: i64,
    pub price_cents: i64,
}

/// Everything booking needs to validate and price a basket for one event.
#[derive(Debug, Clone)]
pub struct Catalogue {
    pub event: EventInfo,
    pub ticket_types: Vec<TicketType>,
    /// Seats in map order (section, row, number).
    seats: Vec<SeatInfo>,
    index: HashMap<SeatId, usize>,
    /// The event's catalogue version when this copy was read.
    pub version: i64,
}

impl Catalogue {
    pub fn new(event: EventInfo, ticket_types: Vec<TicketType>, seats: Vec<SeatInfo>, version: i64) -> Self {
        let index = seats.iter().enumerate().map(|(i, s)| (s.id, i)).collect();
        Self { event, ticket_types, seats, index, version }
    }

    pub fn seat(&self, id: SeatId) -> Option<&SeatInfo> {
        self.index.get(&id).map(|&i| &self.seats[i])
    }

    /// Where a seat is in map order (its index in [`Self::seats`]).
    pub fn position(&self, id: SeatId) -> Option<usize> {
        self.index.get(&id).copied()
    }

    pub fn seats(&self) -> &[SeatInfo] {
        &self.seats
    }

    /// The label of a seat, or its bare id if it left the catalogue since (allocation withdrawn).
    pub fn label(&self, id: SeatId) -> String {
        self.seat(id).map_or_else(|| format!("Seat {id}"), |s| s.label.clone())
    }

    pub fn ticket_type_name(&self, id: i64) -> &str {
        self.ticket_types.iter().find(|t| t.id == id).map_or("", |t| t.name.as_str())
    }
}
