//! The edge as pingora runs it: live streams that pass each event at once and outlive every timeout, TLS with HTTP/1.1 and HTTP/2,
//! balancing over booking nodes that fail and come back, and requests that reach booking exactly as the
//! client wrote them.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri};
use tokens::unix_now;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::harness::*;

fn bearer(event: i64) -> String {
    format!("Bearer {}", proof(KEYS, event, unix_now(), 600))
}

/// An upstream whose every answer (but to the health check) is an event stream of `events` events, at least
/// `every` apart, in lock step with the client: event `i + 1` is written only once the client reports, through
/// the returned sender, that it has read `i + 1` events. A proxy that holds an event back therefore stalls the
/// stream, which the client sees as a bounded wait that ends, rather than as a lag measured against the clock.
async fn stream_upstream(events: usize, every: Duration) -> (SocketAddr, Arc<watch::Sender<usize>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let read = Arc::new(watch::channel(0usize).0);
    let acks = read.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut acked = acks.subscribe();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let readyz = buf.starts_with(b"GET /readyz ");
                    buf.drain(..end + 4);
                    if readyz {
                        let _ = socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
                        continue;
                    }
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-store\r\n\
                                transfer-encoding: chunked\r\n\r\n";
                    if socket.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let mut tick = tokio::time::interval(every);
                    for i in 0..events {
                        tick.tick().await;
                        let event = format!("id: {i}\ndata: {i}\n\n");
                        let framed = format!("{:x}\r\n{event}\r\n", event.len());
                        if socket.write_all(framed.as_bytes()).await.is_err() {
                            return;
                        }
                        // The client's read of this event, bounded: past the bound the stream stops here and
                        // the client's own wait ends the test.
                        let seen = tokio::time::timeout(STALL, acked.wait_for(|n| *n > i)).await;
                        if !matches!(seen, Ok(Ok(_))) {
                            return;
                        }
                    }
                    let _ = socket.write_all(b"0\r\n\r\n").await;
                    return;
                }
            });
        }
    });
    (addr, read)
}

