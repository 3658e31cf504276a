//! Joining, admitting, sponsor passes, freed slots and a fan's standing in an event's queue.

use std::collections::HashMap;
use std::time::Duration;

use redis::AsyncCommands;

use super::*;
use crate::gate::Payment;
use crate::room::{Batch, Counts, EtaSample, QueueState, Scheduled, Settings};

/// What joining gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// No waiting room is configured for this event.
    Unknown,
    /// The queue takes nobody now.
    Closed(QueueState),
    /// The pre-queue's opening time has passed: open it and join again.
    Opening,
    /// In the pre-queue, with `count` fans.
    Prequeue { count: u64 },
    /// The account's place; `head` is the last place passed; `fresh` if given now.
    Place { place: u64, head: u64, fresh: bool },
    /// The room's challenge is on and the join solved none (and holds no place): nothing was done.
    ChallengeRequired,
    /// The challenge sent already paid for a join: nothing was done.
    Spent,
    /// The client's network was given the room's `places_per_network` places already: nothing was done.
    NetworkFull { cap: u64 },
    /// A `reject` room has no room now (or fans wait): the fan is turned away, nothing was done.
    NoPlaces,
    /// In a `lottery` room's pool for its next draw, with `count` fans.
    Pool { count: u64 },
    /// In the line behind the code holders (a `codes_first` room, joined without a code): `number` in that
    /// line, at `position` (every queue place waiting comes first).
    Later { number: u64, position: u64 },
    /// The presale code was refused (or the room takes code holders only and none was sent): nothing was done.
    Code(CodeRefusal),
}

/// Why a join's presale code was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeRefusal {
    /// The room takes code holders only and the join sent no code.
    Required,
    /// No such code in this room.
    Unknown,
    /// Redeemed by as many accounts as it allows.
    Spent,
    /// Its window begins at `starts_ms`.
    NotYet { starts_ms: u64 },
    /// Its window ended at `ends_ms`.
    Ended { ends_ms: u64 },
}

/// Who joins: the account, its client's network (address prefix; empty when unknown), and the challenge it
/// pays with.
#[derive(Debug, Clone, Copy)]
pub struct Joining<'a> {
    pub account: &'a str,
    pub network: &'a str,
    pub payment: Option<&'a Payment>,
    /// The presale code sent, normalised ([`crate::codes::normalise`]); empty when none.
    pub code: &'a str,
}

/// What a sponsor pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Passed {
    Unknown,
    Closed(QueueState),
    /// The pass was used before.
    Spent,
    /// The room has `max_active` fans within their session: the pass is kept for later.
    Full {
        max_active: u64,
    },
    /// Admitted at `at_ms` (Redis's clock) for the room's session.
    Admitted {
        at_ms: u64,
        session_seconds: u64,
    },
}

/// What an admission step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stepped {
    Idle,
    Opening,
    Moved { head: u64, seq: u64, admitted: u64, skipped: u64 },
}

/// What a state change did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateChange {
    Unknown,
    /// The state was not the one expected; nothing done.
    Changed(String),
    /// Back to prequeue after places were given: refused.
    Refused(String),
    Done {
        drawn: u64,
    },
}

/// One read of an event's queue (an atomic MULTI/EXEC), with the steps and skips after what the node knew.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub settings: Option<Settings>,
    pub counts: Counts,
    pub waits_ms: Vec<u64>,
    pub new_batches: Vec<Batch>,
    pub new_skipped: Vec<u64>,
    /// Fans who left at or after the `left_since` asked for: account, when (ms).
    pub new_left: Vec<(String, u64)>,
    /// The room's scheduled changes still to apply, earliest first.
    pub schedule: Vec<Scheduled>,
    pub redis_ms: u64,
}

/// Why a fan's slot is freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreedBy {
    /// Its order was paid.
    Paid,
    /// It left (`POST /queue/{id}/leave`): its admission ends too.
    Left,
}

/// What freeing a slot did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freed {
    Unknown,
    /// The slot was freed now (`at_ms`, Redis's clock).
    Now {
        at_ms: u64,
    },
    /// The fan held no slot.
    NotActive {
        at_ms: u64,
    },
}

