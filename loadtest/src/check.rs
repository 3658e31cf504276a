//! The invariant checker: after a run, reads Postgres and Redis and asserts what the product promises. Fails
//! loudly, printing the offending rows.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::Context;
use sqlx::PgPool;
use uuid::Uuid;

use crate::run::{Confirmed, Summary, Turn, TurnOutcome};

/// Where to look.
pub struct Target<'a> {
    pub database_url: &'a str,
    pub redis_url: &'a str,
    pub redis_key_prefix: &'a str,
    pub event: i64,
    /// The run's output directory (`orders.jsonl`, `summary.json`).
    pub out: &'a Path,
    /// A run with faults injected: see `loadtest check --help`.
    pub chaos: bool,
}

/// One check's verdict.
struct Verdict {
    name: &'static str,
    problems: Vec<String>,
    /// Each problem is something lost or broken for good (a sale, an order, a payment, a change), not only a
    /// rule broken along the way.
    lost: bool,
}

/// Runs every check, prints each verdict, and fails if any found a problem.
pub async fn run(target: &Target<'_>) -> anyhow::Result<()> {
    let pool = PgPool::connect(target.database_url).await.context("connecting to Postgres")?;
    let confirmed = read_confirmed(&target.out.join("orders.jsonl"))?;
    let summary: Summary = serde_json::from_str(
        &std::fs::read_to_string(target.out.join("summary.json")).context("reading summary.json")?,
    )
    .context("parsing summary.json")?;
    let mut verdicts = vec![
        one_active_order_per_seat(&pool, target.event).await?,
        confirmed_orders_exist(&pool, target.event, &confirmed).await?,
        paid_orders_paid_once(&pool, target.event, &confirmed).await?,
        totals_match_allocation_prices(&pool, target.event).await?,
        no_held_back_seat_sold(&pool, target.event).await?,
    ];
    let turns = read_lines::<Turn>(&target.out.join("turns.jsonl"))?;
    verdicts.push(places_given_once(&turns));
    verdicts.push(nobody_behind_a_later_joiner(&turns));
    verdicts.push(every_waiting_fan_admitted(&turns, target.chaos));
    let rate = room_rate(target).await?;
    let overshoot = rate.map(|rate| admission_overshoot(&turns, rate, admit_burst(rate)));
    if target.chaos {
        verdicts.push(only_unavailable_with_retry_after(&summary));
        verdicts.push(every_change_on_the_stream_once(target, &pool).await?);
        // Redis's own record of the steps may be lost with its data: the fans' proofs say when each came in.
        verdicts.push(match (rate, overshoot) {
            (Some(rate), Some(over)) => Verdict {
                name: "admissions within the rate (one burst more after a fault)",
                problems: (over > admit_burst(rate))
                    .then(|| format!("{over:.1} fans admitted above the rate line and its burst"))
                    .into_iter()
                    .collect(),
                lost: false,
            },
            _ => Verdict { name: "admissions within the rate", problems: vec!["no room".into()], lost: false },
        });
    } else {
        verdicts.push(no_server_errors(&summary));
        verdicts.push(admissions_within_bounds(target).await?);
    }
    write_record(target.out, &summary, &verdicts, &turns, overshoot)?;
    let mut failed = 0;
    for v in &verdicts {
        if v.problems.is_empty() {
            println!("  ok    {}", v.name);
        } else {
            failed += 1;
            println!("  FAIL  {} ({} problems)", v.name, v.problems.len());
            for p in v.problems.iter().take(20) {
                println!("          {p}");
            }
            if v.problems.len() > 20 {
                println!("          ... and {} more", v.problems.len() - 20);
            }
        }
    }
    anyhow::ensure!(failed == 0, "{failed} of {} invariant checks failed", verdicts.len());
    println!("all {} invariant checks passed for event {}", verdicts.len(), target.event);
    Ok(())
}

fn read_confirmed(path: &Path) -> anyhow::Result<Vec<Confirmed>> {
    read_lines(path)
}

