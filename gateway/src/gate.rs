//! The gate: the proof of work a join pays with while its room's `challenge` is on. Challenges follow ALTCHA's
//! proof-of-work protocol (v2), issued and verified by the `altcha` crate, in process and without Redis:
//!
//! - A challenge is signed (HMAC), expires after [`CHALLENGE_LIFETIME`], and carries the room and the account
//!   it was issued to in its signed `data`, so it pays for nobody else's place.
//! - It is *deterministic*: the gateway picks a secret counter, uniform below the room's difficulty, and
//!   publishes the first half of the key that counter derives (SHA-256 of salt, nonce and counter). A solver
//!   tries counters from 0 until a key starts with that prefix: half the difficulty in hashes on average, at
//!   most all of it. The gateway also signs the whole key, so checking a solution is two HMACs, never a hash
//!   search.
//! - A solution is single use: the join that sends it spends its nonce in Redis (`lua/queue_join.lua`), in the
//!   same script that gives the place.

use std::collections::BTreeMap;
use std::time::Duration;

use altcha::{Challenge, CreateChallengeOptions, Payload, VerifySolutionOptions};
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::json;
use sha2::Sha256;

/// How long a challenge may take to be solved and sent.
pub const CHALLENGE_LIFETIME: Duration = Duration::from_secs(300);
/// The key derivation a solver repeats: one SHA-256 per counter tried (WebCrypto's `digest` in a browser).
pub const ALGORITHM: &str = "SHA-256";
/// The request field a join sends its solution in: base64 of ALTCHA's JSON payload,
/// `{"challenge": {...}, "solution": {"counter", "derivedKey"}}`.
pub const HEADER: &str = "altcha";
/// A payload longer than this is refused before it is decoded: a real one is under 1 KB.
pub const MAX_PAYLOAD_BYTES: usize = 4096;

/// A solved challenge that a join pays with: its nonce, spent once, and when it expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payment {
    pub nonce: String,
    pub expires_at_ms: u64,
}

/// Why a solution was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    #[error("the `altcha` field is not base64 of ALTCHA's JSON payload")]
    Malformed,
    #[error("the challenge was not issued here, or the solution does not solve it")]
    Forged,
    #[error("the challenge was issued for another waiting room or account")]
    NotYours,
    #[error("the challenge has expired; solve the new one")]
    Expired,
}

impl Failure {
    /// The stable error code.
    pub fn code(self) -> &'static str {
        match self {
            Failure::Malformed => "challenge_malformed",
            Failure::Forged => "challenge_failed",
            Failure::NotYours => "challenge_not_yours",
            Failure::Expired => "challenge_expired",
        }
    }

    /// Whether the client can only have sent it on purpose (an honest client's challenge may expire).
    pub fn is_forgery(self) -> bool {
        self != Failure::Expired
    }
}

/// Issues and checks challenges with secrets derived from the admission key, so every node of a deployment
/// shares them with no setting of their own.
pub struct Gate {
    signature_secret: String,
    key_secret: String,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gate")
    }
}

/// HMAC-SHA256 of `label` under `secret`, in hex: a secret of its own for each use of one key.
fn derive(secret: &[u8], label: &str) -> String {
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(secret).unwrap_or_else(|_| unreachable!("HMAC takes any key"));
    mac.update(label.as_bytes());
    mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

impl Gate {
    /// A gate whose secrets derive from `admission_secret` (the signing key of admission proofs).
    pub fn new(admission_secret: &[u8]) -> Self {
        Self {
            signature_secret: derive(admission_secret, "onsale gate: challenge signature"),
            key_secret: derive(admission_secret, "onsale gate: derived key signature"),
        }
    }

    /// A gate keyed by the first (signing) key of a keyring spec, `kid:secret[,...]`.
    pub fn from_keyring_spec(spec: &str) -> Self {
        let secret = spec.split(',').next().and_then(|entry| entry.split_once(':')).map_or("", |(_, s)| s.trim());
        Self::new(secret.as_bytes())
    }

    /// A challenge for `account` to join `event`'s queue, taking up to `difficulty` hashes, valid from `now`
    /// (Unix seconds) for [`CHALLENGE_LIFETIME`].
    pub fn issue(&self, event: i64, account: &str, difficulty: u32, now: u64) -> Challenge {
        let data = BTreeMap::from([("evt".to_owned(), json!(event)), ("sub".to_owned(), json!(account))]);
        let options = CreateChallengeOptions {
            algorithm: ALGORITHM.to_owned(),
            cost: 1,
            counter: Some(rand::random_range(0..difficulty.max(1))),
            data: Some(data),
            expires_at: Some((now + CHALLENGE_LIFETIME.as_secs()) as i64),
            hmac_signature_secret: Some(self.signature_secret.clone()),
            hmac_key_signature_secret: Some(self.key_secret.clone()),
            ..CreateChallengeOptions::default()
        };
        // Creating fails only on a malformed key prefix, and deterministic mode derives its own.
        altcha::create_challenge(options).unwrap_or_else(|e| unreachable!("a deterministic challenge: {e}"))
    }

    /// Checks a join's `altcha` field: a solution of a challenge issued here, unexpired, for this room and
    /// account. The answer is what the join pays with; that it was not paid before is Redis's to say.
    pub fn check(&self, field: &str, event: i64, account: &str) -> Result<Payment, Failure> {
        if field.len() > MAX_PAYLOAD_BYTES {
            return Err(Failure::Malformed);
        }
        let json = base64::engine::general_purpose::STANDARD.decode(field.trim()).map_err(|_| Failure::Malformed)?;
        let payload: Payload = serde_json::from_slice(&json).map_err(|_| Failure::Malformed)?;
        let options = VerifySolutionOptions {
            hmac_key_signature_secret: Some(self.key_secret.clone()),
            ..VerifySolutionOptions::new(&payload.challenge, &payload.solution, self.signature_secret.as_str())
        };
        let params = &payload.challenge.parameters;
        // A challenge issued here always carries a key signature: without one, `altcha` would fall back to
        // deriving the key, at whatever cost the client wrote in.
        if params.key_signature.is_none() || params.algorithm != ALGORITHM || params.cost != 1 {
            return Err(Failure::Forged);
        }
        let verdict = altcha::verify_solution(options).map_err(|_| Failure::Forged)?;
        if verdict.expired {
            return Err(Failure::Expired);
        }
        if !verdict.verified {
            return Err(Failure::Forged);
        }
        let data = params.data.as_ref();
        let bound = data.and_then(|d| d.get("evt")).and_then(|v| v.as_i64()) == Some(event)
            && data.and_then(|d| d.get("sub")).and_then(|v| v.as_str()) == Some(account);
        if !bound {
            return Err(Failure::NotYours);
        }
        let expires_at = params.expires_at.and_then(|at| u64::try_from(at).ok()).ok_or(Failure::Forged)?;
        Ok(Payment { nonce: params.nonce.clone(), expires_at_ms: expires_at * 1000 })
    }
}

/// Encodes a solved challenge as a join sends it (tests, the load generator's fans and bots).
pub fn payload_field(challenge: &Challenge, solution: &altcha::Solution) -> String {
    let payload = Payload { challenge: challenge.clone(), solution: solution.clone() };
    base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(&payload).unwrap_or_default())
}

#[cfg(test)]
mod tests;
