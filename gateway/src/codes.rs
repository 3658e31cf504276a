//! Presale codes: what an operator asks for, the codes made from it, and how a fan's typed code is read. A
//! room's `access` decides what codes do (`room::Access`); the join script redeems them
//! (`lua/queue_join.lua`), once per account, within each code's window and redemption cap.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The request field a presale code comes in.
pub const HEADER: &str = "presale-code";

/// Most codes one batch makes.
pub const MAX_BATCH: u32 = 100_000;

/// Most accounts one code may admit.
pub const MAX_USES: u32 = 10_000_000;

/// Letters of a made code: Crockford's base 32, no I, L, O or U, so a code read aloud or typed from paper
/// survives.
const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// Length of a made code: 60 random bits, grouped by four for reading.
const MADE_LENGTH: usize = 12;

/// A code as the store keeps it: upper case, no separators, 4 to 32 of `A-Z 0-9`. Fans type codes in any case
/// with dashes or spaces; anything else is not a code.
pub fn normalise(raw: &str) -> Option<String> {
    let code: String = raw.chars().filter(|c| !matches!(c, '-' | ' ')).map(|c| c.to_ascii_uppercase()).collect();
    ((4..=32).contains(&code.len()) && code.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()))
        .then_some(code)
}

/// A new random code, as handed out: `XXXX-XXXX-XXXX`.
pub fn make() -> String {
    let bits = rand::random::<u64>();
    let mut out = String::with_capacity(MADE_LENGTH + 2);
    for i in 0..MADE_LENGTH {
        if i > 0 && i % 4 == 0 {
            out.push('-');
        }
        out.push(char::from(ALPHABET[((bits >> (5 * i)) & 31) as usize]));
    }
    out
}

/// A batch of codes an operator asks for: `count` single-use codes (the default), or one code many accounts
/// share up to `uses` (`count` 1, `uses` above 1, and the operator's own `code` if it likes).
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchAsk {
    /// How many codes, 1 to 100,000 (1 by default).
    #[schema(minimum = 1, maximum = 100_000)]
    pub count: Option<u32>,
    /// How many accounts each code admits, 1 to 10,000,000 (1 by default).
    #[schema(minimum = 1, maximum = 10_000_000)]
    pub uses: Option<u32>,
    /// The code itself, for a batch of one (4 to 32 of A-Z 0-9; dashes and spaces are ignored, case too).
    pub code: Option<String>,
    /// When the codes start to work, Unix seconds (now by default).
    #[schema(maximum = 4_102_444_800_u64)]
    pub starts_at: Option<u64>,
    /// When they stop, Unix seconds (never by default).
    #[schema(maximum = 4_102_444_800_u64)]
    pub ends_at: Option<u64>,
}

/// Why a batch was refused (a 422 with this code).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("{field} must be between {min} and {max}")]
    OutOfRange { field: &'static str, min: u64, max: u64 },
    #[error("code must be 4 to 32 of A-Z 0-9 (dashes and spaces are ignored)")]
    BadCode,
    #[error("a batch with its own code has one code (count 1)")]
    CodeWithCount,
    #[error("ends_at must be after starts_at")]
    EmptyWindow,
}

impl BatchError {
    pub fn code(&self) -> &'static str {
        match self {
            BatchError::OutOfRange { .. } | BatchError::EmptyWindow => "setting_out_of_range",
            BatchError::BadCode | BatchError::CodeWithCount => "invalid_request",
        }
    }
}

/// A batch, checked, with its codes made: what the store writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Batch {
    /// The batch's id (16 hex digits).
    pub batch: String,
    /// How many codes it has.
    pub count: u32,
    /// How many accounts each code admits.
    pub uses: u32,
    /// Unix seconds.
    pub starts_at: u64,
    /// Unix seconds; null: never.
    pub ends_at: Option<u64>,
    /// Unix seconds.
    pub created_at: u64,
}

