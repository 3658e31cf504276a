//! One fan's journey, as a goose transaction: join the queue (again while the gateway answers 503), poll at
//! the server's pace until admitted, load the event and the seat map's status (the live map, `crate::map`,
//! keeps it current as the page's stream does), hold seats the map shows free (retrying around the seat a 409 names), check out with an
//! Idempotency-Key, and pay (booking opens the payment at the provider; the fan completes it there; the
//! provider calls booking back, signed). Some fans close the tab while queued, let their hold expire, or never
//! pay (the order lapses at its deadline).
//!
//! Every request goes through goose (so its report has each one's latency) and through the run's connection
//! limit (fans reach the gateway through a CDN that pools connections).

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use goose::prelude::*;
use serde_json::{Value, json};
use tokens::{AccountClaims, AccountId, unix_now};

use crate::crowd::{self, BotsSolve, Kind, Tally};
use crate::map::LiveMap;
use crate::picker;
use crate::run::{Confirmed, Run, Stats, Turn, TurnOutcome};

/// The run every goose user of this process belongs to.
pub static RUN: OnceLock<Run> = OnceLock::new();

/// The event's live seat map: its layout, and the followers' copies fans pick from.
pub static MAP: OnceLock<Arc<LiveMap>> = OnceLock::new();

/// An answer: status (0 when the request failed before one came), the raw body, and the body as JSON (Null
/// if it is not, or when it was not asked for).
struct Answer {
    status: u16,
    raw: bytes::Bytes,
    body: Value,
}

impl Answer {
    fn str(&self, field: &str) -> Option<String> {
        self.body[field].as_str().map(str::to_owned)
    }
}

/// The fan's identity on the wire.
struct Fan {
    account: String,
    account_token: String,
    /// The client IP the CDN reports (`X-Forwarded-For`).
    ip: String,
    /// A fan, or a bot (`crate::crowd`).
    kind: Kind,
}

/// Sends one request through goose, under the connection limit, and records its status. Statuses in
/// `expected` count as successes in goose's report.
async fn send(
    user: &mut GooseUser,
    run: &Run,
    name: &str,
    method: GooseMethod,
    path: &str,
    prepare: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    expected: &[u16],
) -> Result<Answer, Box<TransactionError>> {
    let builder = prepare(user.get_request_builder(&method, path)?);
    let request = GooseRequest::builder().set_request_builder(builder).name(name).build();
    // The permit covers reading the body too: the connection is busy until then.
    let permit = run.connections.acquire().await;
    let mut goose = user.request(request).await?;
    let (status, raw, retry_after) = match goose.response {
        Ok(response) => {
            let status = response.status().as_u16();
            let retry_after = response.headers().contains_key("retry-after");
            (status, response.bytes().await.unwrap_or_default(), retry_after)
        }
        Err(_) => (0, bytes::Bytes::new(), false),
    };
    drop(permit);
    if status == 503 && !retry_after {
        // A refusal while a dependency is down must say when to come back.
        run.stats.status(&format!("{name} {NO_RETRY_AFTER}"), status);
    } else {
        run.stats.status(name, status);
    }
    if expected.contains(&status) {
        user.set_success(&mut goose.request)?;
    }
    let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    Ok(Answer { status, raw, body })
}

/// Attempts at a checkout or a payment's opening while the gateway says booking cannot answer (503) or nothing
/// answers: a fan whose order met a stopped booking tries again, as the page does, instead of leaving its seats
/// held until the order's payment window ends.
const RETRIES_WHILE_UNAVAILABLE: u32 = 5;

