//! Times as the store keeps them: whole minutes of Unix nanoseconds, and SQLite's signed
//! integers.

/// Length of a rollup, nanoseconds (one minute).
pub const MINUTE_NANOS: u64 = 60_000_000_000;

/// Now as Unix nanoseconds (the writer's clock for retention).
pub fn unix_nanos_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The start of the minute holding `unix_nano`.
pub fn minute_of(unix_nano: u64) -> u64 {
    unix_nano - unix_nano % MINUTE_NANOS
}

/// The end of the minute `unix_nano` falls in (itself on a minute's start): where a range
/// ending there ends in the store's whole minutes.
pub fn minute_end(unix_nano: u64) -> u64 {
    if unix_nano.is_multiple_of(MINUTE_NANOS) {
        unix_nano
    } else {
        minute_of(unix_nano).saturating_add(MINUTE_NANOS)
    }
}

/// Unix nanoseconds as SQLite's integer (saturating past year 2262).
pub(super) fn sql_time(unix_nano: u64) -> i64 {
    i64::try_from(unix_nano).unwrap_or(i64::MAX)
}

/// SQLite's integer back to Unix nanoseconds (negative reads as 0).
pub(super) fn unix_time(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}