fn read_lines<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<Vec<T>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("a line of {}: {l}", path.display())))
        .collect()
}

async fn one_active_order_per_seat(pool: &PgPool, event: i64) -> anyhow::Result<Verdict> {
    let rows: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT seat_id, count(*) FROM order_seats WHERE event_id = $1 AND active GROUP BY seat_id HAVING count(*) > 1",
    )
    .bind(event)
    .fetch_all(pool)
    .await?;
    let problems = rows.iter().map(|(seat, n)| format!("seat {seat} is in {n} active orders")).collect();
    Ok(Verdict { name: "at most one active order per (event, seat)", problems, lost: true })
}

async fn confirmed_orders_exist(pool: &PgPool, event: i64, confirmed: &[Confirmed]) -> anyhow::Result<Verdict> {
    let rows: Vec<(Uuid, String, i64, i64)> = sqlx::query_as(
        "SELECT o.id, o.account_id, o.total_cents, os.seat_id FROM orders o JOIN order_seats os ON os.order_id = o.id
          WHERE o.event_id = $1",
    )
    .bind(event)
    .fetch_all(pool)
    .await?;
    let mut orders: HashMap<String, (String, i64, HashSet<i64>)> = HashMap::new();
    for (id, account, total, seat) in rows {
        orders.entry(id.to_string()).or_insert_with(|| (account, total, HashSet::new())).2.insert(seat);
    }
    let mut problems = Vec::new();
    for c in confirmed {
        match orders.get(&c.order_id) {
            None => problems.push(format!("order {} confirmed to {} is not in the database", c.order_id, c.account)),
            Some((account, total, seats)) => {
                let seen: HashSet<i64> = c.seat_ids.iter().copied().collect();
                if *account != c.account || *total != c.total_cents || *seats != seen {
                    problems.push(format!(
                        "order {}: the fan saw {} {:?} {} cents, the database has {} {:?} {} cents",
                        c.order_id, c.account, c.seat_ids, c.total_cents, account, seats, total
                    ));
                }
            }
        }
    }
    Ok(Verdict { name: "every order a fan saw confirmed exists, with its seats and total", problems, lost: true })
}

/// Every order a fan was told is paid is paid (its seats sold, for good), and no order of the event was paid
/// more than once (one `order.paid` outbox row at most).
async fn paid_orders_paid_once(pool: &PgPool, event: i64, confirmed: &[Confirmed]) -> anyhow::Result<Verdict> {
    let rows: Vec<(Uuid, String, i64, i64)> = sqlx::query_as(
        "SELECT o.id, o.status,
                (SELECT count(*) FROM order_events e WHERE e.order_id = o.id AND e.kind = 'order.paid'),
                (SELECT count(*) FROM order_seats os WHERE os.order_id = o.id AND os.active AND os.expires_at IS NULL)
           FROM orders o WHERE o.event_id = $1",
    )
    .bind(event)
    .fetch_all(pool)
    .await?;
    let by_id: HashMap<String, (String, i64, i64)> =
        rows.into_iter().map(|(id, status, paid, live)| (id.to_string(), (status, paid, live))).collect();
    let mut problems: Vec<String> = by_id
        .iter()
        .filter(|(_, (_, paid, _))| *paid > 1)
        .map(|(id, (_, paid, _))| format!("order {id} was paid {paid} times"))
        .collect();
    for c in confirmed.iter().filter(|c| c.paid) {
        match by_id.get(&c.order_id) {
            Some((status, 1, live)) if status == "paid" && *live as usize == c.seat_ids.len() => {}
            other => problems.push(format!("order {} was confirmed paid; the database has {other:?}", c.order_id)),
        }
    }
    Ok(Verdict { name: "every order a fan was told is paid is paid, once, with its seats", problems, lost: true })
}