impl QueueStore {
    /// Gives `account`, joining from `network` (its address prefix), its place in `event`'s queue
    /// (`lua/queue_join.lua`), above `floor`, the highest place this node knows was given out, spending the
    /// challenge it paid with, if any. A place is answered only once the replicas asked for hold it.
    pub async fn join(&self, event: i64, joining: &Joining<'_>, floor: u64) -> Result<Joined, StoreError> {
        let mut inv = self.script(&self.scripts.join, event);
        inv.arg(joining.account).arg(floor);
        match joining.payment {
            Some(paid) => inv.arg(&paid.nonce).arg(paid.expires_at_ms),
            None => inv.arg("").arg(0),
        };
        inv.arg(joining.network).arg(joining.code);
        let mut conn = self.conn.clone();
        let p = parts(self.run(inv.invoke_async(&mut conn)).await?)?;
        let joined = match p.first().map(String::as_str) {
            Some("unknown") => Joined::Unknown,
            Some("closed") => Joined::Closed(p.get(1).and_then(|s| QueueState::parse(s)).unwrap_or(QueueState::Closed)),
            Some("opening") => Joined::Opening,
            Some("pre") => Joined::Prequeue { count: number(&p, 1)? },
            Some("place") => Joined::Place { place: number(&p, 1)?, head: number(&p, 2)?, fresh: number(&p, 3)? == 1 },
            Some("challenge") => Joined::ChallengeRequired,
            Some("spent") => Joined::Spent,
            Some("network_full") => Joined::NetworkFull { cap: number(&p, 1)? },
            Some("no_places") => Joined::NoPlaces,
            Some("pool") => Joined::Pool { count: number(&p, 1)? },
            Some("later") => Joined::Later { number: number(&p, 1)?, position: number(&p, 2)? },
            Some("code_required") => Joined::Code(CodeRefusal::Required),
            Some("code_unknown") => Joined::Code(CodeRefusal::Unknown),
            Some("code_spent") => Joined::Code(CodeRefusal::Spent),
            Some("code_not_yet") => Joined::Code(CodeRefusal::NotYet { starts_ms: number(&p, 1)? }),
            Some("code_ended") => Joined::Code(CodeRefusal::Ended { ends_ms: number(&p, 1)? }),
            _ => return Err(StoreError::Reply(p.join(" "))),
        };
        // A place given earlier is waited for too: the answer that gave it may have been refused unreplicated.
        if matches!(joined, Joined::Prequeue { .. } | Joined::Place { .. } | Joined::Later { .. }) {
            self.replicate(event, true).await?;
        }
        Ok(joined)
    }

    /// Admits `account` at once on a sponsor pass (`lua/queue_pass.lua`), spending the pass `id` until
    /// `expires_at_ms`.
    pub async fn admit_pass(
        &self,
        event: i64,
        account: &str,
        id: &str,
        expires_at_ms: u64,
    ) -> Result<Passed, StoreError> {
        let mut inv = self.script(&self.scripts.pass, event);
        inv.arg(account).arg(id).arg(expires_at_ms);
        let mut conn = self.conn.clone();
        let p = parts(self.run(inv.invoke_async(&mut conn)).await?)?;
        let passed = match p.first().map(String::as_str) {
            Some("unknown") => Passed::Unknown,
            Some("closed") => Passed::Closed(p.get(1).and_then(|s| QueueState::parse(s)).unwrap_or(QueueState::Closed)),
            Some("spent") => Passed::Spent,
            Some("full") => Passed::Full { max_active: number(&p, 1)? },
            Some("admitted") => Passed::Admitted { at_ms: number(&p, 1)?, session_seconds: number(&p, 2)? },
            _ => return Err(StoreError::Reply(p.join(" "))),
        };
        if matches!(passed, Passed::Admitted { .. }) {
            self.replicate(event, true).await?;
        }
        Ok(passed)
    }

