//! The waiting room's public endpoints: join, status and the page. Each returns a [`Reply`] that the proxy
//! writes. Status polls are answered from the node-local view ([`Rooms`]); only a join (and the first poll
//! after a pre-queue draw) calls Redis.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokens::{AccountId, AdmissionClaims, Keyring, TicketClaims, TokenError, unix_now};

use super::reply::Reply;
use crate::gate::Gate;
use crate::limits::Limits;
use crate::metrics::record_gate;
use crate::room::{self, ChallengeMode, EtaSample, Freshness, QueueState, Rooms, Standing};
use crate::store::{CodeRefusal, Freed, FreedBy, Joined, Joining, LazyStore, Passed, QueueStore, Stepped};
use tokens::times::rfc3339_seconds;

/// Cookie carrying the platform's account token for browsers (set by the platform's login, `HttpOnly`; or by
/// the demo sign-in). The gateway never takes an account from a URL: a link that signed its reader in would
/// sign a victim in as the attacker who made it (login CSRF), who then owns what the victim queues for and buys.
pub const ACCOUNT_COOKIE: &str = "wr_account";

/// How long a demo sign-in code may wait to be exchanged.
pub const SIGNIN_CODE_LIFETIME: Duration = Duration::from_secs(300);

/// Cookie carrying an event's queue ticket.
pub fn ticket_cookie(event: i64) -> String {
    format!("wr_queue_{event}")
}

/// What joining and polling answer (200).
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct QueueAnswer {
    pub event_id: i64,
    /// `waiting`, `admitted`, `paused`, `closed` or `sold_out`.
    pub state: String,
    /// Waiting in the pre-queue: the place is drawn at the opening.
    pub prequeue: bool,
    /// 1 is next; null in the pre-queue, or when admitted, closed or sold out.
    pub position: Option<u64>,
    /// Seconds until admission: at the room's rate while it has room; while it is full, when slots free (the
    /// oldest sessions' ends, or the pace of recent frees); until the opening in the pre-queue. Null when
    /// nothing can be promised.
    pub eta_seconds: Option<u64>,
    /// When to poll again (server pacing, with jitter).
    pub poll_after_ms: u64,
    /// Fans in the pre-queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prequeue_size: Option<u64>,
    /// When the pre-queue opens by itself (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opens_at: Option<String>,
    /// In a `lottery` room's pool: the next draw gives the fan a random place. Present (true) only then.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub in_draw: bool,
    /// When the next draw is (RFC 3339), and how many fans are in its pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draw_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draw_pool: Option<u64>,
    /// The signed queue ticket (also set as the `wr_queue_{event_id}` cookie): present on a join, and when a
    /// poll hands out a new one (a pre-queue place drawn).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ticket: Option<String>,
    /// When admitted: the admission proof for `/events/{event_id}/...` (also the `wr_admission` cookie).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission_token: Option<String>,
    /// When admitted (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admitted_at: Option<String>,
    /// When the admission ends (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// Where an admitted fan goes next.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Every seat left is held by fans admitted earlier: nobody is admitted until some come back (holds that
    /// run out, checkouts that fail), so there is no ETA meanwhile. Present (true) only then.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub all_held: bool,
    /// The room lets nobody in for now, though it is open (`queue_all`): the fan keeps its place, and there is
    /// no ETA meanwhile. Present (true) only then.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub queue_all: bool,
    /// While all held: how many seats may come back (held, or in orders awaiting payment).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seats_may_return: Option<u64>,
    /// While all held: when the earliest hold or payment window among them ends (RFC 3339), the first moment
    /// the queue may move again. In the past: any moment now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_release_at: Option<String>,
    /// Waiting behind the presale code holders (the room admits them first): joining again with a code moves
    /// the fan among them. Present (true) only then.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub behind_code_holders: bool,
}

impl QueueAnswer {
    fn new(event: i64, state: &str) -> Self {
        Self {
            event_id: event,
            state: state.to_owned(),
            prequeue: false,
            position: None,
            eta_seconds: None,
            poll_after_ms: 5000,
            prequeue_size: None,
            opens_at: None,
            in_draw: false,
            draw_at: None,
            draw_pool: None,
            ticket: None,
            admission_token: None,
            admitted_at: None,
            expires_at: None,
            next: None,
            all_held: false,
            queue_all: false,
            seats_may_return: None,
            next_release_at: None,
            behind_code_holders: false,
        }
    }
}

/// A fan's place on its way out (a 200 reply): the body and the cookies that go with it.
struct Placed {
    body: QueueAnswer,
    cookies: Vec<String>,
    /// When admitted: when (Redis's clock, ms).
    admitted_at_ms: Option<u64>,
}