/// `send`, and again a second or so later while booking cannot answer, up to [`RETRIES_WHILE_UNAVAILABLE`]
/// attempts; only for a request its idempotency makes one however often it is sent.
async fn send_until_answered(
    user: &mut GooseUser,
    run: &Run,
    name: &str,
    method: GooseMethod,
    path: &str,
    prepare: impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    expected: &[u16],
) -> Result<Answer, Box<TransactionError>> {
    let mut tries = 1;
    loop {
        let answer = send(user, run, name, method, path, &prepare, expected).await?;
        if !matches!(answer.status, 0 | 503) || tries >= RETRIES_WHILE_UNAVAILABLE {
            return Ok(answer);
        }
        tries += 1;
        tokio::time::sleep(Duration::from_millis(rand::random_range(1000..=2000))).await;
    }
}

/// Marks, in a status's name, a 503 that came without `Retry-After`.
pub const NO_RETRY_AFTER: &str = "(no Retry-After)";

/// How long a fan thinks between steps; a bot never does.
fn think(run: &Run, kind: Kind) -> Duration {
    if kind == Kind::Bot {
        return Duration::ZERO;
    }
    let (low, high) = run.settings.think_ms;
    Duration::from_millis(if high > low { rand::random_range(low..=high) } else { low })
}

/// Polls, at the server's pace, until the fan is admitted (its proof) or its wait ends otherwise (None);
/// `turn` records how and when.
async fn wait_for_turn(
    user: &mut GooseUser,
    run: &Run,
    fan: &Fan,
    join: Answer,
    joined_at: Instant,
    turn: &mut Turn,
) -> Result<Option<String>, Box<TransactionError>> {
    let (s, event) = (&run.settings, run.settings.event);
    let mut answer = join;
    let mut ticket = answer.str("ticket").unwrap_or_default();
    // The waits the room promised at each poll after the join, and when.
    let mut promised: Vec<(Instant, f64)> = Vec::new();
    loop {
        match answer.body["state"].as_str() {
            Some("admitted") => {
                run.stats.promises(promised.iter().map(|(at, eta)| (*eta, at.elapsed().as_secs_f64())));
                let proof = answer.str("admission_token").unwrap_or_default();
                turn.admitted_at = claim(&proof, "iat");
                turn.outcome = TurnOutcome::Admitted;
                return Ok(Some(proof));
            }
            Some("sold_out") | Some("closed") => {
                run.stats.told_sold_out(run.started.elapsed());
                turn.outcome = TurnOutcome::Closed;
                return Ok(None);
            }
            _ if answer.status == 409 => {
                Stats::add(&run.stats.lapsed);
                turn.outcome = TurnOutcome::Lapsed;
                return Ok(None);
            }
            _ => {}
        }
        if joined_at.elapsed() > s.max_wait {
            Stats::add(&run.stats.timed_out);
            turn.outcome = if answer.body["all_held"] == true { TurnOutcome::HeldBack } else { TurnOutcome::TimedOut };
            return Ok(None);
        }
        let pause = answer.body["poll_after_ms"].as_u64().unwrap_or(2000);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        answer = send(
            user,
            run,
            "status",
            GooseMethod::Get,
            &format!("/queue/{event}/status"),
            |b| b.bearer_auth(&ticket).header("x-forwarded-for", &fan.ip),
            &[200],
        )
        .await?;
        if let Some(fresh) = answer.str("ticket") {
            ticket = fresh;
        }
        if let (Some("waiting"), Some(eta)) = (answer.body["state"].as_str(), answer.body["eta_seconds"].as_f64()) {
            promised.push((Instant::now(), eta));
        }
    }
}

/// A number in a signed token's payload, read without checking the signature (the gateway checks it; the fan
/// only reads its own place and admission time).
fn claim(token: &str, name: &str) -> Option<u64> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).ok()?;
    serde_json::from_slice::<Value>(&bytes).ok()?[name].as_u64()
}

/// A true flag in a signed token's payload (read as [`claim`] reads).
fn claim_flag(token: &str, name: &str) -> bool {
    use base64::Engine;
    let payload = token.split('.').nth(1).unwrap_or_default();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap_or_default();
    serde_json::from_slice::<Value>(&bytes).is_ok_and(|v| v[name] == true)
}

