//! The admin listener: its own port, an axum app run as a pingora background service. `/admin/...` needs the
//! admin bearer token; `/metrics` (Prometheus) and `/healthz` do not.
//!
//! `GET /admin/events/{id}` answers from this node's view (so it shows what this node applies), `PUT` writes
//! Redis, which every node reads within one tick.

pub mod client;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;

use crate::codes::{BatchAsk, BatchError};
use crate::room::{
    Access, Applied, ChallengeMode, Freshness, QueueState, Queueing, RateMode, Rooms, SCHEDULE_MAX, Scheduled,
    Settings, SettingsPatch,
};
use crate::store::{LazyStore, StateChange};

/// The admin service.
pub struct Admin {
    pub listener: std::sync::Mutex<Option<std::net::TcpListener>>,
    pub token: SecretString,
    /// Signs sponsor passes (the admission keyring: every node checks them).
    pub keyring: Arc<tokens::Keyring>,
    pub rooms: Arc<Rooms>,
    pub store: LazyStore,
    pub stale_after: Duration,
}

#[async_trait]
impl BackgroundService for Admin {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(std_listener) = self.listener.lock().ok().and_then(|mut l| l.take()) else { return };
        let listener = match tokio::net::TcpListener::from_std(std_listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "admin listener unusable");
                return;
            }
        };
        let state = Arc::new(AdminState {
            token: self.token.clone(),
            keyring: self.keyring.clone(),
            rooms: self.rooms.clone(),
            store: self.store.fork(),
            stale_after: self.stale_after,
        });
        let app = router(state);
        let stop = async move {
            let _ = shutdown.changed().await;
        };
        if let Err(e) = serving::serve(listener, app, serving::Deadlines::default(), stop).await {
            tracing::error!(error = %e, "admin listener stopped");
        }
    }
}

struct AdminState {
    token: SecretString,
    keyring: Arc<tokens::Keyring>,
    rooms: Arc<Rooms>,
    store: LazyStore,
    stale_after: Duration,
}

fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/admin/events/{event}", get(get_room).put(put_room).delete(delete_room))
        .route("/admin/events/{event}/draw", get(get_draw))
        .route("/admin/events/{event}/lottery", get(get_lottery))
        .route("/admin/events/{event}/passes", axum::routing::post(post_pass))
        .route("/admin/events/{event}/codes", get(get_codes).post(post_codes))
        .route("/admin/events/{event}/schedule", get(get_schedule).post(post_schedule))
        .route("/admin/events/{event}/schedule/{change}", axum::routing::delete(delete_scheduled))
        .route("/admin/signin-codes", axum::routing::post(post_signin_code))
        .route("/metrics", get(|| async { telemetry::prometheus().render() }))
        .route("/healthz", get(|| async { axum::Json(json!({ "status": "ok" })) }))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .with_state(state)
}

/// A refusal: the contract's JSON error body, with `Retry-After` when the store is down.
struct Refused {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let body = axum::Json(json!({ "error": self.code, "message": self.message }));
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            (self.status, [(header::RETRY_AFTER, "1")], body).into_response()
        } else {
            (self.status, body).into_response()
        }
    }
}

fn error(status: StatusCode, code: &'static str, message: &str) -> Refused {
    Refused { status, code, message: message.to_owned() }
}

fn unavailable() -> Refused {
    error(StatusCode::SERVICE_UNAVAILABLE, "queue_unavailable", "the queue's store is not answering")
}

/// Constant-time comparison of the bearer token.
fn authorised(headers: &HeaderMap, token: &SecretString) -> bool {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    tokens::same_secret(given.as_bytes(), token.expose_secret().as_bytes())
}

fn event_id(raw: &str) -> Result<i64, Refused> {
    match raw.parse::<i64>() {
        Ok(id) if id > 0 => Ok(id),
        _ => Err(error(StatusCode::BAD_REQUEST, "invalid_path", "event_id must be a positive integer")),
    }
}

/// A request's JSON body, or 422 with `code` and what was wrong with it.
fn json_body<T: serde::de::DeserializeOwned>(body: &Bytes, code: &'static str) -> Result<T, Refused> {
    serde_json::from_slice(body).map_err(|e| error(StatusCode::UNPROCESSABLE_ENTITY, code, &e.to_string()))
}

