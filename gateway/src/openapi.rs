//! The gateway's OpenAPI document: the waiting room (public listener) and the admin API (admin listener).
//! pingora phases are not handlers, so each operation is declared here on a marker function, with the response
//! types the code serialises (`QueueAnswer`, `RoomView`, ...). `gateway openapi` prints it; the committed copy
//! (`gateway/openapi.json`) is checked against it by a test. Requests forwarded to booking are described by
//! booking's own document.

#![allow(dead_code)] // The marker functions only carry their annotations.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::admin::{
    CodesMade, DrawView, LiveView, LotteryDrawView, PassAsk, PassView, RoomView, ScheduleAsk, ScheduleView,
};
use crate::codes::{Batch, BatchAsk, BatchView, Redemption, Report};
use crate::edge::queue::QueueAnswer;
use crate::room::{Access, Applied, ChallengeMode, QueueState, Queueing, RateMode, Scheduled, SettingsPatch};

/// Every error: `{"error": "<stable_code>", "message": "<sentence>", ...details}`.
#[derive(ToSchema)]
pub struct ErrorBody {
    pub error: String,
    pub message: String,
}

/// Join an event's queue (or its pre-queue), once per account. While the room's `challenge` is on, a join that
/// gives a new place pays with a solved proof-of-work challenge (ALTCHA v2): the 428 answer carries
/// `challenge` (sign-protected parameters) and `difficulty`; solve it and join again with the solution in the
/// `altcha` field (docs/api.md has the steps).
#[utoipa::path(post, path = "/queue/{event_id}/join", tag = "queue",
    params(
        ("event_id" = i64, Path, minimum = 1, description = "event id"),
        ("altcha" = Option<String>, Header, description = "base64 of `{\"challenge\", \"solution\": {\"counter\", \"derivedKey\"}}`"),
        ("sponsor-pass" = Option<String>, Header, description = "a sponsor pass for this account and event: admitted at once (within `max_active`), once"),
        ("presale-code" = Option<String>, Header, description = "a presale code for this event (case, dashes and spaces do not matter); redeemed once per account while the room's `access` is `code_required` or `codes_first`"),
    ),
    security(("account" = [])),
    responses(
        (status = 200, body = QueueAnswer, description = "the fan's place (or admission), with its ticket"),
        (status = 400, body = ErrorBody, description = "challenge_malformed, code_malformed, ..."),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody, description = "challenge_failed, challenge_not_yours, pass_invalid, \
            pass_expired, pass_not_yours, code_required, code_unknown, code_other_event, code_not_yet (with \
            `starts_at`), code_ended (with `ended_at`)"),
        (status = 404, body = ErrorBody), (status = 405, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "queue_closed, sold_out, challenge_spent, pass_spent, \
            room_full, code_spent, no_places (a `reject` room is full: with `Retry-After`)"),
        (status = 428, body = ErrorBody, description = "challenge_required, challenge_expired: with `challenge`, \
            `difficulty` and `field`"),
        (status = 429, body = ErrorBody), (status = 503, body = ErrorBody),
    ))]
fn join() {}

/// Leave the room: the fan's slot goes to the next fan at once, its admission ends on every node, and a fan
/// still waiting gives up its place. Said with the admission proof or the queue ticket (Bearer, or the ticket's
/// cookie). Leaving twice is leaving once.
#[utoipa::path(post, path = "/queue/{event_id}/leave", tag = "queue",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    security(("ticket" = [])),
    responses(
        (status = 200, body = Left, description = "`state`: `left`; the ticket's cookie is cleared"),
        (status = 400, body = ErrorBody, description = "invalid_path"),
        (status = 401, body = ErrorBody, description = "proof_required"),
        (status = 403, body = ErrorBody, description = "ticket_wrong_event"),
        (status = 404, body = ErrorBody), (status = 405, body = ErrorBody), (status = 429, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ))]
fn leave() {}

/// What leaving answers.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct Left {
    event_id: i64,
    /// `left`.
    state: String,
}

/// The waiting-room page's proof-of-work worker (JavaScript, cacheable).
#[utoipa::path(get, path = "/queue/{event_id}/solver.js", tag = "queue",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    responses(
        (status = 200, content_type = "text/javascript", body = String, description = "the worker"),
        (status = 400, body = ErrorBody), (status = 405, body = ErrorBody),
    ))]
fn solver() {}

