//! The Debezium format: each event as Debezium's PostgreSQL connector writes it through Kafka
//! Connect's JSON converter, so Debezium consumers and Kafka Connect sinks read pg_cdc topics
//! unchanged.
//!
//! ```text
//! key:   {"schema": <prefix>.<schema>.<table>.Key, "payload": {"id": 1}}
//! value: {"schema": <prefix>.<schema>.<table>.Envelope,
//!         "payload": {"before", "after", "source": {...}, "transaction": null, "op", "ts_ms", "ts_us", "ts_ns"}}
//! ```
//! With `schemas` false, key and value are the payloads alone. With `converter: avro` they are
//! what Kafka Connect's Avro converter writes instead ([`super::connect_avro`]): the Connect
//! schemas mapped to Avro, registered, and the payloads as datums in Confluent's wire format. `op` is `c`, `u`, `d`, `r`
//! (snapshot rows) or `t` (TRUNCATE; Debezium skips them unless told not to, pg_cdc sends what the
//! table's `operations` capture: leave truncate out there to match). After a DELETE a tombstone
//! (the key, no value) follows when `tombstones_on_delete` is set, as in Debezium.
//!
//! Each column's values are typed as Debezium types them under its default settings
//! ([`Dt`]; `time.precision.mode` adaptive, `interval.handling.mode` numeric,
//! `binary.handling.mode` bytes, `include.unknown.datatypes` false: a column of a type Debezium
//! does not know, a composite or `box` say, is left out), with the three
//! `decimal.handling.mode`s. The oracle is Debezium itself: `scripts/capture_debezium.py` records
//! Debezium 3.6's output for the golden workloads, and the tests compare field by field. Where
//! Debezium loses a value pg_cdc writes it (README, "Debezium format": a `name` column, an enum
//! array with a NULL element, a numeric array with NaN), and a multidimensional array stops the
//! sink as in the Avro format.
//!
//! The event is built from pg_cdc's JSON event, so every filter, transformation and redaction
//! rule holds: a hidden column is a string, a computed one typed by its expression.
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use base64::Engine as _;
use cdc_core::config::sink::{DebeziumOptions, DecimalHandling};
use cdc_core::envelope::{Event, Op, RelationPlan};
use cdc_core::format::{EventFormat, FormatError};
use cdc_core::types::{TypeKind, TypeRegistry};
use serde_json::value::RawValue;
use serde_json::{json, Value as Json};

use super::avro::{json_string, numeric_typmod, parse_date, parse_time, parse_timestamp, unscaled};
use super::event::{Fields, JsonEvent};

/// What Debezium writes for a value that TOAST left unchanged (`unavailable.value.placeholder`).
pub const UNAVAILABLE: &str = "__debezium_unavailable_value";

/// Debezium's `date` for PostgreSQL's `infinity` and `-infinity` (PostgreSQL's day counts from
/// 2000-01-01 at the int's extremes, moved to 1970 in 32 bits).
const DATE_INFINITY: i32 = i32::MIN + 10_956;
const DATE_MINUS_INFINITY: i32 = i32::MIN + 10_957;
/// Debezium's `timestamp` for `infinity` and `-infinity` (the PostgreSQL JDBC driver's).
const TIMESTAMP_INFINITY: i64 = 9_223_372_036_825_200_000;
const TIMESTAMP_MINUS_INFINITY: i64 = -9_223_372_036_832_400_000;
/// Days in a month, for a duration (`interval.handling.mode` numeric: 365.25 / 12).
const DAYS_PER_MONTH: f64 = 30.4375;

