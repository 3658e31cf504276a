//! Group commit for checkouts: checkouts that arrive together go to Postgres together, in one
//! `checkout_batch` statement and one commit, instead of one transaction each.
//!
//! A dispatcher waits for a free slot (at most `in_flight` batches run at once), then takes every checkout
//! waiting, up to `max`. Before it sends a batch it waits a little for checkouts already on their way: a
//! request announces its checkout when it starts (before the Redis gate), so the dispatcher knows how many
//! are coming and waits for those, up to `wait`, and never for requests not yet made. With nothing on its way a
//! lone checkout goes at once. Without that wait, a busy server alternates: a big batch, then a lone checkout
//! that took the free slot as soon as the first answered client came back, and a lone checkout costs Postgres
//! several times its share of a batch.
//!
//! Each checkout is settled exactly as it would be alone (the SQL function falls back to `checkout_order` per
//! item for anything but a plainly new order); a batch whose statement fails as a whole wrote nothing and is
//! run again one checkout at a time.
//!
//! After the commit, and before anyone is answered, the seats of every order the batch created are marked sold
//! in Redis in one `reserve_seats` call (best effort: Postgres stays the guarantee), so a fan who hears of an
//! order can no longer release its seats as a hold.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::join_all;
use sqlx::PgPool;
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use super::StoreError;
use super::holds::{Holds, OrderSeats, Until};
use super::orders::{self, Checkout, CheckoutError, NewOrder};

type Settled = Result<Checkout, CheckoutError>;
type Job = (NewOrder, oneshot::Sender<Settled>);

/// Checkouts waiting for a batch at most; a request beyond that waits to be queued.
const QUEUE: usize = 4_096;

/// How a batch is formed.
#[derive(Debug, Clone, Copy)]
pub struct BatchPolicy {
    /// Checkouts in one batch at most; 1 means no batching (every checkout its own transaction).
    pub max: usize,
    /// Batches running at once.
    pub in_flight: usize,
    /// Longest wait for announced checkouts before a batch goes; zero never waits.
    pub wait: Duration,
}

/// Hands checkouts to the dispatcher (or, with batches of one, straight to Postgres).
#[derive(Clone)]
pub struct CheckoutBatcher {
    stores: Stores,
    queue: Option<mpsc::Sender<Job>>,
    coming: Arc<Coming>,
}

/// Where checkouts are written, and where their seats are then marked sold (none in tests of Postgres alone).
#[derive(Clone)]
struct Stores {
    pool: PgPool,
    holds: Option<Holds>,
}

/// Checkouts announced and not yet queued (or given up), and a wake-up for the dispatcher when that count
/// falls without a checkout being queued.
#[derive(Default)]
struct Coming {
    count: AtomicUsize,
    fell: Notify,
}

/// A checkout on its way to the dispatcher: counted from [`CheckoutBatcher::announce`] until it is queued by
/// [`Announced::checkout`] or dropped (the request was refused before Postgres).
pub struct Announced {
    batcher: CheckoutBatcher,
    queued: bool,
}

impl Drop for Announced {
    fn drop(&mut self) {
        let left = self.batcher.coming.count.fetch_sub(1, Ordering::AcqRel) - 1;
        if left == 0 || !self.queued {
            self.batcher.coming.fell.notify_one();
        }
    }
}

impl Announced {
    /// Settles the announced checkout, in whichever batch it lands.
    pub async fn checkout(mut self, new: NewOrder) -> Settled {
        let Some(queue) = self.batcher.queue.clone() else {
            let stores = &self.batcher.stores;
            let settled = orders::checkout(&stores.pool, &new).await;
            stores.mark_sold(std::slice::from_ref(&new), std::slice::from_ref(&settled)).await;
            return settled;
        };
        let (reply, settled) = oneshot::channel();
        let sent = queue.send((new, reply)).await;
        self.queued = sent.is_ok();
        drop(self);
        if sent.is_err() {
            return Err(stopped());
        }
        settled.await.unwrap_or_else(|_| Err(stopped()))
    }
}

impl CheckoutBatcher {
    /// Starts the dispatcher. With `policy.max` 1 there is no dispatcher and every checkout is its own
    /// transaction. The orders' seats are marked sold in `holds` (`None`: not at all, for tests of Postgres
    /// alone).
    pub fn start(pool: PgPool, holds: Option<Holds>, policy: BatchPolicy) -> Self {
        let coming = Arc::new(Coming::default());
        let stores = Stores { pool, holds };
        if policy.max <= 1 {
            return Self { stores, queue: None, coming };
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let slots = Arc::new(Semaphore::new(policy.in_flight.max(1)));
        tokio::spawn(dispatch(stores.clone(), rx, policy, slots, coming.clone()));
        Self { stores, queue: Some(tx), coming }
    }

    /// Announces a checkout that will reach [`Announced::checkout`] soon (or be dropped on the way), so that a
    /// batch about to go waits for it.
    pub fn announce(&self) -> Announced {
        self.coming.count.fetch_add(1, Ordering::AcqRel);
        Announced { batcher: self.clone(), queued: false }
    }

    /// Settles one checkout, in whichever batch it lands.
    pub async fn checkout(&self, new: NewOrder) -> Settled {
        self.announce().checkout(new).await
    }
}

fn stopped() -> CheckoutError {
    StoreError::Unexpected("the checkout dispatcher stopped".into()).into()
}

/// Takes what is waiting whenever a slot is free; ends when every [`CheckoutBatcher`] is dropped.
async fn dispatch(
    stores: Stores,
    mut rx: mpsc::Receiver<Job>,
    policy: BatchPolicy,
    slots: Arc<Semaphore>,
    coming: Arc<Coming>,
) {
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let Some(first) = rx.recv().await else { return };
        let mut jobs = vec![first];
        take_waiting(&mut rx, &mut jobs, policy.max);
        gather(&mut rx, &mut jobs, &policy, &coming).await;
        let stores = stores.clone();
        tokio::spawn(async move {
            // One batch per event (and payment terms): in an on-sale, one batch.
            let mut written = vec![];
            while let Some((head, _)) = jobs.first() {
                let head = head.clone();
                let (batch, rest): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|(n, _)| n.batches_with(&head));
                jobs = rest;
                written.push(settle(&stores.pool, batch).await);
            }
            // Postgres is done with the slot: the next batch may go while this one's seats are marked.
            drop(slot);
            for batch in written {
                batch.answer(&stores).await;
            }
        });
    }
}

