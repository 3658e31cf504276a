//! A state-machine property test: random sequences of hold, extend, release, checkout, pay, fail, deadline,
//! sweep, refund and cancel, run against the real server, each answer checked against a model written here
//! independently of `booking::domain::order`; at the end the database must equal the model.
//!
//! Seeds are fixed (a failure names its seed and the operations so far); set `LIFECYCLE_MODEL_SEED` to try
//! another base seed.

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use sqlx::PgPool;

use crate::app::TestApp;

const CASES: u64 = 16;
const OPS_PER_CASE: usize = 60;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    Expired,
    Failed,
    Operator,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Reserved,
    Paid,
    Cancelled(Why),
    Refunded,
    RefundDue,
}

#[derive(Debug)]
struct MOrder {
    id: String,
    seats: Vec<i64>,
    account: String,
    /// As stored: a reserved order past its deadline stays `Reserved` here until swept or freed.
    stored: St,
    deadline_passed: bool,
    /// Changes of status written (outbox rows other than `order.extended`), the checkout's included.
    changes: usize,
    extensions: usize,
}

impl MOrder {
    fn effective(&self) -> St {
        if self.stored == St::Reserved && self.deadline_passed { St::Cancelled(Why::Expired) } else { self.stored }
    }
    fn takes_seats(&self) -> bool {
        matches!(self.effective(), St::Reserved | St::Paid)
    }
    fn set(&mut self, st: St) {
        self.stored = st;
        self.changes += 1;
    }
}

#[derive(Debug)]
struct MHold {
    token: String,
    account: String,
    seats: Vec<i64>,
    /// Seats whose Redis key still carries this hold's token.
    left: Vec<i64>,
}

#[derive(Default, Debug)]
struct Model {
    orders: Vec<MOrder>,
    holds: Vec<MHold>,
    seen: Seen,
}

/// How often the rare paths were taken, so the test can insist its seeds reach them.
#[derive(Default, Debug, Clone, Copy)]
struct Seen {
    late_paid: usize,
    refund_due: usize,
    late_refused_for_a_hold: usize,
    freed_by_checkout: usize,
    swept: usize,
}

impl Model {
    fn seat_free(&self, seat: i64) -> bool {
        !self.holds.iter().any(|h| h.left.contains(&seat))
            && !self.orders.iter().any(|o| o.takes_seats() && o.seats.contains(&seat))
    }
}

fn status_name(st: St) -> (&'static str, Option<&'static str>) {
    match st {
        St::Reserved => ("reserved", None),
        St::Paid => ("paid", None),
        St::Cancelled(Why::Expired) => ("cancelled", Some("expired")),
        St::Cancelled(Why::Failed) => ("cancelled", Some("payment_failed")),
        St::Cancelled(Why::Operator) => ("cancelled", Some("operator")),
        St::Refunded => ("refunded", None),
        St::RefundDue => ("refund_due", None),
    }
}