async fn totals_match_allocation_prices(pool: &PgPool, event: i64) -> anyhow::Result<Verdict> {
    let wrong_totals: Vec<(Uuid, i64, i64)> = sqlx::query_as(
        "SELECT o.id, o.total_cents, sum(os.price_cents)::bigint FROM orders o JOIN order_seats os ON os.order_id = o.id
          WHERE o.event_id = $1 GROUP BY o.id, o.total_cents HAVING o.total_cents <> sum(os.price_cents)",
    )
    .bind(event)
    .fetch_all(pool)
    .await?;
    let wrong_prices: Vec<(Uuid, i64, i64, i64)> = sqlx::query_as(
        "SELECT os.order_id, os.seat_id, os.price_cents, t.price_cents
           FROM order_seats os
           JOIN seat_allocations a ON a.event_id = os.event_id AND a.seat_id = os.seat_id
           JOIN ticket_types t ON t.id = a.ticket_type_id
          WHERE os.event_id = $1 AND os.price_cents <> t.price_cents",
    )
    .bind(event)
    .fetch_all(pool)
    .await?;
    let mut problems: Vec<String> = wrong_totals
        .iter()
        .map(|(id, total, sum)| format!("order {id}: total {total} but its seats sum to {sum}"))
        .collect();
    problems.extend(
        wrong_prices
            .iter()
            .map(|(id, seat, paid, price)| format!("order {id} seat {seat}: sold at {paid}, allocation price {price}")),
    );
    Ok(Verdict { name: "order totals equal the allocation prices of their seats", problems, lost: false })
}

async fn no_held_back_seat_sold(pool: &PgPool, event: i64) -> anyhow::Result<Verdict> {
    let rows: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT os.order_id, os.seat_id FROM order_seats os
           LEFT JOIN seat_allocations a ON a.event_id = os.event_id AND a.seat_id = os.seat_id
          WHERE os.event_id = $1 AND a.seat_id IS NULL",
    )
    .bind(event)
    .fetch_all(pool)
    .await?;
    let problems = rows.iter().map(|(id, seat)| format!("order {id} sold held-back seat {seat}")).collect();
    Ok(Verdict { name: "no held-back (unallocated) seat sold", problems, lost: false })
}

fn no_server_errors(summary: &Summary) -> Verdict {
    let problems = if summary.server_errors == 0 {
        Vec::new()
    } else {
        summary
            .statuses
            .iter()
            .filter(|(k, _)| k.rsplit(' ').next().is_some_and(|s| s.starts_with('5')))
            .map(|(k, n)| format!("{n} x {k}"))
            .collect()
    };
    Verdict { name: "zero 5xx answers in the run", problems, lost: false }
}

/// A 5xx that is not a 503, or a 503 without `Retry-After`.
fn is_server_error(key: &str) -> bool {
    key.ends_with(" 503") && key.contains(crate::fan::NO_RETRY_AFTER)
        || key.rsplit(' ').next().is_some_and(|s| s.starts_with('5') && s != "503")
}

/// While a dependency is down, answers are 503 with `Retry-After`, never another 5xx.
fn only_unavailable_with_retry_after(summary: &Summary) -> Verdict {
    let problems =
        summary.statuses.iter().filter(|(k, _)| is_server_error(k)).map(|(k, n)| format!("{n} x {k}")).collect();
    Verdict { name: "no 5xx but 503, and every 503 with Retry-After", problems, lost: false }
}