fn take_waiting(rx: &mut mpsc::Receiver<Job>, jobs: &mut Vec<Job>, max: usize) {
    while jobs.len() < max {
        match rx.try_recv() {
            Ok(job) => jobs.push(job),
            Err(_) => break,
        }
    }
}

/// Waits, up to `policy.wait`, for the checkouts that were announced when the batch was about to go: until
/// they are all queued or given up, or the batch is full. Checkouts announced during the wait are not waited
/// for (under a steady stream the wait would never end), though they join if they arrive in time.
async fn gather(rx: &mut mpsc::Receiver<Job>, jobs: &mut Vec<Job>, policy: &BatchPolicy, coming: &Coming) {
    let mut expected = (jobs.len() + coming.count.load(Ordering::Acquire)).min(policy.max);
    if expected <= jobs.len() || policy.wait.is_zero() {
        return;
    }
    let started = Instant::now();
    let deadline = started + policy.wait;
    while jobs.len() < expected {
        let fell = coming.fell.notified();
        let on_way = coming.count.load(Ordering::Acquire);
        if on_way == 0 {
            break;
        }
        // A checkout given up on the way is one fewer to wait for.
        expected = expected.min(jobs.len() + on_way);
        tokio::select! {
            job = rx.recv() => match job {
                Some(job) => jobs.push(job),
                None => break,
            },
            () = fell => {}
            () = tokio::time::sleep_until(deadline) => break,
        }
        take_waiting(rx, jobs, policy.max);
    }
    take_waiting(rx, jobs, policy.max);
    metrics::histogram!("booking_checkout_batch_wait_seconds").record(started.elapsed().as_secs_f64());
}

/// A batch written to Postgres, its checkouts not yet answered.
struct Written {
    news: Vec<NewOrder>,
    settled: Vec<Settled>,
    replies: Vec<oneshot::Sender<Settled>>,
}

async fn settle(pool: &PgPool, batch: Vec<Job>) -> Written {
    metrics::histogram!("booking_checkout_batch_size").record(batch.len() as f64);
    let (news, replies): (Vec<NewOrder>, Vec<oneshot::Sender<Settled>>) = batch.into_iter().unzip();
    let settled = match news.as_slice() {
        [one] => vec![orders::checkout(pool, one).await],
        _ => match orders::checkout_batch(pool, &news).await {
            Ok(settled) => settled,
            Err(e) => {
                tracing::info!(error = %e, size = news.len(), "checkout batch failed whole; settling one by one");
                metrics::counter!("booking_checkout_batches_split_total").increment(1);
                join_all(news.iter().map(|new| orders::checkout(pool, new))).await
            }
        },
    };
    Written { news, settled, replies }
}

impl Written {
    /// Marks the new orders' seats sold, then answers every checkout of the batch.
    async fn answer(self, stores: &Stores) {
        stores.mark_sold(&self.news, &self.settled).await;
        // A receiver gone is a client that hung up: its checkout stands, and its key answers a retry.
        for (reply, result) in self.replies.into_iter().zip(self.settled) {
            let _ = reply.send(result);
        }
    }
}

impl Stores {
    /// Marks the seats of the orders just created (checkouts of one event) sold in Redis until their payment
    /// deadline, in one call, whatever Redis holds for them now: Postgres just gave them to these orders (a
    /// hold that lapsed between the gate and the commit, or a fan who held a seat since, must not leave the
    /// map showing it free or held). Best effort: if it fails, the holds simply expire and Postgres still refuses any
    /// second sale.
    async fn mark_sold(&self, news: &[NewOrder], settled: &[Settled]) {
        let (Some(holds), Some(first)) = (&self.holds, news.first()) else { return };
        let created: Vec<(OrderSeats<'_>, Until)> = news
            .iter()
            .zip(settled)
            .filter_map(|(new, settled)| match settled {
                Ok(Checkout::Created(order)) => Some((
                    OrderSeats { token: new.hold, account: &new.account, seats: &new.seats },
                    Until::deadline(order.payment_due_at),
                )),
                _ => None,
            })
            .collect();
        if let Err(e) = holds.reserve_all(first.event, &created, true).await {
            tracing::warn!(error = %e, orders = created.len(), "checkouts committed but their seats were not marked sold in Redis");
        }
    }
}
