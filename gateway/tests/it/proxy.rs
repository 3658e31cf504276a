//! The proxy path: admission proofs checked in-process, refusals that never reach booking, browsers sent to
//! the waiting room, booking down as a 503.

use std::time::Duration;

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
async fn forwarded_requests_go_over_booking_s_unix_socket_when_set() {
    let dir = std::env::temp_dir().join(format!("gateway-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join(format!("booking-{}.sock", prefix().trim_end_matches(':')));
    let upstream = Upstream::start_unix(&path).await;
    let node = Node::new(upstream.addr, &prefix()).arg("--upstreams", format!("unix:{}", path.display()));
    let gw = GatewayProcess::start(node).await;
    let client = reqwest::Client::new();
    let token = proof(KEYS, 1, unix_now(), 60);
    let auth = format!("Bearer {token}");
    let headers = [("authorization", auth.as_str())];
    let url = format!("{}/events/1/seats", gw.base);
    let answers = futures::future::join_all((0..20).map(|_| get(&client, &url, &headers))).await;
    for (status, body, _) in &answers {
        assert_eq!((*status, body.as_str()), (200, r#"{"upstream":true}"#));
    }
    assert_eq!((upstream.unix_hits(), upstream.hits()), (20, 0), "every request over the socket, none over TCP");
    drop(gw);
    upstream.stop().await;
    let _ = std::fs::remove_file(&path);
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

fn bearer(event: i64) -> String {
    format!("Bearer {}", proof(KEYS, event, unix_now(), 60))
}

#[tokio::test]
async fn a_request_is_forwarded_whole_and_its_chunked_answer_streamed_back_over_one_kept_connection() {
    let upstream = WireUpstream::start(WireMode::Chunked).await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let body = format!(r#"{{"seat_ids":[{}]}}"#, vec!["1"; 4000].join(","));
    for round in 0..3 {
        let res = gw
            .client
            .post(format!("{}/events/1/holds?round={round}", gw.base))
            .header("authorization", bearer(1))
            .header("content-type", "application/json")
            .header("idempotency-key", format!("key-{round}"))
            .header("connection", "keep-alive, x-hop")
            .header("keep-alive", "timeout=5")
            .header("x-hop", "for the gateway only")
            .body(body.clone())
            .send()
            .await
            .expect("request reached the gateway");
        assert_eq!(res.status().as_u16(), 200);
        let answer: serde_json::Value = res.json().await.expect("the chunked answer, reassembled");
        assert_eq!(answer, serde_json::json!({ "method": "POST", "body_bytes": body.len() }));
    }
    let seen = upstream.requests();
    assert_eq!(seen.len(), 3, "each request reached booking once");
    for (round, request) in seen.iter().enumerate() {
        assert!(
            request.head.starts_with(&format!("POST /events/1/holds?round={round} HTTP/1.1\r\n")),
            "{}",
            request.head
        );
        assert_eq!(request.body, body.as_bytes());
        assert_eq!(request.header("idempotency-key"), Some(format!("key-{round}").as_str()));
        assert_eq!(request.header("content-type"), Some("application/json"));
        assert!(request.header("authorization").is_some_and(|a| a.starts_with("Bearer ")));
        // Hop-by-hop headers are the client's connection's, not booking's, and so are those `Connection` names.
        assert_eq!(request.header("connection"), None);
        assert_eq!(request.header("keep-alive"), None);
        assert_eq!(request.header("x-hop"), None);
        // Who the client is, as the gateway decided (no trusted proxy here: the TCP peer), and an id to trace by.
        assert_eq!(request.header("x-forwarded-for"), Some("127.0.0.1"));
        let id = request.header("x-request-id").unwrap_or_default();
        assert!(id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{id:?}");
    }
    assert!(
        seen.iter().all(|r| r.connection == seen[0].connection),
        "the gateway kept and reused one connection to booking: {seen:?}"
    );
}

/// A recording upstream, a gateway in front of it, the gateway's address and a client connection to it, written
/// against the socket.
async fn raw_client() -> (WireUpstream, GatewayProcess, String, tokio::net::TcpStream) {
    let upstream = WireUpstream::start(WireMode::Chunked).await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let addr = gw.base.trim_start_matches("http://").to_owned();
    let socket = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    (upstream, gw, addr, socket)
}

/// Writes `request` on the client's connection and reads until `done` says the answer is whole (or the gateway
/// closes the connection).
async fn raw_exchange(socket: &mut tokio::net::TcpStream, request: &[u8], done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    socket.write_all(request).await.expect("write");
    let (mut answer, mut buf) = (Vec::new(), vec![0u8; 4096]);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !done(&answer) {
        assert!(std::time::Instant::now() < deadline, "no whole answer: {}", String::from_utf8_lossy(&answer));
        let n =
            tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf)).await.expect("answer").expect("read");
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    answer
}

#[tokio::test]
async fn a_head_answer_carries_no_body_and_the_connection_goes_on() {
    let (upstream, _gw, addr, mut socket) = raw_client().await;
    let auth = bearer(1);
    let head = format!("HEAD /events/1 HTTP/1.1\r\nhost: {addr}\r\nauthorization: {auth}\r\n\r\n");
    let answer = raw_exchange(&mut socket, head.as_bytes(), |a| a.windows(4).any(|w| w == b"\r\n\r\n")).await;
    let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 200 ok\r\n"), "{text}");
    assert!(text.contains("content-length: 42\r\n"), "booking's length is kept: {text}");
    assert!(text.ends_with("\r\n\r\n"), "nothing after the head: {text}");
    // The same client connection carries the next request, and its answer is the first thing read: no body of
    // the HEAD answer came in between.
    let get = format!("GET /events/1 HTTP/1.1\r\nhost: {addr}\r\nauthorization: {auth}\r\nconnection: close\r\n\r\n");
    let answer = raw_exchange(&mut socket, get.as_bytes(), |_| false).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains(r#"GET","body_bytes":"#), "booking's chunked answer to the GET: {text}");
    let methods: Vec<String> =
        upstream.requests().iter().map(|r| r.head.split(' ').next().unwrap_or("").to_owned()).collect();
    assert_eq!(methods, ["HEAD", "GET"], "each reached booking once");
}

#[tokio::test]
async fn a_chunked_request_body_reaches_booking_whole_with_its_length() {
    let (upstream, _gw, addr, mut socket) = raw_client().await;
    let request = format!(
        "POST /events/1/holds HTTP/1.1\r\nhost: {addr}\r\nauthorization: {}\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\nconnection: close\r\n\r\n7\r\n{{\"seat_\r\nb\r\nids\":[1,2]}}\r\n0\r\n\r\n",
        bearer(1)
    );
    let answer = raw_exchange(&mut socket, request.as_bytes(), |_| false).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    let seen = upstream.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, br#"{"seat_ids":[1,2]}"#);
    assert_eq!(seen[0].header("content-length"), Some("18"));
    assert_eq!(seen[0].header("transfer-encoding"), None, "the body went read whole, with its length");
    assert!(seen[0].head.starts_with("POST /events/1/holds HTTP/1.1\r\n"), "{}", seen[0].head);
}

#[tokio::test]
async fn every_request_is_answered_once_when_booking_closes_each_connection_after_answering() {
    // Booking closes every connection right after its answer, without saying so: each request must find that
    // out (or fail on the closed connection and go again on a fresh one) and still get its answer, once.
    let upstream = WireUpstream::start(WireMode::CloseAfterEach).await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let url = format!("{}/events/1/seats", gw.base);
    for i in 0..6 {
        if i % 2 == 1 {
            // Half the requests after a pause (the close noticed while idle), half at once (the close racing
            // the next request).
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let reply = gw.get("/events/1/seats", &[("authorization", &bearer(1))]).await;
        assert_eq!(reply.status, 200, "request {i} to {url}: {}", reply.text);
        assert_eq!(reply.body["method"], "GET");
    }
    let seen = upstream.requests();
    assert_eq!(seen.len(), 6, "each request reached booking exactly once: {seen:?}");
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_and_never_reaches_booking() {
    let upstream = WireUpstream::start(WireMode::Chunked).await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix()).arg("--max-body-bytes", 1024)).await;
    let post = |len: usize| {
        gw.client
            .post(format!("{}/events/1/holds", gw.base))
            .header("authorization", bearer(1))
            .header("content-type", "application/json")
            .body(vec![b' '; len])
    };
    let refused = gw.send(post(1025)).await;
    assert_eq!((refused.status, refused.code()), (413, "body_too_large"), "{}", refused.text);
    // The gateway closes a connection whose body it did not read, and says so: the client's next request (on
    // the same client) goes on a new connection instead of meeting a reset.
    assert_eq!(refused.header("connection").map(str::to_ascii_lowercase).as_deref(), Some("close"));
    assert!(upstream.requests().is_empty(), "a refused body reached booking");
    let accepted = gw.send(post(1024)).await;
    assert_eq!(accepted.status, 200, "{}", accepted.text);
    assert_eq!(accepted.body["body_bytes"], 1024);
    assert_eq!(upstream.requests().len(), 1);
}

#[tokio::test]
async fn a_client_expecting_100_continue_gets_it_and_booking_gets_the_body() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (upstream, _gw, addr, mut socket) = raw_client().await;
    let body = r#"{"seat_ids":[1,2]}"#;
    let head = format!(
        "POST /events/1/holds HTTP/1.1\r\nhost: {addr}\r\nauthorization: {}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nexpect: 100-continue\r\n\r\n",
        bearer(1),
        body.len()
    );
    socket.write_all(head.as_bytes()).await.expect("write head");
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf))
        .await
        .expect("the gateway answers 100 Continue without waiting for the body")
        .expect("read");
    assert!(buf[..n].starts_with(b"HTTP/1.1 100 Continue\r\n"), "{}", String::from_utf8_lossy(&buf[..n]));
    socket.write_all(body.as_bytes()).await.expect("write body");
    let mut answer = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !answer.ends_with(b"0\r\n\r\n") {
        assert!(std::time::Instant::now() < deadline, "no whole answer: {}", String::from_utf8_lossy(&answer));
        let n =
            tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf)).await.expect("answer").expect("read");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buf[..n]);
    }
    assert!(answer.starts_with(b"HTTP/1.1 200 OK\r\n"), "{}", String::from_utf8_lossy(&answer));
    let seen = upstream.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, body.as_bytes());
    assert_eq!(seen[0].header("expect"), None, "the gateway answered the expectation itself");
}

