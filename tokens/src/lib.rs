//! Signed tokens shared by the gateway and booking.
//!
//! Two kinds exist. An **account token** is issued by the ticketing platform's login (or, for demos and tests,
//! by the dev CLI) and says who the fan is. An **admission proof** is issued by the gateway when it admits a fan
//! from the waiting room and says "this account may use event N until T"; booking serves only requests that
//! carry one. Both are HS256 JWTs with a key id, checked locally with no network call.
//!
//! Keys live in a [`Keyring`]: the first key signs, every key verifies, so a key rotates by putting the new
//! key first and keeping the old one until tokens signed with it have expired.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation, decode, decode_header, encode};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

#[cfg(test)]
mod tests;
pub mod times;

/// Audience of admission proofs: they are meant for booking.
pub const ADMISSION_AUDIENCE: &str = "booking";
/// Issuer of admission proofs: the waiting-room gateway.
pub const ADMISSION_ISSUER: &str = "waiting-room";
/// Audience of account tokens: they are presented to the waiting room.
pub const ACCOUNT_AUDIENCE: &str = "waiting-room";
/// Clock skew tolerated on `exp` and `nbf`, in seconds.
pub const LEEWAY_SECONDS: u64 = 5;
/// Tokens longer than this are refused before any parsing: no legitimate token comes near it.
pub const MAX_TOKEN_BYTES: usize = 2048;

/// Whether `given` is `expected`, comparing every byte whatever the first difference, so the time taken says
/// nothing of the secret (bearer tokens, pay tokens).
pub fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len() && given.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}
/// Shortest secret accepted for HS256 (the hash output size).
pub const MIN_SECRET_BYTES: usize = 32;
/// Most admission proofs a [`Keyring`] remembers as verified (a few hundred bytes each; a fan presents one
/// proof on every request of a session, so this covers the fans of a busy on-sale on one node).
pub const VERIFIED_PROOFS_MAX: usize = 100_000;

/// An account id as the platform issues it: 1 to 64 characters of `A-Z a-z 0-9 . _ - @`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AccountId(String);

impl AccountId {
    /// Parses an account id, refusing anything that could not be a key or a label.
    pub fn parse(raw: &str) -> Result<Self, TokenError> {
        let ok = !raw.is_empty()
            && raw.len() <= 64
            && raw.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@'));
        if ok { Ok(Self(raw.to_owned())) } else { Err(TokenError::BadSubject) }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for AccountId {
    type Error = TokenError;
    fn try_from(raw: String) -> Result<Self, TokenError> {
        Self::parse(&raw)
    }
}

impl From<AccountId> for String {
    fn from(id: AccountId) -> String {
        id.0
    }
}

impl fmt::Display for AccountId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Claims of an admission proof.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionClaims {
    /// The admitted account.
    pub sub: AccountId,
    /// The event the fan was admitted to; the proof is worthless for any other.
    pub evt: i64,
    pub aud: String,
    pub iss: String,
    /// Issued at, seconds since the Unix epoch.
    pub iat: u64,
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
}

impl AdmissionClaims {
    /// An admission to `event` for `account`, valid for `ttl_seconds` from `now` (Unix seconds).
    pub fn new(account: AccountId, event: i64, now: u64, ttl_seconds: u64) -> Self {
        Self {
            sub: account,
            evt: event,
            aud: ADMISSION_AUDIENCE.to_owned(),
            iss: ADMISSION_ISSUER.to_owned(),
            iat: now,
            exp: now + ttl_seconds,
        }
    }
}

/// Audience of queue tickets: they come back to the waiting room that issued them.
pub const TICKET_AUDIENCE: &str = "queue";

/// Claims of a queue ticket: the gateway's signed record of a fan's place in an event's queue. Any gateway node
/// can read it without asking Redis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TicketClaims {
    pub sub: AccountId,
    pub evt: i64,
    /// The place in the queue, from 1; 0 while the fan waits in the pre-queue (places are drawn at opening).
    /// On a held ticket: the position it shows, for ever.
    pub place: u64,
    pub aud: String,
    pub iss: String,
    pub iat: u64,
    pub exp: u64,
    /// Given for a forged or spent proof of work in a room that holds such clients in an endless queue: the
    /// ticket's holder waits for a turn that never comes and holds no place.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// In a room whose presale code holders go first, a fan who joined without a code waits behind them with
    /// this number in their own line (its `place` is 0 until the line reaches it); 0: not in that line.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub later: u64,
    /// The wait the room promised at the join, in seconds (none when admitted at once, or nothing was promised):
    /// kept against the wait the fan has, to measure the room's ETAs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta: Option<u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl TicketClaims {
    /// A ticket for `account`'s `place` in `event`'s queue, valid for `ttl_seconds` from `now`.
    pub fn new(account: AccountId, event: i64, place: u64, now: u64, ttl_seconds: u64) -> Self {
        Self {
            sub: account,
            evt: event,
            place,
            aud: TICKET_AUDIENCE.to_owned(),
            iss: ADMISSION_ISSUER.to_owned(),
            iat: now,
            exp: now + ttl_seconds,
            held: false,
            later: 0,
            eta: None,
        }
    }
}

/// Audience of sponsor passes: they come back to the waiting room that issued them.
pub const PASS_AUDIENCE: &str = "sponsor-pass";

/// Claims of a sponsor pass: an operator's signed word that one account may enter one event's room at once
/// (within its `max_active`), once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassClaims {
    pub sub: AccountId,
    pub evt: i64,
    pub aud: String,
    pub iss: String,
    pub iat: u64,
    pub exp: u64,
    /// The pass's id, spent when it is used.
    pub jti: String,
}