impl BatchAsk {
    /// Checks the ask and makes its codes (as handed out: made ones grouped by dashes), at `now` (Unix seconds).
    pub fn make(&self, now: u64) -> Result<(Batch, Vec<String>), BatchError> {
        let count = self.count.unwrap_or(1);
        let uses = self.uses.unwrap_or(1);
        let range = |field, value: u64, min, max| {
            if (min..=max).contains(&value) { Ok(()) } else { Err(BatchError::OutOfRange { field, min, max }) }
        };
        range("count", count.into(), 1, MAX_BATCH.into())?;
        range("uses", uses.into(), 1, MAX_USES.into())?;
        let starts_at = self.starts_at.unwrap_or(now);
        range("starts_at", starts_at, 0, 4_102_444_800)?;
        if let Some(ends) = self.ends_at {
            range("ends_at", ends, 0, 4_102_444_800)?;
            if ends <= starts_at {
                return Err(BatchError::EmptyWindow);
            }
        }
        let codes = match &self.code {
            Some(_) if count != 1 => return Err(BatchError::CodeWithCount),
            Some(own) => vec![normalise(own).ok_or(BatchError::BadCode)?],
            None => (0..count).map(|_| make()).collect(),
        };
        let batch = Batch {
            batch: format!("{:016x}", rand::random::<u64>()),
            count,
            uses,
            starts_at,
            ends_at: self.ends_at,
            created_at: now,
        };
        Ok((batch, codes))
    }
}

impl Batch {
    /// The value the join script reads for each of the batch's codes: `batch:uses:starts_ms:ends_ms`.
    pub fn stored(&self) -> String {
        format!("{}:{}:{}:{}", self.batch, self.uses, self.starts_at * 1000, self.ends_at.unwrap_or(0) * 1000)
    }
}

/// One account's redemption of a code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Redemption {
    pub account: String,
    pub code: String,
    /// Unix seconds.
    pub at: u64,
}

/// A batch with how many accounts redeemed its codes.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BatchView {
    #[serde(flatten)]
    pub batch: Batch,
    pub redeemed: u64,
}

/// A room's codes: the batches, and who redeemed what (newest first, at most [`MAX_LISTED`]).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Report {
    pub event_id: i64,
    pub batches: Vec<BatchView>,
    pub redeemed_total: u64,
    pub redemptions: Vec<Redemption>,
}

/// Most redemptions one report lists.
pub const MAX_LISTED: usize = 10_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_codes_are_read_in_any_case_with_separators_and_anything_else_is_refused() {
        assert_eq!(normalise("abcd-efgh 1234").as_deref(), Some("ABCDEFGH1234"));
        assert_eq!(normalise("FanClub2026").as_deref(), Some("FANCLUB2026"));
        for bad in ["", "abc", "a:bcd", "ÄBCD", "abcd_efgh", &"A".repeat(33), "ab\ncd"] {
            assert_eq!(normalise(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn made_codes_read_back_as_themselves_and_differ() {
        let made: Vec<String> = (0..1000).map(|_| make()).collect();
        for code in &made {
            assert_eq!(code.len(), 14);
            let read = normalise(code).expect("a made code reads");
            assert_eq!(read, code.replace('-', ""));
        }
        let distinct: std::collections::HashSet<_> = made.iter().collect();
        assert_eq!(distinct.len(), made.len());
    }

    #[test]
    fn a_batch_is_checked_before_any_code_is_made() {
        let ask = |count, uses, code: Option<&str>, starts, ends| BatchAsk {
            count,
            uses,
            code: code.map(str::to_owned),
            starts_at: starts,
            ends_at: ends,
        };
        let (batch, codes) = ask(Some(50), None, None, None, None).make(1_000).expect("fifty codes");
        assert_eq!((codes.len(), batch.uses, batch.starts_at, batch.ends_at), (50, 1, 1_000, None));
        let (shared, codes) = ask(None, Some(500), Some("fan-club"), Some(10), Some(20)).make(5).expect("shared");
        assert_eq!(codes, vec!["FANCLUB".to_owned()]);
        assert_eq!(shared.stored(), format!("{}:500:10000:20000", shared.batch));
        assert_eq!(
            ask(Some(0), None, None, None, None).make(1).map_err(|e| e.code()).err(),
            Some("setting_out_of_range")
        );
        assert_eq!(
            ask(Some(100_001), None, None, None, None).make(1).map_err(|e| e.code()).err(),
            Some("setting_out_of_range")
        );
        assert_eq!(
            ask(None, Some(0), None, None, None).make(1).map_err(|e| e.code()).err(),
            Some("setting_out_of_range")
        );
        assert_eq!(ask(Some(2), None, Some("FANCLUB"), None, None).make(1), Err(BatchError::CodeWithCount));
        assert_eq!(ask(None, None, Some("no!"), None, None).make(1), Err(BatchError::BadCode));
        assert_eq!(ask(None, None, None, Some(20), Some(20)).make(1), Err(BatchError::EmptyWindow));
    }
}