#[tokio::test]
async fn booking_that_stops_answering_is_a_503_after_the_upstream_timeout_and_is_not_asked_twice() {
    let upstream = WireUpstream::start(WireMode::SilentAfter(1)).await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix()).arg("--upstream-timeout-ms", 300)).await;
    let first = gw.get("/events/1", &[("authorization", &bearer(1))]).await;
    assert_eq!(first.status, 200, "{}", first.text);
    // The second goes over the kept connection, where booking reads it and says nothing.
    // It ends at the 300-ms timeout set here: the bound is half the 10-s default, so the setting is what ended it.
    let reply = tokio::time::timeout(Duration::from_secs(5), gw.get("/events/1", &[("authorization", &bearer(1))]))
        .await
        .expect("answered at the upstream timeout set, not the default");
    assert_eq!((reply.status, reply.code()), (503, "booking_unavailable"), "{}", reply.text);
    assert_eq!(reply.header("retry-after"), Some("1"));
    let seen = upstream.requests();
    assert_eq!(seen.len(), 2, "a request booking may be working on is not sent again: {seen:?}");
    assert_eq!(seen[0].connection, seen[1].connection, "the second went over the kept connection");
}

/// Answers stream through as booking writes them, so an answer booking breaks off reaches the client as it
/// was: its head and the bytes booking sent, then the close, short of the length its head announced, which
/// every client reads as a failed answer. The request is not sent again.
#[tokio::test]
async fn an_answer_booking_breaks_off_reaches_the_client_cut_short_then_the_close() {
    let upstream = WireUpstream::start(WireMode::CutMidBody).await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let addr = gw.base.trim_start_matches("http://").to_owned();
    for _ in 0..2 {
        let mut socket = tokio::net::TcpStream::connect(&addr).await.expect("connect");
        let get = format!("GET /events/1 HTTP/1.1\r\nhost: {addr}\r\nauthorization: {}\r\n\r\n", bearer(1));
        let bytes = raw_exchange(&mut socket, get.as_bytes(), |_| false).await;
        let text = String::from_utf8_lossy(&bytes).to_ascii_lowercase();
        assert!(text.starts_with("http/1.1 200 ") && text.contains("\r\ncontent-length: 100\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n{\"partial\""), "the ten bytes booking sent, then the close: {text}");
    }
    assert_eq!(upstream.requests().len(), 2, "each request reached booking once");
}

