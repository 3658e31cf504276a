//! Times as every answer of both services gives them: RFC 3339, in UTC.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// An instant in RFC 3339, to the precision it has (a database time keeps its microseconds).
pub fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

/// A Unix-second instant in RFC 3339; empty when out of range.
pub fn rfc3339_seconds(unix_seconds: u64) -> String {
    i64::try_from(unix_seconds)
        .ok()
        .and_then(|s| OffsetDateTime::from_unix_timestamp(s).ok())
        .map(rfc3339)
        .unwrap_or_default()
}

/// A Unix-millisecond instant in RFC 3339, to the millisecond; empty when out of range.
pub fn rfc3339_ms(unix_ms: impl Into<i128>) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(unix_ms.into() * 1_000_000).map(rfc3339).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_and_milliseconds_read_back_as_the_instant_they_name() {
        assert_eq!(rfc3339_seconds(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_seconds(1_796_688_000), "2026-12-08T00:00:00Z");
        assert_eq!(rfc3339_ms(1_796_688_000_250_u64), "2026-12-08T00:00:00.25Z");
        assert_eq!(rfc3339_ms(-1_000_i64), "1969-12-31T23:59:59Z");
        let parsed = OffsetDateTime::parse(&rfc3339_ms(1_796_688_000_123_u64), &Rfc3339).expect("parses");
        assert_eq!(parsed.unix_timestamp_nanos(), 1_796_688_000_123_000_000);
    }

    #[test]
    fn an_instant_out_of_range_gives_nothing_rather_than_a_wrong_time() {
        assert_eq!(rfc3339_seconds(u64::MAX), "");
        assert_eq!(rfc3339_ms(i128::MAX / 2_000_000), "");
    }
}