impl PassClaims {
    /// A pass for `account` to `event`, valid for `ttl_seconds` from `now`, with id `jti`.
    pub fn new(account: AccountId, event: i64, now: u64, ttl_seconds: u64, jti: String) -> Self {
        Self {
            sub: account,
            evt: event,
            aud: PASS_AUDIENCE.to_owned(),
            iss: ADMISSION_ISSUER.to_owned(),
            iat: now,
            exp: now + ttl_seconds,
            jti,
        }
    }
}

/// Claims of an account token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountClaims {
    pub sub: AccountId,
    pub aud: String,
    pub iss: String,
    pub iat: u64,
    pub exp: u64,
}

impl AccountClaims {
    /// An account token for `account` from the platform `issuer`, valid for `ttl_seconds` from `now`.
    pub fn new(account: AccountId, issuer: &str, now: u64, ttl_seconds: u64) -> Self {
        Self {
            sub: account,
            aud: ACCOUNT_AUDIENCE.to_owned(),
            iss: issuer.to_owned(),
            iat: now,
            exp: now + ttl_seconds,
        }
    }
}

/// Why a token was refused. Each variant maps to one stable error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is not a well-formed JWT")]
    Malformed,
    #[error("the token is larger than {MAX_TOKEN_BYTES} bytes")]
    TooLarge,
    #[error("the token's algorithm is not HS256")]
    WrongAlgorithm,
    /// Also a key id that is missing or unknown: the refusal does not tell a prober which key ids exist.
    #[error("the token's signature does not verify")]
    BadSignature,
    #[error("the token has expired")]
    Expired,
    /// `nbf` or `iat` in the future (beyond the clock skew tolerated).
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token is for another audience or issuer")]
    WrongAudience,
    #[error("the token's subject is not a valid account id")]
    BadSubject,
}

/// Name of the cookie that carries the admission proof for browsers.
pub const ADMISSION_COOKIE: &str = "wr_admission";

/// Why a request's admission proof was not accepted. Gateway and booking answer each the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmissionRefusal {
    /// No proof in `Authorization: Bearer` nor in the admission cookie.
    Missing,
    Expired,
    Invalid(TokenError),
    /// A valid proof, for another event.
    WrongEvent,
}

impl AdmissionRefusal {
    /// HTTP status: 401, or 403 for a proof of another event.
    pub fn status(&self) -> u16 {
        if *self == AdmissionRefusal::WrongEvent { 403 } else { 401 }
    }

