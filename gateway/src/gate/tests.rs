use altcha::{Solution, SolveChallengeOptions};
use tokens::unix_now;

use super::*;

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-admission";

fn solve(challenge: &Challenge) -> Solution {
    altcha::solve_challenge(SolveChallengeOptions::new(challenge)).expect("solvable").expect("within the timeout")
}

fn solved(gate: &Gate, event: i64, account: &str, difficulty: u32) -> String {
    let challenge = gate.issue(event, account, difficulty, unix_now());
    payload_field(&challenge, &solve(&challenge))
}

#[test]
fn a_solved_challenge_pays_for_its_own_room_and_account() {
    let gate = Gate::new(SECRET);
    let payment = gate.check(&solved(&gate, 7, "fan-1", 2000), 7, "fan-1").expect("accepted");
    assert_eq!(payment.nonce.len(), 32);
    let expected = (unix_now() + CHALLENGE_LIFETIME.as_secs()) * 1000;
    assert!(payment.expires_at_ms.abs_diff(expected) <= 2000, "{payment:?}");
}

#[test]
fn a_challenge_is_worthless_for_another_room_or_account() {
    let gate = Gate::new(SECRET);
    let field = solved(&gate, 7, "fan-1", 2000);
    assert_eq!(gate.check(&field, 8, "fan-1"), Err(Failure::NotYours));
    assert_eq!(gate.check(&field, 7, "fan-2"), Err(Failure::NotYours));
}

#[test]
fn a_challenge_from_another_deployment_is_forged() {
    let theirs = Gate::new(b"another deployment's admission secret, 32+ bytes");
    let field = solved(&theirs, 7, "fan-1", 2000);
    assert_eq!(Gate::new(SECRET).check(&field, 7, "fan-1"), Err(Failure::Forged));
}

#[test]
fn a_wrong_key_or_an_edited_challenge_is_forged() {
    let gate = Gate::new(SECRET);
    let challenge = gate.issue(7, "fan-1", 2000, unix_now());
    let good = solve(&challenge);
    let wrong_key = Solution { derived_key: "00".repeat(32), ..good.clone() };
    assert_eq!(gate.check(&payload_field(&challenge, &wrong_key), 7, "fan-1"), Err(Failure::Forged));
    // Cheaper parameters, or the key signature dropped (which would make `altcha` derive at the client's
    // cost): the signature no longer holds, or the gate refuses before asking.
    let mut easier = challenge.clone();
    easier.parameters.key_prefix = "00".into();
    assert_eq!(gate.check(&payload_field(&easier, &good), 7, "fan-1"), Err(Failure::Forged));
    let mut unsigned_key = challenge.clone();
    unsigned_key.parameters.key_signature = None;
    assert_eq!(gate.check(&payload_field(&unsigned_key, &good), 7, "fan-1"), Err(Failure::Forged));
    let mut costly = challenge;
    costly.parameters.cost = 1_000_000_000;
    assert_eq!(gate.check(&payload_field(&costly, &good), 7, "fan-1"), Err(Failure::Forged));
}

#[test]
fn an_expired_challenge_is_expired_not_forged() {
    let gate = Gate::new(SECRET);
    let challenge = gate.issue(7, "fan-1", 2000, unix_now() - CHALLENGE_LIFETIME.as_secs() - 10);
    let field = payload_field(&challenge, &solve(&challenge));
    let refused = gate.check(&field, 7, "fan-1");
    assert_eq!(refused, Err(Failure::Expired));
    assert!(!Failure::Expired.is_forgery());
}

#[test]
fn garbage_is_malformed() {
    let gate = Gate::new(SECRET);
    let long = "A".repeat(MAX_PAYLOAD_BYTES + 4);
    for field in ["", "not base64!", "e30=", "bnVsbA==", long.as_str()] {
        assert_eq!(gate.check(field, 7, "fan-1"), Err(Failure::Malformed), "{field:.20}");
    }
}

#[test]
fn difficulty_bounds_the_counters_a_solver_tries() {
    let gate = Gate::new(SECRET);
    let most = (0..40).map(|_| solve(&gate.issue(7, "fan-1", 1000, unix_now())).counter).max();
    assert!(most.is_some_and(|c| c < 1000), "{most:?}");
}