#[sqlx::test(migrations = "../migrations")]
async fn random_order_lifecycles_match_the_model(pool: PgPool) {
    let mut app = TestApp::spawn_with(pool, &["--sweep-interval-ms", "0"]).await;
    let base: u64 = std::env::var("LIFECYCLE_MODEL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20261202);
    let all_seats = app.seats_on_sale().await;
    let mut seen = Vec::new();
    for case in 0..CASES {
        let seed = base + case;
        // Each case on four seats of its own, so cases do not meet.
        let seats: Vec<i64> = all_seats[(case as usize) * 4..(case as usize) * 4 + 4].to_vec();
        seen.push(run_case(&mut app, seed, &seats).await);
    }
    let total = |f: fn(&Seen) -> usize| seen.iter().map(f).sum::<usize>();
    let reached = [
        ("late payment made paid", total(|s| s.late_paid)),
        ("refund due", total(|s| s.refund_due)),
        ("late payment refused for another fan's live hold", total(|s| s.late_refused_for_a_hold)),
        ("unpaid order freed by a checkout", total(|s| s.freed_by_checkout)),
        ("unpaid order swept", total(|s| s.swept)),
    ];
    eprintln!("paths reached: {reached:?}");
    assert!(reached.iter().all(|(_, n)| *n > 0), "these seeds miss a path: {reached:?}");
    app.assert_invariants().await;
    app.stop().await;
}

async fn run_case(app: &mut TestApp, seed: u64, seats: &[i64]) -> Seen {
    let mut rng = StdRng::seed_from_u64(seed);
    // Accounts of this case only: paid seats count against an account's cap for good.
    let accounts: Vec<String> = ["a", "b", "c"].iter().map(|a| format!("fan-{seed}-{a}")).collect();
    let mut m = Model::default();
    let mut log: Vec<String> = Vec::new();
    for _ in 0..OPS_PER_CASE {
        let op = rng.random_range(0..11);
        let ctx = |log: &[String]| format!("seed {seed}, ops: {log:#?}");
        match op {
            // Hold one or two seats.
            0 | 1 => {
                let account = accounts.choose(&mut rng).expect("accounts").clone();
                let n = rng.random_range(1..=2);
                let mut basket: Vec<i64> = seats.choose_multiple(&mut rng, n).copied().collect();
                basket.sort_unstable();
                log.push(format!("hold {account} {basket:?}"));
                let r = app.hold(&account, &basket).await;
                let free = basket.iter().all(|&s| m.seat_free(s));
                assert_eq!(r.status, if free { 201 } else { 409 }, "{} {}", r.body, ctx(&log));
                if free {
                    let token = r.str("hold_token");
                    m.holds.push(MHold { token, account, left: basket.clone(), seats: basket });
                }
            }
            // Release or extend a live hold.
            2 => {
                let Some(i) = (!m.holds.is_empty()).then(|| rng.random_range(0..m.holds.len())) else { continue };
                if rng.random_bool(0.5) {
                    log.push(format!("release {}", m.holds[i].token));
                    let h = m.holds.remove(i);
                    let r = app.release(&h.account, &h.token).await;
                    assert_eq!(
                        (r.status, r.body["released"].as_i64()),
                        (200, Some(h.seats.len() as i64)),
                        "{}",
                        ctx(&log)
                    );
                } else {
                    log.push(format!("extend hold {}", m.holds[i].token));
                    let r = app.extend(&m.holds[i].account, &m.holds[i].token).await;
                    assert_eq!(r.status, 200, "{} {}", r.body, ctx(&log));
                }
            }
            // Check a hold out.
            3 | 4 => {
                let Some(i) = (!m.holds.is_empty()).then(|| rng.random_range(0..m.holds.len())) else { continue };
                let h = m.holds.remove(i);
                log.push(format!("checkout {}", h.token));
                let r = app.checkout(&h.account, &h.token, &format!("k-{}", h.token)).await;
                assert_eq!(r.status, 201, "{} {}", r.body, ctx(&log));
                // A checkout frees the seats of unpaid orders whose deadline passed.
                for o in m.orders.iter_mut() {
                    if o.stored == St::Reserved && o.deadline_passed && o.seats.iter().any(|s| h.seats.contains(s)) {
                        o.set(St::Cancelled(Why::Expired));
                        m.seen.freed_by_checkout += 1;
                    }
                }
                m.orders.push(MOrder {
                    id: r.str("order_id"),
                    seats: h.seats,
                    account: h.account,
                    stored: St::Reserved,
                    deadline_passed: false,
                    changes: 1,
                    extensions: 0,
                });
            }
            // A payment succeeds or fails.
            5 | 6 => {
                let Some(i) = (!m.orders.is_empty()).then(|| rng.random_range(0..m.orders.len())) else { continue };
                let succeeded = op == 5;
                log.push(format!("pay {} succeeded={succeeded}", m.orders[i].id));
                let kind = if succeeded { "payment.succeeded" } else { "payment.failed" };
                let r = app.pay(&m.orders[i].id, kind).await;
                let outcome = if succeeded { model_payment(&mut m, i) } else { model_failure(&mut m.orders[i]) };
                assert_eq!((r.status, r.body["outcome"].as_str()), (200, Some(outcome)), "{} {}", r.body, ctx(&log));
            }
            // The deadline of a live reserved order passes.
            7 => {
                let live: Vec<usize> =
                    (0..m.orders.len()).filter(|&i| m.orders[i].effective() == St::Reserved).collect();
                let Some(&i) = live.choose(&mut rng) else { continue };
                log.push(format!("deadline passes {}", m.orders[i].id));
                app.pass_deadline(&m.orders[i].id).await;
                m.orders[i].deadline_passed = true;
            }
            // The sweeper runs.
            8 => sweep(app, &mut m, &mut log, seed).await,
            // An operator refunds or cancels.
            9 => {
                let Some(i) = (!m.orders.is_empty()).then(|| rng.random_range(0..m.orders.len())) else { continue };
                let refund = rng.random_bool(0.5);
                log.push(format!("{} {}", if refund { "refund" } else { "cancel" }, m.orders[i].id));
                let action = if refund { "refund" } else { "cancel" };
                let r = app.admin(Method::POST, &format!("/admin/orders/{}/{action}", m.orders[i].id)).await;
                let o = &mut m.orders[i];
                let next = match (refund, o.effective()) {
                    (true, St::Paid | St::RefundDue) => Some(St::Refunded),
                    (false, St::Reserved) => Some(St::Cancelled(Why::Operator)),
                    (false, St::Paid) => Some(St::RefundDue),
                    _ => None,
                };
                match next {
                    Some(st) => {
                        assert_eq!(r.status, 200, "{} {}", r.body, ctx(&log));
                        o.set(st);
                    }
                    None => assert_eq!(r.status, 409, "{} {}", r.body, ctx(&log)),
                }
            }
            // The fan asks for more time to pay.
            _ => {
                let Some(i) = (!m.orders.is_empty()).then(|| rng.random_range(0..m.orders.len())) else { continue };
                log.push(format!("extend order {}", m.orders[i].id));
                let o = &mut m.orders[i];
                let r = app.extend_order(&o.account, &o.id).await;
                if o.effective() == St::Reserved {
                    assert_eq!(r.status, 200, "{} {}", r.body, ctx(&log));
                    o.extensions += 1;
                } else {
                    assert_eq!((r.status, r.code()), (409, "order_not_reserved"), "{} {}", r.body, ctx(&log));
                }
            }
        }
    }
    // The sweeper sweeps every case's orders: end each case with one, so the next starts with nothing to sweep.
    sweep(app, &mut m, &mut log, seed).await;
    compare(app, &m, seed, seats, &log).await;
    m.seen
}

async fn sweep(app: &TestApp, m: &mut Model, log: &mut Vec<String>, seed: u64) {
    log.push("sweep".into());
    // Every order a payment event was delivered for has a payment open: the sweeper asked the provider about each
    // first (the provider's answer is the webhook the model already delivered).
    let asked: Vec<_> = m.orders.iter().map(|o| booking::domain::OrderId(o.id.parse().expect("uuid"))).collect();
    let n = booking::store::lifecycle::sweep(&app.pool, 100, &asked).await.expect("sweep");
    let mut want = 0;
    for o in m.orders.iter_mut().filter(|o| o.stored == St::Reserved && o.deadline_passed) {
        o.set(St::Cancelled(Why::Expired));
        want += 1;
    }
    m.seen.swept += want as usize;
    assert_eq!(n, want, "seed {seed}, ops: {log:#?}");
}

/// A successful payment, by the model's rules; returns the outcome the webhook must report.
fn model_payment(m: &mut Model, i: usize) -> &'static str {
    match m.orders[i].effective() {
        St::Reserved => {
            m.orders[i].set(St::Paid);
            "paid"
        }
        St::Cancelled(Why::Operator) => {
            m.orders[i].set(St::RefundDue);
            "refund_due"
        }
        St::Cancelled(_) => {
            let seats = m.orders[i].seats.clone();
            // Redis first, as a checkout's hold: a seat another fan holds is never taken from them.
            let held = m.holds.iter().any(|h| h.left.iter().any(|s| seats.contains(s)));
            let taken = m
                .orders
                .iter()
                .enumerate()
                .any(|(j, o)| j != i && o.takes_seats() && o.seats.iter().any(|s| seats.contains(s)));
            if held || taken {
                m.orders[i].set(St::RefundDue);
                m.seen.refund_due += 1;
                m.seen.late_refused_for_a_hold += usize::from(held);
                return "refund_due";
            }
            // The order takes its seats back; unpaid orders past their deadline on those seats are freed first.
            for (j, o) in m.orders.iter_mut().enumerate() {
                if j != i && o.stored == St::Reserved && o.deadline_passed && o.seats.iter().any(|s| seats.contains(s))
                {
                    o.set(St::Cancelled(Why::Expired));
                }
            }
            m.orders[i].deadline_passed = false;
            m.orders[i].set(St::Paid);
            m.seen.late_paid += 1;
            "paid"
        }
        St::Paid | St::Refunded | St::RefundDue => "ignored",
    }
}