/// The Connect type a column's values are written as (Debezium's name in the comment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dt {
    /// `boolean` (bool, bit(1)).
    Boolean,
    /// `int16`, `int32`, `int64`: the number as is.
    Int(&'static str),
    /// `float`, `double`: the number; NaN and the infinities as strings.
    Float(&'static str),
    /// `org.apache.kafka.connect.data.Decimal`: the unscaled value's two's complement, big-endian,
    /// in base64 (`numeric(p, s)`; `money` at scale 2 without a precision).
    Decimal {
        /// Digits after the point.
        scale: u32,
        /// `numeric(p, s)`'s p.
        precision: Option<u32>,
        /// The values are `money`'s text (`$1,234.50`).
        money: bool,
    },
    /// `io.debezium.data.VariableScaleDecimal`: `{"scale", "value"}`, trailing zeros dropped.
    VariableDecimal,
    /// `decimal.handling.mode` string: the exact text.
    DecimalString {
        /// The column's scale, when it has one.
        scale: Option<u32>,
        /// The values are `money`'s text.
        money: bool,
    },
    /// `decimal.handling.mode` double.
    DecimalDouble {
        /// The values are `money`'s text.
        money: bool,
    },
    /// `string`, optionally a named one (`io.debezium.data.Uuid`, `Json`, `Xml`, `Tsvector`).
    String(Option<&'static str>),
    /// `io.debezium.data.Enum` with its labels.
    Enum(Vec<String>),
    /// `bytes` (base64).
    Bytes,
    /// `io.debezium.time.Date`: days from 1970-01-01.
    Date,
    /// `io.debezium.time.Time` (milliseconds, `time(0..3)`) or `MicroTime`.
    Time {
        /// Milliseconds.
        millis: bool,
    },
    /// `io.debezium.time.Timestamp` (milliseconds, `timestamp(0..3)`) or `MicroTimestamp`.
    Timestamp {
        /// Milliseconds.
        millis: bool,
    },
    /// `io.debezium.time.ZonedTimestamp`: ISO-8601 in UTC with the column's fractional digits.
    ZonedTimestamp {
        /// Fractional digits (the type's precision, 6 without one).
        digits: usize,
    },
    /// `io.debezium.time.ZonedTime`: the time in UTC, fraction without trailing zeros.
    ZonedTime,
    /// `io.debezium.time.MicroDuration`: microseconds, a month being 30.4375 days.
    MicroDuration,
    /// `io.debezium.data.Bits` of `length` bits: little-endian bytes.
    Bits {
        /// `bit(n)`'s n (2147483647 for `varbit` without one).
        length: i32,
    },
    /// `io.debezium.data.geometry.Point`: `{"x", "y", "wkb", "srid"}`.
    Point,
    /// `array` of the element type.
    Array(Box<Dt>),
}

/// The type of a column of type `oid` with modifier `typmod`, or `None` for a type Debezium does
/// not know (it leaves such columns out).
pub fn column_dt(types: &TypeRegistry, oid: u32, typmod: i32, decimals: DecimalHandling) -> Option<Dt> {
    let oid = types.base_type(oid);
    let decimal = |scale: Option<u32>, precision: Option<u32>, money: bool| match (decimals, scale) {
        (DecimalHandling::Precise, Some(scale)) => Dt::Decimal { scale, precision, money },
        (DecimalHandling::Precise, None) => Dt::VariableDecimal,
        (DecimalHandling::String, scale) => Dt::DecimalString { scale, money },
        (DecimalHandling::Double, _) => Dt::DecimalDouble { money },
    };
    Some(match oid {
        16 => Dt::Boolean,
        21 => Dt::Int("int16"),
        23 => Dt::Int("int32"),
        20 | 26 => Dt::Int("int64"),
        700 => Dt::Float("float"),
        701 => Dt::Float("double"),
        1700 => match numeric_typmod(typmod) {
            Some((precision, scale)) => decimal(Some(scale), Some(precision), false),
            None => decimal(None, None, false),
        },
        790 => decimal(Some(2), None, true),
        25 | 1043 | 1042 | 19 | 18 | 869 | 650 | 829 | 774 | 3904 | 3926 | 3906 | 3908 | 3910 | 3912 => {
            Dt::String(None)
        }
        2950 => Dt::String(Some("io.debezium.data.Uuid")),
        114 | 3802 => Dt::String(Some("io.debezium.data.Json")),
        142 => Dt::String(Some("io.debezium.data.Xml")),
        3614 => Dt::String(Some("io.debezium.data.Tsvector")),
        17 => Dt::Bytes,
        1082 => Dt::Date,
        1083 => Dt::Time { millis: (0..=3).contains(&typmod) },
        1114 => Dt::Timestamp { millis: (0..=3).contains(&typmod) },
        1184 => Dt::ZonedTimestamp { digits: if (0..=6).contains(&typmod) { typmod as usize } else { 6 } },
        1266 => Dt::ZonedTime,
        1186 => Dt::MicroDuration,
        1560 if typmod == 1 => Dt::Boolean,
        1560 | 1562 => Dt::Bits { length: if typmod > 0 { typmod } else { i32::MAX } },
        600 => Dt::Point,
        _ => match (types.kind(oid), types.details(oid)) {
            (TypeKind::Array { element, .. }, _) => Dt::Array(Box::new(column_dt(types, element, typmod, decimals)?)),
            (_, Some(d)) if d.typtype == b'e' => Dt::Enum(d.enum_labels.clone()),
            _ => return None,
        },
    })
}

/// The type of a computed column's values.
fn computed_dt(kind: TypeKind) -> Dt {
    match kind {
        TypeKind::Bool => Dt::Boolean,
        TypeKind::Integer => Dt::Int("int64"),
        TypeKind::Float => Dt::Float("double"),
        _ => Dt::String(None),
    }
}

impl Dt {
    /// Its Connect schema (without `field`), as the JSON converter writes it.
    pub fn schema(&self, optional: bool) -> Json {
        let named = |ty: &str, name: &str| json!({"type": ty, "optional": optional, "name": name, "version": 1});
        let variable = || {
            json!({"type": "struct", "fields": [
                {"type": "int32", "optional": false, "field": "scale"},
                {"type": "bytes", "optional": false, "field": "value"}],
                "optional": optional, "name": "io.debezium.data.VariableScaleDecimal", "version": 1,
                "doc": "Variable scaled decimal"})
        };
        match self {
            Dt::Boolean => json!({"type": "boolean", "optional": optional}),
            Dt::Int(t) | Dt::Float(t) => json!({"type": t, "optional": optional}),
            Dt::Decimal { scale, precision, .. } => {
                let mut parameters = json!({"scale": scale.to_string()});
                if let Some(p) = precision {
                    parameters["connect.decimal.precision"] = json!(p.to_string());
                }
                let mut s = named("bytes", "org.apache.kafka.connect.data.Decimal");
                s["parameters"] = parameters;
                s
            }
            Dt::VariableDecimal => variable(),
            Dt::DecimalString { .. } => json!({"type": "string", "optional": optional}),
            Dt::DecimalDouble { .. } => json!({"type": "double", "optional": optional}),
            Dt::String(None) => json!({"type": "string", "optional": optional}),
            Dt::String(Some(name)) => named("string", name),
            Dt::Enum(labels) => {
                let mut s = named("string", "io.debezium.data.Enum");
                s["parameters"] = json!({"allowed": labels.join(",")});
                s
            }
            Dt::Bytes => json!({"type": "bytes", "optional": optional}),
            Dt::Date => named("int32", "io.debezium.time.Date"),
            Dt::Time { millis: true } => named("int32", "io.debezium.time.Time"),
            Dt::Time { millis: false } => named("int64", "io.debezium.time.MicroTime"),
            Dt::Timestamp { millis: true } => named("int64", "io.debezium.time.Timestamp"),
            Dt::Timestamp { millis: false } => named("int64", "io.debezium.time.MicroTimestamp"),
            Dt::ZonedTimestamp { .. } => named("string", "io.debezium.time.ZonedTimestamp"),
            Dt::ZonedTime => named("string", "io.debezium.time.ZonedTime"),
            Dt::MicroDuration => named("int64", "io.debezium.time.MicroDuration"),
            Dt::Bits { length } => {
                let mut s = named("bytes", "io.debezium.data.Bits");
                s["parameters"] = json!({"length": length.to_string()});
                s
            }
            Dt::Point => json!({"type": "struct", "fields": [
                {"type": "double", "optional": false, "field": "x"},
                {"type": "double", "optional": false, "field": "y"},
                {"type": "bytes", "optional": true, "field": "wkb"},
                {"type": "int32", "optional": true, "field": "srid"}],
                "optional": optional, "name": "io.debezium.data.geometry.Point", "version": 1,
                "doc": "Geometry (POINT)"}),
            Dt::Array(e) => json!({"type": "array", "items": e.schema(true), "optional": optional}),
        }
    }

    /// Appends the JSON of one value (`raw`: its non-null JSON in pg_cdc's event).
    pub fn write(&self, raw: &str, out: &mut String) -> Result<(), String> {
        let bad = || format!("{raw} is not a {self:?} value");
        let text = || json_string(raw).ok_or_else(bad);
        match self {
            Dt::Boolean => match raw {
                "true" | "false" => out.push_str(raw),
                "\"1\"" => out.push_str("true"),
                "\"0\"" => out.push_str("false"),
                _ => return Err(bad()),
            },
            Dt::Int(_) => out.push_str(raw),
            // A computed double, NaN and the infinities are strings in both.
            Dt::Float(_) => out.push_str(raw),
            Dt::Decimal { scale, money, .. } => match decimal_text(raw, *money) {
                Some(d) => {
                    let unscaled = unscaled(&d, *scale).ok_or_else(bad)?;
                    write_base64(out, &unscaled.to_signed_bytes_be());
                }
                None => out.push_str("null"),
            },
            Dt::VariableDecimal => match decimal_text(raw, false) {
                Some(d) => {
                    let (int, frac) = d.split_once('.').unwrap_or((&d, ""));
                    let frac = frac.trim_end_matches('0');
                    let unscaled = unscaled(&format!("{int}.{frac}"), frac.len() as u32).ok_or_else(bad)?;
                    let _ = write!(out, "{{\"scale\":{},\"value\":", frac.len());
                    write_base64(out, &unscaled.to_signed_bytes_be());
                    out.push('}');
                }
                None => out.push_str("null"),
            },
            Dt::DecimalString { money, .. } => match decimal_text(raw, *money) {
                Some(d) if *money => write_json_str(out, &money_text(&d)),
                Some(d) => write_json_str(out, &d),
                None => write_json_str(
                    out,
                    match raw {
                        "\"NaN\"" => "NAN",
                        "\"Infinity\"" => "POSITIVE_INFINITY",
                        "\"-Infinity\"" => "NEGATIVE_INFINITY",
                        _ => return Err(bad()),
                    },
                ),
            },
            Dt::DecimalDouble { money } => match decimal_text(raw, *money) {
                Some(d) => {
                    let v: f64 = d.parse().map_err(|_| bad())?;
                    out.push_str(&serde_json::to_string(&v).map_err(|e| e.to_string())?);
                }
                None => out.push_str(raw),
            },
            // pg_cdc's JSON embeds json and jsonb as JSON (a JSON string too): Debezium's is the text.
            Dt::String(Some("io.debezium.data.Json")) => write_json_str(out, raw),
            Dt::String(_) | Dt::Enum(_) | Dt::Bytes => match raw.starts_with('"') {
                true => out.push_str(raw),
                // A computed number or boolean in a string column: its text.
                false => write_json_str(out, raw),
            },
            Dt::Date => {
                let d = match &*text()? {
                    "infinity" => DATE_INFINITY,
                    "-infinity" => DATE_MINUS_INFINITY,
                    s => parse_date(s).ok_or_else(bad)?,
                };
                let _ = write!(out, "{d}");
            }
            Dt::Time { millis } => {
                let micros = parse_time(&text()?).ok_or_else(bad)?;
                let _ = write!(out, "{}", if *millis { micros / 1000 } else { micros });
            }
            Dt::Timestamp { millis } => {
                let v = match &*text()? {
                    "infinity" => TIMESTAMP_INFINITY,
                    "-infinity" => TIMESTAMP_MINUS_INFINITY,
                    s => {
                        let micros = parse_timestamp(s).ok_or_else(bad)?;
                        if *millis {
                            micros.div_euclid(1000)
                        } else {
                            micros
                        }
                    }
                };
                let _ = write!(out, "{v}");
            }
            Dt::ZonedTimestamp { digits } => write_json_str(out, &zoned_timestamp(&text()?, *digits).ok_or_else(bad)?),
            Dt::ZonedTime => write_json_str(out, &zoned_time(&text()?).ok_or_else(bad)?),
            Dt::MicroDuration => {
                let _ = write!(out, "{}", duration_micros(&text()?).ok_or_else(bad)?);
            }
            Dt::Bits { .. } => write_base64(out, &bits(&text()?).ok_or_else(bad)?),
            Dt::Point => {
                let (x, y) = point(&text()?).ok_or_else(bad)?;
                let mut wkb = vec![1u8, 1, 0, 0, 0];
                wkb.extend_from_slice(&x.to_le_bytes());
                wkb.extend_from_slice(&y.to_le_bytes());
                let _ = write!(out, "{{\"x\":{},\"y\":{},\"wkb\":", json_f64(x), json_f64(y));
                write_base64(out, &wkb);
                out.push_str(",\"srid\":null}");
            }
            Dt::Array(e) => {
                let items: Vec<&RawValue> = serde_json::from_str(raw).map_err(|_| bad())?;
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let item = item.get();
                    if item.starts_with('[') && !matches!(**e, Dt::Array(_)) {
                        return Err(format!(
                            "{raw}: a multidimensional array cannot be written as a Debezium array of one dimension"
                        ));
                    }
                    match item {
                        "null" => out.push_str("null"),
                        // An element a decimal cannot hold (NaN) is null, as a column's is.
                        item => e.write(item, out)?,
                    }
                }
                out.push(']');
            }
        }
        Ok(())
    }

    /// The value Debezium gives a NOT NULL column an image does not hold (a DELETE's old key image
    /// under REPLICA IDENTITY DEFAULT): the type's zero.
    fn fallback(&self, out: &mut String) {
        if let Dt::DecimalString { scale: Some(s), .. } = self {
            if *s > 0 {
                out.push_str("\"0.");
                out.extend(std::iter::repeat_n('0', *s as usize));
                out.push('"');
                return;
            }
        }
        out.push_str(match self {
            Dt::Boolean => "false",
            Dt::Int(_) | Dt::Date | Dt::Time { .. } | Dt::Timestamp { .. } | Dt::MicroDuration => "0",
            Dt::Float(_) | Dt::DecimalDouble { .. } => "0.0",
            Dt::Decimal { .. } => "\"AA==\"",
            Dt::VariableDecimal => "{\"scale\":0,\"value\":\"AA==\"}",
            Dt::DecimalString { .. } => "\"0\"",
            Dt::String(_) | Dt::Enum(_) | Dt::Bytes | Dt::Bits { .. } => "\"\"",
            Dt::ZonedTimestamp { .. } => "\"1970-01-01T00:00:00Z\"",
            Dt::ZonedTime => "\"00:00:00Z\"",
            Dt::Point => "{\"x\":0.0,\"y\":0.0,\"wkb\":null,\"srid\":null}",
            Dt::Array(_) => "[]",
        });
    }

    /// The value of a column TOAST left unchanged (Debezium's placeholder where the type can
    /// hold it).
    fn unavailable(&self, out: &mut String) {
        match self {
            Dt::String(_) | Dt::Enum(_) => write_json_str(out, UNAVAILABLE),
            Dt::Bytes => write_base64(out, UNAVAILABLE.as_bytes()),
            _ => out.push_str("null"),
        }
    }
}

/// A decimal's text (`None`: NaN or an infinity); `money` strips the currency's symbol and
/// grouping (`-$1,234.50` is `-1234.50`).
fn decimal_text(raw: &str, money: bool) -> Option<String> {
    if money {
        let s = json_string(raw)?;
        let negative = s.contains('-') || s.starts_with('(');
        let digits: String = s.chars().filter(|c| c.is_ascii_digit() || *c == '.').collect();
        return (!digits.is_empty()).then(|| if negative { format!("-{digits}") } else { digits });
    }
    match raw.as_bytes().first()? {
        b'"' => None,
        _ => Some(raw.to_string()),
    }
}

/// `money`'s text with its two decimals (`0` is `0.00`).
fn money_text(d: &str) -> String {
    let (int, frac) = d.split_once('.').unwrap_or((d, ""));
    format!("{int}.{frac:0<2}")
}

fn json_f64(v: f64) -> String {
    serde_json::to_string(&v).unwrap_or_else(|_| "null".into())
}

fn write_json_str(out: &mut String, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&serde_json::to_string(s).expect("a string serializes"));
    }
}