    /// One admission step (`lua/queue_admit.lua`).
    pub async fn admit(&self, event: i64, max_walk: u64, burst: Duration) -> Result<Stepped, StoreError> {
        let mut inv = self.script(&self.scripts.admit, event);
        inv.arg(max_walk).arg(burst.as_millis() as u64);
        let mut conn = self.conn.clone();
        let p = parts(self.run(inv.invoke_async(&mut conn)).await?)?;
        let stepped = match p.first().map(String::as_str) {
            Some("idle") => Stepped::Idle,
            Some("opening") => Stepped::Opening,
            Some("stepped") => Stepped::Moved {
                head: number(&p, 1)?,
                seq: number(&p, 2)?,
                admitted: number(&p, 3)?,
                skipped: number(&p, 4)?,
            },
            _ => return Err(StoreError::Reply(p.join(" "))),
        };
        if matches!(stepped, Stepped::Moved { admitted, skipped, .. } if admitted + skipped > 0) {
            self.replicate(event, false).await?;
        }
        Ok(stepped)
    }

    /// Changes the state, drawing the pre-queue when it opens (`lua/queue_set_state.lua`).
    pub async fn set_state(
        &self,
        event: i64,
        state: QueueState,
        seed: u64,
        expect: Option<QueueState>,
    ) -> Result<StateChange, StoreError> {
        let mut inv = self.script(&self.scripts.set_state, event);
        inv.arg(state.as_str()).arg(seed).arg(expect.map_or("", QueueState::as_str));
        let mut conn = self.conn.clone();
        let p = parts(self.run(inv.invoke_async(&mut conn)).await?)?;
        let state_of = |p: &[String]| p.get(1).cloned().unwrap_or_default();
        let change = match p.first().map(String::as_str) {
            Some("unknown") => StateChange::Unknown,
            Some("changed") => StateChange::Changed(state_of(&p)),
            Some("refused") => StateChange::Refused(state_of(&p)),
            Some("ok") => StateChange::Done { drawn: number(&p, 2)? },
            _ => return Err(StoreError::Reply(p.join(" "))),
        };
        if matches!(change, StateChange::Done { .. }) {
            self.replicate(event, false).await?;
        }
        Ok(change)
    }

    /// Records that these accounts polled (`lua/queue_touch.lua`).
    pub async fn touch(&self, event: i64, accounts: &[String]) -> Result<(), StoreError> {
        if accounts.is_empty() {
            return Ok(());
        }
        let mut inv = self.scripts.touch.prepare_invoke();
        inv.key(self.keys(event).key("seen"));
        for account in accounts {
            inv.arg(account);
        }
        let mut conn = self.conn.clone();
        let _: u64 = self.run(inv.invoke_async(&mut conn)).await?;
        Ok(())
    }

    /// Reads the queue in one MULTI/EXEC, fetching only steps after `last_to` and skips after `last_skipped`.
    pub async fn snapshot(
        &self,
        event: i64,
        last_to: u64,
        last_skipped: u64,
        left_since: u64,
    ) -> Result<Snapshot, StoreError> {
        let k = self.keys(event);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("TIME")
            .hgetall(k.key("settings"))
            .get(k.key("seq"))
            .get(k.key("head"))
            .hgetall(k.key("stats"))
            .zcard(k.key("active"))
            .scard(k.key("pre"))
            .lrange(k.key("waits"), 0, -1)
            .zrangebyscore(k.key("batches"), format!("({last_to}"), "+inf")
            .zrangebyscore(k.key("skipped"), format!("({last_skipped}"), "+inf")
            .zrangebyscore_withscores(k.key("left"), left_since, "+inf")
            .zrange(k.key("schedule"), 0, -1);
        type Reply = (
            (u64, u64),
            HashMap<String, String>,
            Option<u64>,
            Option<u64>,
            HashMap<String, String>,
            u64,
            u64,
            Vec<u64>,
            Vec<String>,
            Vec<u64>,
            Vec<(String, u64)>,
            Vec<String>,
        );
        let mut conn = self.conn.clone();
        let (time, settings, seq, head, stats, active, prequeue, waits_ms, batches, skipped, left, schedule): Reply =
            self.run(pipe.query_async(&mut conn)).await?;
        let stat = |name: &str| stats.get(name).and_then(|v| v.parse().ok()).unwrap_or(0);
        let new_batches = batches.iter().map(|m| Batch::parse(m).ok_or_else(|| StoreError::Reply(m.clone())));
        Ok(Snapshot {
            settings: Settings::from_hash(&settings),
            counts: Counts {
                seq: seq.unwrap_or(0),
                head: head.unwrap_or(0),
                active,
                admitted_total: stat("admitted_total"),
                abandoned_total: stat("abandoned_total"),
                prequeue,
                later_seq: stat("later_seq"),
                later_head: stat("later_head"),
                freed_total: stat("freed_total"),
                last_draw_ms: stat("last_draw_ms"),
                next_draw_ms: stat("next_draw_ms"),
                eta_counted: stat("eta_counted"),
            },
            waits_ms,
            new_batches: new_batches.collect::<Result<_, _>>()?,
            new_skipped: skipped,
            new_left: left,
            schedule: parse_all(&schedule),
            redis_ms: time.0 * 1000 + time.1 / 1000,
        })
    }