/// 404 `queue_not_found` unless `event` has a room in Redis (one made a moment ago counts).
async fn room_exists(store: &crate::store::QueueStore, event: i64) -> Result<(), Refused> {
    match store.settings(event).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => {
            Err(error(StatusCode::NOT_FOUND, "queue_not_found", "this event has no waiting room; PUT creates one"))
        }
        Err(_) => Err(unavailable()),
    }
}

fn guard(state: &AdminState, headers: &HeaderMap, raw: &str) -> Result<i64, Refused> {
    if !authorised(headers, &state.token) {
        return Err(error(StatusCode::UNAUTHORIZED, "admin_token_required", "the admin API needs its bearer token"));
    }
    event_id(raw)
}

/// A room's settings, with this node's live figures (GET) or what a change drew (PUT).
#[derive(Debug, Serialize, ToSchema)]
pub struct RoomView {
    pub event_id: i64,
    pub state: QueueState,
    pub admit_per_minute: u32,
    pub max_active: u32,
    pub session_seconds: u32,
    pub abandon_after_seconds: u32,
    /// Unix seconds, as it was set.
    pub opens_at: Option<u64>,
    /// Bumped on every change.
    pub version: u64,
    /// Every seat left is held or awaiting payment (the gateway sets it from booking's availability): nobody
    /// is admitted until some come back.
    pub all_held: bool,
    /// While all held: how many seats may come back (held, or in orders awaiting payment).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seats_may_return: Option<u64>,
    /// The last seats are selling (the gateway sets it from booking's availability): fans poll more often.
    pub ending: bool,
    /// While all held: when the earliest hold or payment window ends (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_release_at: Option<String>,
    /// `on`: a new place costs a solved proof-of-work challenge.
    pub challenge: ChallengeMode,
    /// The most hashes a challenge takes (half on average): with `auto`, the difficulty in force now.
    pub challenge_difficulty: u32,
    /// `auto`'s bounds and how often it decides, in seconds.
    pub challenge_min_difficulty: u32,
    pub challenge_max_difficulty: u32,
    pub challenge_window_seconds: u32,
    /// Forged or spent solutions are answered as a waiting fan that never advances.
    pub infinite_queue_for_failed: bool,
    /// Most places one client network is given (0: no cap).
    pub places_per_network: u32,
    /// `public`, `code_required` or `codes_first`.
    pub access: Access,
    /// `fifo`, `passthrough` or `reject`.
    pub queueing: Queueing,
    /// Nobody is let in while the room stays open.
    pub queue_all: bool,
    /// `fixed` or `adaptive`, with `adaptive`'s bounds and targets.
    pub rate_mode: RateMode,
    pub rate_floor: u32,
    pub rate_ceiling: u32,
    pub target_p99_ms: u32,
    pub target_503_percent: u32,
    /// Fans admitted per minute now: `admit_per_minute`, or the rate `adaptive` decided.
    pub rate_in_force: u32,
    /// `adaptive`: why the rate is what it is (booking's answers over the last seconds, against the targets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_reason: Option<String>,
    /// The changes the room's schedule still holds, earliest first (from this node's view; GET only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub schedule: Vec<Scheduled>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveView>,
    /// PUT only: pre-queue places drawn by this change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drawn: Option<u64>,
}

impl RoomView {
    fn new(event: i64, s: &Settings) -> Self {
        Self {
            event_id: event,
            state: s.state,
            admit_per_minute: s.admit_per_minute,
            max_active: s.max_active,
            session_seconds: s.session_seconds,
            abandon_after_seconds: s.abandon_after_seconds,
            opens_at: s.opens_at_ms.map(|ms| ms / 1000),
            version: s.version,
            all_held: s.all_held.is_some(),
            seats_may_return: s.all_held.map(|h| h.seats),
            ending: s.ending,
            next_release_at: s
                .all_held
                .and_then(|h| h.next_release_ms)
                .map(|ms| tokens::times::rfc3339_seconds(ms / 1000)),
            challenge: s.challenge,
            challenge_difficulty: s.challenge_difficulty,
            challenge_min_difficulty: s.challenge_min_difficulty,
            challenge_max_difficulty: s.challenge_max_difficulty,
            challenge_window_seconds: s.challenge_window_seconds,
            infinite_queue_for_failed: s.infinite_queue_for_failed,
            places_per_network: s.places_per_network,
            access: s.access,
            queueing: s.queueing,
            queue_all: s.queue_all,
            rate_mode: s.rate_mode,
            rate_floor: s.rate_floor,
            rate_ceiling: s.rate_ceiling,
            target_p99_ms: s.target_p99_ms,
            target_503_percent: s.target_503_percent,
            rate_in_force: s.rate(),
            rate_reason: s.rate_reason.clone().filter(|_| s.rate_mode == RateMode::Adaptive),
            schedule: Vec::new(),
            live: None,
            drawn: None,
        }
    }
}