impl From<QueueAnswer> for Placed {
    fn from(body: QueueAnswer) -> Self {
        Self { body, cookies: Vec::new(), admitted_at_ms: None }
    }
}

impl From<Placed> for Reply {
    fn from(answer: Placed) -> Self {
        let body = serde_json::to_value(&answer.body).unwrap_or_default();
        answer.cookies.into_iter().fold(Reply::json(200, &body), |reply, c| reply.header("set-cookie", c))
    }
}

fn bearer(authorization: Option<&str>) -> Option<&str> {
    let (scheme, token) = authorization?.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Tunables of the queue endpoints.
#[derive(Debug, Clone)]
pub struct QueueOptions {
    pub account_issuer: String,
    pub ticket_ttl_seconds: u64,
    pub stale_after: Duration,
    pub cookie_secure: bool,
    pub admit_burst: Duration,
    pub max_walk: u64,
    /// `GET /queue/{id}/signin` exchanges demo sign-in codes (made on the admin listener) for the account
    /// cookie. Off in production: a platform signs its fans in itself.
    pub dev_signin: bool,
    /// The prefix lengths (IPv4, IPv6) a room's `places_per_network` counts places by.
    pub network_prefix: (u8, u8),
}

/// The queue endpoints of one proxy service.
pub struct Queue {
    /// Signs admission proofs and queue tickets.
    pub admission: Arc<Keyring>,
    /// Verifies the platform's account tokens.
    pub accounts: Keyring,
    pub rooms: Arc<Rooms>,
    pub store: LazyStore,
    /// Issues and checks the proof-of-work challenges of rooms whose `challenge` is on.
    pub gate: Gate,
    /// The rate limits: a join that sends a presale code spends one of its account's budget, and a refused
    /// code one more of the account's and of the address's, so codes cannot be guessed faster than the limits.
    pub limits: Arc<Limits>,
    pub options: QueueOptions,
}

/// What a join brings: the account (`Authorization` or the account cookie), a solved challenge (`altcha`), a
/// sponsor pass (`sponsor-pass`), and the client's address as the limits read it.
#[derive(Debug, Clone, Copy)]
pub struct JoinAsk<'a> {
    pub authorization: Option<&'a str>,
    pub cookies: &'a [&'a str],
    pub altcha: Option<&'a str>,
    pub pass: Option<&'a str>,
    /// A presale code (`presale-code`), as the fan typed it.
    pub code: Option<&'a str>,
    pub client: Option<IpAddr>,
}

/// The request field a sponsor pass comes in.
pub const PASS_HEADER: &str = "sponsor-pass";

