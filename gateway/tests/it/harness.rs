//! The test harness: a real counting upstream, the real `gateway` binary (pingora) on loopback ports, the real
//! Redis of the local stack (each test under its own key prefix), and one helper per endpoint.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::any;
use serde_json::Value;
use tokens::{AccountClaims, AccountId, AdmissionClaims, Keyring, unix_now};

pub const KEYS: &str = "k1:gateway-integration-test-admission-key-01";
pub const ACCOUNT_KEYS: &str = "a1:gateway-integration-test-account-keys-001";
pub const ADMIN_TOKEN: &str = "integration-admin-token";
pub const OTHER_SECRET_SAME_KID: &str = "k1:a-different-secret-that-nobody-trusts-02";
pub const OTHER_KID: &str = "k9:gateway-integration-test-admission-key-01";

pub use testkit::{free_port, prefix, redis_url};

/// The stack's Redis Cluster, whatever `REDIS_URL` says (`deploy/stack env` exports its URL either way).
pub fn cluster_url() -> String {
    std::env::var("REDIS_CLUSTER_URL")
        .unwrap_or_else(|_| panic!("REDIS_CLUSTER_URL is not set: run the tests with `deploy/test`, which starts it"))
}

/// A plain connection to one node of the stack's cluster, with the cluster's password.
pub async fn cluster_node(addr: &str) -> redisconn::Conn {
    let cluster = redisconn::Target::parse(&cluster_url()).expect("cluster URL");
    cluster.node(addr).expect("node").connected(redisconn::Options::default()).await.expect("node")
}

/// How the upstream behaves as booking: what its availability says, and how it answers the rest. Tests change
/// it as they go.
#[derive(Default)]
pub struct Booking {
    /// Every other answer waits this long first.
    pub delay_ms: AtomicU64,
    /// Every answer but the health check's waits until this is false again (as a stopped process would),
    /// bounded by the gateway's upstream timeout.
    pub stopped: AtomicBool,
    pub sold_out: AtomicBool,
    /// Seats neither sold nor held.
    pub seats_available: AtomicUsize,
    /// Seats held without an order.
    pub seats_held: AtomicUsize,
    /// Sold seats whose order awaits payment.
    pub seats_awaiting_payment: AtomicUsize,
    /// When the earliest hold or payment window ends, Unix seconds; 0: none.
    pub next_release: AtomicU64,
}