/// Where the fan stands; when admitted, the admission proof.
#[utoipa::path(get, path = "/queue/{event_id}/status", tag = "queue",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    security(("ticket" = [])),
    responses(
        (status = 200, body = QueueAnswer),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 405, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "place_lapsed, session_ended: join again"),
        (status = 429, body = ErrorBody), (status = 503, body = ErrorBody),
    ))]
fn status() {}

/// The waiting-room page (HTML); the status as JSON with `Accept: application/json`.
#[utoipa::path(get, path = "/queue/{event_id}", tag = "queue",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    responses(
        (status = 200, content_type = "text/html", body = String, description = "the page"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 405, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 503, body = ErrorBody),
    ))]
fn page() {}

/// The live seat map as Server-Sent Events, served by the gateway from the event's change log (no admission
/// proof: availability is public; under the per-IP limit). A fresh stream opens with `event: version`
/// (`{"version", "status"}`: read the status, then apply deltas past its version). Then `event: delta` with
/// `id: <version>` and `{"from", "version", "at", "changes": [[seat_id, "a" | "h" | "s"], ...]}` (available,
/// held, sold; in order, the last for a seat wins; `at`: when the first was made, unix ms), and a
/// `: heartbeat` comment every 15 s. `Last-Event-ID` (or
/// `?since=<version>`) resumes after that version from the log, at most 512 versions back; `event: resync`
/// (`{"reason", "status"}`) ends a stream that cannot be carried on: the log no longer reaches back that far,
/// the client is further behind than a replay goes (`too_far_behind`), or it fell behind. A stream ends by
/// itself after its lifetime (an hour by default): resume with `Last-Event-ID`. Streams are capped per client
/// address prefix (429 `too_many_streams`), per event and per node (503 `streams_full`), with `Retry-After`.
#[utoipa::path(get, path = "/events/{event_id}/seats/stream", tag = "seat map",
    params(
        ("event_id" = i64, Path, minimum = 1, description = "event id"),
        ("since" = Option<u64>, Query, description = "resume after this map version (a status's `version`)"),
        ("Last-Event-ID" = Option<u64>, Header, description = "resume after this map version (EventSource sends it)"),
    ),
    responses(
        (status = 200, content_type = "text/event-stream", body = String, description = "the stream"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody, description = "no room for this event"),
        (status = 405, body = ErrorBody),
        (status = 429, body = ErrorBody, description = "`rate_limited`, `too_many_streams`"),
        (status = 503, body = ErrorBody, description = "`queue_unavailable`, `streams_full`"),
    ))]
fn seat_stream() {}

/// The gateway is up.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, description = "alive")))]
fn healthz() {}

/// A room's settings and this node's live figures (admin listener).
#[utoipa::path(get, path = "/admin/events/{event_id}", tag = "admin",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    security(("admin" = [])),
    responses(
        (status = 200, body = RoomView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ))]
fn get_room() {}

/// Create a room or change its settings (admin listener); every node applies it within a second.
#[utoipa::path(put, path = "/admin/events/{event_id}", tag = "admin",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    request_body = SettingsPatch,
    security(("admin" = [])),
    responses(
        (status = 200, body = RoomView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "state_change_refused"),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody),
    ))]
fn put_room() {}

/// Retire a room now (admin listener): its places, codes and history are deleted, and every node forgets it
/// within a tick; a later PUT makes it anew, empty. Rooms over for `GATEWAY_RETIRE_AFTER_SECONDS` retire on
/// their own.
#[utoipa::path(delete, path = "/admin/events/{event_id}", tag = "admin",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    security(("admin" = [])),
    responses(
        (status = 204, description = "retired"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "queue_not_found: no room to retire"),
        (status = 503, body = ErrorBody),
    ))]
fn delete_room() {}

/// Mint a sponsor pass for one account and this event (admin listener): signed, expiring, single use.
#[utoipa::path(post, path = "/admin/events/{event_id}/passes", tag = "admin",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    request_body = PassAsk,
    security(("admin" = [])),
    responses(
        (status = 201, body = PassView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody),
    ))]
fn post_pass() {}

/// Make a batch of presale codes for this room (admin listener): `count` single-use codes, or one code that
/// `uses` accounts share, each working from `starts_at` until `ends_at`.
#[utoipa::path(post, path = "/admin/events/{event_id}/codes", tag = "admin",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    request_body = BatchAsk,
    security(("admin" = [])),
    responses(
        (status = 201, body = CodesMade),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "code_exists"),
        (status = 422, body = ErrorBody, description = "invalid_request, setting_out_of_range"),
        (status = 503, body = ErrorBody),
    ))]
fn post_codes() {}