/// Live figures of a room, as this node last read them.
#[derive(Debug, Serialize, ToSchema)]
pub struct LiveView {
    /// Everyone waiting, code holders and the fans behind them.
    pub waiting: u64,
    /// Of those, the fans who joined without a code and wait behind the code holders.
    pub waiting_without_code: u64,
    pub prequeue: u64,
    /// Admitted within the session window.
    pub active: u64,
    pub admitted_total: u64,
    pub admissions_per_minute: u64,
    pub abandoned_total: u64,
    /// Slots freed before their session ended: fans whose orders were paid, and fans who left.
    pub freed_total: u64,
    pub median_wait_seconds: Option<f64>,
    /// How far the waits this node promised at joins were from the waits the fans had (its last 1,000
    /// admitted fans that were promised one).
    pub eta_error: Option<crate::room::EtaError>,
    pub places_given: u64,
    pub head: u64,
    /// A lottery's next draw (RFC 3339); its pool is `prequeue`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_draw_at: Option<String>,
    /// How old this node's view is.
    pub view_age_ms: u64,
}

/// The recorded pre-queue draw.
#[derive(Debug, Serialize, ToSchema)]
pub struct DrawView {
    pub event_id: i64,
    pub algorithm: String,
    pub seed: u64,
    /// Drawn places are base + 1 ..= base + n.
    pub base: u64,
    pub drawn_at_ms: u64,
    /// Accounts in the order they joined the pre-queue.
    pub join_order: Vec<String>,
    /// The account at each drawn place, in place order.
    pub places: Vec<Option<String>>,
}

/// One recorded lottery draw: its pool in join order, the seed, and the places it gave.
#[derive(Debug, Serialize, ToSchema)]
pub struct LotteryDrawView {
    pub seed: u64,
    /// Drawn places are base + 1 ..= base + n.
    pub base: u64,
    pub drawn_at_ms: u64,
    /// The pool, in the order its fans joined.
    pub join_order: Vec<String>,
    /// The account at each drawn place, in place order.
    pub places: Vec<Option<String>>,
}

/// `GET /admin/events/{event}/lottery`: every draw of a lottery room, oldest first, each recomputable as the
/// pre-queue's draw is.
async fn get_lottery(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Path(raw): Path<String>,
) -> Result<Response, Refused> {
    let event = guard(&state, &headers, &raw)?;
    let store = state.store.get().map_err(|_| unavailable())?;
    room_exists(store, event).await?;
    let draws = store.lottery_draws(event).await.map_err(|_| unavailable())?;
    let mut views = Vec::with_capacity(draws.len());
    for draw in draws {
        let n = draw.join_order.len() as u64;
        let places = store.accounts_at(event, draw.base, n).await.map_err(|_| unavailable())?;
        views.push(LotteryDrawView {
            seed: draw.seed,
            base: draw.base,
            drawn_at_ms: draw.at_ms,
            join_order: draw.join_order,
            places,
        });
    }
    Ok(axum::Json(json!({ "event_id": event, "algorithm": DRAW_ALGORITHM, "draws": views })).into_response())
}

const DRAW_ALGORITHM: &str = "fisher-yates over the join order, driven by x <- x * 48271 mod 2147483647 from the seed";