/// A demo sign-in code: 32 lowercase hex digits (128 random bits).
pub fn is_signin_code(code: &str) -> bool {
    code.len() == 32 && code.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A new demo sign-in code.
pub fn new_signin_code() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl Queue {
    fn cookie(&self, name: &str, value: &str, path: &str, max_age: u64) -> String {
        let secure = if self.options.cookie_secure { "; Secure" } else { "" };
        format!("{name}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Lax{secure}")
    }

    /// The claims of a new ticket for `account`'s `place` (0: none yet) in `event`'s queue.
    fn claims(&self, account: &AccountId, event: i64, place: u64) -> TicketClaims {
        TicketClaims::new(account.clone(), event, place, unix_now(), self.options.ticket_ttl_seconds)
    }

    fn ticket(&self, account: &AccountId, event: i64, place: u64) -> String {
        self.admission.sign(&self.claims(account, event, place))
    }

    /// `GET /queue/{event}/signin?code=`: the demo sign-in. The code (made by the admin listener for one
    /// account token, `deploy/stack url`) is good once and for a few minutes; the answer sets the account
    /// cookie (`HttpOnly`, `SameSite=Lax`, `Secure` unless turned off) and sends the browser to the room.
    pub async fn signin(&self, event: i64, query: Option<&str>) -> Reply {
        if !self.options.dev_signin {
            return Reply::error(404, "not_found", "no such route");
        }
        let code = query.into_iter().flat_map(|q| q.split('&')).find_map(|pair| pair.strip_prefix("code="));
        let Some(code) = code.filter(|c| is_signin_code(c)) else {
            return Reply::error(400, "invalid_request", "a sign-in link carries `code`, 32 hex digits");
        };
        let store = match self.store.get() {
            Ok(store) => store,
            Err(_) => return Reply::unavailable(),
        };
        let token = match store.take_signin_code(code).await {
            Ok(Some(token)) => token,
            Ok(None) => {
                return Reply::error(401, "signin_code_invalid", "this sign-in link is unknown, used or expired");
            }
            Err(e) => {
                tracing::warn!(error = %e, "sign-in: Redis did not answer");
                return Reply::unavailable();
            }
        };
        let claims = match self.accounts.verify_account(&token, &self.options.account_issuer) {
            Ok(claims) => claims,
            Err(TokenError::Expired) => return Reply::error(401, "account_expired", "the account token has expired"),
            Err(e) => return Reply::error(401, "account_invalid", &format!("the account token is not valid: {e}")),
        };
        let max_age = claims.exp.saturating_sub(unix_now());
        Reply { status: 303, headers: Vec::new(), body: bytes::Bytes::new() }
            .header("location", format!("/queue/{event}"))
            .header("set-cookie", self.cookie(ACCOUNT_COOKIE, &token, "/queue", max_age))
            .header("cache-control", "no-store".into())
            .header("referrer-policy", "no-referrer".into())
    }

    /// `POST /queue/{event}/join` with an account token, and while the room's challenge is on, a solved
    /// challenge in the `altcha` field (`crate::gate`).
    pub async fn join(&self, event: i64, ask: &JoinAsk<'_>) -> Reply {
        let JoinAsk { authorization, cookies, altcha, pass, code, client } = *ask;
        let Some(token) = bearer(authorization).or_else(|| tokens::cookie(cookies.iter().copied(), ACCOUNT_COOKIE))
        else {
            return Reply::error(401, "account_required", "joining needs an account token (Authorization: Bearer)");
        };
        let account = match self.accounts.verify_account(token, &self.options.account_issuer) {
            Ok(claims) => claims.sub,
            Err(TokenError::Expired) => return Reply::error(401, "account_expired", "the account token has expired"),
            Err(e) => return Reply::error(401, "account_invalid", &format!("the account token is not valid: {e}")),
        };
        let Ok(store) = self.store.get() else { return Reply::unavailable() };
        if let Some(pass) = pass {
            return self.join_on_pass(store, event, &account, pass).await;
        }
        let code = match code.map(crate::codes::normalise) {
            None => String::new(),
            Some(Some(code)) => {
                if let Err(wait) = self.limits.check_account(&account) {
                    crate::metrics::record_rate_limited("account");
                    return super::too_many(wait);
                }
                code
            }
            Some(None) => {
                self.code_refused(&account, client);
                return Reply::error(400, "code_malformed", "a presale code is 4 to 32 letters and digits");
            }
        };
        let settings = self.settings(store, event).await;
        let gated = settings.as_ref().is_some_and(|s| s.challenge != ChallengeMode::Off);
        // A solution is checked here, in process; that it was not spent before, Redis says as it gives the
        // place. One sent to a room without a challenge is ignored.
        let payment = match altcha.map(|field| self.gate.check(field, event, account.as_str())) {
            Some(Ok(paid)) => Some(paid),
            Some(Err(failure)) if gated => {
                record_gate(failure.code().trim_start_matches("challenge_"));
                if !failure.is_forgery() {
                    return self.challenge(
                        event,
                        &account,
                        settings.as_ref(),
                        "challenge_expired",
                        &failure.to_string(),
                    );
                }
                return self.failed(event, &account, settings.as_ref(), failure.code(), &failure.to_string());
            }
            _ => None,
        };
        let (v4, v6) = self.options.network_prefix;
        let network = client.map(|ip| crate::limits::address_prefix(ip, v4, v6).to_string()).unwrap_or_default();
        let joining = Joining { account: account.as_str(), network: &network, payment: payment.as_ref(), code: &code };
        let mut joined = store.join(event, &joining, self.rooms.floor(event)).await;
        if matches!(joined, Ok(Joined::Opening)) {
            // The pre-queue's opening time has passed and no ticker has opened it yet: open it (the script
            // does nothing if another node just did), then join as a live fan.
            let seed = crate::room::shuffle::seed_from(rand::random());
            if store.set_state(event, QueueState::Open, seed, Some(QueueState::Prequeue)).await.is_err() {
                return Reply::unavailable();
            }
            joined = store.join(event, &joining, self.rooms.floor(event)).await;
        }
        let joined = match joined {
            Ok(joined) => joined,
            Err(e) => {
                tracing::warn!(error = %e, event, "join failed");
                return Reply::unavailable();
            }
        };
        let given = matches!(
            joined,
            Joined::Place { .. } | Joined::Prequeue { .. } | Joined::Later { .. } | Joined::Pool { .. }
        );
        if gated && payment.is_some() && given {
            record_gate("solved");
        }
        if !code.is_empty() && given {
            crate::metrics::record_code("accepted");
        }
        match joined {
            Joined::Unknown => Reply::error(404, "queue_not_found", "this event has no waiting room"),
            Joined::ChallengeRequired => self.challenge(
                event,
                &account,
                settings.as_ref(),
                "challenge_required",
                "this waiting room asks for a solved proof-of-work challenge to join: solve this one and join \
                 again with the solution in the `altcha` field",
            ),
            Joined::NetworkFull { cap } => {
                record_gate("network_full");
                Reply::error_with(
                    429,
                    "too_many_places",
                    "this network (your address's prefix) was given as many places in this queue as one network may",
                    json!({ "places_per_network": cap }),
                )
                .header("retry-after", "60".into())
            }
            Joined::Pool { count } => {
                let ticket = self.ticket(&account, event, 0);
                self.with_ticket(self.pool_body(event, count), event, &ticket).into()
            }
            Joined::NoPlaces => Reply::error(
                409,
                "no_places",
                "every place in this room is taken and it turns new fans away while it is full: try again later",
            )
            .header("retry-after", "60".into()),
            Joined::Spent => {
                record_gate("spent");
                self.failed(event, &account, settings.as_ref(), "challenge_spent", "that solution was already used")
            }
            // Still opening after our own attempt to open it: a moment's race; the fan retries.
            Joined::Opening => Reply::unavailable(),
            Joined::Closed(state) => closed(state),
            Joined::Prequeue { count } => {
                let ticket = self.ticket(&account, event, 0);
                let opens_at_ms = self.rooms.get(event).and_then(|r| r.live.settings.opens_at_ms);
                self.with_ticket(self.prequeue_body(event, count, opens_at_ms), event, &ticket).into()
            }
            Joined::Code(refusal) => {
                if refusal != CodeRefusal::Required {
                    self.code_refused(&account, client);
                }
                self.code_refusal(store, event, &code, refusal).await
            }
            Joined::Later { number, position } => {
                let mut claims = self.claims(&account, event, 0);
                claims.later = number;
                let ticket = self.admission.sign(&claims);
                let settings = settings.unwrap_or(room::Settings::DEFAULT);
                let mut answer = self.waiting(event, &settings, position.max(1));
                answer.body.behind_code_holders = true;
                self.with_ticket(answer, event, &ticket).into()
            }
            Joined::Place { place, head, fresh } => {
                self.rooms.gave(event, place);
                let answer = self.placed_body(store, event, &account, place, head, fresh).await;
                answer.map_or_else(
                    |refusal| refusal,
                    |a| {
                        // The wait promised now travels with the ticket, to be set against the wait the fan has.
                        let mut claims = self.claims(&account, event, place);
                        claims.eta = a.body.eta_seconds.filter(|_| a.body.state == "waiting");
                        let ticket = self.admission.sign(&claims);
                        self.with_ticket(a, event, &ticket).into()
                    },
                )
            }
        }
    }

    /// What a refused presale code costs its sender: one more of its account's budget and of its address's.
    fn code_refused(&self, account: &AccountId, client: Option<IpAddr>) {
        crate::metrics::record_code("refused");
        let _ = self.limits.check_account(account);
        if let Some(ip) = client {
            let _ = self.limits.check_ip(ip);
        }
    }

    /// The answer to a refused presale code (or to a code-less join of a room that takes code holders only).
    async fn code_refusal(&self, store: &QueueStore, event: i64, code: &str, refusal: CodeRefusal) -> Reply {
        match refusal {
            CodeRefusal::Required => Reply::error(
                403,
                "code_required",
                "this waiting room takes presale code holders only: join again with your code in the \
                 `presale-code` field",
            ),
            CodeRefusal::Unknown => match store.code_room(code).await {
                Ok(Some(other)) if other != event => {
                    Reply::error(403, "code_other_event", "this presale code is for another event")
                }
                Ok(_) => Reply::error(403, "code_unknown", "this event has no such presale code"),
                Err(_) => Reply::unavailable(),
            },
            CodeRefusal::Spent => {
                Reply::error(409, "code_spent", "this presale code was redeemed by as many accounts as it allows")
            }
            CodeRefusal::NotYet { starts_ms } => Reply::error_with(
                403,
                "code_not_yet",
                "this presale code does not work yet",
                json!({ "starts_at": rfc3339_seconds(starts_ms / 1000) }),
            ),
            CodeRefusal::Ended { ends_ms } => Reply::error_with(
                403,
                "code_ended",
                "this presale code no longer works",
                json!({ "ended_at": rfc3339_seconds(ends_ms / 1000) }),
            ),
        }
    }

    /// A join with a sponsor pass: admitted at once, within the room's `max_active`, once per pass.
    async fn join_on_pass(&self, store: &QueueStore, event: i64, account: &AccountId, pass: &str) -> Reply {
        let claims = match self.admission.verify_pass(pass) {
            Ok(claims) => claims,
            Err(TokenError::Expired) => return Reply::error(403, "pass_expired", "this sponsor pass has expired"),
            Err(e) => return Reply::error(403, "pass_invalid", &format!("the sponsor pass is not valid: {e}")),
        };
        if claims.evt != event || claims.sub != *account {
            return Reply::error(403, "pass_not_yours", "this sponsor pass is for another event or account");
        }
        let passed = store.admit_pass(event, account.as_str(), &claims.jti, claims.exp * 1000).await;
        match passed {
            Ok(Passed::Admitted { at_ms, session_seconds }) => {
                crate::metrics::record_pass("admitted");
                self.admitted(event, account, at_ms, at_ms + session_seconds * 1000).into()
            }
            Ok(Passed::Spent) => {
                crate::metrics::record_pass("spent");
                Reply::error(409, "pass_spent", "this sponsor pass was used before")
            }
            Ok(Passed::Full { max_active }) => {
                crate::metrics::record_pass("full");
                Reply::error_with(
                    409,
                    "room_full",
                    "the room has as many fans in as it takes; the pass is kept: try again shortly",
                    json!({ "max_active": max_active }),
                )
                .header("retry-after", "10".into())
            }
            Ok(Passed::Closed(state)) => closed(state),
            Ok(Passed::Unknown) => Reply::error(404, "queue_not_found", "this event has no waiting room"),
            Err(e) => {
                tracing::warn!(error = %e, event, "pass failed");
                Reply::unavailable()
            }
        }
    }

    /// The room's settings as this node sees them, or as Redis has them for a room made a moment ago.
    async fn settings(&self, store: &QueueStore, event: i64) -> Option<room::Settings> {
        match self.rooms.get(event) {
            Some(room) => Some(room.live.settings.clone()),
            None => store.settings(event).await.ok().flatten(),
        }
    }

    /// 428 with a new challenge for `account` to join `event`'s queue.
    fn challenge(
        &self,
        event: i64,
        account: &AccountId,
        settings: Option<&room::Settings>,
        code: &str,
        message: &str,
    ) -> Reply {
        let difficulty = settings.map_or(room::Settings::DEFAULT.challenge_difficulty, |s| s.challenge_difficulty);
        let challenge = self.gate.issue(event, account.as_str(), difficulty, unix_now());
        record_gate("issued");
        let details = json!({ "challenge": challenge, "difficulty": difficulty, "field": crate::gate::HEADER });
        Reply::error_with(428, code, message, details)
    }

    /// The answer to a forged or spent solution: a refusal, or in a room that holds such clients in an endless
    /// queue, a waiting fan's answer whose ticket never advances (it holds no place).
    fn failed(
        &self,
        event: i64,
        account: &AccountId,
        settings: Option<&room::Settings>,
        code: &str,
        message: &str,
    ) -> Reply {
        let Some(settings) = settings.filter(|s| s.infinite_queue_for_failed) else {
            let status = match code {
                "challenge_malformed" => 400,
                "challenge_spent" => 409,
                _ => 403,
            };
            return Reply::error(status, code, message);
        };
        record_gate("held");
        // At the back of the line as this node knows it (its view, and the places it gave since).
        let head = self.rooms.get(event).map_or(0, |room| room.live.counts.head);
        let position = self.rooms.floor(event).saturating_sub(head) + 1;
        let mut claims = self.claims(account, event, position);
        claims.held = true;
        let ticket = self.admission.sign(&claims);
        self.with_ticket(self.waiting(event, settings, position), event, &ticket).into()
    }

    async fn placed_body(
        &self,
        store: &QueueStore,
        event: i64,
        account: &AccountId,
        place: u64,
        head: u64,
        fresh: bool,
    ) -> Result<Placed, Reply> {
        let room = self.rooms.get(event);
        let now_ms = room.as_ref().map_or(unix_now() * 1000, |r| r.live.now_ms());
        // A node that has not yet read the room (it was made a moment ago) reads its settings now: a fan admitted
        // at once gets the room's session, never a default one. If they cannot be read, the fan waits a tick.
        let settings = match &room {
            Some(r) => Some(r.live.settings.clone()),
            None => store.settings(event).await.ok().flatten(),
        };
        let known = settings.is_some();
        let settings = settings.unwrap_or(room::Settings::DEFAULT);
        if fresh && place == head + 1 && known && settings.state == QueueState::Open {
            // First in line: one admission step now, so a fan who arrives while there is room and nobody waits
            // is admitted at once rather than at the next tick.
            if let Ok(Stepped::Moved { head: new_head, .. }) =
                store.admit(event, self.options.max_walk, self.options.admit_burst).await
                && new_head >= place
            {
                // Bring this node's view up to the step, so the fan's next poll here agrees with this answer.
                if let Err(e) = crate::view::refresh(store, &self.rooms, event).await {
                    tracing::warn!(error = %e, event, "refresh after an immediate admission failed");
                }
                let until_ms = now_ms + u64::from(settings.session_seconds) * 1000;
                return Ok(self.admitted(event, account, now_ms, until_ms));
            }
        }
        if place <= head {
            // Already admitted earlier (joining again within the session): the status path knows the details.
            return match room {
                Some(room) => self.standing_reply(event, account, &room, place, now_ms),
                None => Err(Reply::unavailable()),
            };
        }
        Ok(self.waiting(event, &settings, place - head))
    }

    /// Hands out a ticket: in the body (for apps) and as the event's queue cookie (for browsers).
    fn with_ticket(&self, mut answer: Placed, event: i64, ticket: &str) -> Placed {
        let ttl = self.options.ticket_ttl_seconds;
        answer.cookies.push(self.cookie(&ticket_cookie(event), ticket, &format!("/queue/{event}"), ttl));
        answer.body.ticket = Some(ticket.to_owned());
        answer
    }

    fn prequeue_body(&self, event: i64, count: u64, opens_at_ms: Option<u64>) -> Placed {
        let eta = opens_at_ms.map(|at| (at / 1000).saturating_sub(unix_now()));
        Placed::from(QueueAnswer {
            prequeue: true,
            prequeue_size: Some(count),
            opens_at: opens_at_ms.map(|ms| rfc3339_seconds(ms / 1000)),
            eta_seconds: eta,
            poll_after_ms: room::poll_after_ms(&room::Settings::DEFAULT, eta, jitter()),
            ..QueueAnswer::new(event, "waiting")
        })
    }

    /// A fan in a lottery room's pool: no place until the next draw, which this node's view times.
    fn pool_body(&self, event: i64, count: u64) -> Placed {
        let room = self.rooms.get(event);
        let next_ms = room.as_ref().map(|r| r.live.counts.next_draw_ms).filter(|&ms| ms > 0);
        let now_ms = room.as_ref().map_or(unix_now() * 1000, |r| r.live.now_ms());
        let eta = next_ms.map(|at| at.saturating_sub(now_ms).div_ceil(1000));
        let settings = room.map_or(room::Settings::DEFAULT, |r| r.live.settings.clone());
        Placed::from(QueueAnswer {
            in_draw: true,
            draw_at: next_ms.map(|ms| rfc3339_seconds(ms.div_ceil(1000))),
            draw_pool: Some(count),
            eta_seconds: eta,
            poll_after_ms: room::poll_after_ms(&settings, eta, jitter()),
            ..QueueAnswer::new(event, "waiting")
        })
    }

    fn waiting(&self, event: i64, settings: &room::Settings, position: u64) -> Placed {
        let state = match settings.state {
            QueueState::Open | QueueState::Prequeue => "waiting",
            other => other.as_str(),
        };
        let held = settings.all_held.filter(|_| settings.state == QueueState::Open);
        let queue_all = settings.queue_all && settings.state == QueueState::Open;
        // From this node's view of the room's outflow, or the configured rate for a room it has not read yet.
        let eta = match self.rooms.get(event) {
            _ if held.is_some() || queue_all => None,
            Some(room) => room.live.eta_seconds(position),
            None => room::eta_seconds(settings, position, settings.pace_per_minute()),
        };
        Placed::from(QueueAnswer {
            position: Some(position),
            eta_seconds: eta,
            poll_after_ms: room::poll_after_ms(settings, eta, jitter()),
            all_held: held.is_some(),
            queue_all,
            seats_may_return: held.map(|h| h.seats),
            next_release_at: held.and_then(|h| h.next_release_ms).map(|ms| rfc3339_seconds(ms / 1000)),
            ..QueueAnswer::new(event, state)
        })
    }

    fn admitted(&self, event: i64, account: &AccountId, at_ms: u64, until_ms: u64) -> Placed {
        let now = unix_now();
        let exp = until_ms / 1000;
        let claims = AdmissionClaims { iat: at_ms / 1000, exp, ..AdmissionClaims::new(account.clone(), event, now, 0) };
        let proof = self.admission.sign(&claims);
        let cookie =
            self.cookie(tokens::ADMISSION_COOKIE, &proof, &format!("/events/{event}"), exp.saturating_sub(now));
        let body = QueueAnswer {
            admission_token: Some(proof),
            admitted_at: Some(rfc3339_seconds(at_ms / 1000)),
            expires_at: Some(rfc3339_seconds(exp)),
            next: Some(format!("/events/{event}/buy")),
            ..QueueAnswer::new(event, "admitted")
        };
        Placed { body, cookies: vec![cookie], admitted_at_ms: Some(at_ms) }
    }

    fn standing_reply(
        &self,
        event: i64,
        account: &AccountId,
        room: &room::Room,
        place: u64,
        now_ms: u64,
    ) -> Result<Placed, Reply> {
        let standing = match room.history.read() {
            Ok(history) => room::standing(&room.live, &history, place, now_ms),
            Err(_) => return Err(Reply::unavailable()),
        };
        Err(match standing {
            Standing::Prequeue { count, opens_at_ms } => return Ok(self.prequeue_body(event, count, opens_at_ms)),
            Standing::Waiting { position } => return Ok(self.waiting(event, &room.live.settings, position)),
            Standing::Admitted { at_ms, until_ms } => return Ok(self.admitted(event, account, at_ms, until_ms)),
            Standing::Lapsed => Reply::error(
                409,
                "place_lapsed",
                "your turn came while you were away, so your place was released; join again for a new one",
            ),
            Standing::SessionEnded => {
                Reply::error(409, "session_ended", "your admission has ended; join again for a new place")
            }
            // Handled by the caller, which looks the place up.
            Standing::Drawn => Reply::unavailable(),
        })
    }

    /// `POST /queue/{event}/leave`: the fan is done. Its admission ends on every node and its slot goes to the
    /// next fan at once; a fan still waiting gives up its place. Who leaves is said by its admission proof or its
    /// queue ticket (`Authorization: Bearer`, or the ticket's cookie, which the room's pages send). Leaving
    /// twice is leaving once.
    pub async fn leave(&self, event: i64, authorization: Option<&str>, cookies: &[&str]) -> Reply {
        let candidates = [bearer(authorization), tokens::cookie(cookies.iter().copied(), &ticket_cookie(event))];
        let mut who = None;
        for token in candidates.into_iter().flatten() {
            let found = match self.admission.verify_admission(token) {
                Ok(claims) => Some((claims.sub, claims.evt)),
                Err(_) => self.admission.verify_ticket(token).ok().map(|t| (t.sub, t.evt)),
            };
            if found.is_some() {
                who = found;
                break;
            }
        }
        let Some((account, ticket_event)) = who else {
            return Reply::error(
                401,
                "proof_required",
                "leaving needs the admission proof or the queue ticket of the fan who leaves",
            );
        };
        if ticket_event != event {
            return Reply::error(403, "ticket_wrong_event", "that proof or ticket is for another event");
        }
        let Ok(store) = self.store.get() else { return Reply::unavailable() };
        match store.free(event, account.as_str(), FreedBy::Left).await {
            Ok(Freed::Unknown) => Reply::error(404, "queue_not_found", "this event has no waiting room"),
            Ok(Freed::Now { at_ms } | Freed::NotActive { at_ms }) => {
                // This node's view learns it now; the others at their next read.
                if let Some(room) = self.rooms.get(event)
                    && let Ok(mut left) = room.left.write()
                {
                    left.extend(vec![(account.as_str().to_owned(), at_ms)], at_ms, room.live.settings.session_seconds);
                }
                let cleared = self.cookie(&ticket_cookie(event), "", &format!("/queue/{event}"), 0);
                Reply::json(200, &json!({ "event_id": event, "state": "left" })).header("set-cookie", cleared)
            }
            Err(e) => {
                tracing::warn!(error = %e, event, "leave failed");
                Reply::unavailable()
            }
        }
    }

    /// `GET /queue/{event}/status` with a queue ticket.
    pub async fn status(&self, event: i64, authorization: Option<&str>, cookies: &[&str]) -> Reply {
        let cookie_name = ticket_cookie(event);
        let header = bearer(authorization);
        let cookie = tokens::cookie(cookies.iter().copied(), &cookie_name);
        // A browser may carry the platform's account token in `Authorization` and its ticket in the cookie:
        // whichever candidate is a valid ticket is the one that counts.
        let mut refused = None;
        let mut found = None;
        for token in [header, cookie].into_iter().flatten() {
            match self.admission.verify_ticket(token) {
                Ok(ticket) => {
                    found = Some(ticket);
                    break;
                }
                Err(e) => {
                    refused.get_or_insert((token, e));
                }
            }
        }
        let ticket = match (found, refused) {
            (Some(ticket), _) => ticket,
            (None, None) => {
                return Reply::error(401, "ticket_required", "polling needs the queue ticket that joining gave");
            }
            (None, Some((token, _))) if self.accounts.verify_account(token, &self.options.account_issuer).is_ok() => {
                return Reply::error(
                    401,
                    "ticket_required",
                    "that is an account token; polling needs the queue ticket that joining gave (its `ticket` \
                     field, or the cookie it set)",
                );
            }
            (None, Some((_, TokenError::Expired))) => {
                return Reply::error(401, "ticket_expired", "the queue ticket has expired; join again");
            }
            (None, Some((_, e))) => {
                return Reply::error(401, "ticket_invalid", &format!("the queue ticket is not valid: {e}"));
            }
        };
        if ticket.evt != event {
            return Reply::error(403, "ticket_wrong_event", "the queue ticket is for another event");
        }
        let room = match self.rooms.fresh(event, self.options.stale_after) {
            Ok(room) => room,
            Err(Freshness::Unknown) => return Reply::error(404, "queue_not_found", "this event has no waiting room"),
            Err(Freshness::Stale) => return Reply::unavailable(),
        };
        if ticket.held {
            // Held in the endless queue: the same position for ever, paced like any other, and no place to
            // keep alive.
            let settings = &room.live.settings;
            if let Some(reply) = closed_for_waiting(event, settings, 0, room.live.counts.head) {
                return reply;
            }
            return self.waiting(event, settings, ticket.place).into();
        }
        if room.left_at(ticket.sub.as_str()).is_some_and(|at_ms| ticket.iat * 1000 <= at_ms) {
            return Reply::error(409, "session_ended", "you left this waiting room; join again for a new place");
        }
        self.rooms.seen(event, ticket.sub.as_str());
        if let Some(reply) = closed_for_waiting(event, &room.live.settings, ticket.place, room.live.counts.head) {
            return reply;
        }
        let now_ms = room.live.now_ms();
        if ticket.place == 0
            && ticket.later > 0
            && let Some(position) = room.live.later_position(ticket.later)
        {
            // Behind the code holders, as this node's view has the line.
            let mut answer = self.waiting(event, &room.live.settings, position);
            answer.body.behind_code_holders = true;
            return answer.into();
        }
        let counts = &room.live.counts;
        if ticket.place == 0 && ticket.later == 0 && ticket.iat * 1000 > counts.last_draw_ms + 1000 {
            let lottery = room.live.settings.queueing == room::Queueing::Lottery;
            if lottery && room.live.settings.state == QueueState::Open {
                // Joined a lottery's pool after its last draw: still in it, as this node's view has the room.
                return self.pool_body(event, counts.prequeue).into();
            }
        }
        if ticket.place == 0 && room.live.settings.state != QueueState::Prequeue {
            // The pre-queue or a lottery's pool was drawn, or the line behind the code holders reached this fan:
            // learn its place once, and hand out a ticket that carries it.
            let Ok(store) = self.store.get() else { return Reply::unavailable() };
            if ticket.later == 0 && store.in_pool(event, ticket.sub.as_str()).await.unwrap_or(false) {
                // In a pool not drawn yet (joined in the second of the last draw, or while the room was paused).
                return self.pool_body(event, counts.prequeue).into();
            }
            return match store.place_of(event, ticket.sub.as_str()).await {
                Ok(Some(place)) => {
                    let new_ticket = self.ticket(&ticket.sub, event, place);
                    self.standing_reply(event, &ticket.sub, &room, place, now_ms)
                        .map_or_else(|refusal| refusal, |a| self.with_ticket(a, event, &new_ticket).into())
                }
                Ok(None) => Reply::error(
                    409,
                    "place_lapsed",
                    "your place was released while you were away; join again for a new one",
                ),
                Err(_) => Reply::unavailable(),
            };
        }
        let answer = self.standing_reply(event, &ticket.sub, &room, ticket.place, now_ms);
        if let (Ok(admitted), Some(promised)) = (&answer, ticket.eta)
            && let Some(at) = admitted.admitted_at_ms
            && room.etas.lock().is_ok_and(|mut log| log.first(ticket.sub.as_str()))
            && let Ok(store) = self.store.get()
        {
            // Counted in the room's figure, once across every node; a miss costs the figure one sample, never
            // the fan its answer.
            let sample = EtaSample::new(promised, at.saturating_sub(ticket.iat * 1000) as f64 / 1000.0);
            if let Err(e) = store.count_eta(event, ticket.sub.as_str(), &sample).await {
                tracing::debug!(event, error = %e, "could not count an admitted fan's ETA");
            }
        }
        answer.map_or_else(|refusal| refusal, Reply::from)
    }
}

/// For a waiting fan of a closed or sold-out queue: the answer that says so.
fn closed_for_waiting(event: i64, settings: &room::Settings, place: u64, head: u64) -> Option<Reply> {
    let waiting = place == 0 || place > head;
    (waiting && matches!(settings.state, QueueState::Closed | QueueState::SoldOut)).then(|| {
        Placed::from(QueueAnswer { poll_after_ms: 30_000, ..QueueAnswer::new(event, settings.state.as_str()) }).into()
    })
}

fn closed(state: QueueState) -> Reply {
    let (code, message) = if state == QueueState::SoldOut {
        ("sold_out", "every seat of this event is sold")
    } else {
        ("queue_closed", "this waiting room is closed")
    };
    Reply::error_with(409, code, message, json!({ "state": state.as_str() }))
}

/// A factor in 0.8..1.2 that spreads polls.
fn jitter() -> f64 {
    0.8 + rand::random::<f64>() * 0.4
}