/// A room's presale codes: its batches with their redemptions counted, and who redeemed which code (newest
/// first, at most 10,000) (admin listener).
#[utoipa::path(get, path = "/admin/events/{event_id}/codes", tag = "admin",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    security(("admin" = [])),
    responses(
        (status = 200, body = Report),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ))]
fn get_codes() {}

/// The recorded pre-queue draw, for anyone to recompute (admin listener).
#[utoipa::path(get, path = "/admin/events/{event_id}/draw", tag = "admin",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    security(("admin" = [])),
    responses(
        (status = 200, body = DrawView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ))]
fn get_draw() {}

/// Schedule a change of this room's settings (admin listener): `set` (as `PUT` takes it) applies at `at`, on
/// every node within a second of it.
#[utoipa::path(post, path = "/admin/events/{event_id}/schedule", tag = "admin",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    security(("admin" = [])),
    request_body = ScheduleAsk,
    responses(
        (status = 201, body = Scheduled),
        (status = 400, body = ErrorBody, description = "invalid_path"),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody, description = "queue_not_found"),
        (status = 409, body = ErrorBody, description = "schedule_full"),
        (status = 422, body = ErrorBody, description = "invalid_schedule, setting_out_of_range, state_not_settable, \
            empty_change"),
        (status = 503, body = ErrorBody),
    ))]
fn post_schedule() {}

/// A room's schedule: the changes waiting, and the last applied with their outcome (admin listener).
#[utoipa::path(get, path = "/admin/events/{event_id}/schedule", tag = "admin",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    security(("admin" = [])),
    responses(
        (status = 200, body = ScheduleView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ))]
fn get_schedule() {}

/// Cancel a change still waiting in a room's schedule (admin listener).
#[utoipa::path(delete, path = "/admin/events/{event_id}/schedule/{change_id}", tag = "admin",
    params(("event_id" = i64, Path, minimum = 1, description = "event id"), ("change_id" = String, Path, description = "the change's id")),
    security(("admin" = [])),
    responses(
        (status = 204, description = "cancelled"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "queue_not_found, change_not_found"),
        (status = 503, body = ErrorBody),
    ))]
fn delete_scheduled() {}

/// A lottery room's draws, oldest first: each with its seed, its pool in join order and the places it gave, so
/// anyone can recompute them (admin listener).
#[utoipa::path(get, path = "/admin/events/{event_id}/lottery", tag = "admin",
    params(("event_id" = i64, Path, minimum = 1, description = "event id")),
    security(("admin" = [])),
    responses(
        (status = 200, body = LotteryDraws),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ))]
fn get_lottery() {}

/// What `GET /admin/events/{event_id}/lottery` answers.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct LotteryDraws {
    event_id: i64,
    algorithm: String,
    draws: Vec<LotteryDrawView>,
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Waiting-room gateway API", description = "The waiting room on the public listener, the admin \
        API on the admin listener. `/events/{event_id}/...` is forwarded to booking (see booking's document) with \
        an admission proof; `/events/{event_id}/seats/status` and `/seats/layout/{catalogue_version}` without \
        one, under the per-IP limit."),
    paths(join, leave, solver, status, page, seat_stream, healthz, get_room, put_room, delete_room, post_pass, post_codes, get_codes, get_draw, post_schedule, get_schedule, delete_scheduled, get_lottery),
    components(schemas(ErrorBody, Left, QueueAnswer, RoomView, LiveView, DrawView, PassAsk, PassView, SettingsPatch, QueueState, ChallengeMode, Access, BatchAsk, CodesMade, Report, BatchView, Batch, Redemption, Queueing, RateMode, ScheduleAsk, ScheduleView, Scheduled, Applied, LotteryDraws, LotteryDrawView)),
    modifiers(&Security),
)]
struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        for (name, what) in [
            ("account", "The platform's account token (or `booking token account`)"),
            ("ticket", "The queue ticket that joining gave"),
            ("admin", "The admin listener's bearer token (GATEWAY_ADMIN_TOKEN)"),
        ] {
            let scheme = HttpBuilder::new().scheme(HttpAuthScheme::Bearer).description(Some(what)).build();
            components.add_security_scheme(name, SecurityScheme::Http(scheme));
        }
    }
}

/// The document as pretty JSON.
pub fn document() -> String {
    ApiDoc::openapi().to_pretty_json().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_committed_document_matches_the_code() {
        let committed = include_str!("../openapi.json");
        assert!(
            committed.trim_end() == super::document().trim_end(),
            "gateway/openapi.json is stale: run `cargo run -p gateway -- openapi > gateway/openapi.json`"
        );
    }
}