fn write_base64(out: &mut String, b: &[u8]) {
    out.push('"');
    base64::engine::general_purpose::STANDARD.encode_string(b, out);
    out.push('"');
}

/// pg_cdc's `timestamptz` text (`2024-03-15T14:23:45.5Z`) as Debezium writes it: the fraction
/// with `digits` digits, a year above 9999 with a `+`.
fn zoned_timestamp(s: &str, digits: usize) -> Option<String> {
    if s == "infinity" || s == "-infinity" {
        return Some(s.to_string());
    }
    let body = s.strip_suffix('Z')?;
    let (date, time) = body.split_once('T')?;
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let year_digits = date.trim_start_matches(['-', '+']).split('-').next()?.len();
    let plus = if year_digits > 4 && !date.starts_with(['-', '+']) { "+" } else { "" };
    let mut out = format!("{plus}{date}T{hms}");
    if digits > 0 {
        let frac: String = frac.chars().chain(std::iter::repeat('0')).take(digits).collect();
        out.push('.');
        out.push_str(&frac);
    }
    out.push('Z');
    Some(out)
}

/// A `timetz` text (`14:23:45.5+05:30`) in UTC, as Java's ISO offset time writes it
/// (`08:53:45.5Z`).
fn zoned_time(s: &str) -> Option<String> {
    let at = s.rfind(['+', '-'])?;
    let micros = parse_time(&s[..at])?;
    let sign = if s.as_bytes()[at] == b'-' { -1 } else { 1 };
    let mut parts = s[at + 1..].split(':');
    let h: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next().map_or(Some(0), |x| x.parse().ok())?;
    let sec: i64 = parts.next().map_or(Some(0), |x| x.parse().ok())?;
    let offset = sign * (h * 3600 + m * 60 + sec) * 1_000_000;
    let utc = (micros - offset).rem_euclid(86_400_000_000);
    let (secs, frac) = (utc / 1_000_000, utc % 1_000_000);
    let mut out = format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60);
    if frac > 0 {
        let f = format!("{frac:06}");
        out.push('.');
        out.push_str(f.trim_end_matches('0'));
    }
    out.push('Z');
    Some(out)
}