async fn get_room(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Path(raw): Path<String>,
) -> Result<Response, Refused> {
    let event = guard(&state, &headers, &raw)?;
    let room = state.rooms.fresh(event, state.stale_after).map_err(|f| match f {
        Freshness::Unknown => {
            error(StatusCode::NOT_FOUND, "queue_not_found", "this event has no waiting room; PUT creates one")
        }
        Freshness::Stale => unavailable(),
    })?;
    let live = &room.live;
    let view = RoomView {
        live: Some(LiveView {
            waiting: live.waiting(),
            waiting_without_code: live.later_waiting(),
            prequeue: live.counts.prequeue,
            active: live.counts.active,
            admitted_total: live.counts.admitted_total,
            admissions_per_minute: live.admitted_last_minute,
            abandoned_total: live.counts.abandoned_total,
            freed_total: live.counts.freed_total,
            median_wait_seconds: live.median_wait_ms.map(|ms| ms as f64 / 1000.0),
            eta_error: room.live.eta_error,
            places_given: live.counts.seq,
            head: live.counts.head,
            next_draw_at: (live.counts.next_draw_ms > 0 && live.settings.queueing == Queueing::Lottery)
                .then(|| tokens::times::rfc3339_seconds(live.counts.next_draw_ms.div_ceil(1000))),
            view_age_ms: live.read_at.elapsed().as_millis() as u64,
        }),
        schedule: live.schedule.clone(),
        ..RoomView::new(event, &live.settings)
    };
    Ok(axum::Json(view).into_response())
}

async fn put_room(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Path(raw): Path<String>,
    body: Bytes,
) -> Result<Response, Refused> {
    let event = guard(&state, &headers, &raw)?;
    let patch: SettingsPatch = json_body(&body, "invalid_settings")?;
    patch.validate().map_err(|e| error(StatusCode::UNPROCESSABLE_ENTITY, e.code(), &e.to_string()))?;
    let store = state.store.get().map_err(|_| unavailable())?;
    let seed = crate::room::shuffle::seed_from(rand::random());
    let configured = store.configure(event, &patch, seed).await.map_err(|e| {
        tracing::warn!(error = %e, event, "admin change failed");
        unavailable()
    })?;
    let drawn = match configured.change {
        Some(StateChange::Refused(current)) => {
            return Err(error(
                StatusCode::CONFLICT,
                "state_change_refused",
                &format!("the queue is {current} and has given out places; it cannot go back to prequeue"),
            ));
        }
        Some(StateChange::Done { drawn }) => drawn,
        _ => 0,
    };
    tracing::info!(event, ?patch, version = configured.settings.version, "waiting room changed");
    let view = RoomView { drawn: Some(drawn), ..RoomView::new(event, &configured.settings) };
    Ok(axum::Json(view).into_response())
}

/// `DELETE /admin/events/{event}`: retires the room now (see `QueueStore::retire`); every node forgets it
/// within a tick. 404 when there is no room to retire.
async fn delete_room(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Path(raw): Path<String>,
) -> Result<Response, Refused> {
    let event = guard(&state, &headers, &raw)?;
    let store = state.store.get().map_err(|_| unavailable())?;
    let retired = store.retire(event).await.map_err(|e| {
        tracing::warn!(error = %e, event, "retiring a room failed");
        unavailable()
    })?;
    if !retired {
        return Err(error(StatusCode::NOT_FOUND, "queue_not_found", "this event has no waiting room to retire"));
    }
    tracing::info!(event, "waiting room retired by an operator");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A sponsor pass asked for.
#[derive(Debug, serde::Deserialize, serde::Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PassAsk {
    /// The account the pass admits (as the platform's account tokens name it).
    pub account: String,
    /// How long the pass may wait to be used, 60 to 2,592,000 seconds (30 days); 86,400 by default.
    #[schema(minimum = 60, maximum = 2_592_000)]
    pub ttl_seconds: Option<u64>,
}

/// A sponsor pass: sent as the `sponsor-pass` field of that account's join, it admits at once (within the
/// room's `max_active`), once.
#[derive(Debug, Serialize, ToSchema)]
pub struct PassView {
    pub event_id: i64,
    pub account: String,
    pub pass: String,
    /// Unix seconds.
    pub expires_at: u64,
}