    /// The stable snake_case code for HTTP error bodies.
    pub fn code(&self) -> &'static str {
        match self {
            AdmissionRefusal::Missing => "admission_required",
            AdmissionRefusal::Expired => "admission_expired",
            AdmissionRefusal::Invalid(_) => "admission_invalid",
            AdmissionRefusal::WrongEvent => "admission_wrong_event",
        }
    }
}

impl fmt::Display for AdmissionRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdmissionRefusal::Missing => f.write_str("this request needs an admission proof from the waiting room"),
            AdmissionRefusal::Expired => f.write_str("the admission proof has expired"),
            AdmissionRefusal::Invalid(e) => write!(f, "the admission proof is not valid: {e}"),
            AdmissionRefusal::WrongEvent => f.write_str("the admission proof is for another event"),
        }
    }
}

impl AdmissionClaims {
    /// The admitted account, if the proof is for `event`.
    pub fn account_for(&self, event: i64) -> Result<&AccountId, AdmissionRefusal> {
        if self.evt == event { Ok(&self.sub) } else { Err(AdmissionRefusal::WrongEvent) }
    }
}

/// The text of a request's `Authorization` header, if it has one. A value with any byte other than visible
/// ASCII, space or tab is refused, never skipped: a reader that skipped it would fall back to the cookie, and
/// one that read it another way would act on another proof.
pub fn authorization_text(raw: Option<&[u8]>) -> Result<Option<&str>, AdmissionRefusal> {
    match raw {
        None => Ok(None),
        Some(bytes) if visible_ascii(bytes) => Ok(std::str::from_utf8(bytes).ok()),
        Some(_) => Err(AdmissionRefusal::Invalid(TokenError::Malformed)),
    }
}

/// Whether every byte is visible ASCII, a space or a tab. The loop has no early exit, so the compiler checks
/// many bytes an instruction: a proof's header is checked on every request the gateway forwards.
fn visible_ascii(bytes: &[u8]) -> bool {
    !bytes.iter().fold(false, |bad, &b| bad | (b != b'\t' && !(b' '..=b'~').contains(&b)))
}

/// The admission proof a request carries: the `Authorization: Bearer` token, else the admission cookie among
/// the `Cookie` header values.
pub fn find_admission_proof<'a>(
    authorization: Option<&'a str>,
    cookies: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let bearer = authorization.and_then(|value| {
        let (scheme, token) = value.split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    });
    bearer.or_else(|| cookie(cookies, ADMISSION_COOKIE))
}

/// The value of cookie `name` among a request's `Cookie` header values.
pub fn cookie<'a>(cookies: impl IntoIterator<Item = &'a str>, name: &str) -> Option<&'a str> {
    cookies
        .into_iter()
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Why a keyring specification was refused (start-up only).
#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    #[error("the keyring is empty; expected `kid:secret[,kid:secret...]`")]
    Empty,
    #[error("key entry {0} is not `kid:secret`")]
    Entry(usize),
    #[error("key `{0}` is shorter than {MIN_SECRET_BYTES} bytes")]
    ShortSecret(String),
    #[error("key id `{0}` appears twice")]
    DuplicateKid(String),
    #[error("key `{0}`: {1}")]
    Key(String, String),
}

struct Key {
    kid: String,
    encoding: EncodingKey,
    decoding: DecodingKey,
}

/// Admission proofs this keyring has verified, by their exact text. A fan presents the same proof on every
/// request, so a hit skips base64, HMAC and JSON, the costliest part of the check.
/// Only proofs that passed the full check get in, the keys never change for the life of the keyring, and a hit
/// still checks the expiry, so an answer from here is the answer the full check would give. Bounded: when
/// full, the expired entries go, and if that frees nothing, all of them.
struct VerifiedProofs {
    /// foldhash (seeded per map): SipHash over a proof of a few hundred bytes costs much more per request. Only
    /// verified proofs are keys, so no one can fill the map with keys chosen to collide.
    map: Mutex<HashMap<Box<str>, Arc<AdmissionClaims>, foldhash::fast::RandomState>>,
    max: usize,
}

