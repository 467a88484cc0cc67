//! PostgreSQL timestamps (microseconds since 2000-01-01 UTC) as ISO-8601 text.

/// Microseconds between 1970-01-01 and 2000-01-01.
pub const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// Converts a PostgreSQL timestamp to Unix microseconds.
pub fn pg_to_unix_micros(pg_micros: i64) -> i64 {
    pg_micros.saturating_add(PG_EPOCH_OFFSET_MICROS)
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (H. Hinnant's `civil_from_days`).
pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Formats a PostgreSQL timestamp as `YYYY-MM-DDTHH:MM:SS.mmmZ` (milliseconds, UTC), the precision of
/// `metadata.timestamp`.
pub fn format_pg_timestamp_ms(pg_micros: i64) -> String {
    let mut out = Vec::with_capacity(24);
    write_pg_timestamp_ms(&mut out, pg_micros);
    String::from_utf8(out).unwrap_or_default()
}

/// Appends [`format_pg_timestamp_ms`]'s text to `out`, digit by digit: every event's metadata
/// carries one, and `format!` (an allocation and the formatting machinery) was 6 % of the worker's
/// CPU in a snapshot.
pub fn write_pg_timestamp_ms(out: &mut Vec<u8>, pg_micros: i64) {
    let unix = pg_to_unix_micros(pg_micros);
    let millis = unix.div_euclid(1000);
    let secs = millis.div_euclid(1000);
    let ms = millis.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let digits = |out: &mut Vec<u8>, v: i64, width: u32| {
        if width == 4 && !(0..10_000).contains(&v) {
            // Outside years 0-9999: as format! writes it (a sign, no padding beyond 4 digits).
            out.extend_from_slice(format!("{v:04}").as_bytes());
            return;
        }
        for i in (0..width).rev() {
            out.push(b'0' + (v / 10i64.pow(i) % 10) as u8);
        }
    };
    digits(out, y, 4);
    out.push(b'-');
    digits(out, m.into(), 2);
    out.push(b'-');
    digits(out, d.into(), 2);
    out.push(b'T');
    digits(out, sod / 3600, 2);
    out.push(b':');
    digits(out, sod % 3600 / 60, 2);
    out.push(b':');
    digits(out, sod % 60, 2);
    out.push(b'.');
    digits(out, ms, 3);
    out.push(b'Z');
}

/// The UTC date of a PostgreSQL timestamp plus `days`, as `YYYY-MM-DD`.
pub fn format_pg_date_plus_days(pg_micros: i64, days: u32) -> String {
    let day = pg_to_unix_micros(pg_micros).div_euclid(86_400_000_000) + i64::from(days);
    let (y, m, d) = civil_from_days(day);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_pg_timestamp_ms(0), "2000-01-01T00:00:00.000Z");
        // 2024-03-15T14:23:45.123456Z
        let unix_micros: i64 = 1_710_512_625_123_456;
        assert_eq!(format_pg_timestamp_ms(unix_micros - PG_EPOCH_OFFSET_MICROS), "2024-03-15T14:23:45.123Z");
        assert_eq!(format_pg_timestamp_ms(-1), "1999-12-31T23:59:59.999Z");
        assert_eq!(format_pg_timestamp_ms(-PG_EPOCH_OFFSET_MICROS), "1970-01-01T00:00:00.000Z");
        // The seed's retention: 2024-03-15 plus 2555 days (seven years).
        assert_eq!(format_pg_date_plus_days(unix_micros - PG_EPOCH_OFFSET_MICROS, 2555), "2031-03-14");
        assert_eq!(format_pg_date_plus_days(-1, 1), "2000-01-01");
    }

    #[test]
    fn timestamps_are_written_as_format_writes_them() {
        let formatted = |pg_micros: i64| {
            let unix = pg_to_unix_micros(pg_micros);
            let millis = unix.div_euclid(1000);
            let secs = millis.div_euclid(1000);
            let sod = secs.rem_euclid(86_400);
            let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
            format!(
                "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
                sod / 3600,
                sod % 3600 / 60,
                sod % 60,
                millis.rem_euclid(1000)
            )
        };
        let day = 86_400_000_000i64;
        for t in [
            0,
            -1,
            1,
            999,
            1_000,
            day - 1,
            day,
            -PG_EPOCH_OFFSET_MICROS,
            800_000 * day,
            -800_000 * day,
            3_000_000 * day,
            -1_000_000 * day,
            1_710_512_625_123_456 - PG_EPOCH_OFFSET_MICROS,
        ] {
            assert_eq!(format_pg_timestamp_ms(t), formatted(t), "{t}");
        }
    }
}
