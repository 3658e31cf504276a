//! A successful payment, in both stores. An order still on time is paid in Postgres alone. A late payment (the
//! order was cancelled: its deadline passed, or a failed payment came first) takes the seats back only as a
//! checkout would take them: Redis first, where the seats are claimed all or none, so a seat another fan holds
//! now, or another order has, is never taken from under them; then Postgres, under the checkout's lock on the
//! account, rechecks the account's cap and that no active order has a seat. Either refusal ends in
//! `refund_due` (money to return), and the claim is given back.

use sqlx::PgPool;

use super::StoreError;
use super::holds::{Holds, OrderSeats, Until};
use super::lifecycle::{self, Delivery, OrderRow, Outcome, Reclaim, Scope, Window};
use crate::domain::OrderId;
use crate::domain::order::Status;

/// How long a late payment's claim on its seats lasts if Postgres does not answer or booking dies first (it lapses; a
/// paid order's markers are written for good once Postgres commits).
const CLAIM_FOR: time::Duration = time::Duration::seconds(60);

/// Applies a successful payment of order `id` (see the module's comment).
pub async fn succeeded(
    pool: &PgPool,
    holds: &Holds,
    id: OrderId,
    delivery: Delivery<'_>,
    window: Window,
    max_seats_per_account: usize,
) -> Result<Outcome, StoreError> {
    let reclaim = |seats_claimed| Reclaim { seats_claimed, max_seats_per_account };
    // An order read on time may be cancelled by the time Postgres locks it (a failed payment delivered at the
    // same moment): then nothing is written, and it is read again and claimed as a late one.
    for _ in 0..2 {
        let Some(order) = lifecycle::get(pool, id, Scope::Any).await? else { return Ok(Outcome::NotFound) };
        if order.state().effective().0 != Status::Cancelled {
            match lifecycle::apply_payment(pool, id, delivery, window, None).await? {
                Some(outcome) => return Ok(outcome),
                None => continue,
            }
        }
        return late(pool, holds, &order, delivery, window, reclaim).await;
    }
    // Still moving after two reads: refund_due, never a sale without a claim.
    let outcome = lifecycle::apply_payment(pool, id, delivery, window, Some(reclaim(false))).await?;
    outcome.ok_or_else(|| StoreError::Unexpected("a late payment asked for a claim twice".into()))
}

/// A late payment: claim the seats in Redis, then ask Postgres; give the claim back unless the order ends paid.
async fn late(
    pool: &PgPool,
    holds: &Holds,
    order: &OrderRow,
    delivery: Delivery<'_>,
    window: Window,
    reclaim: impl Fn(bool) -> Reclaim,
) -> Result<Outcome, StoreError> {
    let seats = order.seat_ids();
    let on = OrderSeats { token: order.hold, account: &order.account, seats: &seats };
    let until = Until::deadline(lifecycle::db_now(pool).await? + CLAIM_FOR);
    let claimed = holds.claim(order.event, &on, until).await?;
    let outcome = lifecycle::apply_payment(pool, order.id, delivery, window, Some(reclaim(claimed)))
        .await
        .and_then(|o| o.ok_or_else(|| StoreError::Unexpected("a claimed late payment asked for a claim".into())));
    // The claim is given back when Postgres answered and the order is not paid (by this delivery or another
    // one at the same time). When Postgres did not answer, it may have committed: the claim stays, and lapses
    // by itself unless the provider's retry finds the order paid.
    let refused = match &outcome {
        Ok(
            Outcome::Changed { order, .. }
            | Outcome::Unchanged(order)
            | Outcome::Refused { order, .. }
            | Outcome::Duplicate { order, .. },
        ) => order.status != Status::Paid,
        Ok(Outcome::NotFound) => true,
        Err(_) => false,
    };
    if !claimed {
        metrics::counter!("booking_late_payments_refused_total", "by" => "redis").increment(1);
    } else if refused {
        metrics::counter!("booking_late_payments_refused_total", "by" => "postgres").increment(1);
        if let Err(e) = holds.release_order(order.event, &on).await {
            tracing::warn!(error = %e, order = %order.id, "a late payment's claim was not given back; it lapses");
        }
    }
    outcome
}