fn model_failure(o: &mut MOrder) -> &'static str {
    if o.effective() == St::Reserved {
        o.set(St::Cancelled(Why::Failed));
        "cancelled"
    } else {
        "ignored"
    }
}

/// The database equals the model: each order's status, its outbox rows, and which seats are sold.
async fn compare(app: &TestApp, m: &Model, seed: u64, seats: &[i64], log: &[String]) {
    for o in &m.orders {
        let r = app.admin(Method::GET, &format!("/admin/orders/{}", o.id)).await;
        let (status, reason) = status_name(o.effective());
        assert_eq!(r.body["order"]["status"].as_str(), Some(status), "seed {seed} order {} {:#?}", o.id, log);
        assert_eq!(r.body["order"]["cancel_reason"].as_str(), reason, "seed {seed} order {}", o.id);
        let kinds: Vec<&str> =
            r.body["history"].as_array().expect("history").iter().filter_map(|h| h["kind"].as_str()).collect();
        let extended = kinds.iter().filter(|k| **k == "order.extended").count();
        assert_eq!(
            (kinds.len() - extended, extended),
            (o.changes, o.extensions),
            "seed {seed} order {} {kinds:?}",
            o.id
        );
    }
    let mut sold: Vec<i64> = sqlx::query_scalar(
        "SELECT seat_id FROM order_seats WHERE seat_id = ANY($1) AND active AND (expires_at IS NULL OR expires_at > now())",
    )
    .bind(seats)
    .fetch_all(&app.pool)
    .await
    .expect("sold");
    sold.sort_unstable();
    let mut want: Vec<i64> = m.orders.iter().filter(|o| o.takes_seats()).flat_map(|o| o.seats.clone()).collect();
    want.sort_unstable();
    assert_eq!(sold, want, "seed {seed}: sold seats {log:#?}");
}
