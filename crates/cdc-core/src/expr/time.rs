//! `date`, `timestamp` and `timestamptz` values: parsing PostgreSQL's ISO text output (what pgoutput
//! sends under `DateStyle=ISO`, `TimeZone=UTC`) and the ISO-8601 forms people write in literals, and
//! printing them back.
//!
//! Dates are days since 1970-01-01, timestamps microseconds since 1970-01-01 00:00 (UTC for
//! `timestamptz`), in the proleptic Gregorian calendar with astronomical years (1 BC is year 0).
//! `infinity` and `-infinity` are the extreme values of the integer type, so they order correctly.

use std::fmt::Write as _;

/// `date 'infinity'`.
pub(crate) const DATE_INF: i32 = i32::MAX;
/// `date '-infinity'`.
pub(crate) const DATE_NINF: i32 = i32::MIN;
/// `timestamp 'infinity'`.
pub(crate) const TS_INF: i64 = i64::MAX;
/// `timestamp '-infinity'`.
pub(crate) const TS_NINF: i64 = i64::MIN;

pub(crate) const USECS_PER_DAY: i64 = 86_400_000_000;
const USECS_PER_SEC: i64 = 1_000_000;

/// Why text is not a date or time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DtErr {
    /// Not a date/time literal.
    Syntax,
    /// A field or the whole value out of range.
    Range,
    /// `now`, `today`, ...: values that depend on when they are read.
    NotImmutable,
}

/// A parsed literal before it is given a type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dt {
    PosInf,
    NegInf,
    At {
        /// Astronomical year (for range checks).
        year: i64,
        /// Days since 1970-01-01.
        days: i64,
        /// Microseconds since midnight (may reach a day or more: 24:00:00, leap second).
        time: i64,
        /// Seconds east of UTC, when the literal had a zone.
        offset: Option<i64>,
    },
}

/// Days since 1970-01-01 of a proleptic Gregorian date (astronomical year).
pub(crate) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The (astronomical year, month, day) of a day number since 1970-01-01.
pub(crate) use crate::time::civil_from_days;

fn is_leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if is_leap(y) => 29,
        _ => 28,
    }
}

struct Cur<'a> {
    s: &'a [u8],
    i: usize,
}

impl Cur<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    /// Up to `max` digits, at least `min`.
    fn digits(&mut self, min: usize, max: usize) -> Result<(i64, usize), DtErr> {
        let start = self.i;
        let mut v: i64 = 0;
        while self.i - start < max {
            match self.peek() {
                Some(c) if c.is_ascii_digit() => {
                    v = v * 10 + i64::from(c - b'0');
                    self.i += 1;
                }
                _ => break,
            }
        }
        let n = self.i - start;
        if n < min {
            return Err(DtErr::Syntax);
        }
        Ok((v, n))
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn skip_blanks(&mut self) {
        while self.peek() == Some(b' ') {
            self.i += 1;
        }
    }

    fn eat_word(&mut self, w: &[u8]) -> bool {
        let end = self.i + w.len();
        if end <= self.s.len() && self.s[self.i..end].eq_ignore_ascii_case(w) {
            self.i = end;
            true
        } else {
            false
        }
    }
}

fn d2(s: &[u8], i: usize) -> Option<i64> {
    let (a, b) = (s.get(i)?.wrapping_sub(b'0'), s.get(i + 1)?.wrapping_sub(b'0'));
    (a <= 9 && b <= 9).then_some(i64::from(a) * 10 + i64::from(b))
}

