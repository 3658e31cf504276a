//! What booking's and the gateway's integration tests share: the stack's Redis, a key prefix of a test's own,
//! ports for the servers tests start, bounded waiting, and forged credentials.

pub mod forgery;

use std::time::Duration;

/// The stack's Redis (`deploy/test` exports `REDIS_URL`).
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| {
        panic!("REDIS_URL is not set: run the tests with `deploy/test`, which starts Postgres and Redis")
    })
}

/// A direct connection to the stack's Redis (one server or the cluster, as `REDIS_URL` says), to read and write
/// what the services do.
pub async fn redis() -> redisconn::Conn {
    let target = redisconn::Target::parse(&redis_url()).expect("REDIS_URL is a Redis URL");
    target
        .connected(redisconn::Options::default())
        .await
        .expect("Redis is not answering: run the tests with `deploy/test`, which starts it")
}

/// A Redis key prefix no other test (or earlier run) uses.
pub fn prefix() -> String {
    format!("t{:016x}:", rand::random::<u64>())
}

/// A port for a server process a test starts (which binds it itself). The kernel's choice of a free port is
/// claimed by creating a file named after it in a directory every test shares, so no two tests (nextest runs
/// each in its own process) are handed the same port between the probe and the bind. Claims older than ten
/// minutes are stale (no test runs that long) and are taken again.
pub fn free_port() -> u16 {
    let dir = std::env::temp_dir().join("onsale-test-ports");
    std::fs::create_dir_all(&dir).expect("the port claims' directory");
    for _ in 0..200 {
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("probe").local_addr().expect("addr").port();
        let claim = dir.join(port.to_string());
        if std::fs::OpenOptions::new().write(true).create_new(true).open(&claim).is_ok() {
            return port;
        }
        let stale = std::fs::metadata(&claim)
            .and_then(|m| m.modified())
            .is_ok_and(|at| at.elapsed().is_ok_and(|age| age > Duration::from_secs(600)));
        if stale {
            let _ = std::fs::remove_file(&claim);
        }
    }
    panic!("no unclaimed port after 200 probes")
}

/// Waits (bounded) until `check` holds; says whether it did.
pub async fn eventually(within: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// `n` values drawn from a proptest `strategy`, deterministically and without shrinking: for inputs sent over
/// HTTP, where each case is a request and a failure names its input.
pub fn draw<S: proptest::strategy::Strategy>(strategy: S, n: usize) -> Vec<S::Value> {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    (0..n).filter_map(|_| strategy.new_tree(&mut runner).ok().map(|tree| tree.current())).collect()
}

/// A waiting room's settings as an operator's client may send them: the real field names and one unknown, each
/// with a number in or out of range, a state (valid or not), text, null or an array.
pub fn settings_bodies() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
    use proptest::prelude::*;
    use serde_json::{Value, json};
    let value = prop_oneof![
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        (0u64..100_000).prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        prop_oneof![Just("open"), Just("paused"), Just("closed"), Just("sold_out"), Just("")].prop_map(|s| json!(s)),
        prop_oneof![
            Just("fixed"),
            Just("adaptive"),
            Just("fifo"),
            Just("passthrough"),
            Just("reject"),
            Just("lottery")
        ]
        .prop_map(|s| json!(s)),
        any::<bool>().prop_map(|b| json!(b)),
        "[ -~]{0,10}".prop_map(|s| json!(s)),
        Just(Value::Null),
        Just(json!([1, 2])),
    ];
    let name = prop_oneof![
        Just("state"),
        Just("admit_per_minute"),
        Just("max_active"),
        Just("session_seconds"),
        Just("abandon_after_seconds"),
        Just("opens_at"),
        Just("rate_mode"),
        Just("queueing"),
        Just("queue_all"),
        Just("draw_every_seconds"),
        Just("rate_floor"),
        Just("rate_ceiling"),
        Just("target_p99_ms"),
        Just("target_503_percent"),
        Just("nonsense"),
    ];
    prop::collection::vec((name, value), 0..6)
        .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
}

/// A Redis server of the test's own, so it can be killed, started again, or lose its data.
pub struct OwnRedis {
    pub child: std::process::Child,
    pub port: u16,
    /// Where it keeps its append-only file, when it keeps one.
    dir: Option<std::path::PathBuf>,
}

impl OwnRedis {
    pub async fn start() -> Self {
        Self::spawn(free_port(), None).await
    }

    /// A Redis that persists as the stack's does: the append-only file, fsynced every second.
    pub async fn start_persistent() -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("onsale-redis-{port}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("Redis's directory");
        Self::spawn(port, Some(dir)).await
    }

    async fn spawn(port: u16, dir: Option<std::path::PathBuf>) -> Self {
        Self { child: Self::server(port, dir.as_deref()).await, port, dir }
    }

    /// A redis-server on `port`, listening; persisting in `dir` if given.
    async fn server(port: u16, dir: Option<&std::path::Path>) -> std::process::Child {
        let mut cmd = std::process::Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""]);
        match dir {
            Some(dir) => cmd.args(["--appendonly", "yes", "--appendfsync", "everysec"]).arg("--dir").arg(dir),
            None => cmd.args(["--appendonly", "no"]),
        };
        let child =
            cmd.stdout(std::process::Stdio::null()).spawn().expect("redis-server (installed by deploy/stack services)");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(std::time::Instant::now() < deadline, "redis-server did not listen");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        child
    }

    /// Stops the server, cleanly (`SHUTDOWN`, which writes what it has) or not (SIGKILL), and starts it again on
    /// the same port and files.
    pub async fn restart(&mut self, clean: bool) {
        if clean {
            let _ = std::process::Command::new("redis-cli").args(["-p", &self.port.to_string(), "shutdown"]).status();
        } else {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        self.child = Self::server(self.port, self.dir.as_deref()).await;
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
