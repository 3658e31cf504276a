use super::*;

const SECRET_A: &str = "a-very-long-development-secret-number-one";
const SECRET_B: &str = "a-very-long-development-secret-number-two";

fn ring(spec: &str) -> Keyring {
    Keyring::parse(spec).expect("valid keyring")
}

fn account(id: &str) -> AccountId {
    AccountId::parse(id).expect("valid account id")
}

fn check_refused(ring: &Keyring, token: &str, expected: TokenError) {
    assert_eq!(ring.verify_admission(token).map(|_| ()), Err(expected), "token {token}");
}

#[test]
fn one_byte_out_of_range_anywhere_refuses_the_header() {
    // Every length across the widths the check works in at once, and every position in it.
    for len in 0..300 {
        let valid: Vec<u8> = (0..len).map(|i| if i % 40 == 7 { b'\t' } else { b' ' + (i % 95) as u8 }).collect();
        assert!(authorization_text(Some(&valid)).is_ok(), "length {len}");
        for at in 0..len {
            for bad in [0x00, 0x1f, 0x7f, 0x80, 0xff] {
                let mut raw = valid.clone();
                raw[at] = bad;
                assert!(authorization_text(Some(&raw)).is_err(), "byte {bad:#x} at {at} of {len}");
            }
        }
    }
}

#[test]
fn admission_round_trips() {
    let ring = ring(&format!("k1:{SECRET_A}"));
    let claims = AdmissionClaims::new(account("fan-1"), 42, unix_now(), 600);
    let token = ring.sign(&claims);
    assert_eq!(ring.verify_admission(&token), Ok(claims));
}

#[test]
fn rotated_keys_verify_old_tokens_and_sign_with_the_new_one() {
    let old = ring(&format!("k1:{SECRET_A}"));
    let rotated = ring(&format!("k2:{SECRET_B},k1:{SECRET_A}"));
    let claims = AdmissionClaims::new(account("fan-1"), 1, unix_now(), 600);
    assert!(rotated.verify_admission(&old.sign(&claims)).is_ok());
    // An unknown key id is refused as a bad signature is: a prober learns nothing of which key ids exist.
    check_refused(&old, &rotated.sign(&claims), TokenError::BadSignature);
    let forged = ring(&format!("k1:{SECRET_B}")).sign(&claims);
    assert_eq!(
        old.verify_admission(&forged).map_err(|e| e.to_string()),
        old.verify_admission(&rotated.sign(&claims)).map_err(|e| e.to_string())
    );
}

#[test]
fn expired_beyond_leeway_is_refused_but_within_leeway_is_accepted() {
    let ring = ring(&format!("k1:{SECRET_A}"));
    let now = unix_now();
    let mut claims = AdmissionClaims::new(account("fan-1"), 1, now - 100, 10);
    check_refused(&ring, &ring.sign(&claims), TokenError::Expired);
    claims.exp = now - 2;
    assert!(ring.verify_admission(&ring.sign(&claims)).is_ok());
}

#[test]
fn wrong_key_same_kid_is_a_bad_signature() {
    let signer = ring(&format!("k1:{SECRET_B}"));
    let verifier = ring(&format!("k1:{SECRET_A}"));
    let token = signer.sign(&AdmissionClaims::new(account("fan-1"), 1, unix_now(), 60));
    check_refused(&verifier, &token, TokenError::BadSignature);
}

#[test]
fn alg_none_and_garbage_and_oversize_are_refused() {
    let ring = ring(&format!("k1:{SECRET_A}"));
    // {"alg":"none","kid":"k1"} . {"sub":"fan","evt":1,...} . (empty signature)
    let none = "eyJhbGciOiJub25lIiwia2lkIjoiazEifQ.eyJzdWIiOiJmYW4iLCJldnQiOjEsImF1ZCI6ImJvb2tpbmciLCJpc3MiOiJ3YWl0aW5nLXJvb20iLCJpYXQiOjEsImV4cCI6OTk5OTk5OTk5OX0.";
    assert!(ring.verify_admission(none).is_err());
    check_refused(&ring, "not-a-jwt", TokenError::Malformed);
    check_refused(&ring, &"a".repeat(MAX_TOKEN_BYTES + 1), TokenError::TooLarge);
}

#[test]
fn tampered_payload_is_refused() {
    let ring = ring(&format!("k1:{SECRET_A}"));
    let token = ring.sign(&AdmissionClaims::new(account("fan-1"), 1, unix_now(), 60));
    let other = ring.sign(&AdmissionClaims::new(account("fan-2"), 1, unix_now(), 60));
    let mut parts: Vec<&str> = token.split('.').collect();
    let other_payload = other.split('.').nth(1).expect("payload");
    parts[1] = other_payload;
    check_refused(&ring, &parts.join("."), TokenError::BadSignature);
}