/// PostgreSQL's own ISO output (`2024-03-15`, `2024-03-15 14:23:45.123`, `... +00`, `+05:30`),
/// read at fixed positions. None for anything else (BC, infinity, 5-digit years): [`parse`] then
/// reads it.
#[inline]
fn parse_iso_output(s: &[u8]) -> Option<Dt> {
    if s.len() < 10 || s[4] != b'-' || s[7] != b'-' {
        return None;
    }
    let year = d2(s, 0)? * 100 + d2(s, 2)?;
    let (month, day) = (d2(s, 5)?, d2(s, 8)?);
    if year == 0 || !(1..=12).contains(&month) || day < 1 || day > i64::from(days_in_month(year, month as u32)) {
        return None;
    }
    let days = days_from_civil(year, month as u32, day as u32);
    if s.len() == 10 {
        return Some(Dt::At { year, days, time: 0, offset: None });
    }
    if s.len() < 19 || s[10] != b' ' || s[13] != b':' || s[16] != b':' {
        return None;
    }
    let (h, mi, sec) = (d2(s, 11)?, d2(s, 14)?, d2(s, 17)?);
    if h > 23 || mi > 59 || sec > 59 {
        return None;
    }
    let mut i = 19;
    let mut us = 0;
    if s.get(i) == Some(&b'.') {
        i += 1;
        let mut n = 0;
        while let Some(d) = s.get(i).map(|c| c.wrapping_sub(b'0')).filter(|d| *d <= 9) {
            if n == 6 {
                return None;
            }
            us = us * 10 + i64::from(d);
            n += 1;
            i += 1;
        }
        if n == 0 {
            return None;
        }
        for _ in n..6 {
            us *= 10;
        }
    }
    let mut offset = None;
    if let Some(&sign @ (b'+' | b'-')) = s.get(i) {
        let oh = d2(s, i + 1)?;
        i += 3;
        let mut om = 0;
        if s.get(i) == Some(&b':') {
            om = d2(s, i + 1)?;
            i += 3;
        }
        if s.get(i) == Some(&b':') {
            return None; // seconds in the offset: rare, the general parser reads them
        }
        let secs = oh * 3600 + om * 60;
        offset = Some(if sign == b'-' { -secs } else { secs });
    }
    if i != s.len() {
        return None;
    }
    Some(Dt::At { year, days, time: ((h * 60 + mi) * 60 + sec) * USECS_PER_SEC + us, offset })
}