/// `POST /admin/events/{event}/passes` `{"account", "ttl_seconds"}`: a signed, expiring, single-use sponsor pass
/// for one account and this event.
async fn post_pass(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Path(raw): Path<String>,
    body: Bytes,
) -> Result<Response, Refused> {
    let event = guard(&state, &headers, &raw)?;
    let ask: PassAsk = json_body(&body, "invalid_request")?;
    let account = tokens::AccountId::parse(&ask.account).map_err(|_| {
        error(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", "account: 1 to 64 of A-Z a-z 0-9 . _ - @")
    })?;
    let ttl = ask.ttl_seconds.unwrap_or(86_400);
    if !(60..=2_592_000).contains(&ttl) {
        return Err(error(StatusCode::UNPROCESSABLE_ENTITY, "setting_out_of_range", "ttl_seconds: 60 to 2,592,000"));
    }
    let store = state.store.get().map_err(|_| unavailable())?;
    room_exists(store, event).await?;
    let now = tokens::unix_now();
    let claims = tokens::PassClaims::new(account, event, now, ttl, format!("{:032x}", rand::random::<u128>()));
    let pass = state.keyring.sign(&claims);
    tracing::info!(event, account = %claims.sub, jti = %claims.jti, "sponsor pass issued");
    let view = PassView { event_id: event, account: claims.sub.to_string(), pass, expires_at: claims.exp };
    Ok((StatusCode::CREATED, axum::Json(view)).into_response())
}

/// A batch of presale codes, made: hand `codes` out (dashes and case do not matter when they are typed).
#[derive(Debug, Serialize, ToSchema)]
pub struct CodesMade {
    pub event_id: i64,
    #[serde(flatten)]
    pub batch: crate::codes::Batch,
    pub codes: Vec<String>,
}

/// `POST /admin/events/{event}/codes`: a batch of presale codes for this room.
async fn post_codes(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Path(raw): Path<String>,
    body: Bytes,
) -> Result<Response, Refused> {
    let event = guard(&state, &headers, &raw)?;
    let ask: BatchAsk = json_body(&body, "invalid_request")?;
    let (batch, codes) = ask
        .make(tokens::unix_now())
        .map_err(|e: BatchError| error(StatusCode::UNPROCESSABLE_ENTITY, e.code(), &e.to_string()))?;
    let store = state.store.get().map_err(|_| unavailable())?;
    room_exists(store, event).await?;
    let stored: Vec<String> = codes.iter().filter_map(|c| crate::codes::normalise(c)).collect();
    let added = store.add_codes(event, &batch, &stored).await.map_err(|e| {
        tracing::warn!(error = %e, event, "could not add presale codes");
        unavailable()
    })?;
    if !added {
        return Err(error(StatusCode::CONFLICT, "code_exists", "this room has that code already"));
    }
    tracing::info!(event, batch = %batch.batch, codes = batch.count, uses = batch.uses, "presale codes made");
    Ok((StatusCode::CREATED, axum::Json(CodesMade { event_id: event, batch, codes })).into_response())
}

/// `GET /admin/events/{event}/codes`: the room's batches, redemptions counted, and who redeemed what.
async fn get_codes(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Path(raw): Path<String>,
) -> Result<Response, Refused> {
    let event = guard(&state, &headers, &raw)?;
    let store = state.store.get().map_err(|_| unavailable())?;
    room_exists(store, event).await?;
    let report = store.codes_report(event).await.map_err(|_| unavailable())?;
    Ok(axum::Json(report).into_response())
}

/// A change to schedule: `set` at `at`.
#[derive(Debug, Clone, serde::Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleAsk {
    /// When it applies: Unix seconds (a time passed applies at once).
    #[schema(maximum = 4_102_444_800_u64)]
    pub at: u64,
    /// The change, as `PUT /admin/events/{event_id}` takes it.
    pub set: SettingsPatch,
}

/// A room's schedule: what waits, and what was applied lately.
#[derive(Debug, Serialize, ToSchema)]
pub struct ScheduleView {
    pub event_id: i64,
    /// The changes waiting, earliest first.
    pub waiting: Vec<Scheduled>,
    /// The last fifty applied, latest first.
    pub applied: Vec<Applied>,
}