/// A request smuggler's table: requests that RFC 9112 says must be refused, or that a proxy in front may read
/// otherwise than the gateway. Each is refused with its status, the connection closed, and none reaches booking.
/// `json` marks the refusals the gateway writes itself (the rest are pingora's bare 400 for a head it cannot
/// parse).
#[tokio::test]
async fn requests_a_smuggler_sends_are_refused_the_connection_closed_and_none_reaches_booking() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = WireUpstream::start(WireMode::Chunked).await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let auth = bearer(1);
    let post = |version: &str, fields: &str, body: &str| {
        format!("POST /events/1/holds HTTP/{version}\r\nauthorization: {auth}\r\n{fields}\r\n{body}")
    };
    let host = "host: x\r\n";
    let chunked = format!("{host}transfer-encoding: chunked\r\n");
    let trailers =
        format!("0\r\n{}\r\n", "x-trailer: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n".repeat(1200));
    let cases: Vec<(&str, String, u16, bool)> = vec![
        (
            "chunked twice",
            post("1.1", &format!("{host}transfer-encoding: chunked, chunked\r\n"), "0\r\n\r\n"),
            400,
            true,
        ),
        (
            "chunked in two fields",
            post("1.1", &format!("{chunked}transfer-encoding: chunked\r\n"), "0\r\n\r\n"),
            400,
            true,
        ),
        (
            "gzip before chunked",
            post("1.1", &format!("{host}transfer-encoding: gzip, chunked\r\n"), "0\r\n\r\n"),
            501,
            true,
        ),
        ("gzip alone", post("1.1", &format!("{host}transfer-encoding: gzip\r\n"), "0\r\n\r\n"), 400, false),
        ("transfer-encoding on HTTP/1.0", post("1.0", &chunked, "0\r\n\r\n"), 400, false),
        ("no Host", post("1.1", "content-length: 2\r\n", "{}"), 400, true),
        ("two Hosts", post("1.1", "host: a\r\nhost: b\r\ncontent-length: 2\r\n", "{}"), 400, false),
        ("length and chunks", post("1.1", &format!("{chunked}content-length: 5\r\n"), "0\r\n\r\n"), 400, true),
        ("two lengths", post("1.1", &format!("{host}content-length: 2\r\ncontent-length: 3\r\n"), "{}x"), 400, false),
        ("a length that is not a number", post("1.1", &format!("{host}content-length: 2x\r\n"), "{}"), 400, false),
        ("a negative length", post("1.1", &format!("{host}content-length: -2\r\n"), "{}"), 400, false),
        ("obs-fold", post("1.1", &format!("{host}x-folded: a\r\n b\r\ncontent-length: 2\r\n"), "{}"), 400, false),
        ("space before the colon", post("1.1", &format!("{host}content-length : 2\r\n"), "{}"), 400, false),
        ("a field line that is not one", post("1.1", &format!("{host}bad field line\r\n"), ""), 400, false),
        ("a chunk size that is not hex", post("1.1", &chunked, "zz\r\n{}\r\n0\r\n\r\n"), 400, true),
        ("an empty chunk-size line", post("1.1", &chunked, "\r\n2\r\n{}\r\n0\r\n\r\n"), 400, true),
        ("64 KiB of trailer fields", post("1.1", &chunked, &format!("2\r\n{{}}\r\n{trailers}")), 400, true),
        ("a chunk of 2^64-1 bytes", post("1.1", &chunked, "ffffffffffffffff\r\nabc"), 413, true),
        // A proxy in front that does not read a bare LF as a line end sees one field where the gateway sees two.
        (
            "a field line ending in a bare LF",
            post("1.1", &format!("{host}x-a: 1\ncontent-length: 2\r\n"), "{}"),
            400,
            true,
        ),
        (
            "a request line ending in a bare LF",
            format!("GET /events/1 HTTP/1.1\n{host}authorization: {auth}\r\n\r\n"),
            400,
            true,
        ),
    ];
    let mut failures = Vec::new();
    for (name, request, status, json) in &cases {
        let mut socket = tokio::net::TcpStream::connect(gw.base.trim_start_matches("http://")).await.expect("connect");
        socket.write_all(request.as_bytes()).await.expect("write");
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut answer)).await;
        let text = String::from_utf8_lossy(&answer);
        if read.is_err() {
            failures.push(format!("{name}: the connection stayed open after {text:?}"));
        } else if !text.starts_with(&format!("HTTP/1.1 {status} ")) {
            failures.push(format!("{name}: expected {status}, got {text:?}"));
        } else if *json && !text.contains(r#""error":""#) {
            failures.push(format!("{name}: no JSON error body in {text:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    assert!(upstream.requests().is_empty(), "{:?}", upstream.requests());
}

/// Chunk extensions are read past (pingora's parser takes a bare LF or a control byte inside one) and never
/// forwarded: booking gets the body whole with its length. Whatever the client sent after a chunked body is
/// never read as a request: the gateway answers, then closes the connection.
#[tokio::test]
async fn chunk_extensions_never_reach_booking_and_nothing_after_a_chunked_body_is_read_as_a_request() {
    let (upstream, _gw, addr, mut socket) = raw_client().await;
    let auth = bearer(1);
    let requests = format!(
        "POST /events/1/holds HTTP/1.1\r\nhost: {addr}\r\nauthorization: {auth}\r\ntransfer-encoding: chunked\r\n\r\n\
         3;ext=a\nb\r\n{{\"a\r\n3;x=\x01\r\n\":1\r\n1\r\n}}\r\n0\r\n\r\n\
         GET /events/1?next HTTP/1.1\r\nhost: {addr}\r\nauthorization: {auth}\r\nconnection: close\r\n\r\n"
    );
    let bytes = raw_exchange(&mut socket, requests.as_bytes(), |_| false).await;
    let answers = answers(&bytes);
    let statuses: Vec<&str> = answers.iter().map(|(h, _)| &h[9..12]).collect();
    assert_eq!(statuses, ["200"], "one answer, then the close: {}", String::from_utf8_lossy(&bytes));
    assert!(answers[0].0.contains("\r\nconnection: close\r\n"), "{}", answers[0].0);
    assert_eq!(answers[0].1, br#"{"method":"POST","body_bytes":7}"#);
    let seen = upstream.requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].body, br#"{"a":1}"#, "the body whole, no extension in it");
    assert_eq!(seen[0].header("content-length"), Some("7"));
    assert_eq!(seen[0].header("transfer-encoding"), None);
}

/// The answers in `bytes`, read one after another: each one's head (lower-cased) and body, by its framing.
fn answers(mut bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&bytes[..end + 4]).to_ascii_lowercase();
        bytes = &bytes[end + 4..];
        let length =
            head.lines().find_map(|l| l.strip_prefix("content-length: ")).map(|n| n.trim().parse().expect("length"));
        let body = if let Some(n) = length {
            let body = bytes[..n].to_vec();
            bytes = &bytes[n..];
            body
        } else if head.contains("transfer-encoding: chunked\r\n") {
            let mut body = Vec::new();
            loop {
                let line = bytes.windows(2).position(|w| w == b"\r\n").expect("chunk size line");
                let size = usize::from_str_radix(std::str::from_utf8(&bytes[..line]).expect("hex"), 16).expect("size");
                bytes = &bytes[line + 2..];
                if size == 0 {
                    bytes = &bytes[2..];
                    break;
                }
                body.extend_from_slice(&bytes[..size]);
                bytes = &bytes[size + 2..];
            }
            body
        } else {
            std::mem::take(&mut bytes).to_vec()
        };
        out.push((head, body));
    }
    out
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection_until_the_client_closes_it() {
    let (upstream, _gw, addr, mut socket) = raw_client().await;
    let auth = bearer(1);
    // Four requests in one write: forwarded, the gateway's own, one with a body the gateway does not use (it
    // must be read past, not taken for the next request), and a last one that closes the connection.
    let requests = format!(
        "GET /events/1?x=1 HTTP/1.1\r\nhost: {addr}\r\nauthorization: {auth}\r\n\r\n\
         GET /healthz HTTP/1.1\r\nhost: {addr}\r\n\r\n\
         POST /queue/1/join HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 11\r\n\r\nGET /x HTTP\
         POST /events/1/holds HTTP/1.1\r\nhost: {addr}\r\nauthorization: {auth}\r\ncontent-length: 2\r\n\
         connection: close\r\n\r\n{{}}"
    );
    let bytes = raw_exchange(&mut socket, requests.as_bytes(), |_| false).await;
    let answers = answers(&bytes);
    let statuses: Vec<&str> = answers.iter().map(|(h, _)| &h[9..12]).collect();
    assert_eq!(statuses, ["200", "200", "401", "200"], "{}", String::from_utf8_lossy(&bytes));
    for (i, (head, _)) in answers.iter().enumerate() {
        assert_eq!(head.matches("\r\ndate: ").count(), 1, "one date in answer {i}: {head}");
        let connection = if i == 3 { "close" } else { "keep-alive" };
        assert!(head.contains(&format!("\r\nconnection: {connection}\r\n")), "answer {i}: {head}");
    }
    assert_eq!(answers[0].1, br#"{"method":"GET","body_bytes":0}"#, "booking's chunked answer, chunked again");
    assert_eq!(answers[1].1, br#"{"status":"ok"}"#);
    assert!(String::from_utf8_lossy(&answers[2].1).contains("account_required"));
    assert_eq!(answers[3].1, br#"{"method":"POST","body_bytes":2}"#);
    let seen = upstream.requests();
    let heads: Vec<&str> = seen.iter().map(|r| r.head.lines().next().unwrap_or("")).collect();
    assert_eq!(heads, ["GET /events/1?x=1 HTTP/1.1", "POST /events/1/holds HTTP/1.1"], "the target as it came");
    assert_eq!(seen[1].body, b"{}");
}

#[tokio::test]
async fn an_http_1_0_client_gets_its_answer_then_the_close_unless_it_asks_to_keep_the_connection() {
    let (_upstream, _gw, addr, mut socket) = raw_client().await;
    let get = format!("GET /events/1 HTTP/1.0\r\nhost: {addr}\r\nauthorization: {}\r\n\r\n", bearer(1));
    let bytes = raw_exchange(&mut socket, get.as_bytes(), |_| false).await;
    let text = String::from_utf8_lossy(&bytes).to_ascii_lowercase();
    // Booking's answer is chunked; HTTP/1.0 has no chunks: the body runs until the close.
    assert!(text.starts_with("http/1.1 200 ok\r\n") && text.contains("\r\nconnection: close\r\n"), "{text}");
    assert!(
        !text.contains("transfer-encoding") && text.ends_with("\r\n\r\n{\"method\":\"get\",\"body_bytes\":0}"),
        "{text}"
    );
    let mut kept = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    let ask = "GET /healthz HTTP/1.0\r\nconnection: keep-alive\r\n\r\n";
    for _ in 0..2 {
        let bytes = raw_exchange(&mut kept, ask.as_bytes(), |a| a.ends_with(br#"{"status":"ok"}"#)).await;
        let text = String::from_utf8_lossy(&bytes).to_ascii_lowercase();
        assert!(text.contains("\r\nconnection: keep-alive\r\n"), "{text}");
    }
}

#[tokio::test]
async fn booking_is_shown_exactly_the_proof_the_gateway_checked() {
    let upstream = WireUpstream::start(WireMode::Chunked).await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let a = proof_for("fan-a", KEYS, 1, unix_now(), 60);
    let b = proof_for("fan-b", KEYS, 1, unix_now(), 60);
    let send = |authorization: Option<Vec<u8>>, cookie: String| {
        let mut req = gw.client.get(format!("{}/events/1", gw.base)).header("cookie", cookie);
        if let Some(value) = authorization {
            req = req.header("authorization", reqwest::header::HeaderValue::from_bytes(&value).expect("header bytes"));
        }
        gw.send(req)
    };
    // The header and the cookie disagree: the header is the proof, and booking never sees the other.
    let both = send(Some(format!("Bearer {a}").into_bytes()), format!("theme=dark; wr_admission={b}")).await;
    assert_eq!(both.status, 200, "{}", both.text);
    // The cookie alone: booking is shown it as the bearer token, and the other cookies stay.
    let cookie = send(None, format!("wr_admission={b}; lang=fr")).await;
    assert_eq!(cookie.status, 200, "{}", cookie.text);
    // A header that is not plain ASCII (a proof, then U+00A0) is refused, not skipped for the cookie's proof.
    let odd = send(Some(format!("Bearer {a}\u{a0}").into_bytes()), format!("wr_admission={b}")).await;
    assert_eq!((odd.status, odd.code()), (401, "admission_invalid"), "{}", odd.text);
    // The scheme in another case, the token padded: booking is shown it written plainly.
    let loose = send(Some(format!("bearer   {a} ").into_bytes()), "lang=de".into()).await;
    assert_eq!(loose.status, 200, "{}", loose.text);
    // Two fields: the first is the proof, and booking is shown it alone.
    let twice = gw
        .send(
            gw.client
                .get(format!("{}/events/1", gw.base))
                .header("authorization", format!("Bearer {a}"))
                .header("authorization", format!("Bearer {b}")),
        )
        .await;
    assert_eq!(twice.status, 200, "{}", twice.text);

    let seen = upstream.requests();
    assert_eq!(seen.len(), 4, "the refused request never reached booking");
    let fields =
        |r: &WireRequest| r.head.lines().filter(|l| l.to_ascii_lowercase().starts_with("authorization:")).count();
    assert!(seen.iter().all(|r| fields(r) == 1), "{seen:?}");
    let a_bearer = format!("Bearer {a}");
    let b_bearer = format!("Bearer {b}");
    for loose_or_twice in &seen[2..] {
        assert_eq!(loose_or_twice.header("authorization"), Some(a_bearer.as_str()));
    }
    assert_eq!(
        (seen[0].header("authorization"), seen[0].header("cookie")),
        (Some(a_bearer.as_str()), Some("theme=dark"))
    );
    assert_eq!((seen[1].header("authorization"), seen[1].header("cookie")), (Some(b_bearer.as_str()), Some("lang=fr")));
    assert!(seen.iter().all(|r| !r.head.contains("wr_admission")), "{seen:?}");
}

/// The attack: three `GET /events/{id}/seats` (4.2 MB each) from a client with a tiny receive window that never
/// reads stayed open past 95 s, each pinning a connection to booking. A write to the client that makes no
/// progress for the write timeout now ends both connections.
#[tokio::test]
async fn a_client_that_never_reads_a_forwarded_answer_loses_it_and_frees_booking_s_connection() {
    use tokio::io::AsyncWriteExt;
    const BODY: usize = 64 << 20;
    let upstream = WireUpstream::start(WireMode::Large(BODY)).await;
    let node = Node::new(upstream.addr, &prefix()).arg("--client-write-timeout-ms", 500);
    let gw = GatewayProcess::start(node).await;
    let addr: std::net::SocketAddr = gw.base.trim_start_matches("http://").parse().expect("addr");
    let clients = join_all((0..3).map(|_| async {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("a small receive window");
        let mut socket = socket.connect(addr).await.expect("connect");
        let get = format!("GET /events/1/seats HTTP/1.1\r\nhost: {addr}\r\nauthorization: {}\r\n\r\n", bearer(1));
        socket.write_all(get.as_bytes()).await.expect("request");
        socket
    }))
    .await;
    let freed = testkit::eventually(Duration::from_secs(30), async || upstream.broken_off() == 3);
    assert!(freed.await, "booking's connections were let go: {} of 3", upstream.broken_off());
    assert_eq!(upstream.requests().len(), 3);
    // The clients' connections are closed too: reading on, each finds the end short of the whole answer.
    for mut socket in clients {
        use tokio::io::AsyncReadExt;
        let mut got = 0usize;
        let mut buf = vec![0u8; 64 * 1024];
        let read = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(n) = socket.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                got += n;
            }
        });
        assert!(read.await.is_ok(), "the gateway closed the client's connection");
        assert!(got < BODY, "the answer was cut short: {got} bytes");
    }
}

/// The attack: a proof signed with the right key and an `exp` in the year 3000 was accepted. A proof now lasts at
/// most its room's session (and a minute's leeway), whatever its expiry says.
#[tokio::test]
async fn a_proof_that_outlives_its_room_s_session_is_refused() {
    let upstream = Upstream::start().await;
    let gw = GatewayProcess::start(Node::new(upstream.addr, &prefix())).await;
    let event = 31;
    gw.configure(event, serde_json::json!({ "state": "open", "session_seconds": 600 })).await;
    gw.wait_for_room(event).await;
    let now = unix_now();
    let forever = proof(KEYS, event, now, 30_000_000_000 - now);
    let reply = gw.get(&format!("/events/{event}"), &[("authorization", &format!("Bearer {forever}"))]).await;
    assert_eq!((reply.status, reply.code()), (401, "admission_invalid"), "{}", reply.text);
    let long = proof(KEYS, event, now, 600 + 61);
    let reply = gw.get(&format!("/events/{event}"), &[("authorization", &format!("Bearer {long}"))]).await;
    assert_eq!((reply.status, reply.code()), (401, "admission_invalid"), "{}", reply.text);
    assert_eq!(upstream.hits(), 0, "neither reached booking");
    let session = proof(KEYS, event, now, 600);
    let reply = gw.get(&format!("/events/{event}"), &[("authorization", &format!("Bearer {session}"))]).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
}

/// The attack: a head sent one byte every 5 s kept its connection open past 75 s (booking, the admin listener
/// and the provider close at 20 s). A head must now be in within the head deadline; a request already read is
/// served however long it takes, and the connection then carries the next.
#[tokio::test]
async fn a_head_sent_a_byte_at_a_time_is_cut_off_but_an_idle_kept_connection_and_a_slow_answer_are_not() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = WireUpstream::start(WireMode::SilentAfter(0)).await;
    let node = Node::new(upstream.addr, &prefix()).arg("--head-timeout-seconds", 2).arg("--upstream-timeout-ms", 3000);
    let gw = GatewayProcess::start(node).await;
    let addr = gw.base.trim_start_matches("http://").to_owned();
    // A byte every 200 ms for up to 20 s (ten times the deadline). (A client that sends nothing at all is
    // closed by pingora's own wait for a read, the keep-alive time.)
    let trickle = async {
        let mut socket = tokio::net::TcpStream::connect(&addr).await.expect("connect");
        let head = format!("GET /healthz HTTP/1.1\r\nhost: {addr}\r\nx-slow: {}", "a".repeat(100));
        let mut buf = [0u8; 256];
        for (sent, byte) in head.bytes().enumerate() {
            if socket.write_all(&[byte]).await.is_err() {
                return Some(sent);
            }
            match tokio::time::timeout(Duration::from_millis(200), socket.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => return Some(sent),
                Ok(Ok(n)) => {
                    panic!("the gateway answered a head it never got: {:?}", String::from_utf8_lossy(&buf[..n]))
                }
                Err(_) => {}
            }
        }
        None
    };
    let cut = trickle.await;
    assert!(cut.is_some(), "the trickled head was cut off before it was whole");
    // A kept connection idle for longer than the head deadline (within the keep-alive time) serves the next.
    let mut socket = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    let health = format!("GET /healthz HTTP/1.1\r\nhost: {addr}\r\n\r\n");
    for round in 0..2 {
        let answer = raw_exchange(&mut socket, health.as_bytes(), |a| a.ends_with(b"}")).await;
        assert!(answer.starts_with(b"HTTP/1.1 200 "), "round {round}: {}", String::from_utf8_lossy(&answer));
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    // Booking takes longer than the head deadline to (not) answer: the request is in flight, so the client gets
    // its 503.
    let mut socket = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    let get = format!("GET /events/1 HTTP/1.1\r\nhost: {addr}\r\nauthorization: {}\r\n\r\n", bearer(1));
    let answer = raw_exchange(&mut socket, get.as_bytes(), |a| a.ends_with(b"}")).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 503 ") && text.contains("booking_unavailable"), "{text}");
}
