//! Seats booking picks for a fan: the best free block (best available), and the free blocks nearest to a basket
//! whose seat went (see `domain::best` for the score and the distance).

use axum::response::Response;
use serde_json::Value;

use super::AppState;
use super::error::ApiError;
use super::events::snapshot;
use super::hold_views::{Alternative, PickView, account_limit, granted, priced, view};
use crate::domain::best::{self, Want};
use crate::domain::{Catalogue, EventId, HoldToken, SeatId, SeatStatus};
use crate::store::holds::{Acquired, Ask, HoldKey};

/// How many times best available asks Redis before it gives up: each try offers the best blocks of a copy of
/// the statuses, and the next reads a newer copy.
const TRIES: usize = 3;
/// Blocks offered to Redis per try (they overlap, so far fewer seats): enough that fans asking at once find
/// the next free one within a try.
const CANDIDATES: usize = 256;
/// Nearby blocks offered with a refusal, and how many are checked against Redis to find them.
const ALTERNATIVES: usize = 3;
const NEARBY_CHECKED: usize = 32;

/// Holds the best free block of `want.quantity` side-by-side seats (or, with `allow_split`, the seats in the
/// fewest blocks), trying the next block when one went meanwhile.
pub(super) async fn best_available(
    state: &AppState,
    cat: &Catalogue,
    event: EventId,
    account: &str,
    want: &Want,
    allow_split: bool,
    claim: Option<&HoldKey>,
) -> Result<Response, ApiError> {
    let max = state.limits.max_seats_per_account;
    let mut newer_than = None;
    for _ in 0..TRIES {
        let snap = snapshot(state, event, cat, newer_than).await?;
        let free = snap.free();
        let mut blocks = best::best_blocks(cat, &free, want, CANDIDATES);
        if blocks.is_empty() && allow_split {
            blocks.extend(best::best_split(cat, &free, want));
        }
        if blocks.is_empty() {
            // A cached copy may miss a seat freed a moment ago: one newer look before saying no.
            if newer_than.is_none() {
                newer_than = Some(snap.read_at());
                continue;
            }
            return Err(nothing_fits(best::left(cat, &free, want), want, allow_split));
        }
        let (seats, blocks_at) = best::pack(cat, &blocks);
        let token = HoldToken::generate();
        let ask = Ask {
            account,
            token,
            seats: &seats,
            blocks: &blocks_at,
            block_size: want.quantity,
            max_per_account: max,
            idempotency: claim,
        };
        match state.holds.acquire(event, &ask).await? {
            Acquired::Granted { expires_at_ms, version, block } => {
                let picked = &blocks[block];
                let pick = PickView { score: picked.score, side_by_side: picked.together };
                return Ok(granted(view(cat, token, &picked.seats, expires_at_ms, version, Some(pick))));
            }
            Acquired::NoneFree | Acquired::SeatTaken { .. } => newer_than = Some(snap.read_at()),
            Acquired::AccountCap { counted } => return Err(account_limit(max, counted)),
        }
    }
    metrics::counter!("booking_holds_total", "outcome" => "best_available_contended").increment(1);
    let mut e = ApiError::conflict(
        "best_available_contended",
        "other fans took every block this request tried, one try after another; try again",
    );
    e.retry_after_seconds = Some(1);
    Err(e)
}

fn nothing_fits(left: best::Left, want: &Want, allow_split: bool) -> ApiError {
    metrics::counter!("booking_holds_total", "outcome" => "no_seats_together").increment(1);
    let n = want.quantity;
    let message = if allow_split || left.available < n {
        format!("{} seats that fit this request are free, fewer than {n}", left.available)
    } else {
        format!(
            "no {n} seats side by side are free; {} fit this request, at most {} together",
            left.available, left.largest_block
        )
    };
    ApiError::conflict("no_seats_together", message)
        .with("available", left.available)
        .with("largest_block", left.largest_block)
}

/// Up to three blocks of as many seats as `basket`, side by side, free now (checked in Redis), no two sharing
/// a seat, nearest to the basket on the map first. Best effort: a refusal goes out without them rather than
/// fail.
pub(super) async fn alternatives(state: &AppState, cat: &Catalogue, event: EventId, basket: &[SeatId]) -> Value {
    let found = async {
        let snap = snapshot(state, event, cat, None).await?;
        let nearby = best::nearest_blocks(cat, &snap.free(), basket, basket.len(), NEARBY_CHECKED);
        let (seats, _) = best::pack(cat, &nearby);
        let now = state.holds.seat_states(event, &seats).await?;
        let taken: std::collections::HashSet<SeatId> =
            seats.iter().zip(now).filter(|(_, s)| *s != SeatStatus::Available).map(|(id, _)| *id).collect();
        let mut used = std::collections::HashSet::new();
        let offered: Vec<Alternative> = nearby
            .into_iter()
            .filter(|b| {
                let fits = !b.seats.iter().any(|s| taken.contains(s) || used.contains(s));
                if fits {
                    used.extend(b.seats.iter().copied());
                }
                fits
            })
            .take(ALTERNATIVES)
            .map(|b| {
                let seats = priced(cat, &b.seats);
                Alternative {
                    seat_ids: b.seats.iter().map(|s| s.0).collect(),
                    labels: seats.iter().map(|s| s.label.clone()).collect(),
                    total_cents: seats.iter().map(|s| s.price_cents).sum(),
                }
            })
            .collect();
        Ok::<_, ApiError>(offered)
    };
    match found.await {
        Ok(offered) => serde_json::to_value(offered).unwrap_or_default(),
        Err(e) => {
            tracing::warn!(error = %e.message, "no alternatives for a refused hold");
            Value::Array(Vec::new())
        }
    }
}