/// `POST /admin/events/{event}/schedule`: a change of the room's settings at a time of its own.
async fn post_schedule(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Path(raw): Path<String>,
    body: Bytes,
) -> Result<Response, Refused> {
    let event = guard(&state, &headers, &raw)?;
    let ask: ScheduleAsk = json_body(&body, "invalid_schedule")?;
    if ask.at > 4_102_444_800 {
        return Err(error(StatusCode::UNPROCESSABLE_ENTITY, "setting_out_of_range", "at must be before 2100"));
    }
    ask.set.validate().map_err(|e| error(StatusCode::UNPROCESSABLE_ENTITY, e.code(), &e.to_string()))?;
    let store = state.store.get().map_err(|_| unavailable())?;
    room_exists(store, event).await?;
    let change = Scheduled { id: format!("{:016x}", rand::random::<u64>()), at: ask.at, set: ask.set };
    let added = store.schedule_add(event, &change).await.map_err(|e| {
        tracing::warn!(error = %e, event, "could not schedule a change");
        unavailable()
    })?;
    if !added {
        let message = format!("this room has {SCHEDULE_MAX} changes waiting: cancel one first");
        return Err(error(StatusCode::CONFLICT, "schedule_full", &message));
    }
    tracing::info!(event, id = change.id, at = change.at, set = ?change.set, "change scheduled");
    Ok((StatusCode::CREATED, axum::Json(change)).into_response())
}

/// `GET /admin/events/{event}/schedule`.
async fn get_schedule(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Path(raw): Path<String>,
) -> Result<Response, Refused> {
    let event = guard(&state, &headers, &raw)?;
    let store = state.store.get().map_err(|_| unavailable())?;
    room_exists(store, event).await?;
    let (waiting, applied) = store.schedule(event).await.map_err(|_| unavailable())?;
    Ok(axum::Json(ScheduleView { event_id: event, waiting, applied }).into_response())
}

/// `DELETE /admin/events/{event}/schedule/{change}`: cancels a change still waiting.
async fn delete_scheduled(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Path((raw, change)): Path<(String, String)>,
) -> Result<Response, Refused> {
    let event = guard(&state, &headers, &raw)?;
    let store = state.store.get().map_err(|_| unavailable())?;
    room_exists(store, event).await?;
    if !store.schedule_cancel(event, &change).await.map_err(|_| unavailable())? {
        return Err(error(StatusCode::NOT_FOUND, "change_not_found", "no such change waits in this room's schedule"));
    }
    tracing::info!(event, id = change, "scheduled change cancelled");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /admin/signin-codes` `{"account_token"}`: a demo sign-in code for that account token, good once for
/// a few minutes at `GET /queue/{event}/signin?code=` (a node with `GATEWAY_DEV_SIGNIN` only). The token is
/// checked when the code is exchanged.
async fn post_signin_code(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Refused> {
    if !authorised(&headers, &state.token) {
        return Err(error(StatusCode::UNAUTHORIZED, "admin_token_required", "the admin API needs its bearer token"));
    }
    #[derive(serde::Deserialize)]
    struct Ask {
        account_token: String,
    }
    let ask: Ask = json_body(&body, "invalid_request")?;
    if ask.account_token.is_empty() || ask.account_token.len() > tokens::MAX_TOKEN_BYTES {
        return Err(error(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", "account_token is not a token"));
    }
    let store = state.store.get().map_err(|_| unavailable())?;
    let code = crate::edge::queue::new_signin_code();
    let lifetime = crate::edge::queue::SIGNIN_CODE_LIFETIME;
    store.put_signin_code(&code, &ask.account_token, lifetime).await.map_err(|e| {
        tracing::warn!(error = %e, "could not keep a sign-in code");
        unavailable()
    })?;
    let answer = json!({ "code": code, "expires_in_seconds": lifetime.as_secs() });
    Ok((StatusCode::CREATED, axum::Json(answer)).into_response())
}

async fn get_draw(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Path(raw): Path<String>,
) -> Result<Response, Refused> {
    let event = guard(&state, &headers, &raw)?;
    let store = state.store.get().map_err(|_| unavailable())?;
    let draw = store
        .draw(event)
        .await
        .map_err(|_| unavailable())?
        .ok_or_else(|| error(StatusCode::NOT_FOUND, "no_draw", "this event's pre-queue has not been drawn"))?;
    let places = store.accounts_at(event, draw.base, draw.join_order.len() as u64).await.map_err(|_| unavailable())?;
    let view = DrawView {
        event_id: event,
        algorithm: DRAW_ALGORITHM.into(),
        seed: draw.seed,
        base: draw.base,
        drawn_at_ms: draw.at_ms,
        join_order: draw.join_order,
        places,
    };
    Ok(axum::Json(view).into_response())
}