/// How long the client or the upstream waits for the other before calling the stream stalled.
const STALL: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_passes_each_piece_at_once_and_outlives_the_per_read_timeout() {
    // 40 events at least 100 ms apart: an answer of 4 s or more, longer than the wait for booking (per read,
    // 1 s), which bounds each silence and never the whole answer.
    const EVENTS: usize = 40;
    let (addr, read) = stream_upstream(EVENTS, Duration::from_millis(100)).await;
    let node = Node::new(addr, &prefix()).arg("--upstream-timeout-ms", 1000);
    let gw = GatewayProcess::start(node).await;
    let mut res = gw
        .client
        .get(format!("{}/events/1/feed", gw.base))
        .header("authorization", bearer(1))
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("the stream opens");
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(res.headers().get("content-type").and_then(|v| v.to_str().ok()), Some("text/event-stream"));
    let (mut pending, mut ids) = (String::new(), Vec::new());
    loop {
        // Booking writes the next event only after this one is read here, so an event the gateway holds back
        // (buffered until more arrive, or until the stream ends) is a stall.
        let piece = tokio::time::timeout(STALL, res.chunk()).await.unwrap_or_else(|_| {
            panic!("the stream stalled after {} events: the gateway held event {} back", ids.len(), ids.len())
        });
        let Some(piece) = piece.expect("read") else { break };
        pending.push_str(std::str::from_utf8(&piece).expect("utf-8"));
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            let id: usize = event.lines().find_map(|l| l.strip_prefix("id: ")).expect("id").parse().expect("number");
            ids.push(id);
            read.send_replace(ids.len());
        }
    }
    assert_eq!(ids, (0..EVENTS).collect::<Vec<_>>(), "every event arrived, in order, in one answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_http_1_1_and_http_2_clients() {
    let upstream = Upstream::start().await;
    let dir = std::env::temp_dir().join(format!("gateway-tls-{}", prefix().trim_end_matches(':')));
    std::fs::create_dir_all(&dir).expect("dir");
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("a certificate");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, certified.cert.pem()).expect("write cert");
    std::fs::write(&key, certified.signing_key.serialize_pem()).expect("write key");
    let node = Node::new(upstream.addr, &prefix()).arg("--tls-cert", cert.display()).arg("--tls-key", key.display());
    let gw = GatewayProcess::start(node).await;
    let port: u16 = gw.base.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    let root = reqwest::Certificate::from_pem(certified.cert.pem().as_bytes()).expect("root");
    let at = SocketAddr::from(([127, 0, 0, 1], port));
    let client = |h1: bool| {
        let builder = reqwest::Client::builder().add_root_certificate(root.clone()).resolve("localhost", at);
        if h1 { builder.http1_only() } else { builder }.build().expect("client")
    };
    for (h1, version) in [(true, reqwest::Version::HTTP_11), (false, reqwest::Version::HTTP_2)] {
        let client = client(h1);
        let res = client
            .get(format!("https://localhost:{port}/events/1/seats"))
            .header("authorization", bearer(1))
            .send()
            .await
            .expect("a TLS request");
        assert_eq!((res.version(), res.status().as_u16()), (version, 200));
        assert_eq!(res.text().await.expect("body"), r#"{"upstream":true}"#);
        let res = client.get(format!("https://localhost:{port}/healthz")).send().await.expect("health");
        assert_eq!((res.version(), res.status().as_u16()), (version, 200));
        // Plain HTTP on the TLS port is not served.
        assert!(gw.client.get(format!("http://127.0.0.1:{port}/healthz")).send().await.is_err());
    }
    assert_eq!(upstream.hits(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_balanced_and_a_failed_node_is_taken_out_then_put_back() {
    let a = Upstream::start().await;
    let b = Upstream::start().await;
    let b_addr = b.addr;
    let node = Node::new(a.addr, &prefix()).arg("--upstreams", format!("{},{}", a.addr, b.addr));
    let gw = GatewayProcess::start(node.arg("--health-check-ms", 200)).await;
    let auth = bearer(1);
    let headers = [("authorization", auth.as_str())];
    let ask = || gw.get("/events/1/seats", &headers);
    for _ in 0..20 {
        assert_eq!(ask().await.status, 200);
    }
    assert!(a.hits() >= 5 && b.hits() >= 5, "round robin: {} and {}", a.hits(), b.hits());

    // The health check takes the stopped node out: then ten requests in a row are all answered, by the other.
    b.stop().await;
    let mut failed = 0;
    let out = testkit::eventually(Duration::from_secs(15), async || {
        let mut answered = 0;
        for _ in 0..10 {
            match ask().await.status {
                200 => answered += 1,
                _ => failed += 1,
            }
        }
        answered == 10
    })
    .await;
    assert!(out, "the stopped node was not taken out ({failed} requests failed)");
    eprintln!("requests that failed before the node was out: {failed}");
    for _ in 0..20 {
        assert_eq!(ask().await.status, 200, "a node taken out stays out while it is down");
    }

    // Started again, it is put back and answers again; nothing fails meanwhile.
    let b = Upstream::start_at(b_addr).await;
    let back = testkit::eventually(Duration::from_secs(15), async || {
        assert_eq!(ask().await.status, 200);
        b.hits() > 0
    })
    .await;
    assert!(back, "the node was not put back");
    b.stop().await;
    a.stop().await;
}

/// What an HTTP server (hyper, under axum) parsed of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Parsed {
    method: String,
    target: String,
    fields: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

/// Fields that belong to one connection or one framing, and those the gateway adds: not part of the
/// comparison (the body is compared whole instead).
const NOT_COMPARED: [&str; 7] =
    ["connection", "keep-alive", "content-length", "transfer-encoding", "x-forwarded-for", "x-request-id", "te"];

/// An upstream that records what hyper parses of each request (the health check aside) and answers 200.
async fn recorder() -> (SocketAddr, Arc<Mutex<Vec<Parsed>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
        let record = record.clone();
        async move {
            if uri.path() != "/readyz" {
                let mut fields: Vec<(String, Vec<u8>)> = headers
                    .iter()
                    .filter(|(n, _)| !NOT_COMPARED.contains(&n.as_str()))
                    .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                    .collect();
                // Field order between different names is not meaning; the order of one name's values is.
                fields.sort_by(|x, y| x.0.cmp(&y.0));
                let target = uri.path_and_query().map_or_else(|| uri.to_string(), ToString::to_string);
                record.lock().expect("record").push(Parsed {
                    method: method.to_string(),
                    target,
                    fields,
                    body: body.to_vec(),
                });
            }
            "ok"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, seen)
}

async fn send_raw(addr: &str, request: &[u8]) -> Vec<u8> {
    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
    socket.write_all(request).await.expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut answer))
        .await
        .expect("answered and closed")
        .expect("read");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn booking_gets_exactly_what_hyper_parses_from_the_client_s_bytes() {
    let (addr, seen) = recorder().await;
    let gw = GatewayProcess::start(Node::new(addr, &prefix())).await;
    let gateway = gw.base.trim_start_matches("http://").to_owned();
    let auth = bearer(1);
    let corpus: Vec<String> = vec![
        format!(
            "GET /events/1/seats?section=A&x=%2F HTTP/1.1\r\nHost: onsale.example\r\nAuthorization: {auth}\r\nAccept: application/json\r\nX-Dup: one\r\nUser-Agent: t\r\nx-dup: two\r\nConnection: close\r\n\r\n"
        ),
        format!(
            "POST /events/1/holds HTTP/1.1\r\nhost: onsale.example\r\nauthorization: {auth}\r\ncontent-type: application/json\r\nidempotency-key: k-1\r\ncontent-length: 19\r\nconnection: close\r\n\r\n{{\"seat_ids\":[1, 2]}}"
        ),
        format!(
            "POST /events/1/orders HTTP/1.1\r\nhost: onsale.example\r\nauthorization: {auth}\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n4\r\n{{\"ho\r\n10\r\nld_token\":\"abc\"}}\r\n0\r\n\r\n"
        ),
        format!(
            "DELETE /events/1/holds/a%20b HTTP/1.1\r\nhost: onsale.example\r\nauthorization: {auth}\r\nx-spaced:   a  b\t\r\nconnection: close\r\n\r\n"
        ),
        format!(
            "PUT /events/1/x HTTP/1.1\r\nhost: onsale.example\r\nauthorization: {auth}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        ),
        format!("GET /events/1 HTTP/1.0\r\nhost: onsale.example\r\nauthorization: {auth}\r\n\r\n"),
        format!(
            "OPTIONS /events/1/holds HTTP/1.1\r\nhost: onsale.example\r\nauthorization: {auth}\r\norigin: https://fans.example\r\nconnection: close\r\n\r\n"
        ),
    ];
    let mut differences = Vec::new();
    for request in &corpus {
        let direct = send_raw(&addr.to_string(), request.as_bytes()).await;
        let proxied = send_raw(&gateway, request.as_bytes()).await;
        let ok = |answer: &[u8]| answer.get(9..12) == Some(&b"200"[..]);
        assert!(ok(&direct) && ok(&proxied), "{request:?}: {}", String::from_utf8_lossy(&proxied));
        let mut records = seen.lock().expect("record").split_off(0);
        assert_eq!(records.len(), 2, "{request:?}: {records:?}");
        let through = records.pop().expect("through the gateway");
        let straight = records.pop().expect("straight");
        if through != straight {
            differences.push(format!("{request:?}\n  straight: {straight:?}\n  through:  {through:?}"));
        }
    }
    assert!(differences.is_empty(), "\n{}", differences.join("\n"));
}