/// An ISO-8601 interval (`P1Y2M3DT4H5M6.7S`, parts signed) in microseconds, a month being
/// 30.4375 days, computed as Debezium does (in doubles).
fn duration_micros(s: &str) -> Option<i64> {
    let body = s.strip_prefix('P')?;
    let (date, time) = body.split_once('T').unwrap_or((body, ""));
    let (mut years, mut months, mut days, mut hours, mut minutes, mut seconds) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    let mut number = String::new();
    for c in date.chars() {
        match c {
            'Y' => years = std::mem::take(&mut number).parse().ok()?,
            'M' => months = std::mem::take(&mut number).parse().ok()?,
            'W' => days += 7.0 * std::mem::take(&mut number).parse::<f64>().ok()?,
            'D' => days += std::mem::take(&mut number).parse::<f64>().ok()?,
            _ => number.push(c),
        }
    }
    for c in time.chars() {
        match c {
            'H' => hours = std::mem::take(&mut number).parse().ok()?,
            'M' => minutes = std::mem::take(&mut number).parse().ok()?,
            'S' => seconds = std::mem::take(&mut number).parse().ok()?,
            _ => number.push(c),
        }
    }
    if !number.is_empty() {
        return None;
    }
    let days_total = (years * 12.0 + months) * DAYS_PER_MONTH + days;
    let secs = ((days_total * 24.0 + hours) * 60.0 + minutes) * 60.0 + seconds;
    Some((secs * 1e6).round() as i64)
}