/// Whether `claims` are still valid at `now`, by the rule `jsonwebtoken` applies (`exp >= now - leeway`).
fn unexpired(claims: &AdmissionClaims, now: u64) -> bool {
    claims.exp.saturating_add(LEEWAY_SECONDS) >= now
}

impl VerifiedProofs {
    fn new(max: usize) -> Self {
        Self { map: Mutex::new(HashMap::default()), max: max.max(1) }
    }

    fn get(&self, token: &str, now: u64) -> Option<Arc<AdmissionClaims>> {
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(token).filter(|claims| unexpired(claims, now)).cloned()
    }

    fn insert(&self, token: &str, claims: Arc<AdmissionClaims>, now: u64) {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= self.max {
            map.retain(|_, c| unexpired(c, now));
            if map.len() >= self.max {
                map.clear();
            }
        }
        map.insert(token.into(), claims);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// The checks every token of one kind must pass: HS256 only, `exp` and `nbf` (with leeway), audience, issuer,
/// subject.
fn validation(audience: &str, issuer: &str) -> Validation {
    let mut validation = Validation::new(Algorithm::HS256);
    validation.leeway = LEEWAY_SECONDS;
    validation.validate_nbf = true;
    validation.set_audience(&[audience]);
    validation.set_issuer(&[issuer]);
    validation.set_required_spec_claims(&["exp", "aud", "iss", "sub"]);
    validation
}

/// HS256 keys by key id; the first one signs.
pub struct Keyring {
    keys: Vec<Key>,
    /// Built once: a `Validation` is several hash sets, too dear to rebuild per request.
    admission: Validation,
    ticket: Validation,
    pass: Validation,
    verified: VerifiedProofs,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kids: Vec<&str> = self.keys.iter().map(|k| k.kid.as_str()).collect();
        f.debug_struct("Keyring").field("kids", &kids).finish_non_exhaustive()
    }
}

impl Keyring {
    /// Parses `kid:secret[,kid:secret...]`. The first key signs; all verify.
    pub fn parse(spec: &str) -> Result<Self, KeyringError> {
        let mut keys: Vec<Key> = Vec::new();
        for (i, entry) in spec.split(',').map(str::trim).filter(|e| !e.is_empty()).enumerate() {
            let (kid, secret) = entry.split_once(':').ok_or(KeyringError::Entry(i))?;
            if kid.is_empty() {
                return Err(KeyringError::Entry(i));
            }
            if secret.len() < MIN_SECRET_BYTES {
                return Err(KeyringError::ShortSecret(kid.to_owned()));
            }
            if keys.iter().any(|k| k.kid == kid) {
                return Err(KeyringError::DuplicateKid(kid.to_owned()));
            }
            let key_err = |e: jsonwebtoken::errors::Error| KeyringError::Key(kid.to_owned(), e.to_string());
            keys.push(Key {
                kid: kid.to_owned(),
                encoding: EncodingKey::from_secret(secret.as_bytes()).map_err(key_err)?,
                decoding: DecodingKey::from_secret(secret.as_bytes()).map_err(key_err)?,
            });
        }
        if keys.is_empty() {
            return Err(KeyringError::Empty);
        }
        Ok(Self {
            keys,
            admission: validation(ADMISSION_AUDIENCE, ADMISSION_ISSUER),
            ticket: validation(TICKET_AUDIENCE, ADMISSION_ISSUER),
            pass: validation(PASS_AUDIENCE, ADMISSION_ISSUER),
            verified: VerifiedProofs::new(VERIFIED_PROOFS_MAX),
        })
    }

    /// Signs `claims` with the first key, naming it in the header's `kid`.
    pub fn sign<C: Serialize>(&self, claims: &C) -> String {
        let key = &self.keys[0];
        let header = Header { kid: Some(key.kid.clone()), ..Header::new(Algorithm::HS256) };
        // HMAC signing of serialisable claims cannot fail: the key was accepted at parse time.
        encode(&header, claims, &key.encoding).unwrap_or_default()
    }

    /// Verifies an admission proof: signature, `kid`, algorithm, `exp` (with leeway), audience and issuer.
    pub fn verify_admission(&self, token: &str) -> Result<AdmissionClaims, TokenError> {
        self.verify(token, &self.admission)
    }

