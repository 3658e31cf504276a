//! The proxy path: admission proofs checked in-process, refusals that never reach booking, browsers sent to
//! the waiting room, booking down as a 503.

use futures::future::join_all;
use tokens::unix_now;

use crate::harness::*;

async fn get(
    client: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
) -> (u16, String, reqwest::header::HeaderMap) {
    let mut req = client.get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = req.send().await.expect("request reached the gateway");
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    (status, res.text().await.expect("body"), headers)
}

fn code(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[tokio::test]
async fn a_valid_proof_is_forwarded_from_header_or_cookie() {
    let upstream = Upstream::start().await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let client = reqwest::Client::new();
    let token = proof(KEYS, 1, unix_now(), 60);
    let url = format!("{}/events/1/seats", gw.base);
    let (status, body, _) = get(&client, &url, &[("authorization", &format!("Bearer {token}"))]).await;
    assert_eq!((status, body.as_str()), (200, r#"{"upstream":true}"#));
    let (status, _, _) = get(&client, &url, &[("cookie", &format!("wr_admission={token}"))]).await;
    assert_eq!(status, 200);
    assert_eq!(upstream.hits(), 2);
    drop(gw);
    upstream.stop().await;
}

#[tokio::test]
async fn bad_proofs_are_refused_and_never_reach_booking() {
    let upstream = Upstream::start().await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let client = reqwest::Client::new();
    let now = unix_now();
    let good = proof(KEYS, 1, now, 60);
    let mut tampered: Vec<String> = good.split('.').map(str::to_owned).collect();
    tampered[1] = proof(KEYS, 1, now, 3600).split('.').nth(1).expect("payload").to_owned();
    // {"alg":"none","kid":"k1"} . {"sub":"fan","evt":1,"aud":"booking","iss":"waiting-room","iat":1,"exp":9999999999} .
    let alg_none = "eyJhbGciOiJub25lIiwia2lkIjoiazEifQ.eyJzdWIiOiJmYW4iLCJldnQiOjEsImF1ZCI6ImJvb2tpbmciLCJpc3MiOiJ3YWl0aW5nLXJvb20iLCJpYXQiOjEsImV4cCI6OTk5OTk5OTk5OX0.";
    let cases: Vec<(&str, Option<String>, u16, &str)> = vec![
        ("none", None, 401, "admission_required"),
        ("alg none", Some(alg_none.to_owned()), 401, "admission_invalid"),
        ("wrong key", Some(proof(OTHER_SECRET_SAME_KID, 1, now, 60)), 401, "admission_invalid"),
        ("unknown kid", Some(proof(OTHER_KID, 1, now, 60)), 401, "admission_invalid"),
        ("expired beyond leeway", Some(proof(KEYS, 1, now - 3600, 60)), 401, "admission_expired"),
        ("another event", Some(proof(KEYS, 2, now, 60)), 403, "admission_wrong_event"),
        ("tampered payload", Some(tampered.join(".")), 401, "admission_invalid"),
        ("oversized", Some("e".repeat(3000)), 401, "admission_invalid"),
        ("garbage", Some("not-a-jwt".to_owned()), 401, "admission_invalid"),
    ];
    let url = format!("{}/events/1/holds", gw.base);
    // Fired at once: refusals are decided per request, in-process.
    let responses = join_all(cases.iter().map(|(_, token, _, _)| {
        let auth = token.as_ref().map(|t| format!("Bearer {t}"));
        let client = client.clone();
        let url = url.clone();
        async move {
            let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
            get(&client, &url, &headers).await
        }
    }))
    .await;
    let mut failures = Vec::new();
    for ((name, _, status, expected), (got, body, _)) in cases.iter().zip(&responses) {
        if *got != *status || code(body) != *expected {
            failures.push(format!("{name}: expected {status} {expected}, got {got} {body}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    assert_eq!(upstream.hits(), 0, "a refused request reached booking");
    drop(gw);
    upstream.stop().await;
}

#[tokio::test]
async fn browsers_go_to_the_waiting_room_and_other_paths_get_json() {
    let upstream = Upstream::start().await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let (status, _, headers) = get(&client, &format!("{}/events/7", gw.base), &[("accept", "text/html,*/*")]).await;
    assert_eq!(status, 302);
    assert_eq!(headers.get("location").and_then(|v| v.to_str().ok()), Some("/queue/7"));
    let (status, body, _) = get(&client, &format!("{}/healthz", gw.base), &[]).await;
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));
    let (status, body, _) = get(&client, &format!("{}/nope", gw.base), &[]).await;
    assert_eq!((status, code(&body).as_str()), (404, "not_found"));
    let (status, body, _) = get(&client, &format!("{}/events/abc/seats", gw.base), &[]).await;
    assert_eq!((status, code(&body).as_str()), (400, "invalid_path"));
    assert_eq!(upstream.hits(), 0);
    drop(gw);
    upstream.stop().await;
}

#[tokio::test]
async fn booking_down_is_a_503_with_retry_after() {
    // An upstream address with nothing listening: bind, note the port, release it.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("probe").local_addr().expect("addr");
    let gw = GatewayProcess::start(Node::new(dead, &prefix())).await;
    let client = reqwest::Client::new();
    let token = proof(KEYS, 1, unix_now(), 60);
    let (status, body, headers) =
        get(&client, &format!("{}/events/1", gw.base), &[("authorization", &format!("Bearer {token}"))]).await;
    assert_eq!((status, code(&body).as_str()), (503, "booking_unavailable"), "{body}");
    assert_eq!(headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
}