/// A bit string (`1010`) as Debezium's `Bits`: the number it spells, little-endian, as few bytes
/// as hold its highest set bit (Java's `BitSet.toByteArray`).
fn bits(s: &str) -> Option<Vec<u8>> {
    let n = s.len();
    let mut out = vec![0u8; n.div_ceil(8)];
    for (i, c) in s.bytes().enumerate() {
        match c {
            b'1' => {
                let bit = n - 1 - i;
                out[bit / 8] |= 1 << (bit % 8);
            }
            b'0' => {}
            _ => return None,
        }
    }
    while out.last() == Some(&0) {
        out.pop();
    }
    Some(out)
}

/// A `point` text (`(1.5,2)`).
fn point(s: &str) -> Option<(f64, f64)> {
    let (x, y) = s.strip_prefix('(')?.strip_suffix(')')?.split_once(',')?;
    Some((x.trim().parse().ok()?, y.trim().parse().ok()?))
}

/// One column of a table version's events.
#[derive(Debug, Clone)]
struct Column {
    /// The name in the JSON event.
    name: String,
    /// `"name":`, escaped once.
    json_key: String,
    dt: Dt,
    optional: bool,
}

impl Column {
    fn new(name: &str, dt: Dt, optional: bool) -> Column {
        let mut json_key = String::with_capacity(name.len() + 3);
        write_json_str(&mut json_key, name);
        json_key.push(':');
        Column { name: name.to_string(), json_key, dt, optional }
    }
}

/// What the format keeps of one table version.
struct Version {
    plan: Arc<RelationPlan>,
    /// Columns of the images, in order (those Debezium would leave out are not here).
    columns: Vec<Column>,
    /// Every column a key may name, by name.
    key_types: HashMap<String, Dt>,
    /// The value's Connect schema, and its JSON text (with `schemas`).
    value_connect: Json,
    value_schema: String,
    /// Key schemas' JSON texts, by the key's column names.
    key_schemas: HashMap<Vec<String>, String>,
    /// `<prefix>.<schema>.<table>`.
    name: String,
    /// With the Avro converter: the registry's id of the value schema, and of each key schema
    /// (with its Connect schema) by the key's column names.
    avro_value_id: Option<u32>,
    avro_keys: HashMap<Vec<String>, (Json, u32)>,
}

/// Where the Avro converter registers its schemas.
struct AvroTarget {
    subjects: super::Subjects,
    /// The sink's `schema_registry`, and the server setting `cdc.schema_registry`.
    sink_registry: Option<String>,
    server_registry: Option<String>,
    ids: super::AvroIds,
    /// Value schemas of table versions registered since the last `take_registrations`.
    registrations: Vec<cdc_core::format::Registration>,
}