/// The whole journey of one fan.
pub async fn journey(user: &mut GooseUser) -> TransactionResult {
    let Some(run) = RUN.get() else { return Ok(()) };
    let s = &run.settings;
    let n = user.weighted_users_index;
    let (kind, k) = s.crowd.member(n);
    let (account, ip) = match kind {
        Kind::Fan => (format!("{}-{k}", s.run_id), format!("10.{}.{}.{}", (k >> 16) & 0xff, (k >> 8) & 0xff, k & 0xff)),
        Kind::Bot => (format!("{}-bot-{k}", s.run_id), s.crowd.bot_ip(k)),
    };
    let Ok(id) = AccountId::parse(&account) else { return Ok(()) };
    let fan =
        Fan { account_token: s.accounts.sign(&AccountClaims::new(id, &s.issuer, unix_now(), 7200)), account, ip, kind };
    let tally = run.stats.crowd.of(kind);
    let event = s.event;
    if s.gateways.len() > 1 {
        user.set_base_url(&s.gateways[n % s.gateways.len()])?;
    }

    // Join; as the page does, again a second or so later while the gateway cannot answer (503, or no answer).
    let joined_at = Instant::now();
    // A refused join may have left the fan's place pending (the next attempt finds it): the fan's turn counts
    // from its first attempt.
    let join_sent_ms = run.started.elapsed().as_millis() as u64;
    // A room that asks for a proof of work answers 428 with a challenge: solved (or, by a bot that does not
    // solve, forged) and sent with the next join.
    let mut gate = Gate { altcha: None, tries: 0, spent: 0 };
    let join = loop {
        let altcha = gate.altcha.take();
        let join = send(
            user,
            run,
            "join",
            GooseMethod::Post,
            &format!("/queue/{event}/join"),
            |b| {
                let b = b.bearer_auth(&fan.account_token).header("x-forwarded-for", &fan.ip);
                match &altcha {
                    Some(field) => b.header("altcha", field),
                    None => b,
                }
            },
            &[200, 428],
        )
        .await?;
        if joined_at.elapsed() > s.max_wait {
            break join;
        }
        match join.status {
            0 | 503 => tokio::time::sleep(Duration::from_millis(rand::random_range(500..=1500))).await,
            428 if gate.pay(run, &fan, tally, &join).await => {}
            // Refused at the gate (a forgery, or the network's cap): a bot tries again at once, a few times.
            400 | 403 | 409 | 429 if fan.kind == Kind::Bot && gate.again(run, tally, &join).await => {}
            _ => break join,
        }
    };
    if join.status != 200 {
        return Ok(());
    }
    Stats::add(&run.stats.joined);
    // A ticket the room holds in its endless queue (a forgery answered as a waiting fan) is no place.
    let held = join.str("ticket").is_some_and(|t| claim_flag(&t, "held"));
    Tally::add(if held { &tally.held } else { &tally.places }, 1);
    let mut turn = Turn {
        account: fan.account.clone(),
        place: join.str("ticket").and_then(|t| claim(&t, "place")).unwrap_or(0),
        join_sent_ms,
        join_answered_ms: run.started.elapsed().as_millis() as u64,
        admitted_at: None,
        outcome: TurnOutcome::Failed,
    };
    if fan.kind == Kind::Fan && join.body["state"] != "admitted" && rand::random::<f64>() < s.abandon_queue {
        // Closes the tab: never polls again; the gateway must skip it without stalling the queue.
        Stats::add(&run.stats.abandoned_queue);
        turn.outcome = TurnOutcome::Abandoned;
        run.stats.turn(turn);
        return Ok(());
    }

    // The wait the room promised at the join (none when admitted at once, or while nothing can be promised).
    let promised = (join.body["state"] == "waiting").then(|| join.body["eta_seconds"].as_f64()).flatten();
    // Wait, at the server's pace, until admitted.
    let waited = wait_for_turn(user, run, &fan, join, joined_at, &mut turn).await;
    run.stats.turn(turn);
    let Some(proof) = waited? else { return Ok(()) };
    run.stats.admitted(run.started.elapsed(), joined_at.elapsed(), promised);
    Tally::add(&tally.admitted, 1);
    let auth = format!("Bearer {proof}");

    // The event, then the seat map.
    send(
        user,
        run,
        "event",
        GooseMethod::Get,
        &format!("/events/{event}"),
        |b| b.header("authorization", &auth),
        &[200],
    )
    .await?;
    // The map's status, as the page reads it before it follows the stream (public: no proof).
    let status = send(
        user,
        run,
        "map status",
        GooseMethod::Get,
        &format!("/events/{event}/seats/status"),
        |b| b.header("x-forwarded-for", &fan.ip),
        &[200],
    )
    .await?;
    run.stats.map_status(status.raw.len());
    let Some(map) = MAP.get() else { return Ok(()) };
    if !map.any_available(n) {
        // Admitted with nothing left to hold: the waiting room should not let this happen.
        Stats::add(&run.stats.admitted_nothing_left);
    }
    tokio::time::sleep(think(run, fan.kind)).await;

    // Hold: pick, and on a 409 try again around the seat it names.
    let party = picker::party_size(rand::random());
    let best = rand::random::<f64>() < s.best_share;
    let mut taken: HashSet<i64> = HashSet::new();
    let mut hold = None;
    for _ in 0..s.hold_attempts {
        // The page's copy of the map, as live as its stream keeps it.
        let available = map.available(n);
        let Some(seats) = map.layout.pick(&available, &taken, party, best, rand::random(), rand::random()) else {
            break;
        };
        let started = Instant::now();
        let answer = send(
            user,
            run,
            "hold",
            GooseMethod::Post,
            &format!("/events/{event}/holds"),
            |b| b.header("authorization", &auth).json(&json!({ "seat_ids": seats })),
            &[201, 409],
        )
        .await?;
        run.stats.hold_latency(started.elapsed());
        match answer.status {
            201 => {
                hold = Some((answer.str("hold_token").unwrap_or_default(), seats));
                break;
            }
            409 => {
                Stats::add(&run.stats.conflicts);
                match answer.body["seat_id"].as_i64() {
                    Some(seat) => {
                        taken.insert(seat);
                    }
                    // Not a seat conflict (the account's cap): nothing more to try.
                    None => break,
                }
            }
            _ => break,
        }
    }
    let Some((hold_token, seats)) = hold else {
        Stats::add(&run.stats.gave_up);
        return Ok(());
    };
    Stats::add(&run.stats.held);
    if fan.kind == Kind::Fan && rand::random::<f64>() < s.abandon_hold {
        // Walks away: the hold expires by itself and the seats go back on sale.
        Stats::add(&run.stats.abandoned_hold);
        return Ok(());
    }
    tokio::time::sleep(think(run, fan.kind)).await;

    // Check out.
    let key = format!("{}-{hold_token}", fan.account);
    let started = Instant::now();
    // As the page does, the same order again while booking cannot answer: its idempotency key makes it one.
    let order = send_until_answered(
        user,
        run,
        "checkout",
        GooseMethod::Post,
        &format!("/events/{event}/orders"),
        |b| b.header("authorization", &auth).header("idempotency-key", &key).json(&json!({ "hold_token": hold_token })),
        &[201, 409],
    )
    .await?;
    run.stats.checkout_latency(started.elapsed());
    if order.status != 201 {
        Stats::add(&run.stats.checkout_refused);
        return Ok(());
    }
    let mut confirmed = Confirmed {
        order_id: order.str("order_id").unwrap_or_default(),
        account: fan.account.clone(),
        seat_ids: seats,
        total_cents: order.body["total_cents"].as_i64().unwrap_or(-1),
        paid: false,
    };
    run.stats.confirmed(&confirmed, run.started.elapsed());
    Tally::add(&tally.orders, 1);
    Tally::add(&tally.seats, confirmed.seat_ids.len() as u64);
    if fan.kind == Kind::Fan && rand::random::<f64>() < s.abandon_payment {
        // Never pays: the order lapses at its deadline and its seats go back on sale.
        Stats::add(&run.stats.unpaid);
    } else {
        tokio::time::sleep(think(run, fan.kind)).await;
        confirmed.paid = pay(user, run, &auth, event, &confirmed.order_id).await?;
    }
    run.stats.settled(confirmed);
    Ok(())
}