impl Booking {
    /// Waits while stopped; bounded: the gateway gives up on the answer long before.
    async fn until_running(&self) {
        for _ in 0..6000 {
            if !self.stopped.load(Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn availability(&self) -> String {
        let next = self.next_release.load(Ordering::SeqCst);
        let next = (next > 0).then(|| {
            let at = time::OffsetDateTime::from_unix_timestamp(i64::try_from(next).expect("seconds")).expect("time");
            at.format(&time::format_description::well_known::Rfc3339).expect("RFC 3339")
        });
        serde_json::json!({
            "sold_out": self.sold_out.load(Ordering::SeqCst),
            "seats_available": self.seats_available.load(Ordering::SeqCst),
            "seats_held": self.seats_held.load(Ordering::SeqCst),
            "seats_awaiting_payment": self.seats_awaiting_payment.load(Ordering::SeqCst),
            "next_release_at": next,
        })
        .to_string()
    }
}

/// A real upstream: answers every request with 200 and counts them, except the gateway's own questions:
/// booking's availability (`GET /events/{id}/availability`), answered from [`Booking`], and its health
/// check (`GET /readyz`); the others as [`Booking`] says.
pub struct Upstream {
    pub addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    unix_hits: Arc<AtomicUsize>,
    pub booking: Arc<Booking>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Upstream {
    pub async fn start() -> Self {
        Self::start_with(None, "127.0.0.1:0".parse().expect("addr")).await
    }

    /// The same upstream on a given address (one that answered before, started again).
    pub async fn start_at(addr: SocketAddr) -> Self {
        Self::start_with(None, addr).await
    }

    /// The same upstream, also answering on a Unix socket at `path` (as `booking serve --listen-unix` does);
    /// what arrives there is counted apart, in [`Self::unix_hits`].
    pub async fn start_unix(path: &std::path::Path) -> Self {
        Self::start_with(Some(path), "127.0.0.1:0".parse().expect("addr")).await
    }

    async fn start_with(unix: Option<&std::path::Path>, addr: SocketAddr) -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let unix_hits = Arc::new(AtomicUsize::new(0));
        let booking = Arc::new(Booking { seats_available: AtomicUsize::new(1000), ..Booking::default() });
        let app = |counter: Arc<AtomicUsize>, booking: Arc<Booking>| {
            Router::new().fallback(any(move |uri: axum::http::Uri| {
                let counter = counter.clone();
                let booking = booking.clone();
                async move {
                    let body = if uri.path() == "/readyz" {
                        // The gateway's health check: answered, not counted.
                        r#"{"status":"ready"}"#.to_owned()
                    } else if uri.path().ends_with("/availability") {
                        booking.until_running().await;
                        booking.availability()
                    } else {
                        let delay = booking.delay_ms.load(Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                        booking.until_running().await;
                        counter.fetch_add(1, Ordering::SeqCst);
                        r#"{"upstream":true}"#.to_owned()
                    };
                    ([("content-type", "application/json")], body)
                }
            }))
        };
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        let unix = unix.map(|path| tokio::net::UnixListener::bind(path).expect("bind the upstream's Unix socket"));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let tcp_app = app(hits.clone(), booking.clone());
        let unix_app = app(unix_hits.clone(), booking.clone());
        let task = tokio::spawn(async move {
            let stop = async {
                let _ = rx.await;
            };
            match unix {
                Some(unix) => {
                    tokio::select! {
                        _ = axum::serve(listener, tcp_app).into_future() => {}
                        _ = axum::serve(unix, unix_app).into_future() => {}
                        () = stop => {}
                    }
                }
                None => {
                    let _ = axum::serve(listener, tcp_app).with_graceful_shutdown(stop).await;
                }
            }
        });
        Self { addr, hits, unix_hits, booking, shutdown: Some(tx), task: Some(task) }
    }

    pub fn unix_hits(&self) -> usize {
        self.unix_hits.load(Ordering::SeqCst)
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

/// How to start a gateway node.
#[derive(Clone)]
pub struct Node {
    pub upstream: SocketAddr,
    pub redis_url: String,
    pub prefix: String,
    /// Extra `--flag value` pairs.
    pub args: Vec<(String, String)>,
}

impl Node {
    pub fn new(upstream: SocketAddr, prefix: &str) -> Self {
        Self { upstream, redis_url: redis_url(), prefix: prefix.to_owned(), args: Vec::new() }
    }

    pub fn arg(mut self, name: &str, value: impl ToString) -> Self {
        self.args.push((name.to_owned(), value.to_string()));
        self
    }
}

/// The gateway binary, stopped with SIGINT when dropped.
pub struct GatewayProcess {
    child: Child,
    pub base: String,
    pub admin: String,
    pub client: reqwest::Client,
}

impl GatewayProcess {
    pub async fn start(node: Node) -> Self {
        let port = free_port();
        let admin_port = free_port();
        let mut args: Vec<(String, String)> = [
            ("--listen", format!("127.0.0.1:{port}")),
            ("--upstreams", node.upstream.to_string()),
            ("--admin-listen", format!("127.0.0.1:{admin_port}")),
            ("--admin-token", ADMIN_TOKEN.to_owned()),
            ("--admission-keys", KEYS.to_owned()),
            ("--account-keys", ACCOUNT_KEYS.to_owned()),
            ("--grace-seconds", "0".to_owned()),
            ("--redis-url", node.redis_url.clone()),
            ("--redis-key-prefix", node.prefix.clone()),
            ("--tick-ms", "100".to_owned()),
            // The tests share two cores with each other and with Postgres: a Redis call may wait behind them for
            // more than the 500 ms a deployment allows (a CI run once saw 500 simultaneous joins time out). No
            // test waits on this timeout: the one that stops Redis kills it, so its calls fail at once.
            ("--redis-timeout-ms", "5000".to_owned()),
            ("--availability-poll-ms", "200".to_owned()),
            // Limits out of the way unless a test sets them.
            ("--ip-rps", "100000".to_owned()),
            ("--ip-burst", "100000".to_owned()),
            ("--account-rps", "100000".to_owned()),
            ("--account-burst", "100000".to_owned()),
            ("--max-connections-per-ip", "0".to_owned()),
            ("--streams-per-prefix", "0".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        // On a cluster (a replica per master), queue writes wait for the replica, as the stack runs them there.
        if node.redis_url.starts_with("redis+cluster://") {
            args.push(("--redis-wait-replicas".to_owned(), "1".to_owned()));
        }
        for (name, value) in &node.args {
            match args.iter_mut().find(|(k, _)| k == name) {
                Some(slot) => slot.1 = value.clone(),
                None => args.push((name.clone(), value.clone())),
            }
        }
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gateway"));
        // Only the flags below configure it: the stack's environment (deploy/test exports it) must not leak in.
        for (name, _) in std::env::vars() {
            if name.starts_with("GATEWAY_") || name.starts_with("ACCOUNT_") || name == "REDIS_KEY_PREFIX" {
                cmd.env_remove(name);
            }
        }
        cmd.arg("serve");
        for (name, value) in &args {
            cmd.args([name, value]);
        }
        let mut child = cmd.env("RUST_LOG", "warn").stdin(Stdio::null()).spawn().expect("start the gateway binary");
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            // A gateway that could not bind (a process outside the tests took the port) exits: say so.
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the gateway exited before listening on {port}: {status}");
            }
            assert!(Instant::now() < deadline, "the gateway did not listen on {port} within 20 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(64)
            .build()
            .expect("client");
        Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin_port}"),
            client,
        }
    }

    /// A metric from the node's admin listener, by its full name with labels (`name{label="v"}`), if it has
    /// one yet.
    pub async fn metric(&self, series: &str) -> Option<u64> {
        let metrics = self.send(self.client.get(format!("{}/metrics", self.admin))).await;
        let prefix = format!("{series} ");
        metrics.text.lines().find_map(|l| l.strip_prefix(prefix.as_str())).and_then(|v| v.trim().parse().ok())
    }

    /// Sends a request; returns status, JSON body (Null if not JSON) and headers.
    pub async fn send(&self, req: reqwest::RequestBuilder) -> Reply {
        let res = req.send().await.expect("request reached the gateway");
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let text = res.text().await.expect("body");
        Reply { status, body: serde_json::from_str(&text).unwrap_or(Value::Null), text, headers }
    }

    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        let mut req = self.client.get(format!("{}{path}", self.base));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(req).await
    }

    /// `POST /queue/{event}/join` as `account`.
    pub async fn join(&self, event: i64, account: &str) -> Reply {
        let req = self.client.post(format!("{}/queue/{event}/join", self.base)).bearer_auth(account_token(account));
        self.send(req).await
    }

    /// `POST /queue/{event}/join` as `account`, paying with a solved challenge (the `altcha` field).
    pub async fn join_paying(&self, event: i64, account: &str, altcha: &str) -> Reply {
        let req = self.client.post(format!("{}/queue/{event}/join", self.base)).bearer_auth(account_token(account));
        self.send(req.header(gateway::gate::HEADER, altcha)).await
    }

    /// `POST /queue/{event}/leave`, saying who leaves with a ticket or an admission proof (or not at all).
    pub async fn leave(&self, event: i64, bearer: Option<&str>) -> Reply {
        let mut req = self.client.post(format!("{}/queue/{event}/leave", self.base));
        if let Some(token) = bearer {
            req = req.bearer_auth(token);
        }
        self.send(req).await
    }

    /// `GET /queue/{event}/status` with a ticket.
    pub async fn status(&self, event: i64, ticket: &str) -> Reply {
        self.send(self.client.get(format!("{}/queue/{event}/status", self.base)).bearer_auth(ticket)).await
    }

    /// Polls `ticket` (bounded: 10 s) until `check` holds for the answer; returns it.
    pub async fn poll_until(&self, event: i64, ticket: &str, what: &str, check: impl Fn(&Reply) -> bool) -> Reply {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let answer = self.status(event, ticket).await;
            if check(&answer) {
                return answer;
            }
            assert!(Instant::now() < deadline, "{what}: {}", answer.text);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `PUT /admin/events/{event}` on this node's admin listener.
    pub async fn configure(&self, event: i64, settings: Value) -> Reply {
        let req =
            self.client.put(format!("{}/admin/events/{event}", self.admin)).bearer_auth(ADMIN_TOKEN).json(&settings);
        let reply = self.send(req).await;
        assert_eq!(reply.status, 200, "configure {settings}: {}", reply.text);
        reply
    }

    /// `GET /admin/events/{event}` on this node's admin listener.
    pub async fn room(&self, event: i64) -> Reply {
        self.send(self.client.get(format!("{}/admin/events/{event}", self.admin)).bearer_auth(ADMIN_TOKEN)).await
    }

    /// Waits (bounded) until this node's view shows the room, so status polls can be answered.
    pub async fn wait_for_room(&self, event: i64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.room(event).await.status != 200 {
            assert!(Instant::now() < deadline, "node never saw room {event}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
    pub text: String,
    pub headers: reqwest::header::HeaderMap,
}

impl Reply {
    pub fn code(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn ticket(&self) -> String {
        self.body["ticket"].as_str().unwrap_or_else(|| panic!("no ticket in {}", self.text)).to_owned()
    }

    pub fn place(&self) -> u64 {
        let ticket = self.ticket();
        Keyring::parse(KEYS).expect("keys").verify_ticket(&ticket).expect("a valid ticket").place
    }
}

pub fn account_token(account: &str) -> String {
    let claims = AccountClaims::new(AccountId::parse(account).expect("id"), "platform", unix_now(), 600);
    Keyring::parse(ACCOUNT_KEYS).expect("keys").sign(&claims)
}

pub fn proof(keys: &str, event: i64, issued: u64, ttl: u64) -> String {
    proof_for("fan-1", keys, event, issued, ttl)
}

pub fn proof_for(account: &str, keys: &str, event: i64, issued: u64, ttl: u64) -> String {
    let claims = AdmissionClaims::new(AccountId::parse(account).expect("id"), event, issued, ttl);
    Keyring::parse(keys).expect("keys").sign(&claims)
}

/// A direct Redis connection, to read what the scripts wrote.
pub async fn redis() -> redisconn::Conn {
    testkit::redis().await
}

/// A queue key, built by the gateway's own key builder.
pub fn key(prefix: &str, event: i64, name: &str) -> String {
    gateway::store::QueueKeys::new(prefix, event).key(name)
}

/// Every admission step recorded for an event: (from, to, at_ms, admitted), in order.
pub async fn batches(prefix: &str, event: i64) -> Vec<(u64, u64, u64, u64)> {
    let mut conn = redis().await;
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(key(prefix, event, "batches"))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .expect("zrange");
    members
        .iter()
        .map(|m| {
            let p: Vec<u64> = m.split(':').map(|x| x.parse().expect("number")).collect();
            (p[0], p[1], p[2], p[3])
        })
        .collect()
}

/// One request as a [`WireUpstream`] read it off its socket.
#[derive(Debug, Clone)]
pub struct WireRequest {
    /// Which accepted connection carried it (0, 1, ...).
    pub connection: usize,
    /// The request line and headers, as sent.
    pub head: String,
    pub body: Vec<u8>,
}

impl WireRequest {
    /// A header's value (names compared without case), if the head has it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// How a [`WireUpstream`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireMode {
    /// 200 with a chunked JSON body naming the request's method and body length, and a fixed `date` (to a
    /// HEAD, only a head with `content-length: 42`); the connection stays open.
    Chunked,
    /// The same, then the connection is closed without notice (as a server does with an idle connection).
    CloseAfterEach,
    /// Answers the connection's first `n` requests as `Chunked` does, then reads the next and never answers.
    SilentAfter(usize),
    /// Announces 100 bytes of body, sends 10 and closes the connection.
    CutMidBody,
    /// Answers with a body of this many bytes; a write of it that fails (the gateway closed the connection) is
    /// counted in [`WireUpstream::broken_off`].
    Large(usize),
}

/// An upstream written against the socket, not a framework: it records every request exactly as the gateway
/// wrote it (head and body, with the connection it came on) and answers with chunked framing.
pub struct WireUpstream {
    pub addr: SocketAddr,
    pub requests: Arc<std::sync::Mutex<Vec<WireRequest>>>,
    broken_off: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl WireUpstream {
    pub async fn start(mode: WireMode) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let broken_off = Arc::new(AtomicUsize::new(0));
        let (seen, broken) = (requests.clone(), broken_off.clone());
        let task = tokio::spawn(async move {
            for connection in 0.. {
                let Ok((socket, _)) = listener.accept().await else { return };
                tokio::spawn(serve_wire(socket, connection, mode, seen.clone(), broken.clone()));
            }
        });
        Self { addr, requests, broken_off, task }
    }

    /// Answers whose writing failed because the gateway closed the connection ([`WireMode::Large`]).
    pub fn broken_off(&self) -> usize {
        self.broken_off.load(Ordering::SeqCst)
    }

    pub fn requests(&self) -> Vec<WireRequest> {
        self.requests.lock().expect("requests").clone()
    }
}

impl Drop for WireUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_wire(
    mut socket: tokio::net::TcpStream,
    connection: usize,
    mode: WireMode,
    seen: Arc<std::sync::Mutex<Vec<WireRequest>>>,
    broken_off: Arc<AtomicUsize>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut answered = 0;
    loop {
        // One request: the head up to the blank line, then Content-Length bytes of body.
        let head_end = loop {
            if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut request = WireRequest { connection, head, body: Vec::new() };
        let length: usize = request.header("content-length").map_or(0, |v| v.parse().expect("content-length"));
        while buf.len() < head_end + length {
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        request.body = buf[head_end..head_end + length].to_vec();
        buf.drain(..head_end + length);
        if request.head.starts_with("GET /readyz ") {
            // The gateway's health check: answered, and neither recorded nor counted.
            if socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await.is_err() {
                return;
            }
            continue;
        }
        let method = request.head.split(' ').next().unwrap_or("").to_owned();
        let length = request.body.len();
        seen.lock().expect("requests").push(request);
        if mode == WireMode::SilentAfter(answered) {
            tokio::time::sleep(Duration::from_secs(60)).await;
            return;
        }
        answered += 1;
        if let WireMode::Large(bytes) = mode {
            let head = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {bytes}\r\n\r\n");
            let piece = vec![b' '; 64 * 1024];
            let mut written = socket.write_all(head.as_bytes()).await;
            let mut left = bytes;
            while written.is_ok() && left > 0 {
                let n = left.min(piece.len());
                written = socket.write_all(&piece[..n]).await;
                left -= n;
            }
            if written.is_err() {
                broken_off.fetch_add(1, Ordering::SeqCst);
                return;
            }
            continue;
        }
        if mode == WireMode::CutMidBody {
            let _ = socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"partial\"").await;
            return;
        }
        if method == "HEAD" {
            // The length a GET's answer would have, and no body.
            if socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 42\r\n\r\n")
                .await
                .is_err()
            {
                return;
            }
            continue;
        }
        // The body in three chunks, so the gateway has to stream a chunked answer.
        let parts = [r#"{"method":""#.to_owned(), format!(r#"{method}","body_bytes":"#), format!("{length}}}")];
        let mut answer =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ndate: Thu, 03 Dec 2026 00:00:00 GMT\r\n\
              transfer-encoding: chunked\r\n\r\n"
                .to_vec();
        for part in &parts {
            answer.extend_from_slice(format!("{:x}\r\n{part}\r\n", part.len()).as_bytes());
        }
        answer.extend_from_slice(b"0\r\n\r\n");
        if socket.write_all(&answer).await.is_err() {
            return;
        }
        if mode == WireMode::CloseAfterEach {
            return;
        }
    }
}