impl AvroTarget {
    /// The registry a table's schemas go to (the sink's, the table's, the server's), and its
    /// value and key subjects; `name` is `<prefix>.<schema>.<table>`.
    fn place(&self, plan: &RelationPlan, name: &str) -> Result<(String, String, String), FormatError> {
        let url = super::configured_registry(self.sink_registry.as_deref(), plan, self.server_registry.as_deref())
            .ok_or_else(|| {
                FormatError::operator(
                    "the debezium format's avro converter needs a schema registry, and none is set: give the sink a \
                     \"schema_registry\", the table a schema_evolution.schema_registry, or set cdc.schema_registry",
                )
            })?;
        let url = super::checked_registry(&url)?;
        let (value, key) = self.subjects.of(&plan.relation.namespace, &plan.relation.name, name, plan.topic_version);
        Ok((url, value, key))
    }

    /// The id of the Avro schema of Connect schema `connect` under `subject`.
    fn id(&mut self, url: &str, subject: &str, connect: &Json, plan: &RelationPlan) -> Result<u32, FormatError> {
        let schema = super::connect_avro::avro_schema(connect).map_err(FormatError::operator)?;
        super::avro::parse_schema(&schema).map_err(FormatError::operator)?;
        let text = schema.to_string();
        self.ids.id(url, subject, text.clone(), &text, plan)
    }
}

/// The Debezium format of one sink.
pub struct DebeziumFormat {
    options: DebeziumOptions,
    /// `source.name` and the schemas' prefix.
    prefix: String,
    /// `source.db`.
    database: String,
    /// `source.version`: pg_cdc's.
    version: String,
    tables: HashMap<u32, Version>,
    /// The table and LSN of the last DELETE: an UPDATE of the same change right after it moved
    /// the row to another key (pg_cdc retracts the old key first), which Debezium writes as a
    /// create.
    last_delete: Option<(u32, cdc_core::Lsn)>,
    /// With `converter: avro`: the registry to register with.
    avro: Option<AvroTarget>,
}

impl DebeziumFormat {
    /// The format of a sink in `database`; `version` is pg_cdc's (`source.version`).
    pub fn new(options: DebeziumOptions, database: &str, version: &str) -> DebeziumFormat {
        let prefix = options.topic_prefix.clone().unwrap_or_else(|| database.to_string());
        DebeziumFormat {
            options,
            prefix,
            database: database.to_string(),
            version: format!("pg_cdc-{version}"),
            tables: HashMap::new(),
            last_delete: None,
            avro: None,
        }
    }

    /// Serializes with Kafka Connect's Avro converter (`converter: avro`): schemas registered
    /// under `subjects`' subjects with the registry that is set first (the sink's, the table's,
    /// the server's), records in Confluent's wire format.
    pub fn with_avro(
        mut self,
        subjects: super::Subjects,
        sink_registry: Option<String>,
        server_registry: Option<String>,
    ) -> DebeziumFormat {
        self.avro = Some(AvroTarget {
            subjects,
            sink_registry,
            server_registry,
            ids: super::AvroIds::default(),
            registrations: Vec::new(),
        });
        self
    }