    /// The account's place, if it has one.
    pub async fn place_of(&self, event: i64, account: &str) -> Result<Option<u64>, StoreError> {
        let mut conn = self.conn.clone();
        self.run(conn.hget(self.keys(event).key("places"), account)).await
    }

    /// Whether `account` waits in `event`'s pool (a lottery's next draw, or the pre-queue).
    pub async fn in_pool(&self, event: i64, account: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        self.run(conn.sismember(self.keys(event).key("pre"), account)).await
    }

    /// The accounts at places `base + 1 ..= base + n`, in place order (from the place -> account record).
    pub async fn accounts_at(&self, event: i64, base: u64, n: u64) -> Result<Vec<Option<String>>, StoreError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let places: Vec<u64> = (base + 1..=base + n).collect();
        let mut conn = self.conn.clone();
        self.run(redis::cmd("HMGET").arg(self.keys(event).key("who")).arg(&places).query_async(&mut conn)).await
    }

    /// Frees `account`'s slot in `event`'s room at once (`lua/queue_free.lua`); one that left also gives up its
    /// admission and any place it waits in.
    pub async fn free(&self, event: i64, account: &str, by: FreedBy) -> Result<Freed, StoreError> {
        let mut inv = self.script(&self.scripts.free, event);
        inv.arg(account).arg(match by {
            FreedBy::Paid => "paid",
            FreedBy::Left => "left",
        });
        let mut conn = self.conn.clone();
        let p = parts(self.run(inv.invoke_async(&mut conn)).await?)?;
        let freed = match p.first().map(String::as_str) {
            Some("unknown") => Freed::Unknown,
            Some("freed") => Freed::Now { at_ms: number(&p, 1)? },
            Some("not_active") => Freed::NotActive { at_ms: number(&p, 1)? },
            _ => return Err(StoreError::Reply(p.join(" "))),
        };
        if by == FreedBy::Left {
            self.replicate(event, true).await?;
        }
        Ok(freed)
    }

    /// Counts `account`'s `sample` in the room's ETA error, once whichever nodes ask (`lua/queue_eta.lua`); true
    /// when it was counted now.
    pub async fn count_eta(&self, event: i64, account: &str, sample: &EtaSample) -> Result<bool, StoreError> {
        let mut inv = self.script(&self.scripts.eta, event);
        inv.arg(account).arg(sample.encode());
        let mut conn = self.conn.clone();
        let counted: u8 = self.run(inv.invoke_async(&mut conn)).await?;
        Ok(counted == 1)
    }

    /// The ETA samples of the room's last admitted fans (every node's), newest first; one that does not read is
    /// left out.
    pub async fn eta_samples(&self, event: i64) -> Result<Vec<EtaSample>, StoreError> {
        let mut conn = self.conn.clone();
        let raw: Vec<String> =
            self.run(conn.lrange(self.keys(event).key("etaerrs"), 0, EtaSample::KEPT as isize - 1)).await?;
        Ok(raw.iter().filter_map(|r| EtaSample::parse(r)).collect())
    }
}