/// Parses a date, timestamp or timestamptz: `2024-03-15`, `2024-03-15 14:23:45.123+00`,
/// `2024-03-15T14:00:00Z`, `2024-03-15 14:00 +05:30`, `0044-03-15 BC`, `infinity`, `-infinity`,
/// `epoch`. Fractions beyond microseconds are rounded.
pub(crate) fn parse(s: &[u8]) -> Result<Dt, DtErr> {
    if let Some(dt) = parse_iso_output(s) {
        return Ok(dt);
    }
    let s = s.trim_ascii();
    for (w, v) in [(&b"infinity"[..], Dt::PosInf), (b"+infinity", Dt::PosInf), (b"-infinity", Dt::NegInf)] {
        if s.eq_ignore_ascii_case(w) {
            return Ok(v);
        }
    }
    if s.eq_ignore_ascii_case(b"epoch") {
        return Ok(Dt::At { year: 1970, days: 0, time: 0, offset: Some(0) });
    }
    for w in [&b"now"[..], b"today", b"tomorrow", b"yesterday", b"allballs"] {
        if s.eq_ignore_ascii_case(w) {
            return Err(DtErr::NotImmutable);
        }
    }
    let mut c = Cur { s, i: 0 };
    let (year, _) = c.digits(1, 7)?;
    if !c.eat(b'-') {
        return Err(DtErr::Syntax);
    }
    let (month, _) = c.digits(1, 2)?;
    if !c.eat(b'-') {
        return Err(DtErr::Syntax);
    }
    let (day, _) = c.digits(1, 2)?;
    let mut time: i64 = 0;
    let mut offset = None;
    // Time part: after 'T' or blanks, when a digit follows.
    let save = c.i;
    let has_time = if c.eat(b'T') || c.eat(b't') {
        true
    } else {
        c.skip_blanks();
        matches!(c.peek(), Some(d) if d.is_ascii_digit())
    };
    if has_time {
        let (h, _) = c.digits(1, 2)?;
        if !c.eat(b':') {
            return Err(DtErr::Syntax);
        }
        let (mi, _) = c.digits(2, 2)?;
        let (mut sec, mut us) = (0, 0);
        if c.eat(b':') {
            sec = c.digits(2, 2)?.0;
            if c.eat(b'.') {
                let start = c.i;
                let (_, n) = c.digits(1, usize::MAX)?;
                let frac = &s[start..start + n];
                for k in 0..6 {
                    us = us * 10 + frac.get(k).map_or(0, |d| i64::from(d - b'0'));
                }
                if frac.get(6).is_some_and(|&d| d >= b'5') {
                    us += 1;
                }
            }
        }
        if h > 24 || mi > 59 || sec > 60 || (h == 24 && (mi, sec, us) != (0, 0, 0)) {
            return Err(DtErr::Range);
        }
        time = ((h * 60 + mi) * 60 + sec) * USECS_PER_SEC + us;
        // Zone.
        c.skip_blanks();
        if c.eat(b'Z') || c.eat(b'z') || c.eat_word(b"utc") || c.eat_word(b"gmt") {
            offset = Some(0);
        } else if let Some(sign @ (b'+' | b'-')) = c.peek() {
            c.i += 1;
            let (mut oh, n) = c.digits(1, 4)?;
            let (mut om, mut os) = (0, 0);
            if n > 2 {
                // +HHMM
                om = oh % 100;
                oh /= 100;
            } else if c.eat(b':') {
                om = c.digits(2, 2)?.0;
                if c.eat(b':') {
                    os = c.digits(2, 2)?.0;
                }
            }
            if oh > 15 || om > 59 || os > 59 {
                return Err(DtErr::Range);
            }
            let secs = oh * 3600 + om * 60 + os;
            offset = Some(if sign == b'-' { -secs } else { secs });
        }
    } else {
        c.i = save;
    }
    c.skip_blanks();
    let bc = if c.eat_word(b"bc") {
        true
    } else {
        c.eat_word(b"ad");
        false
    };
    if c.i != s.len() {
        return Err(DtErr::Syntax);
    }
    if year == 0 || !(1..=12).contains(&month) {
        return Err(DtErr::Range);
    }
    let astro = if bc { 1 - year } else { year };
    let month = month as u32;
    if day < 1 || day > i64::from(days_in_month(astro, month)) {
        return Err(DtErr::Range);
    }
    // PostgreSQL's dates start on 4713-01-01 BC (Julian day 0).
    if astro < -4712 {
        return Err(DtErr::Range);
    }
    Ok(Dt::At { year: astro, days: days_from_civil(astro, month, day as u32), time, offset })
}

impl Dt {
    /// As a `date`: the time and zone are ignored, as PostgreSQL's date input does.
    pub(crate) fn to_date(self) -> Result<i32, DtErr> {
        match self {
            Dt::PosInf => Ok(DATE_INF),
            Dt::NegInf => Ok(DATE_NINF),
            Dt::At { year, days, .. } => {
                if year > 5_874_897 {
                    return Err(DtErr::Range);
                }
                i32::try_from(days).map_err(|_| DtErr::Range)
            }
        }
    }

    /// As a `timestamp` (zone ignored) or a `timestamptz` (zone applied; none means UTC, the
    /// worker's TimeZone).
    pub(crate) fn to_micros(self, with_zone: bool) -> Result<i64, DtErr> {
        match self {
            Dt::PosInf => Ok(TS_INF),
            Dt::NegInf => Ok(TS_NINF),
            Dt::At { year, days, time, offset } => {
                if year > 294_276 {
                    return Err(DtErr::Range);
                }
                let off = if with_zone { offset.unwrap_or(0) } else { 0 };
                Ok(days * USECS_PER_DAY + time - off * USECS_PER_SEC)
            }
        }
    }
}

