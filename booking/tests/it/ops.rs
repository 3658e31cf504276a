//! Health, readiness, metrics and the OpenAPI document.

use sqlx::PgPool;

use crate::app::TestApp;

#[sqlx::test(migrations = "../migrations")]
async fn health_readiness_and_metrics_answer(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let health = app.send(app.client.get(app.url("/healthz"))).await;
    assert_eq!(health.status, 200);
    let ready = app.send(app.client.get(app.url("/readyz"))).await;
    assert_eq!((ready.status, ready.str("postgres"), ready.str("redis")), (200, "ok".into(), "ok".into()));
    assert_eq!(app.get_event("fan-a").await.status, 200);
    let text = app.client.get(app.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert!(text.contains("booking_http_requests_total"), "{text}");
    app.stop().await;
}

/// One HTTP/1.1 exchange over booking's Unix socket, written against the socket: the status and the body.
async fn over_unix(path: &std::path::Path, request: String) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::UnixStream::connect(path).await.expect("connect to the Unix socket");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read");
    let status = answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

#[sqlx::test(migrations = "../migrations")]
async fn the_same_api_answers_on_the_unix_socket(pool: PgPool) {
    let dir = std::env::temp_dir().join(format!("booking-unix-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("booking.sock");
    // A stale socket file from a process that died is replaced; any other file is never touched.
    drop(std::os::unix::net::UnixListener::bind(&path).expect("a stale socket"));
    let app = TestApp::spawn_with(pool, &["--listen-unix", path.to_str().expect("utf-8 path")]).await;
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).expect("socket").permissions());
    assert_eq!(mode & 0o777, 0o666, "open to local users, as the loopback port is");

    let event = app.event;
    let proof = app.proof("fan-unix");
    let (status, body) = over_unix(
        &path,
        format!(
            "GET /events/{event} HTTP/1.1\r\nHost: booking\r\nAuthorization: Bearer {proof}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let over_tcp = app.get_event("fan-unix").await;
    let body: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(body, over_tcp.body, "the same answer as over TCP");
    let (status, _) =
        over_unix(&path, format!("GET /events/{event} HTTP/1.1\r\nHost: booking\r\nConnection: close\r\n\r\n")).await;
    assert_eq!(status, 401, "the socket needs the same admission proof");
    app.stop().await;

    let file = dir.join("not-a-socket");
    std::fs::write(&file, b"keep me").expect("file");
    let refused = booking::http::bind_unix(&file).expect_err("a regular file is not replaced");
    assert!(refused.to_string().contains("not a socket"), "{refused}");
    assert_eq!(std::fs::read(&file).expect("still there"), b"keep me");
    let _ = std::fs::remove_dir_all(&dir);
}

#[sqlx::test(migrations = "../migrations")]
async fn event_lists_ticket_types_and_seats_on_sale(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let r = app.get_event("fan-a").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["seats_on_sale"].as_u64(), Some(350), "400 seats less a 50-seat sponsor block");
    assert!(!r.body["ticket_types"].as_array().expect("types").is_empty());
    app.stop().await;
}

#[test]
fn committed_openapi_matches_the_code() {
    let generated = booking::http::openapi::document();
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json")).unwrap_or_default();
    assert!(
        committed.trim() == generated.trim(),
        "booking/openapi.json is stale: regenerate it with `cargo run -p booking -- openapi > booking/openapi.json`"
    );
}

#[test]
fn operation_ids_are_unique_and_every_link_names_an_operation_and_its_parameters() {
    let doc: serde_json::Value = serde_json::from_str(&booking::http::openapi::document()).expect("json");
    let mut operations = std::collections::HashMap::new();
    for item in doc["paths"].as_object().expect("paths").values() {
        for operation in item.as_object().expect("path item").values() {
            let id = operation["operationId"].as_str().expect("operationId").to_owned();
            let params: Vec<String> = operation["parameters"]
                .as_array()
                .map(|ps| ps.iter().filter_map(|p| p["name"].as_str().map(str::to_owned)).collect())
                .unwrap_or_default();
            assert!(operations.insert(id.clone(), params).is_none(), "operationId {id} is used twice");
        }
    }
    let mut links = 0;
    for item in doc["paths"].as_object().expect("paths").values() {
        for operation in item.as_object().expect("path item").values() {
            for response in operation["responses"].as_object().expect("responses").values() {
                for (name, link) in response["links"].as_object().into_iter().flatten() {
                    let target = link["operationId"].as_str().expect("link operationId");
                    let params = operations.get(target).unwrap_or_else(|| panic!("link {name} names {target}"));
                    for param in link["parameters"].as_object().into_iter().flatten().map(|(p, _)| p) {
                        assert!(params.contains(param), "link {name}: {target} has no parameter {param}");
                    }
                    links += 1;
                }
            }
        }
    }
    assert_eq!(
        links, 6,
        "a hold links to its release, extension and checkout; an order to its reading, payment and extension"
    );
}

/// No JIT compilation: the order functions turn it off for themselves, whoever calls them, and booking's own
/// connections turn it off for everything else (migration 015 has the measurement that called for it).
#[sqlx::test(migrations = "../migrations")]
async fn neither_the_order_functions_nor_bookings_connections_compile_plans(pool: PgPool) {
    let functions = [
        "checkout_order",
        "checkout_batch",
        "transition_order",
        "order_snapshot",
        "expire_order",
        "expire_stale_orders_on",
    ];
    let settings: Vec<(String, Vec<String>)> = sqlx::query_as(
        "SELECT proname::text, coalesce(proconfig, '{}') FROM pg_proc
         WHERE proname = ANY($1) AND pronamespace = current_schema()::regnamespace",
    )
    .bind(&functions[..])
    .fetch_all(&pool)
    .await
    .expect("settings");
    assert_eq!(settings.len(), functions.len(), "{settings:?}");
    for (name, config) in &settings {
        assert!(config.iter().any(|c| c == "jit=off"), "{name} may be compiled: {config:?}");
    }

    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL: run the tests with `deploy/test`");
    let args = ["booking", "serve", "--database-url", &url, "--redis-url", "redis://127.0.0.1:1/"];
    let args = args.into_iter().chain(["--admission-keys", crate::app::KEYS]);
    let booking::config::Command::Serve(cfg) =
        <booking::config::Cli as clap::Parser>::try_parse_from(args).expect("config").command
    else {
        unreachable!("serve was asked for")
    };
    let own = booking::http::connect_postgres(&cfg).await.expect("booking's pool");
    let jit: String = sqlx::query_scalar("SHOW jit").fetch_one(&own).await.expect("SHOW jit");
    assert_eq!(jit, "off");
    own.close().await;
}

#[sqlx::test(migrations = "../migrations")]
async fn every_function_is_written_out_in_migrations_functions_as_postgres_has_it(pool: PgPool) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations/functions");
    let functions: Vec<(String, String)> = sqlx::query_as(
        "SELECT p.proname::text, pg_get_functiondef(p.oid) FROM pg_proc p
         JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .expect("functions");
    assert!(functions.iter().any(|(name, _)| name == "checkout_order"), "the migrations made the functions");
    for (name, definition) in &functions {
        let path = dir.join(format!("{name}.sql"));
        let file = std::fs::read_to_string(&path).unwrap_or_else(|_| panic!("{} is missing", path.display()));
        // The file is a comment header, then the definition exactly as Postgres prints it.
        let body: String = file.lines().skip_while(|l| l.starts_with("--")).map(|l| format!("{l}\n")).collect();
        assert!(
            body.trim_end() == definition.trim_end(),
            "{} differs from the migrated database's {name}: copy `SELECT pg_get_functiondef('{name}'::regproc)` into it",
            path.display()
        );
    }
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("migrations/functions")
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".sql").map(str::to_owned))
        .collect();
    files.sort();
    let names: Vec<String> = functions.into_iter().map(|(name, _)| name).collect();
    assert_eq!(files, names, "one file per function, and none for a function that no longer exists");
}

