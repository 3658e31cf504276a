//! `gateway admin ...`: the operators' client of a gateway's admin listener. Prints the JSON answer; exits
//! non-zero, with the error's message, on any refusal.

use anyhow::{Context, bail};
use secrecy::ExposeSecret;
use serde_json::{Value, json};

use crate::config::{AdminAction, AdminArgs};

/// Runs one admin command to completion.
pub fn run(args: AdminArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(execute(args))
}

/// A time option: Unix seconds, or `+N` seconds from now.
fn unix_time(option: &str, raw: &str) -> anyhow::Result<u64> {
    crate::room::unix_time_arg(raw).map_err(|e| anyhow::anyhow!("{option}: {e}"))
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
        AdminAction::Retire { event } => (*event, client.delete(format!("{base}/admin/events/{event}"))),
        AdminAction::Set { event, patch } => (*event, client.put(format!("{base}/admin/events/{event}")).json(patch)),
        AdminAction::Schedule { event, list: true, .. } => {
            (*event, client.get(format!("{base}/admin/events/{event}/schedule")))
        }
        AdminAction::Schedule { event, cancel: Some(id), .. } => {
            (*event, client.delete(format!("{base}/admin/events/{event}/schedule/{id}")))
        }
        AdminAction::Schedule { event, at, patch, .. } => {
            let ask = json!({ "at": at, "set": patch });
            (*event, client.post(format!("{base}/admin/events/{event}/schedule")).json(&ask))
        }
    };
    let request = request.bearer_auth(token);
    // A 503 says the queue's store did not answer (a Redis restarting, a connection being made again): the same
    // request again after its Retry-After, a few times. Reading and setting settings, and retiring, are all safe
    // to repeat.
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
    if status == reqwest::StatusCode::NO_CONTENT {
        eprintln!("done");
        return Ok(());
    }
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
