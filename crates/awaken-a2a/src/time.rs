//! RFC 3339 timestamps (the protocol's `Timestamp` in JSON) from Unix milliseconds.

/// `unix_millis` as an RFC 3339 UTC timestamp with milliseconds
/// (`2026-01-02T03:04:05.678Z`); times before the epoch are the epoch.
pub fn timestamp(unix_millis: i64) -> String {
    let millis = unix_millis.max(0);
    let secs = millis / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        millis % 1000
    )
}

/// The proleptic Gregorian date `days` days after 1970-01-01 (the days-to-civil algorithm
/// over 400-year eras).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}