    /// Finds and verifies the admission proof a request carries (see [`find_admission_proof`]), answering
    /// from the proofs already verified when it can.
    pub fn check_admission<'a>(
        &self,
        authorization: Option<&'a str>,
        cookies: impl IntoIterator<Item = &'a str>,
    ) -> Result<Arc<AdmissionClaims>, AdmissionRefusal> {
        let token = find_admission_proof(authorization, cookies).ok_or(AdmissionRefusal::Missing)?;
        self.check_admission_proof(token)
    }

    /// Verifies an admission proof already found in a request (see [`find_admission_proof`]), answering from
    /// the proofs already verified when it can.
    pub fn check_admission_proof(&self, token: &str) -> Result<Arc<AdmissionClaims>, AdmissionRefusal> {
        self.verify_admission_cached(token, unix_now()).map_err(|e| match e {
            TokenError::Expired => AdmissionRefusal::Expired,
            other => AdmissionRefusal::Invalid(other),
        })
    }

    fn verify_admission_cached(&self, token: &str, now: u64) -> Result<Arc<AdmissionClaims>, TokenError> {
        if let Some(claims) = self.verified.get(token, now) {
            return Ok(claims);
        }
        let claims = Arc::new(self.verify_admission(token)?);
        self.verified.insert(token, claims.clone(), now);
        Ok(claims)
    }

    /// Verifies a queue ticket issued by the waiting room.
    pub fn verify_ticket(&self, token: &str) -> Result<TicketClaims, TokenError> {
        self.verify(token, &self.ticket)
    }

    /// Verifies a sponsor pass (signature, expiry, audience, issuer).
    pub fn verify_pass(&self, token: &str) -> Result<PassClaims, TokenError> {
        self.verify(token, &self.pass)
    }

    /// Verifies an account token from the platform whose issuer is `issuer`.
    pub fn verify_account(&self, token: &str, issuer: &str) -> Result<AccountClaims, TokenError> {
        self.verify(token, &validation(ACCOUNT_AUDIENCE, issuer))
    }

    fn verify<C: DeserializeOwned + Issued>(&self, token: &str, validation: &Validation) -> Result<C, TokenError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::TooLarge);
        }
        let header = decode_header(token).map_err(|_| TokenError::Malformed)?;
        // The algorithm is pinned: a token that asks for `none` or an asymmetric algorithm is refused before
        // any key is consulted.
        if header.alg != Algorithm::HS256 {
            return Err(TokenError::WrongAlgorithm);
        }
        let kid = header.kid.ok_or(TokenError::BadSignature)?;
        let key = self.keys.iter().find(|k| k.kid == kid).ok_or(TokenError::BadSignature)?;
        let claims = decode::<C>(token, &key.decoding, validation).map(|data| data.claims).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind as K;
            match e.kind() {
                K::ExpiredSignature => TokenError::Expired,
                K::ImmatureSignature => TokenError::NotYetValid,
                K::InvalidSignature => TokenError::BadSignature,
                K::InvalidAudience | K::InvalidIssuer => TokenError::WrongAudience,
                K::InvalidAlgorithm => TokenError::WrongAlgorithm,
                _ => TokenError::Malformed,
            }
        })?;
        // A token issued in the future was made by a signer with a wrong clock, or made to outlive its `exp`.
        if claims.issued_at() > unix_now() + LEEWAY_SECONDS {
            return Err(TokenError::NotYetValid);
        }
        Ok(claims)
    }
}

/// Claims that say when they were issued.
trait Issued {
    fn issued_at(&self) -> u64;
}

macro_rules! issued {
    ($($t:ty),*) => {$(
        impl Issued for $t {
            fn issued_at(&self) -> u64 {
                self.iat
            }
        }
    )*};
}
issued!(AdmissionClaims, TicketClaims, AccountClaims, PassClaims);

/// Seconds since the Unix epoch, by this machine's clock (token lifetimes only; business times come from the
/// stores).
pub fn unix_now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}