/// `date` -> `timestamp(tz)`: midnight (UTC).
pub(crate) fn date_to_micros(d: i32) -> i64 {
    match d {
        DATE_INF => TS_INF,
        DATE_NINF => TS_NINF,
        d => i64::from(d) * USECS_PER_DAY,
    }
}

/// `timestamp(tz)` -> `date`: the day it falls on (in UTC).
pub(crate) fn micros_to_date(t: i64) -> i32 {
    match t {
        TS_INF => DATE_INF,
        TS_NINF => DATE_NINF,
        // Every timestamp's day fits an i32.
        t => t.div_euclid(USECS_PER_DAY) as i32,
    }
}

fn pg_year(out: &mut String, astro: i64) -> bool {
    let bc = astro <= 0;
    let _ = write!(out, "{:04}", if bc { 1 - astro } else { astro });
    bc
}

fn iso_year(out: &mut String, astro: i64) {
    let _ = if astro < 0 {
        write!(out, "-{:04}", -astro)
    } else if astro > 9999 {
        write!(out, "+{astro}")
    } else {
        write!(out, "{astro:04}")
    };
}

fn write_time(out: &mut String, tod: i64) {
    let (secs, us) = (tod / USECS_PER_SEC, tod % USECS_PER_SEC);
    let _ = write!(out, "{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60);
    if us != 0 {
        let frac = format!("{us:06}");
        out.push('.');
        out.push_str(frac.trim_end_matches('0'));
    }
}

/// PostgreSQL's text output of a date (`2024-03-15`, `0044-03-15 BC`, `infinity`).
pub(crate) fn write_date(out: &mut String, d: i32) {
    match d {
        DATE_INF => out.push_str("infinity"),
        DATE_NINF => out.push_str("-infinity"),
        d => {
            let (y, m, day) = civil_from_days(i64::from(d));
            let bc = pg_year(out, y);
            let _ = write!(out, "-{m:02}-{day:02}");
            if bc {
                out.push_str(" BC");
            }
        }
    }
}

/// PostgreSQL's text output of a timestamp (`2024-03-15 14:23:45.123`, with `+00` for timestamptz).
pub(crate) fn write_ts(out: &mut String, t: i64, tz: bool) {
    match t {
        TS_INF => out.push_str("infinity"),
        TS_NINF => out.push_str("-infinity"),
        t => {
            let (y, m, d) = civil_from_days(t.div_euclid(USECS_PER_DAY));
            let bc = pg_year(out, y);
            let _ = write!(out, "-{m:02}-{d:02} ");
            write_time(out, t.rem_euclid(USECS_PER_DAY));
            if tz {
                out.push_str("+00");
            }
            if bc {
                out.push_str(" BC");
            }
        }
    }
}

/// ISO-8601 as the event's value conversion writes it (`2024-03-15`, `-0043-03-15`).
pub(crate) fn write_iso_date(out: &mut String, d: i32) {
    match d {
        DATE_INF | DATE_NINF => write_date(out, d),
        d => {
            let (y, m, day) = civil_from_days(i64::from(d));
            iso_year(out, y);
            let _ = write!(out, "-{m:02}-{day:02}");
        }
    }
}

/// ISO-8601 as the event's value conversion writes it (`2024-03-15T14:23:45.123`, `...Z` with zone).
pub(crate) fn write_iso_ts(out: &mut String, t: i64, tz: bool) {
    match t {
        TS_INF | TS_NINF => write_ts(out, t, tz),
        t => {
            let (y, m, d) = civil_from_days(t.div_euclid(USECS_PER_DAY));
            iso_year(out, y);
            let _ = write!(out, "-{m:02}-{d:02}T");
            write_time(out, t.rem_euclid(USECS_PER_DAY));
            if tz {
                out.push('Z');
            }
        }
    }
}
