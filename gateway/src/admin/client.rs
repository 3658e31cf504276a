//! `gateway admin ...`: the operators' client of a gateway's admin listener. Prints the JSON answer; exits
//! non-zero, with the error's message, on any refusal.

use anyhow::{Context, bail};
use secrecy::ExposeSecret;
use serde_json::{Value, json};

use crate::config::{AdminAction, AdminArgs};
use crate::room::{Access, ChallengeMode, QueueState, SettingsPatch};

/// Runs one admin command to completion.
pub fn run(args: AdminArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(execute(args))
}

/// `--opens-at`: Unix seconds, `+N` seconds from now, or 0 to clear.
fn opens_at(raw: &str) -> anyhow::Result<u64> {
    unix_time("--opens-at", raw)
}

/// A time option: Unix seconds, or `+N` seconds from now.
fn unix_time(option: &str, raw: &str) -> anyhow::Result<u64> {
    match raw.strip_prefix('+') {
        Some(offset) => {
            Ok(tokens::unix_now() + offset.parse::<u64>().with_context(|| format!("{option} +N: N seconds"))?)
        }
        None => raw.parse().with_context(|| format!("{option}: Unix seconds or +N")),
    }
}

/// Tries of one request while the gateway answers 503.
const ATTEMPTS: u32 = 3;

async fn execute(args: AdminArgs) -> anyhow::Result<()> {
    let client = reqwest::Client::builder().timeout(std::time::Duration::from_secs(10)).build()?;
    let base = args.url.trim_end_matches('/');
    let token = args.token.expose_secret();
    let (event, request) = match &args.action {
        AdminAction::Get { event } | AdminAction::Draw { event } => {
            let suffix = if matches!(args.action, AdminAction::Draw { .. }) { "/draw" } else { "" };
            (*event, client.get(format!("{base}/admin/events/{event}{suffix}")))
        }
        AdminAction::Codes { event, list: true, .. } => {
            (*event, client.get(format!("{base}/admin/events/{event}/codes")))
        }
        AdminAction::Codes { event, count, uses, code, starts_at, ends_at, .. } => {
            let ask = crate::codes::BatchAsk {
                count: *count,
                uses: *uses,
                code: code.clone(),
                starts_at: starts_at.as_deref().map(|at| unix_time("--starts-at", at)).transpose()?,
                ends_at: ends_at.as_deref().map(|at| unix_time("--ends-at", at)).transpose()?,
            };
            (*event, client.post(format!("{base}/admin/events/{event}/codes")).json(&ask))
        }
        AdminAction::Pass { event, account, ttl_seconds } => {
            let ask = json!({ "account": account, "ttl_seconds": ttl_seconds });
            (*event, client.post(format!("{base}/admin/events/{event}/passes")).json(&ask))
        }
        AdminAction::Set {
            event,
            state,
            admit_per_minute,
            max_active,
            session_seconds,
            abandon_after_seconds,
            opens_at: at,
            challenge,
            challenge_difficulty,
            challenge_min_difficulty,
            challenge_max_difficulty,
            challenge_window_seconds,
            infinite_queue_for_failed,
            places_per_network,
            access,
        } => {
            let state = match state {
                Some(s) => Some(
                    QueueState::parse(s).with_context(|| format!("--state {s}: prequeue, open, paused or closed"))?,
                ),
                None => None,
            };
            let patch = SettingsPatch {
                state,
                admit_per_minute: *admit_per_minute,
                max_active: *max_active,
                session_seconds: *session_seconds,
                abandon_after_seconds: *abandon_after_seconds,
                opens_at: at.as_deref().map(opens_at).transpose()?,
                challenge: match challenge {
                    Some(c) => {
                        Some(ChallengeMode::parse(c).with_context(|| format!("--challenge {c}: on, auto or off"))?)
                    }
                    None => None,
                },
                challenge_difficulty: *challenge_difficulty,
                challenge_min_difficulty: *challenge_min_difficulty,
                challenge_max_difficulty: *challenge_max_difficulty,
                challenge_window_seconds: *challenge_window_seconds,
                infinite_queue_for_failed: *infinite_queue_for_failed,
                places_per_network: *places_per_network,
                access: match access {
                    Some(a) => Some(
                        Access::parse(a)
                            .with_context(|| format!("--access {a}: public, code_required or codes_first"))?,
                    ),
                    None => None,
                },
            };
            (*event, client.put(format!("{base}/admin/events/{event}")).json(&patch))
        }
    };
    let request = request.bearer_auth(token);
    // A 503 says the queue's store did not answer (a Redis restarting, a connection being made again): the same
    // request again after its Retry-After, a few times. Reading and setting settings are both safe to repeat.
    let mut attempt = 1;
    let response = loop {
        let again = request.try_clone().context("a request that can be sent again")?;
        let response = again.send().await.with_context(|| format!("reaching {base}"))?;
        if response.status() != reqwest::StatusCode::SERVICE_UNAVAILABLE || attempt == ATTEMPTS {
            break response;
        }
        let wait = response.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let wait = std::time::Duration::from_secs(wait.unwrap_or(1).clamp(1, 5));
        eprintln!("the gateway's store did not answer (503); trying again in {} s", wait.as_secs());
        tokio::time::sleep(wait).await;
        attempt += 1;
    };
    let status = response.status();
    let body: Value = response.json().await.unwrap_or_else(|_| json!({ "error": "non-JSON answer" }));
    if !status.is_success() {
        bail!("{status}: {} ({})", body["message"].as_str().unwrap_or("no message"), body["error"]);
    }
    println!("{}", serde_json::to_string_pretty(&body)?);
    if let AdminAction::Draw { .. } = args.action {
        verify_draw(event, &body)?;
    }
    Ok(())
}

/// Recomputes the pre-queue draw from the recorded seed and join order and compares it with the places given.
fn verify_draw(event: i64, body: &Value) -> anyhow::Result<()> {
    let seed = body["seed"].as_u64().context("draw without a seed")?;
    let join_order: Vec<String> = serde_json::from_value(body["join_order"].clone())?;
    let places: Vec<Option<String>> = serde_json::from_value(body["places"].clone())?;
    let recomputed = crate::room::shuffle::draw(join_order, seed);
    let matches = recomputed.iter().zip(&places).filter(|(a, b)| b.as_deref() == Some(a.as_str())).count();
    if matches != recomputed.len() || places.len() != recomputed.len() {
        bail!("event {event}: the recorded draw does not recompute ({matches} of {} places match)", recomputed.len());
    }
    eprintln!("event {event}: all {matches} pre-queue places recomputed from seed {seed}");
    Ok(())
}
