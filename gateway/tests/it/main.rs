//! Gateway integration tests: the real `gateway` binary (pingora) on a loopback port, in front of a real
//! HTTP upstream that counts what reaches it.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::any;
use futures::future::join_all;
use tokens::{AccountId, AdmissionClaims, Keyring, unix_now};

const KEYS: &str = "k1:gateway-integration-test-admission-key-01";
const OTHER_SECRET_SAME_KID: &str = "k1:a-different-secret-that-nobody-trusts-02";
const OTHER_KID: &str = "k9:gateway-integration-test-admission-key-01";

/// A real upstream: answers every request with 200 and counts them.
struct Upstream {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Upstream {
    async fn start() -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let app = Router::new().fallback(any(move || {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                ([("content-type", "application/json")], r#"{"upstream":true}"#)
            }
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        Self { addr, hits, shutdown: Some(tx), task: Some(task) }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

/// The gateway binary, stopped with SIGINT when dropped.
struct GatewayProcess {
    child: Child,
    base: String,
}

impl GatewayProcess {
    async fn start(upstream: SocketAddr) -> Self {
        // Ask the kernel for a free loopback port, then hand it to pingora (which binds by address).
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("probe").local_addr().expect("addr").port();
        let child = Command::new(env!("CARGO_BIN_EXE_gateway"))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--upstream", &upstream.to_string()])
            .args(["--admission-keys", KEYS, "--threads", "1", "--grace-seconds", "0"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("start the gateway binary");
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(Instant::now() < deadline, "the gateway did not listen on {port} within 20 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self { child, base: format!("http://127.0.0.1:{port}") }
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn proof(keys: &str, event: i64, issued: u64, ttl: u64) -> String {
    let claims = AdmissionClaims::new(AccountId::parse("fan-1").expect("id"), event, issued, ttl);
    Keyring::parse(keys).expect("keys").sign(&claims)
}

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
    let gw = GatewayProcess::start(upstream.addr).await;
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
    let gw = GatewayProcess::start(upstream.addr).await;
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
    let gw = GatewayProcess::start(upstream.addr).await;
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
    let gw = GatewayProcess::start(dead).await;
    let client = reqwest::Client::new();
    let token = proof(KEYS, 1, unix_now(), 60);
    let (status, body, headers) =
        get(&client, &format!("{}/events/1", gw.base), &[("authorization", &format!("Bearer {token}"))]).await;
    assert_eq!((status, code(&body).as_str()), (503, "booking_unavailable"), "{body}");
    assert_eq!(headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
}