/// The order stream holds every change of the event's orders, each once by id (after the relay caught up).
async fn every_change_on_the_stream_once(target: &Target<'_>, pool: &PgPool) -> anyhow::Result<Verdict> {
    let name = "the order stream has every change of the event, once by id";
    let backlog = "SELECT count(*) FROM order_events e
                   WHERE (e.txid, e.id) > ((SELECT c.txid FROM outbox_cursor c), (SELECT c.id FROM outbox_cursor c))";
    // A stream published again whole after a flush takes a while: at most a batch of rows per relay tick.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let left: i64 = sqlx::query_scalar(backlog).fetch_one(pool).await?;
        if left == 0 {
            break;
        }
        if std::time::Instant::now() > deadline {
            return Ok(Verdict {
                name,
                problems: vec![format!("{left} changes still unpublished after 60 s")],
                lost: true,
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (written, since): (Vec<i64>, Option<i64>) = {
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT id, (extract(epoch FROM created_at) * 1000)::bigint FROM order_events WHERE event_id = $1 ORDER BY id",
        )
        .bind(target.event)
        .fetch_all(pool)
        .await?;
        let since = rows.iter().map(|(_, at)| *at).min();
        (rows.into_iter().map(|(id, _)| id).collect(), since)
    };
    let Some(since) = since else { return Ok(Verdict { name, problems: Vec::new(), lost: true }) };
    let mut conn = redis_conn(target.redis_url).await?;
    // Entry ids start with the publishing time in ms: from a second before the event's first change, a page at
    // a time (a stream published again whole after a flush holds every event's history).
    let key = redisconn::keys::order_stream(target.redis_key_prefix);
    let field =
        |fields: &[String], name: &str| fields.chunks(2).find(|kv| kv[0] == name).and_then(|kv| kv.get(1).cloned());
    let mut seen: HashMap<i64, u32> = HashMap::new();
    let mut start = (since - 1000).max(0).to_string();
    loop {
        let page: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
            .arg(&key)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(STREAM_PAGE)
            .query_async(&mut conn)
            .await
            .context("reading the order stream")?;
        for (_, fields) in &page {
            if field(fields, "event_id").and_then(|e| e.parse::<i64>().ok()) == Some(target.event)
                && let Some(id) = field(fields, "id").and_then(|i| i.parse::<i64>().ok())
            {
                *seen.entry(id).or_default() += 1;
            }
        }
        match page.last() {
            Some((last, _)) if page.len() == STREAM_PAGE => start = format!("({last}"),
            _ => break,
        }
    }
    let mut problems: Vec<String> = written
        .iter()
        .filter(|id| !seen.contains_key(id))
        .map(|id| format!("change {id} is not on the stream"))
        .collect();
    problems
        .extend(seen.iter().filter(|(_, n)| **n > 1).map(|(id, n)| format!("change {id} is on the stream {n} times")));
    let unknown = seen.keys().filter(|id| !written.contains(id)).count();
    if unknown > 0 {
        problems.push(format!("{unknown} entries name changes this event never had"));
    }
    Ok(Verdict { name, problems, lost: true })
}

/// A connection to the stack's Redis, a single server or a cluster as the URL says.
async fn redis_conn(url: &str) -> anyhow::Result<redisconn::Conn> {
    let target = redisconn::Target::parse(url).context("REDIS_URL")?;
    target.connected(redisconn::Options::default()).await.context("connecting to Redis")
}

/// Stream entries read per `XRANGE`.
const STREAM_PAGE: usize = 1000;

/// `check.json`: the run's 5xx and 503 counts and how many items were lost, for `deploy/chaos`'s table.
fn write_record(
    out: &Path,
    summary: &Summary,
    verdicts: &[Verdict],
    turns: &[Turn],
    overshoot: Option<f64>,
) -> anyhow::Result<()> {
    let server_errors: u64 = summary.statuses.iter().filter(|(k, _)| is_server_error(k)).map(|(_, n)| n).sum();
    let unavailable: u64 =
        summary.statuses.iter().filter(|(k, _)| k.ends_with(" 503") && !is_server_error(k)).map(|(_, n)| n).sum();
    let lost: usize = verdicts.iter().filter(|v| v.lost).map(|v| v.problems.len()).sum();
    let failed: Vec<&str> = verdicts.iter().filter(|v| !v.problems.is_empty()).map(|v| v.name).collect();
    let record = serde_json::json!({
        "server_errors": server_errors,
        "unavailable": unavailable,
        "lost": lost,
        "failed": failed,
        "places_given_twice": places_given_twice(turns).len(),
        "admission_overshoot": overshoot,
    });
    std::fs::write(out.join("check.json"), record.to_string()).context("writing check.json")
}

/// Every admission step recorded: the admitted count never exceeds rate x elapsed + one burst, and never more
/// than max_active fans were admitted within one session window, besides the slots freed early (orders paid,
/// fans who left), each of which lets one more fan in.
async fn admissions_within_bounds(target: &Target<'_>) -> anyhow::Result<Verdict> {
    let mut conn = redis_conn(target.redis_url).await?;
    let key = |name: &str| format!("{}{name}", redisconn::keys::queue_base(target.redis_key_prefix, target.event));
    let settings: HashMap<String, String> =
        redis::cmd("HGETALL").arg(key("settings")).query_async(&mut conn).await.context("room settings")?;
    let members: Vec<String> =
        redis::cmd("ZRANGE").arg(key("batches")).arg(0).arg(-1).query_async(&mut conn).await.context("steps")?;
    let stats: HashMap<String, String> =
        redis::cmd("HGETALL").arg(key("stats")).query_async(&mut conn).await.context("room figures")?;
    let freed = stats.get("freed_total").and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let number = |name: &str| settings.get(name).and_then(|v| v.parse::<f64>().ok());
    let (Some(rate), Some(max_active), Some(session)) =
        (rate_bound(&settings), number("max_active"), number("session_seconds"))
    else {
        return Ok(Verdict {
            name: "admissions within the rate and max_active",
            problems: vec!["no room".into()],
            lost: false,
        });
    };
    let steps: Vec<(u64, u64)> = members
        .iter()
        .filter_map(|m| {
            let p: Vec<u64> = m.split(':').filter_map(|x| x.parse().ok()).collect();
            (p.len() == 4).then(|| (p[2], p[3]))
        })
        .collect();
    let mut problems = Vec::new();
    // The gateway's burst: 500 ms of the rate, at least one fan.
    let burst = (rate * 500.0 / 60_000.0).max(1.0);
    let Some(&(t0, _)) = steps.first() else {
        return Ok(Verdict { name: "admissions within the rate and max_active", problems, lost: false });
    };
    let mut total = 0u64;
    for (i, &(at, admitted)) in steps.iter().enumerate() {
        total += admitted;
        let bound = rate * (at - t0) as f64 / 60_000.0 + burst;
        if total as f64 > bound + 1e-6 {
            problems.push(format!("{total} admitted {} ms after the first step, above the bound {bound:.1}", at - t0));
        }
        let window: u64 =
            steps[..=i].iter().filter(|(t, _)| *t as f64 + session * 1000.0 > at as f64).map(|(_, a)| a).sum();
        if window as f64 > max_active + freed {
            problems.push(format!(
                "{window} admitted within one session window ending at step {i}, above {max_active} and the {freed} \
                 slots freed early"
            ));
        }
    }
    Ok(Verdict { name: "admissions within the rate and max_active", problems, lost: false })
}

/// The places the fans' tickets carried that more than one fan got (each such fan is let in beside another,
/// beyond the rate). Pre-queue tickets (place 0) are left out: their places are drawn later.
fn places_given_twice(turns: &[Turn]) -> Vec<(u64, Vec<&str>)> {
    let mut by_place: HashMap<u64, Vec<&str>> = HashMap::new();
    for t in turns.iter().filter(|t| t.place > 0) {
        by_place.entry(t.place).or_default().push(&t.account);
    }
    let mut twice: Vec<(u64, Vec<&str>)> = by_place.into_iter().filter(|(_, fans)| fans.len() > 1).collect();
    twice.sort_unstable();
    twice
}

fn places_given_once(turns: &[Turn]) -> Verdict {
    let problems = places_given_twice(turns)
        .into_iter()
        .map(|(place, fans)| format!("place {place} was given to {}", fans.join(", ")))
        .collect();
    Verdict { name: "each place in the queue given to one fan", problems, lost: false }
}

/// A fan whose join was answered before another fan's join was sent holds an earlier place than that fan:
/// nobody is put behind someone who joined after them (a place lost with Redis's data and given out again would
/// be).
fn nobody_behind_a_later_joiner(turns: &[Turn]) -> Verdict {
    let mut answered: Vec<&Turn> = turns.iter().filter(|t| t.place > 0).collect();
    answered.sort_by_key(|t| t.join_answered_ms);
    let mut asked: Vec<&Turn> = answered.clone();
    asked.sort_by_key(|t| t.join_sent_ms);
    let mut problems = Vec::new();
    let mut earliest: Option<&Turn> = None;
    let mut i = 0;
    for later in asked {
        while i < answered.len() && answered[i].join_answered_ms < later.join_sent_ms {
            if earliest.is_none_or(|e| answered[i].place > e.place) {
                earliest = Some(answered[i]);
            }
            i += 1;
        }
        if let Some(first) = earliest.filter(|e| e.place > later.place) {
            problems.push(format!(
                "{} was given place {} at {} ms, yet {}, who joined at {} ms, got place {}",
                first.account, first.place, first.join_answered_ms, later.account, later.join_sent_ms, later.place
            ));
        }
    }
    Verdict { name: "nobody put behind a fan who joined after them", problems, lost: true }
}

/// Every fan that joined and kept polling was let in, or told the event sold out: none was told its place
/// lapsed (409) while it polled; in a run with faults, none was still waiting at the end either (such a run's
/// queue is short, so only a lost place keeps a fan waiting), unless it was last told that every seat left was
/// held: then nobody is let in until a seat comes back, however short the queue.
fn every_waiting_fan_admitted(turns: &[Turn], chaos: bool) -> Verdict {
    let problems = turns
        .iter()
        .filter(|t| t.outcome == TurnOutcome::Lapsed || (chaos && t.outcome == TurnOutcome::TimedOut))
        .map(|t| format!("{} (place {}) ended its wait {:?}", t.account, t.place, t.outcome))
        .collect();
    Verdict { name: "every fan that kept its place was let in", problems, lost: true }
}

/// The most fans a minute the room may admit, as Redis holds its settings now: `admit_per_minute`, or an
/// adaptive room's ceiling; a room that lets fans in as fast as slots free (passthrough, reject) has no rate
/// to keep (infinite: only `max_active` binds).
fn rate_bound(settings: &HashMap<String, String>) -> Option<f64> {
    let number = |name: &str| settings.get(name).and_then(|v| v.parse::<f64>().ok());
    if let Some("passthrough" | "reject") = settings.get("queueing").map(String::as_str) {
        return Some(f64::INFINITY);
    }
    match settings.get("rate_mode").map(String::as_str) {
        Some("adaptive") => number("rate_ceiling"),
        _ => number("admit_per_minute"),
    }
}

/// The room's admission rate bound, fans a minute (see [`rate_bound`]).
async fn room_rate(target: &Target<'_>) -> anyhow::Result<Option<f64>> {
    let mut conn = redis_conn(target.redis_url).await?;
    let key = format!("{}settings", redisconn::keys::queue_base(target.redis_key_prefix, target.event));
    let settings: HashMap<String, String> =
        redis::cmd("HGETALL").arg(key).query_async(&mut conn).await.context("room settings")?;
    Ok(rate_bound(&settings))
}

/// The gateway's burst: 500 ms of the rate, at least one fan.
fn admit_burst(rate: f64) -> f64 {
    (rate * 500.0 / 60_000.0).max(1.0)
}

/// How many fans, at the worst moment, were let in above the rate line and its burst, by the admission times
/// their proofs carry (whole seconds: a fan admitted in second T came in before T + 1, so the line is drawn to
/// there, which never counts a fan early). 0 when the room kept its rate.
fn admission_overshoot(turns: &[Turn], rate: f64, burst: f64) -> f64 {
    let mut at: Vec<u64> = turns.iter().filter_map(|t| t.admitted_at).collect();
    at.sort_unstable();
    let Some(&first) = at.first() else { return 0.0 };
    let mut worst = 0.0f64;
    for (i, &second) in at.iter().enumerate() {
        if at.get(i + 1) == Some(&second) {
            continue;
        }
        let line = rate * (second + 1 - first) as f64 / 60.0 + burst;
        worst = worst.max((i + 1) as f64 - line);
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(account: &str, place: u64, sent: u64, answered: u64) -> Turn {
        Turn {
            account: account.into(),
            place,
            join_sent_ms: sent,
            join_answered_ms: answered,
            admitted_at: None,
            outcome: TurnOutcome::Admitted,
        }
    }

    #[test]
    fn a_fan_who_joined_later_with_an_earlier_place_is_found_and_overlapping_joins_are_not() {
        // a and b overlap (either order is fair); c asked after a was answered, yet got a's place minus one.
        let turns =
            [turn("a", 2, 0, 10), turn("b", 1, 5, 12), turn("c", 1, 20, 25), turn("d", 3, 30, 31), turn("e", 0, 1, 2)];
        let v = nobody_behind_a_later_joiner(&turns);
        assert_eq!(v.problems.len(), 1, "{:?}", v.problems);
        assert!(v.problems[0].starts_with("a was given place 2") && v.problems[0].contains("c, who joined"));
        assert!(
            nobody_behind_a_later_joiner(&[turns[0].clone(), turns[1].clone(), turns[3].clone()]).problems.is_empty()
        );
        assert_eq!(places_given_twice(&turns), vec![(1, vec!["b", "c"])]);
    }

    #[test]
    fn a_lapsed_fan_fails_always_and_a_waiting_one_only_in_a_run_with_faults_unless_every_seat_was_held() {
        let mut turns = vec![turn("a", 1, 0, 1), turn("b", 2, 0, 1)];
        turns[1].outcome = TurnOutcome::TimedOut;
        assert!(every_waiting_fan_admitted(&turns, false).problems.is_empty());
        assert_eq!(every_waiting_fan_admitted(&turns, true).problems.len(), 1);
        turns[1].outcome = TurnOutcome::HeldBack;
        assert!(every_waiting_fan_admitted(&turns, true).problems.is_empty());
        turns[1].outcome = TurnOutcome::Lapsed;
        assert_eq!(every_waiting_fan_admitted(&turns, false).problems.len(), 1);
    }

    #[test]
    fn admissions_above_the_rate_line_are_counted_by_whole_seconds() {
        let admitted = |seconds: &[u64]| -> Vec<Turn> {
            seconds
                .iter()
                .enumerate()
                .map(|(i, &s)| Turn { admitted_at: Some(s), ..turn(&format!("f{i}"), i as u64 + 1, 0, 1) })
                .collect()
        };
        // 60 a minute is one a second; a burst of 2.
        assert_eq!(admission_overshoot(&admitted(&[100, 100, 100, 101, 102]), 60.0, 2.0), 0.0);
        assert_eq!(admission_overshoot(&admitted(&[100, 100, 100, 100, 101]), 60.0, 2.0), 1.0);
        assert_eq!(
            admission_overshoot(&admitted(&[100, 101, 105, 105, 105, 105, 105, 105, 105, 105, 105]), 60.0, 2.0),
            3.0
        );
        assert_eq!(admission_overshoot(&[], 60.0, 2.0), 0.0);
    }

    #[test]
    fn only_a_503_with_retry_after_is_not_a_server_error() {
        assert!(!is_server_error("hold 503"));
        assert!(is_server_error(&format!("hold {} 503", crate::fan::NO_RETRY_AFTER)));
        assert!(is_server_error("hold 500"));
        assert!(is_server_error("join 502"));
        assert!(!is_server_error("hold 409"));
        assert!(!is_server_error("status 200"));
    }
}