/// Opens the order's payment through the gateway, then completes it at the provider, which calls booking back
/// before it answers. True when booking said the order is paid.
async fn pay(
    user: &mut GooseUser,
    run: &Run,
    auth: &str,
    event: i64,
    order_id: &str,
) -> Result<bool, Box<TransactionError>> {
    let started = Instant::now();
    let path = format!("/events/{event}/orders/{order_id}/payment");
    let opened = send_until_answered(
        user,
        run,
        "payment",
        GooseMethod::Post,
        &path,
        |b| b.header("authorization", auth),
        &[201],
    )
    .await?;
    let Some(pay_url) = opened.str("pay_url") else {
        Stats::add(&run.stats.payment_failed);
        return Ok(false);
    };
    let body = json!({ "outcome": "succeeded" });
    let done = send(user, run, "pay", GooseMethod::Post, &pay_url, |b| b.json(&body), &[200]).await?;
    let paid = done.body["delivered"] == true && done.body["webhook_answer"]["outcome"] == "paid";
    if paid {
        run.stats.paid(started.elapsed(), run.started.elapsed());
    } else {
        Stats::add(&run.stats.payment_failed);
    }
    Ok(paid)
}

/// One member's dealings with the gate while it joins.
struct Gate {
    /// What the next join sends in its `altcha` field.
    altcha: Option<String>,
    /// Joins the gate refused, or challenges a bot could not pay for.
    tries: u32,
    /// Hashes spent so far.
    spent: u64,
}

