//! Pure types and decisions of booking: ids, baskets, an event's seat catalogue.
//!
//! Invariant: nothing here knows sqlx, redis, axum or the clock; time is passed in.

pub mod best;
mod catalogue;
pub mod order;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use catalogue::{Catalogue, EventInfo, SeatInfo, TicketType};

/// An event's id (Postgres `events.id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EventId(pub i64);

/// A seat's id (Postgres `seats.id`), the same for every event at the venue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SeatId(pub i64);

/// The secret handle of one hold. Whoever made the hold gets it; nobody else can guess it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HoldToken(pub Uuid);

impl HoldToken {
    /// A fresh token: a version 7 UUID, the millisecond it was made followed by 74 random bits (no counter, so
    /// a token tells nothing of the next one). Time-ordered, so the orders' unique index on hold tokens takes
    /// its entries at its right edge instead of at random pages: with random keys, ever more checkouts write a
    /// full-page image to the WAL as the index grows.
    pub fn generate() -> Self {
        Self(Uuid::new_v7(uuid::Timestamp::now(uuid::NoContext)))
    }
}

/// An order's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OrderId(pub Uuid);

impl OrderId {
    /// A fresh id: a version 7 UUID (time-ordered), so the indexes on order ids (`orders`, `order_seats`,
    /// `order_events`) grow at their right edge, as a sequence's would.
    pub fn generate() -> Self {
        Self(Uuid::now_v7())
    }
}

macro_rules! display_inner {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    )*};
}
display_inner!(EventId, SeatId, HoldToken, OrderId);

/// Why a basket was refused before touching any store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BasketError {
    #[error("the basket is empty")]
    Empty,
    #[error("seat {0} appears more than once in the basket")]
    Duplicate(SeatId),
    #[error("a basket holds at most {max} seats")]
    TooMany { max: usize },
    #[error("seat {0} does not exist or is not on sale for this event")]
    NotOnSale(SeatId),
}

/// A non-empty list of distinct seats, all on sale for one event, no longer than the basket cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Basket(Vec<SeatId>);

impl Basket {
    /// Checks a requested basket against the cap and the event's catalogue. Order is kept: the first
    /// conflicting seat reported is the first one the fan listed.
    pub fn parse(raw: &[i64], max_seats: usize, catalogue: &Catalogue) -> Result<Self, BasketError> {
        if raw.is_empty() {
            return Err(BasketError::Empty);
        }
        if raw.len() > max_seats {
            return Err(BasketError::TooMany { max: max_seats });
        }
        let mut seen = HashSet::with_capacity(raw.len());
        for &id in raw {
            let seat = SeatId(id);
            if !seen.insert(seat) {
                return Err(BasketError::Duplicate(seat));
            }
            if catalogue.seat(seat).is_none() {
                return Err(BasketError::NotOnSale(seat));
            }
        }
        Ok(Self(raw.iter().map(|&id| SeatId(id)).collect()))
    }

    pub fn seats(&self) -> &[SeatId] {
        &self.0
    }
}

/// A seat's state on the live map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SeatStatus {
    Available,
    Held,
    Sold,
}

/// A seat list as stored in a hold record: ids joined by commas.
pub fn join_seats(seats: &[SeatId]) -> String {
    let mut out = String::with_capacity(seats.len() * 6);
    for (i, s) in seats.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&s.0.to_string());
    }
    out
}

/// Parses a stored seat list; `None` if it was not written by [`join_seats`].
pub fn split_seats(raw: &str) -> Option<Vec<SeatId>> {
    raw.split(',').map(|s| s.parse().ok().map(SeatId)).collect()
}

/// A seat map version: how many times any seat of the event changed state in Redis.
pub type MapVersion = u64;