#[test]
fn the_fake_provider_refuses_to_listen_beyond_loopback_unless_told() {
    let run = |listen: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_payments"))
            .args([
                "--listen",
                listen,
                "--webhook-secret",
                "s",
                "--webhook-url",
                "http://127.0.0.1:9/webhooks/payments",
            ])
            .env_remove("PROVIDER_ALLOW_REMOTE")
            .output()
            .expect("run payments")
    };
    let refused = run("0.0.0.0:0");
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("loopback only"), "{said}");
}

/// A series' value in a Prometheus text exposition.
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[sqlx::test(migrations = "../migrations")]
async fn metrics_show_the_outbox_backlog_and_the_pools_use(pool: PgPool) {
    // No relay here: the order events written below stay unpublished.
    let app = TestApp::spawn_with(pool, &["--outbox-relay-interval-ms", "0"]).await;
    let scrape =
        async || app.client.get(app.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert_eq!(series(&scrape().await, "booking_outbox_backlog"), Some(0.0));
    let seats = app.seats_on_sale().await;
    app.reserve("fan-a", &seats[0..1]).await;
    app.reserve("fan-b", &seats[1..2]).await;
    let unpublished = booking::store::outbox::backlog(&app.pool).await.expect("backlog");
    assert!(unpublished >= 2, "each order's creation is an event: {unpublished}");
    let text = scrape().await;
    assert_eq!(series(&text, "booking_outbox_backlog"), Some(unpublished as f64), "{text}");
    let max = series(&text, "booking_db_connections_max").expect("the pool's size");
    let in_use = series(&text, "booking_db_connections{state=\"in_use\"}").expect("in use");
    let idle = series(&text, "booking_db_connections{state=\"idle\"}").expect("idle");
    assert!(max >= 1.0 && in_use + idle <= max, "{in_use} in use and {idle} idle of {max}");
    app.stop().await;
}