    fn build(&self, plan: &Arc<RelationPlan>, types: &TypeRegistry) -> Version {
        let rel = &plan.relation;
        let decimals = self.options.decimal_handling_mode;
        let dt_of = |i: usize| -> Option<Dt> {
            if plan.redact[i].is_some() {
                Some(Dt::String(None))
            } else {
                column_dt(types, rel.columns[i].type_oid, rel.columns[i].type_mod, decimals)
            }
        };
        let not_null = |i: usize| plan.not_null.get(i).copied().unwrap_or(false);
        let mut columns = Vec::new();
        for &i in &plan.included {
            if let Some(dt) = dt_of(i) {
                columns.push(Column::new(&rel.columns[i].name, dt, !not_null(i)));
            }
        }
        let mut key_types: HashMap<String, Dt> =
            (0..rel.columns.len()).filter_map(|i| Some((rel.columns[i].name.clone(), dt_of(i)?))).collect();
        for (e, cfg) in plan.enrich.iter().zip(&plan.config.enrich) {
            for (name, &oid) in cfg.add_columns.iter().zip(e.added_types()) {
                if let Some(dt) = column_dt(types, oid, -1, decimals) {
                    key_types.insert(name.clone(), dt.clone());
                    columns.push(Column::new(name, dt, true));
                }
            }
        }
        for (name, bound) in &plan.computed {
            columns.push(Column::new(name, computed_dt(bound.result_kind()), true));
        }
        let name = format!("{}.{}.{}", self.prefix, rel.namespace, rel.name);
        let fields: Vec<Json> = columns
            .iter()
            .map(|c| {
                let mut s = c.dt.schema(c.optional);
                s["field"] = json!(c.name);
                s
            })
            .collect();
        let row = |field: &str| json!({"type": "struct", "fields": fields, "optional": true, "name": format!("{name}.Value"), "field": field});
        let optional_i64 = |field: &str| json!({"type": "int64", "optional": true, "field": field});
        let source = json!({"type": "struct", "fields": [
            {"type": "string", "optional": false, "field": "version"},
            {"type": "string", "optional": false, "field": "connector"},
            {"type": "string", "optional": false, "field": "name"},
            {"type": "int64", "optional": false, "field": "ts_ms"},
            {"type": "string", "optional": true, "name": "io.debezium.data.Enum", "version": 1,
             "parameters": {"allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},
             "default": "false", "field": "snapshot"},
            {"type": "string", "optional": false, "field": "db"},
            {"type": "string", "optional": true, "field": "sequence"},
            optional_i64("ts_us"), optional_i64("ts_ns"),
            {"type": "string", "optional": false, "field": "schema"},
            {"type": "string", "optional": false, "field": "table"},
            optional_i64("txId"), optional_i64("lsn"), optional_i64("xmin"),
            {"type": "string", "optional": true, "field": "origin"},
            optional_i64("origin_lsn")],
            "optional": false, "name": "io.debezium.connector.postgresql.Source", "version": 1, "field": "source"});
        let value = json!({"type": "struct", "fields": [
            row("before"), row("after"), source,
            {"type": "struct", "fields": [
                {"type": "string", "optional": false, "field": "id"},
                {"type": "int64", "optional": false, "field": "total_order"},
                {"type": "int64", "optional": false, "field": "data_collection_order"}],
             "optional": true, "name": "event.block", "version": 1, "field": "transaction"},
            {"type": "string", "optional": false, "field": "op"},
            optional_i64("ts_ms"), optional_i64("ts_us"), optional_i64("ts_ns")],
            "optional": false, "name": format!("{name}.Envelope"), "version": 2});
        Version {
            plan: plan.clone(),
            columns,
            key_types,
            value_schema: value.to_string(),
            value_connect: value,
            key_schemas: HashMap::new(),
            name,
            avro_value_id: None,
            avro_keys: HashMap::new(),
        }
    }

    fn value(&self, v: &Version, ev: &JsonEvent<'_>, op: Op, with_schema: bool) -> Result<String, String> {
        let m = &ev.metadata;
        let mut out = String::with_capacity(512 + v.value_schema.len());
        if with_schema {
            out.push_str("{\"schema\":");
            out.push_str(&v.value_schema);
            out.push_str(",\"payload\":");
        }
        let unchanged: &[String] = m.unchanged_toast_columns.as_deref().unwrap_or(&[]);
        out.push_str("{\"before\":");
        // A create has no before image (an UPDATE that moved a row to another key is a DELETE and
        // a create in pg_cdc's events, the create keeping the old row; Debezium's has none).
        let before = if op == Op::Insert { None } else { ev.before.as_ref() };
        write_image(&mut out, &v.columns, before, &[])?;
        out.push_str(",\"after\":");
        write_image(&mut out, &v.columns, ev.after.as_ref(), unchanged)?;
        let commit_us = parse_timestamp(&m.timestamp.0).ok_or("metadata.timestamp is not a timestamp")?;
        let snapshot = if op == Op::Read { "true" } else { "false" };
        out.push_str(",\"source\":{\"version\":");
        write_json_str(&mut out, &self.version);
        out.push_str(",\"connector\":\"postgresql\",\"name\":");
        write_json_str(&mut out, &self.prefix);
        let _ = write!(out, ",\"ts_ms\":{},\"snapshot\":\"{snapshot}\",\"db\":", commit_us.div_euclid(1000));
        write_json_str(&mut out, &self.database);
        let _ = write!(
            out,
            ",\"sequence\":\"[\\\"{}\\\",\\\"{}\\\"]\",\"ts_us\":{commit_us},\"ts_ns\":{},\"schema\":",
            m.commit_lsn,
            m.lsn,
            commit_us.saturating_mul(1000)
        );
        write_json_str(&mut out, &m.schema.0);
        out.push_str(",\"table\":");
        write_json_str(&mut out, &m.table.0);
        let _ = write!(
            out,
            ",\"txId\":{},\"lsn\":{},\"xmin\":null,\"origin\":null,\"origin_lsn\":null}}",
            m.transaction_id, m.lsn
        );
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let _ = write!(
            out,
            ",\"transaction\":null,\"op\":\"{}\",\"ts_ms\":{},\"ts_us\":{},\"ts_ns\":{}}}",
            op_code(op),
            now.as_millis(),
            now.as_micros(),
            now.as_nanos()
        );
        if with_schema {
            out.push('}');
        }
        Ok(out)
    }

    /// The key's payload (and, `with_schema`, its schema) as JSON text, and its column names.
    fn key(&self, v: &mut Version, key: &[u8], with_schema: bool) -> Result<(String, Vec<String>), String> {
        let fields: Fields<'_> =
            serde_json::from_slice(key).map_err(|e| format!("the JSON key does not parse: {e}"))?;
        let mut payload = String::with_capacity(64);
        payload.push('{');
        let mut names = Vec::with_capacity(fields.0.len());
        for (i, (name, raw)) in fields.0.iter().enumerate() {
            let dt =
                v.key_types.get(&*name.0).ok_or_else(|| format!("its key names an unknown column \"{}\"", name.0))?;
            if i > 0 {
                payload.push(',');
            }
            write_json_str(&mut payload, &name.0);
            payload.push(':');
            match raw.get() {
                "null" => payload.push_str("null"),
                r => dt.write(r, &mut payload).map_err(|e| format!("key column \"{}\": {e}", name.0))?,
            }
            names.push(name.0.to_string());
        }
        payload.push('}');
        if !with_schema {
            return Ok((payload, names));
        }
        if !v.key_schemas.contains_key(&names) {
            v.key_schemas.insert(names.clone(), key_schema(v, &names).to_string());
        }
        Ok((format!("{{\"schema\":{},\"payload\":{payload}}}", v.key_schemas[&names]), names))
    }

    /// Encodes the value and key with Connect's Avro converter: the Connect payloads as datums
    /// of the Avro schemas AvroData makes of their Connect schemas, registered (once per worker
    /// and schema) under the topic's subjects, in Confluent's wire format.
    fn encode_avro(
        &mut self,
        plan: &RelationPlan,
        v: &mut Version,
        value: &str,
        key: Option<(String, Vec<String>)>,
    ) -> Result<(Vec<u8>, Option<Vec<u8>>), FormatError> {
        let target = self.avro.as_mut().expect("the Avro converter is set");
        // The registry and the subjects are worked out only when a schema's id is not known yet:
        // once per table version and key, not per event.
        let value_id = match v.avro_value_id {
            Some(id) => id,
            None => {
                let (url, value_subject, _) = target.place(plan, &v.name)?;
                let id = target.id(&url, &value_subject, &v.value_connect, plan)?;
                v.avro_value_id = Some(id);
                if let Some((version, _)) = plan.schema_version {
                    target.registrations.push(cdc_core::format::Registration {
                        table_oid: plan.relation.oid,
                        version,
                        registry: super::schema_registry::label(&url),
                        subject: value_subject,
                        schema_id: id,
                    });
                }
                id
            }
        };
        let datum = |connect: &Json, text: &str, id: u32| -> Result<Vec<u8>, FormatError> {
            let payload: Json = serde_json::from_str(text).map_err(|e| FormatError::operator(e.to_string()))?;
            super::avro::frame(id, |out| super::connect_avro::write_datum(connect, &payload, out))
                .map_err(FormatError::operator)
        };
        let value = datum(&v.value_connect, value, value_id)?;
        let key = match key {
            Some((payload, names)) => {
                if !v.avro_keys.contains_key(&names) {
                    let connect = key_schema(v, &names);
                    let (url, _, key_subject) = target.place(plan, &v.name)?;
                    let id = target.id(&url, &key_subject, &connect, plan)?;
                    v.avro_keys.insert(names.clone(), (connect, id));
                }
                let (connect, id) = &v.avro_keys[&names];
                Some(datum(connect, &payload, *id)?)
            }
            None => None,
        };
        Ok((value, key))
    }
}

/// The Connect schema of a key of the columns `names`.
fn key_schema(v: &Version, names: &[String]) -> Json {
    let fields: Vec<Json> = names
        .iter()
        .map(|n| {
            let mut s = v.key_types[n].schema(false);
            s["field"] = json!(n);
            s
        })
        .collect();
    json!({"type": "struct", "fields": fields, "optional": false, "name": format!("{}.Key", v.name)})
}

fn op_code(op: Op) -> &'static str {
    match op {
        Op::Insert => "c",
        Op::Update => "u",
        Op::Delete => "d",
        Op::Read => "r",
        Op::Truncate => "t",
    }
}

