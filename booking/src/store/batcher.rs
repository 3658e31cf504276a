//! Group commit for checkouts: checkouts that arrive together go to Postgres together, in one
//! `checkout_batch` statement and one commit, instead of one transaction each.
//!
//! A dispatcher waits for a free slot (at most `in_flight` batches run at once), then takes every checkout
//! waiting, up to `max`: a lone checkout goes at once, and batches grow only while Postgres is busy with the
//! previous ones. Each checkout is settled exactly as it would be alone (the SQL function falls back to
//! `checkout_order` per item for anything but a plainly new order); a batch whose statement fails as a whole
//! wrote nothing and is run again one checkout at a time.

use std::sync::Arc;

use futures::future::join_all;
use sqlx::PgPool;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::StoreError;
use super::orders::{self, Checkout, CheckoutError, NewOrder};

type Settled = Result<Checkout, CheckoutError>;
type Job = (NewOrder, oneshot::Sender<Settled>);

/// Checkouts waiting for a batch at most; a request beyond that waits to be queued.
const QUEUE: usize = 4_096;

/// Hands checkouts to the dispatcher (or, with batches of one, straight to Postgres).
#[derive(Clone)]
pub struct CheckoutBatcher {
    pool: PgPool,
    queue: Option<mpsc::Sender<Job>>,
}

impl CheckoutBatcher {
    /// Starts the dispatcher: at most `max` checkouts a batch and `in_flight` batches at once. With `max` 1
    /// there is no dispatcher and every checkout is its own transaction.
    pub fn start(pool: PgPool, max: usize, in_flight: usize) -> Self {
        if max <= 1 {
            return Self { pool, queue: None };
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(dispatch(pool.clone(), rx, max, Arc::new(Semaphore::new(in_flight.max(1)))));
        Self { pool, queue: Some(tx) }
    }

    /// Settles one checkout, in whichever batch it lands.
    pub async fn checkout(&self, new: NewOrder) -> Settled {
        let Some(queue) = &self.queue else { return orders::checkout(&self.pool, &new).await };
        let (reply, settled) = oneshot::channel();
        if queue.send((new, reply)).await.is_err() {
            return Err(stopped());
        }
        settled.await.unwrap_or_else(|_| Err(stopped()))
    }
}

fn stopped() -> CheckoutError {
    StoreError::Unexpected("the checkout dispatcher stopped".into()).into()
}

/// Takes what is waiting whenever a slot is free; ends when every [`CheckoutBatcher`] is dropped.
async fn dispatch(pool: PgPool, mut rx: mpsc::Receiver<Job>, max: usize, slots: Arc<Semaphore>) {
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let Some(first) = rx.recv().await else { return };
        let mut jobs = vec![first];
        while jobs.len() < max {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let pool = pool.clone();
        tokio::spawn(async move {
            // One batch per event (and payment terms): in an on-sale, one batch.
            while let Some((head, _)) = jobs.first() {
                let head = head.clone();
                let (batch, rest): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|(n, _)| n.batches_with(&head));
                jobs = rest;
                settle(&pool, batch).await;
            }
            drop(slot);
        });
    }
}

async fn settle(pool: &PgPool, batch: Vec<Job>) {
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
    // A receiver gone is a client that hung up: its checkout stands, and its key answers a retry.
    for (reply, result) in replies.into_iter().zip(settled) {
        let _ = reply.send(result);
    }
}
