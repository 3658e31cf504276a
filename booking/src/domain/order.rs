//! The order lifecycle as a pure state machine: what each command does to an order in each state.
//!
//! ```text
//! reserved ──paid──▶ paid ──refund──▶ refunded
//!    │                 └───cancel──▶ refund_due ──refund──▶ refunded
//!    ├─payment failed / deadline passed / cancel──▶ cancelled ──late payment──▶ paid (seats free) | refund_due
//! ```
//!
//! A reserved order whose deadline has passed *is* cancelled (reason `expired`), whether or not the sweeper has
//! written it down yet: [`Order::effective`] says so, and every decision starts from it.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An order's status, as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Checked out; the seats are the order's until the payment deadline.
    Reserved,
    Paid,
    /// The seats went back on sale; see the reason.
    Cancelled,
    /// Paid, then its money was returned; the seats went back on sale.
    Refunded,
    /// Money was taken but the order has no seats (a payment after the seats were resold, or a paid order an
    /// operator cancelled): an operator must refund it.
    RefundDue,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Reserved => "reserved",
            Status::Paid => "paid",
            Status::Cancelled => "cancelled",
            Status::Refunded => "refunded",
            Status::RefundDue => "refund_due",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Status::Reserved, Status::Paid, Status::Cancelled, Status::Refunded, Status::RefundDue]
            .into_iter()
            .find(|v| v.as_str() == s)
    }

    /// Whether the order's seats are its own in this status.
    pub fn takes_seats(self) -> bool {
        matches!(self, Status::Reserved | Status::Paid)
    }
}

/// Why an order was cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CancelReason {
    /// The payment deadline passed unpaid.
    Expired,
    PaymentFailed,
    Operator,
}

impl CancelReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CancelReason::Expired => "expired",
            CancelReason::PaymentFailed => "payment_failed",
            CancelReason::Operator => "operator",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [CancelReason::Expired, CancelReason::PaymentFailed, CancelReason::Operator]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

/// What decisions need to know of an order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Order {
    pub status: Status,
    pub reason: Option<CancelReason>,
    /// The payment deadline is behind us (by Postgres's clock).
    pub deadline_passed: bool,
}

impl Order {
    /// The status that holds now: a reserved order past its deadline is cancelled (`expired`).
    pub fn effective(self) -> (Status, Option<CancelReason>) {
        if self.status == Status::Reserved && self.deadline_passed {
            (Status::Cancelled, Some(CancelReason::Expired))
        } else {
            (self.status, self.reason)
        }
    }
}

/// Something that happens to an order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// The provider says the payment went through.
    PaymentSucceeded,
    /// The provider says the payment failed.
    PaymentFailed,
    /// The sweeper tidies an order whose deadline passed.
    Expire,
    /// An operator cancels the order.
    Cancel,
    /// An operator refunds the order.
    Refund,
    /// The fan asks for more time to pay.
    Extend,
}

/// What a command does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Write this change of state (from the stored status). Seats leave sale when `to` does not take them.
    Move { to: Status, reason: Option<CancelReason> },
    /// A payment for a cancelled order: take its seats back if they are all still free (then paid),
    /// otherwise refund_due.
    Reclaim,
    /// Push the payment deadline (within the absolute cap).
    Extend,
    /// Nothing to do, and nothing wrong: a redelivery, a stale message, a failure after success.
    Ignore,
    /// Not allowed in this state (an operator's or fan's mistake): a 409 with this code.
    Refuse(&'static str),
}