/// A row image: every column of the version in order, null where the JSON image has none (a
/// DELETE's old key, say), the placeholder where TOAST left the value unchanged.
fn write_image(
    out: &mut String,
    columns: &[Column],
    image: Option<&Fields<'_>>,
    unchanged: &[String],
) -> Result<(), String> {
    let Some(image) = image else {
        out.push_str("null");
        return Ok(());
    };
    out.push('{');
    // The image's fields come in the columns' order (an image leaves columns out, never reorders
    // them; it may hold a column of a type left out here): one pass.
    let mut next = 0;
    for (i, c) in columns.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&c.json_key);
        let at = image.0[next..].iter().position(|(n, _)| n.0 == c.name).map(|p| next + p);
        if let Some(at) = at {
            next = at + 1;
        }
        match at.map(|at| image.0[at].1.get()) {
            None if unchanged.contains(&c.name) => c.dt.unavailable(out),
            None if !c.optional => c.dt.fallback(out),
            None | Some("null") => out.push_str("null"),
            Some(raw) => c.dt.write(raw, out).map_err(|e| format!("column \"{}\": {e}", c.name))?,
        }
    }
    out.push('}');
    Ok(())
}

impl EventFormat for DebeziumFormat {
    fn encode(&mut self, plan: &Arc<RelationPlan>, types: &TypeRegistry, event: &mut Event) -> Result<(), FormatError> {
        let ev: JsonEvent<'_> = serde_json::from_slice(&event.payload)
            .map_err(|e| FormatError::operator(format!("the JSON event does not fit the Debezium envelope: {e}")))?;
        let mut version = self.tables.remove(&plan.relation.oid);
        if !version.as_ref().is_some_and(|v| Arc::ptr_eq(&v.plan, plan)) {
            version = Some(self.build(plan, types));
        }
        let mut v = version.expect("made above");
        let moved = event.op == Op::Update && self.last_delete == Some((plan.relation.oid, event.lsn));
        self.last_delete = (event.op == Op::Delete).then_some((plan.relation.oid, event.lsn));
        let op = if moved { Op::Insert } else { event.op };
        let with_schema = self.options.schemas && self.avro.is_none();
        let result = (|| {
            let value = self.value(&v, &ev, op, with_schema)?;
            let key = match &event.key {
                Some(k) => Some(self.key(&mut v, k, with_schema)?),
                None => None,
            };
            Ok::<_, String>((value, key))
        })()
        .map_err(FormatError::operator);
        let encoded = match result {
            Ok((value, key)) if self.avro.is_some() => self.encode_avro(plan, &mut v, &value, key),
            Ok((value, key)) => Ok((value.into_bytes(), key.map(|(k, _)| k.into_bytes()))),
            Err(e) => Err(e),
        };
        self.tables.insert(plan.relation.oid, v);
        let (value, key) = encoded?;
        event.payload = value;
        event.key = key;
        event.tombstone = event.op == Op::Delete && self.options.tombstones_on_delete && event.key.is_some();
        Ok(())
    }

    fn take_registrations(&mut self) -> Vec<cdc_core::format::Registration> {
        self.avro.as_mut().map(|a| std::mem::take(&mut a.registrations)).unwrap_or_default()
    }
}