impl Gate {
    /// Pays for a 428's challenge: a fan solves it; a bot solves it within its budget, or forges it. False
    /// when the member gives up (a bot out of budget or tries).
    async fn pay(&mut self, run: &Run, fan: &Fan, tally: &Tally, answer: &Answer) -> bool {
        let crowd = &run.settings.crowd;
        if fan.kind == Kind::Bot && crowd.bots_solve == BotsSolve::None {
            self.altcha = crowd::forge(&answer.body);
            return self.altcha.is_some() && self.tries < crowd.bot_attempts;
        }
        let body = answer.body.clone();
        // Solving is CPU work: off the runtime that drives everyone's requests.
        let Ok(Some(solved)) = tokio::task::spawn_blocking(move || crowd::solve(&body)).await else { return false };
        if fan.kind == Kind::Bot {
            let left = crowd.bot_budget_hashes.saturating_sub(self.spent);
            if solved.hashes > left {
                // A search stopped at the budget spends all of it and finds nothing.
                Tally::add(&tally.hashes, left);
                self.spent += left;
                Tally::add(&tally.out_of_budget, 1);
                return false;
            }
        }
        self.spent += solved.hashes;
        Tally::add(&tally.hashes, solved.hashes);
        Tally::add(&tally.solves, 1);
        self.altcha = Some(solved.field);
        true
    }

    /// After a refusal at the gate: whether a bot tries again (at once; a second later when rate limited).
    async fn again(&mut self, run: &Run, tally: &Tally, answer: &Answer) -> bool {
        let code = answer.body["error"].as_str().unwrap_or("");
        let at_the_gate = code.starts_with("challenge_") || code == "too_many_places";
        if at_the_gate {
            Tally::add(&tally.refused, 1);
        }
        self.tries += 1;
        let again = (at_the_gate || code == "rate_limited") && self.tries < run.settings.crowd.bot_attempts;
        if again && code == "rate_limited" {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        again
    }
}