/// The whole state machine.
pub fn decide(order: Order, command: Command) -> Decision {
    use CancelReason as R;
    use Status as S;
    let (status, reason) = order.effective();
    match (command, status) {
        (Command::PaymentSucceeded, S::Reserved) => Decision::Move { to: S::Paid, reason: None },
        (Command::PaymentSucceeded, S::Cancelled) if reason == Some(R::Operator) => {
            Decision::Move { to: S::RefundDue, reason: None }
        }
        (Command::PaymentSucceeded, S::Cancelled) => Decision::Reclaim,
        (Command::PaymentSucceeded, S::Paid | S::Refunded | S::RefundDue) => Decision::Ignore,

        (Command::PaymentFailed, S::Reserved) => Decision::Move { to: S::Cancelled, reason: Some(R::PaymentFailed) },
        (Command::PaymentFailed, _) => Decision::Ignore,

        (Command::Expire, S::Cancelled) if order.status == S::Reserved => {
            Decision::Move { to: S::Cancelled, reason: Some(R::Expired) }
        }
        (Command::Expire, _) => Decision::Ignore,

        (Command::Cancel, S::Reserved) => Decision::Move { to: S::Cancelled, reason: Some(R::Operator) },
        (Command::Cancel, S::Paid) => Decision::Move { to: S::RefundDue, reason: None },
        (Command::Cancel, _) => Decision::Refuse("order_not_cancellable"),

        (Command::Refund, S::Paid | S::RefundDue) => Decision::Move { to: S::Refunded, reason: None },
        (Command::Refund, _) => Decision::Refuse("order_not_refundable"),

        (Command::Extend, S::Reserved) => Decision::Extend,
        (Command::Extend, _) => Decision::Refuse("order_not_reserved"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Status; 5] = [Status::Reserved, Status::Paid, Status::Cancelled, Status::Refunded, Status::RefundDue];
    const COMMANDS: [Command; 6] = [
        Command::PaymentSucceeded,
        Command::PaymentFailed,
        Command::Expire,
        Command::Cancel,
        Command::Refund,
        Command::Extend,
    ];

    fn order(status: Status, reason: Option<CancelReason>, deadline_passed: bool) -> Order {
        Order { status, reason, deadline_passed }
    }

    #[test]
    fn a_reserved_order_past_its_deadline_is_cancelled_as_expired() {
        let o = order(Status::Reserved, None, true);
        assert_eq!(o.effective(), (Status::Cancelled, Some(CancelReason::Expired)));
        assert_eq!(decide(o, Command::PaymentSucceeded), Decision::Reclaim);
        assert_eq!(decide(o, Command::Extend), Decision::Refuse("order_not_reserved"));
        assert_eq!(decide(o, Command::Cancel), Decision::Refuse("order_not_cancellable"));
    }

    #[test]
    fn nothing_leaves_refunded_and_no_command_makes_a_paid_order_unpaid_except_an_operator() {
        for passed in [false, true] {
            for c in COMMANDS {
                let d = decide(order(Status::Refunded, None, passed), c);
                assert!(matches!(d, Decision::Ignore | Decision::Refuse(_)), "{c:?} -> {d:?}");
                let d = decide(order(Status::Paid, None, passed), c);
                match c {
                    Command::Cancel | Command::Refund => assert!(matches!(d, Decision::Move { .. }), "{c:?}"),
                    _ => assert!(matches!(d, Decision::Ignore | Decision::Refuse(_)), "{c:?} -> {d:?}"),
                }
            }
        }
    }

    #[test]
    fn a_late_payment_after_an_operator_cancelled_is_refund_due_never_a_sale() {
        let o = order(Status::Cancelled, Some(CancelReason::Operator), true);
        assert_eq!(decide(o, Command::PaymentSucceeded), Decision::Move { to: Status::RefundDue, reason: None });
        let o = order(Status::Cancelled, Some(CancelReason::PaymentFailed), false);
        assert_eq!(decide(o, Command::PaymentSucceeded), Decision::Reclaim);
    }

    #[test]
    fn every_move_goes_somewhere_else_and_only_reserved_can_take_seats_back_by_moving() {
        for status in ALL {
            for passed in [false, true] {
                let reason = (status == Status::Cancelled).then_some(CancelReason::PaymentFailed);
                for c in COMMANDS {
                    if let Decision::Move { to, reason: r } = decide(order(status, reason, passed), c) {
                        assert!(to != status || c == Command::Expire, "{status:?} {c:?} stays");
                        assert_eq!(to == Status::Cancelled, r.is_some(), "{status:?} {c:?}");
                        // A move never gives seats to an order that had none: only Reclaim may.
                        assert!(!to.takes_seats() || status.takes_seats(), "{status:?} {c:?} -> {to:?}");
                    }
                }
            }
        }
    }
}
