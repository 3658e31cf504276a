//! Each deadline against a real socket, written byte by byte as a slow or hostile client would.

use std::time::Duration;

use axum::routing::post;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

use super::*;

const SHORT: Duration = Duration::from_millis(300);

/// A server whose `POST /echo` answers the length of the body it was given.
async fn server(deadlines: Deadlines) -> (String, tokio::sync::oneshot::Sender<()>) {
    let app = Router::new().route("/echo", post(|body: bytes::Bytes| async move { body.len().to_string() }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, app, deadlines, async move {
        let _ = stopped.await;
    }));
    (addr, stop)
}

fn short() -> Deadlines {
    Deadlines { head: SHORT, body: SHORT, max_body: 100, max_connections: 100 }
}

/// Everything the server sends until it closes the connection (at most 5 s).
async fn until_closed(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let read = timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "the server kept the connection open; it sent {:?}", String::from_utf8_lossy(&out));
    String::from_utf8_lossy(&out).into_owned()
}

/// Writes one byte every 100 ms for 3 s (or until the server closes): each read on the server's side is
/// quick, only the whole is slow.
fn trickle(mut writer: tokio::net::tcp::OwnedWriteHalf) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if writer.write_all(b"x").await.is_err() {
                return;
            }
        }
    })
}

/// Everything the server sends until it closes the connection, which must be while `trickler` still writes.
async fn closed_while_trickling(
    mut reader: tokio::net::tcp::OwnedReadHalf,
    trickler: tokio::task::JoinHandle<()>,
) -> String {
    let mut out = Vec::new();
    let read = timeout(Duration::from_secs(5), reader.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "the server kept the connection open");
    assert!(!trickler.is_finished(), "the server waited for the client to stop sending");
    trickler.abort();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_head_that_never_ends_is_cut_off_at_the_head_deadline() {
    let (addr, _stop) = server(short()).await;
    let mut stream = TcpStream::connect(&addr).await.expect("connect");
    stream.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.expect("write");
    let (reader, writer) = stream.into_split();
    let answer = closed_while_trickling(reader, trickle(writer)).await;
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer}");
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_the_head_deadline() {
    let (addr, _stop) = server(short()).await;
    let mut stream = TcpStream::connect(&addr).await.expect("connect");
    stream.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc").await.expect("write");
    let answer = until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("\r\n\r\n3"), "{answer}");
}

#[tokio::test]
async fn a_trickling_body_gets_408_at_the_body_deadline_whatever_each_read_takes() {
    let (addr, _stop) = server(short()).await;
    let mut stream = TcpStream::connect(&addr).await.expect("connect");
    stream.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n").await.expect("write");
    let (reader, writer) = stream.into_split();
    let answer = closed_while_trickling(reader, trickle(writer)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"error\":\"request_timeout\""), "{answer}");
}

#[tokio::test]
async fn a_body_over_the_limit_gets_413_declared_or_chunked() {
    let (addr, _stop) = server(short()).await;
    let mut declared = TcpStream::connect(&addr).await.expect("connect");
    declared.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n").await.expect("write");
    let answer = until_closed(&mut declared).await;
    assert!(answer.starts_with("HTTP/1.1 413") && answer.contains("body_too_large"), "{answer}");

    let mut chunked = TcpStream::connect(&addr).await.expect("connect");
    let chunk = format!("{:x}\r\n{}\r\n", 60, "y".repeat(60));
    let request =
        format!("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{chunk}{chunk}0\r\n\r\n");
    chunked.write_all(request.as_bytes()).await.expect("write");
    let answer = until_closed(&mut chunked).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_until_one_closes() {
    let (addr, _stop) = server(Deadlines { head: Duration::from_secs(10), max_connections: 2, ..short() }).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(&addr).await.expect("connect");
        // A whole request, answered: the connection is surely accepted and now idles, holding its slot.
        stream.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na").await.expect("write");
        let mut buf = [0u8; 256];
        let n = timeout(Duration::from_secs(5), stream.read(&mut buf)).await.expect("answered").expect("read");
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        held.push(stream);
    }
    let mut third = TcpStream::connect(&addr).await.expect("the kernel queues it");
    third
        .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\nb")
        .await
        .expect("write");
    let mut buf = [0u8; 256];
    assert!(timeout(SHORT, third.read(&mut buf)).await.is_err(), "a third connection was served beside two");
    drop(held.pop());
    let answer = until_closed(&mut third).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn a_request_in_hand_finishes_when_shutdown_begins() {
    let app = Router::new().route(
        "/echo",
        post(|body: bytes::Bytes| async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            body.len().to_string()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(serve(listener, app, short(), async move {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::new();
    let request = tokio::spawn(client.post(format!("http://{addr}/echo")).body("abcd").send());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let _ = stop.send(());
    let answer = request.await.expect("join").expect("answered").text().await.expect("body");
    assert_eq!(answer, "4");
    timeout(Duration::from_secs(5), served).await.expect("the server stopped").expect("join").expect("serve");
    assert!(TcpStream::connect(addr).await.is_err(), "the listener is closed");
}
