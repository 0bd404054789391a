//! Reading a retry-after header value, as every HTTP provider sends it.

use std::time::Duration;

/// Parses a retry-after header value: whole or fractional seconds, or an HTTP date (IMF
/// fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`) taken relative to `now` (seconds since the Unix
/// epoch). A date in the past means zero. `None` for anything else.
pub fn parse_retry_after(value: &str, now_unix_secs: u64) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<f64>() {
        // Finite and non-negative, but possibly too large for a `Duration`: saturate.
        return (secs.is_finite() && secs >= 0.0)
            .then(|| Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX));
    }
    let at = parse_http_date(v)?;
    Some(Duration::from_secs(at.saturating_sub(now_unix_secs)))
}

fn parse_http_date(v: &str) -> Option<u64> {
    // "Sun, 06 Nov 1994 08:49:37 GMT"
    let rest = v.split_once(", ")?.1;
    let mut parts = rest.split(' ');
    let day: u64 = parts.next()?.parse().ok()?;
    let month = match parts.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: i64 = parts.next()?.parse().ok()?;
    let mut hms = parts.next()?.split(':');
    let h: u64 = hms.next()?.parse().ok()?;
    let m: u64 = hms.next()?.parse().ok()?;
    let s: u64 = hms.next()?.parse().ok()?;
    // The format's year has four digits (a longer one would overflow the arithmetic below).
    if parts.next()? != "GMT"
        || !(1..=31).contains(&day)
        || !(0..=9999).contains(&year)
        || h > 23
        || m > 59
        || s > 60
    {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + (h * 3600 + m * 60 + s) as i64;
    // A date before 1970 is in the past too.
    Some(u64::try_from(secs).unwrap_or(0))
}