#[test]
fn account_token_is_not_an_admission_proof() {
    let ring = ring(&format!("k1:{SECRET_A}"));
    let now = unix_now();
    let claims = AccountClaims {
        sub: account("fan-1"),
        aud: ACCOUNT_AUDIENCE.into(),
        iss: "platform".into(),
        iat: now,
        exp: now + 60,
    };
    let token = ring.sign(&claims);
    assert_eq!(ring.verify_account(&token, "platform"), Ok(claims));
    assert!(ring.verify_admission(&token).is_err());
    assert_eq!(ring.verify_account(&token, "elsewhere").map(|_| ()), Err(TokenError::WrongAudience));
}

#[test]
fn keyring_refuses_short_duplicate_and_malformed_entries() {
    assert!(matches!(Keyring::parse(""), Err(KeyringError::Empty)));
    assert!(matches!(Keyring::parse("k1:short"), Err(KeyringError::ShortSecret(_))));
    assert!(matches!(Keyring::parse(SECRET_A), Err(KeyringError::Entry(0))));
    let dup = format!("k1:{SECRET_A},k1:{SECRET_B}");
    assert!(matches!(Keyring::parse(&dup), Err(KeyringError::DuplicateKid(_))));
}

#[test]
fn account_ids_are_validated() {
    assert!(AccountId::parse("fan-00001@example.com").is_ok());
    for bad in ["", "has space", "semi;colon", &"x".repeat(65), "emoji-🎟"] {
        assert!(AccountId::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn a_queue_ticket_is_not_an_admission_proof_nor_the_reverse() {
    let ring = ring(&format!("k1:{SECRET_A}"));
    let ticket = TicketClaims::new(account("fan-1"), 3, 17, unix_now(), 600);
    let signed = ring.sign(&ticket);
    assert_eq!(ring.verify_ticket(&signed), Ok(ticket));
    assert_eq!(ring.verify_admission(&signed).map(|_| ()), Err(TokenError::WrongAudience));
    let proof = ring.sign(&AdmissionClaims::new(account("fan-1"), 3, unix_now(), 600));
    // An admission proof has no place: refused before its audience is even read.
    assert!(ring.verify_ticket(&proof).is_err());
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[test]
fn a_verified_proof_is_remembered_and_forgeries_never_are() {
    let ring = ring(&format!("k1:{SECRET_A}"));
    let claims = AdmissionClaims::new(account("fan-1"), 7, unix_now(), 600);
    let token = ring.sign(&claims);
    let first = ring.check_admission(Some(&bearer(&token)), []).expect("valid proof");
    let again = ring.check_admission(None, [format!("{ADMISSION_COOKIE}={token}").as_str()]).expect("cached");
    assert_eq!(*first, claims);
    assert!(Arc::ptr_eq(&first, &again), "the second check is answered from the verified proofs");
    assert_eq!(ring.verified.len(), 1);

    // A copy with another payload but the genuine signature, and one signed with another key: both refused,
    // and neither is remembered.
    let (_, rest) = token.split_once('.').expect("jwt");
    let (_, signature) = rest.split_once('.').expect("jwt");
    let other = ring.sign(&AdmissionClaims::new(account("fan-2"), 7, unix_now(), 600));
    let spliced = format!("{}.{signature}", other.rsplit_once('.').expect("jwt").0);
    let refused = ring.check_admission(Some(&bearer(&spliced)), []).expect_err("spliced");
    assert_eq!(refused, AdmissionRefusal::Invalid(TokenError::BadSignature));
    let foreign = self::ring(&format!("k1:{SECRET_B}")).sign(&claims);
    assert!(ring.check_admission(Some(&bearer(&foreign)), []).is_err());
    assert_eq!(ring.verified.len(), 1);
}

#[test]
fn a_remembered_proof_still_expires() {
    let ring = ring(&format!("k1:{SECRET_A}"));
    let now = unix_now();
    let claims = AdmissionClaims::new(account("fan-1"), 7, now, 60);
    let token = ring.sign(&claims);
    assert!(ring.check_admission(Some(&bearer(&token)), []).is_ok());
    assert!(ring.verified.get(&token, claims.exp + LEEWAY_SECONDS).is_some(), "valid up to the leeway");
    assert!(ring.verified.get(&token, claims.exp + LEEWAY_SECONDS + 1).is_none(), "not one second more");

    // An entry whose proof has expired by the real clock is not served: the full check runs and refuses.
    let old = AdmissionClaims::new(account("fan-1"), 7, now - 100, 10);
    let old_token = ring.sign(&old);
    ring.verified.insert(&old_token, Arc::new(old), now - 100);
    assert_eq!(ring.check_admission(Some(&bearer(&old_token)), []), Err(AdmissionRefusal::Expired));
}

#[test]
fn the_verified_proofs_stay_bounded() {
    let mut ring = ring(&format!("k1:{SECRET_A}"));
    ring.verified = VerifiedProofs::new(3);
    let now = unix_now();
    for i in 0..10 {
        let token = ring.sign(&AdmissionClaims::new(account(&format!("fan-{i}")), 7, now, 600));
        assert!(ring.check_admission(Some(&bearer(&token)), []).is_ok());
        assert!(ring.verified.len() <= 3, "{} entries after {} proofs", ring.verified.len(), i + 1);
    }
    // Expired entries are the first to go: with two of three expired, a new proof keeps the live one.
    ring.verified = VerifiedProofs::new(3);
    let live = ring.sign(&AdmissionClaims::new(account("live"), 7, now, 600));
    assert!(ring.check_admission(Some(&bearer(&live)), []).is_ok());
    for i in 0..2 {
        let claims = AdmissionClaims::new(account(&format!("gone-{i}")), 7, now - 100, 10);
        ring.verified.insert(&ring.sign(&claims), Arc::new(claims), now);
    }
    let next = ring.sign(&AdmissionClaims::new(account("next"), 7, now, 600));
    assert!(ring.check_admission(Some(&bearer(&next)), []).is_ok());
    assert_eq!(ring.verified.len(), 2);
    assert!(ring.verified.get(&live, now).is_some());
}

#[test]
fn a_token_not_valid_yet_or_issued_in_the_future_is_refused() {
    let ring = ring(&format!("k1:{SECRET_A}"));
    let now = unix_now();
    let future = AdmissionClaims::new(account("fan-1"), 1, now + 600, 600);
    check_refused(&ring, &ring.sign(&future), TokenError::NotYetValid);
    // Within the clock skew tolerated, it is accepted.
    let skewed = AdmissionClaims::new(account("fan-1"), 1, now + 2, 600);
    assert!(ring.verify_admission(&ring.sign(&skewed)).is_ok());
    // A `nbf` claim is checked although the claims we issue never carry one.
    let mut with_nbf = serde_json::to_value(AdmissionClaims::new(account("fan-1"), 1, now, 600)).expect("json");
    with_nbf["nbf"] = serde_json::json!(now + 600);
    check_refused(&ring, &ring.sign(&with_nbf), TokenError::NotYetValid);
    with_nbf["nbf"] = serde_json::json!(now - 1);
    assert!(ring.verify_admission(&ring.sign(&with_nbf)).is_ok());
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    /// Cookie-header-like text: names, `=`, `;`, spaces and anything else.
    fn cookie_text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z_ =;]{0,40}",
            "(wr_admission|wr_account|theme|x)=[ -~]{0,20}(; ?(wr_admission|x)=[ -~]{0,20}){0,3}",
            any::<String>(),
        ]
    }

    proptest! {
        #[test]
        fn the_cookie_reader_never_panics_and_returns_only_the_named_cookie(values in prop::collection::vec(cookie_text(), 0..4)) {
            let found = cookie(values.iter().map(String::as_str), ADMISSION_COOKIE);
            if let Some(value) = found {
                // The value follows `wr_admission=` in one of the headers, as a whole pair.
                let pair = format!("{ADMISSION_COOKIE}={value}");
                let whole = values.iter().any(|v| v.split(';').any(|p| p.trim() == pair));
                prop_assert!(whole, "{:?} gave {:?}", values, value);
            } else {
                let named = format!("{ADMISSION_COOKIE}=");
                let present = values.iter().any(|v| v.split(';').any(|p| p.trim().starts_with(&named)));
                prop_assert!(!present);
            }
        }

        #[test]
        fn the_header_is_read_or_refused_never_skipped(raw in prop::collection::vec(any::<u8>(), 0..300)) {
            match authorization_text(Some(&raw)) {
                Ok(Some(text)) => prop_assert_eq!(text.as_bytes(), &raw[..]),
                Ok(None) => prop_assert!(false, "a header present is never read as absent"),
                Err(refusal) => {
                    prop_assert_eq!(refusal.code(), "admission_invalid");
                    prop_assert!(raw.iter().any(|&b| b != b'\t' && !(b' '..=b'~').contains(&b)));
                }
            }
        }

        #[test]
        fn any_text_as_a_token_is_refused_without_panicking(token in prop_oneof![any::<String>(), "[A-Za-z0-9_-]{0,60}\\.[A-Za-z0-9_-]{0,200}\\.[A-Za-z0-9_-]{0,60}"]) {
            let ring = ring(&format!("k1:{SECRET_A}"));
            prop_assert!(ring.verify_admission(&token).is_err());
            prop_assert!(ring.verify_ticket(&token).is_err());
            prop_assert!(ring.verify_account(&token, "platform").is_err());
            let header = format!("Bearer {token}");
            prop_assert!(ring.check_admission(Some(&header), [token.as_str()]).is_err());
        }
    }
}

#[test]
fn secrets_are_the_same_only_byte_for_byte() {
    assert!(same_secret(b"abc", b"abc"));
    assert!(!same_secret(b"abc", b"abd"));
    assert!(!same_secret(b"ab", b"abc"), "a prefix is not the secret");
    assert!(!same_secret(b"", b"abc"));
    assert!(same_secret(b"", b""));
}
