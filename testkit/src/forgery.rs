//! Credentials as an attacker makes them: one table of forged, tampered and misused tokens, for each kind, that
//! booking's and the gateway's tests present over HTTP. Each case names the kind of refusal it must get; the
//! service's test maps that to its documented status and code.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{KeyInit, Mac};
use serde_json::{Value, json};

/// What a case must be refused as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// 401 `<kind>_invalid`.
    Invalid,
    /// 401 `<kind>_expired`.
    Expired,
    /// 403 `<kind>_wrong_event`.
    WrongEvent,
}

/// One forged credential.
#[derive(Debug, Clone)]
pub struct Forgery {
    pub name: &'static str,
    pub token: String,
    pub refused: Refused,
}

/// The kind of token a service expects, with the key that signs it.
#[derive(Debug, Clone)]
pub struct Kind {
    /// The key id and the secret the service knows.
    pub kid: String,
    pub secret: String,
    pub audience: &'static str,
    pub issuer: String,
    /// The event the service is asked about (`None`: the kind names no event).
    pub event: Option<i64>,
}

/// `header.payload.signature`, signed with HMAC-SHA256 under `secret` whatever the header claims; the payload
/// is taken as the exact text given (so it may repeat a field).
pub fn jwt_raw(header: &Value, payload: &str, secret: &[u8]) -> String {
    let signing_input = format!("{}.{}", B64.encode(header.to_string()), B64.encode(payload));
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
    mac.update(signing_input.as_bytes());
    format!("{signing_input}.{}", B64.encode(mac.finalize().into_bytes()))
}

/// A JWT of `claims` under `header`, signed as [`jwt_raw`] does.
pub fn jwt(header: &Value, claims: &Value, secret: &[u8]) -> String {
    jwt_raw(header, &claims.to_string(), secret)
}

impl Kind {
    /// Claims the service accepts, for `account`.
    pub fn claims(&self, account: &str) -> Value {
        let t = tokens::unix_now();
        let mut claims = json!({"sub": account, "aud": self.audience, "iss": self.issuer, "iat": t, "exp": t + 600});
        if let Some(event) = self.event {
            claims["evt"] = json!(event);
            claims["place"] = json!(1);
        }
        claims
    }

    fn header(&self) -> Value {
        json!({"alg": "HS256", "typ": "JWT", "kid": self.kid})
    }

    /// A token the service accepts, for `account`.
    pub fn valid(&self, account: &str) -> String {
        jwt(&self.header(), &self.claims(account), self.secret.as_bytes())
    }

    /// The table: every way of forging, tampering with or stretching a token of this kind.
    pub fn forgeries(&self, account: &str) -> Vec<Forgery> {
        use Refused::{Expired, Invalid, WrongEvent};
        let secret = self.secret.as_bytes();
        let good = self.claims(account);
        let t = tokens::unix_now();
        let with = |field: &str, value: Value| {
            let mut c = good.clone();
            c[field] = value;
            jwt(&self.header(), &c, secret)
        };
        let header_with = |field: &str, value: Value| {
            let mut h = self.header();
            h[field] = value;
            h
        };
        let valid = self.valid(account);
        let unsigned = {
            let (input, _) = valid.rsplit_once('.').unwrap_or_default();
            let none = B64.encode(json!({"alg": "none", "typ": "JWT", "kid": self.kid}).to_string());
            format!("{none}.{}.", input.split_once('.').map_or("", |(_, p)| p))
        };
        let payload = good.to_string();
        let duplicated = payload.replacen('{', r#"{"sub":"someone-else","#, 1);
        let mut cases = vec![
            Forgery { name: "alg none, no signature", token: unsigned, refused: Invalid },
            Forgery {
                name: "alg RS256 signed with the HMAC secret as if it were a public key (HS/RS confusion)",
                token: jwt(&header_with("alg", json!("RS256")), &good, secret),
                refused: Invalid,
            },
            Forgery {
                name: "alg HS512",
                token: jwt(&header_with("alg", json!("HS512")), &good, secret),
                refused: Invalid,
            },
            Forgery {
                name: "an unknown kid",
                token: jwt(&header_with("kid", json!("k-unknown")), &good, secret),
                refused: Invalid,
            },
            Forgery {
                name: "a kid injected to point at an empty key",
                token: jwt(&header_with("kid", json!("../../../../dev/null")), &good, b""),
                refused: Invalid,
            },
            Forgery {
                name: "no kid",
                token: jwt(&json!({"alg": "HS256", "typ": "JWT"}), &good, secret),
                refused: Invalid,
            },
            Forgery {
                name: "the right kid, another secret",
                token: jwt(&self.header(), &good, b"another-secret-of-thirty-two-bytes!!"),
                refused: Invalid,
            },
            Forgery { name: "expired an hour ago", token: with("exp", json!(t - 3600)), refused: Expired },
            Forgery {
                name: "not valid before an hour from now",
                token: with("nbf", json!(t + 3600)),
                refused: Invalid,
            },
            Forgery { name: "issued an hour from now", token: with("iat", json!(t + 3600)), refused: Invalid },
            Forgery { name: "another audience", token: with("aud", json!("somewhere-else")), refused: Invalid },
            Forgery { name: "another issuer", token: with("iss", json!("someone-else")), refused: Invalid },
            Forgery { name: "a subject that is no account id", token: with("sub", json!("a b")), refused: Invalid },
            Forgery {
                name: "a claim repeated, the second naming someone else",
                token: jwt_raw(&self.header(), &duplicated, secret),
                refused: Invalid,
            },
            Forgery { name: "truncated", token: valid[..valid.len() - 6].to_owned(), refused: Invalid },
            Forgery {
                name: "oversized (padded past 2048 bytes, validly signed)",
                token: with("pad", json!("x".repeat(2100))),
                refused: Invalid,
            },
            Forgery {
                name: "the payload changed after signing",
                token: {
                    let mut parts: Vec<String> = valid.split('.').map(str::to_owned).collect();
                    let mut c = good.clone();
                    c["sub"] = json!("someone-else");
                    parts[1] = B64.encode(c.to_string());
                    parts.join(".")
                },
                refused: Invalid,
            },
        ];
        if let Some(event) = self.event {
            cases.push(Forgery {
                name: "for another event",
                token: with("evt", json!(event + 1)),
                refused: WrongEvent,
            });
        }
        cases
    }
}
