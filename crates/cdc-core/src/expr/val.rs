//! Types and values: the static type of an expression ([`Ty`]), the value an evaluation step
//! produces ([`Val`], borrowing row text where it can), the owned result ([`Value`]), casts and the
//! text each type reads and prints.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt::Write as _;

use rust_decimal::RoundingStrategy;

use super::num::{self, float_cmp, NumErr, Numeric};
use super::time::{self, DtErr};
use crate::error::{CdcError, ErrorKind};
use crate::json::write_str;
use crate::types::TypeKind;

/// Result of one evaluation step; the error is boxed so the happy path stays small.
pub(crate) type Ev<T> = Result<T, Box<CdcError>>;

pub(crate) fn fail<T>(kind: ErrorKind, msg: impl Into<String>) -> Ev<T> {
    Err(Box::new(CdcError::new(kind, msg)))
}

/// The static type of an expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    /// A quoted literal (or NULL) whose type comes from where it is used, as in PostgreSQL.
    Unknown,
    Bool,
    /// Every integer type (int2, int4, int8, oid, ...), computed as int8.
    Int,
    Float,
    Numeric,
    Text,
    Date,
    Timestamp,
    TimestampTz,
    /// json, jsonb, bytea, arrays: only `IS [NOT] NULL` and `::text`.
    Other(TypeKind),
}

impl Ty {
    pub(crate) fn from_kind(k: TypeKind) -> Ty {
        match k {
            TypeKind::Bool => Ty::Bool,
            TypeKind::Integer => Ty::Int,
            TypeKind::Float => Ty::Float,
            TypeKind::Numeric => Ty::Numeric,
            TypeKind::Text => Ty::Text,
            TypeKind::Date => Ty::Date,
            TypeKind::Timestamp => Ty::Timestamp,
            TypeKind::TimestampTz => Ty::TimestampTz,
            other => Ty::Other(other),
        }
    }

    pub(crate) fn to_kind(self) -> TypeKind {
        match self {
            Ty::Bool => TypeKind::Bool,
            Ty::Int => TypeKind::Integer,
            Ty::Float => TypeKind::Float,
            Ty::Numeric => TypeKind::Numeric,
            Ty::Unknown | Ty::Text => TypeKind::Text,
            Ty::Date => TypeKind::Date,
            Ty::Timestamp => TypeKind::Timestamp,
            Ty::TimestampTz => TypeKind::TimestampTz,
            Ty::Other(k) => k,
        }
    }

    /// The type's name as PostgreSQL prints it in messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Ty::Unknown => "unknown",
            Ty::Bool => "boolean",
            Ty::Int => "integer",
            Ty::Float => "double precision",
            Ty::Numeric => "numeric",
            Ty::Text => "text",
            Ty::Date => "date",
            Ty::Timestamp => "timestamp without time zone",
            Ty::TimestampTz => "timestamp with time zone",
            Ty::Other(TypeKind::Json) => "json",
            Ty::Other(TypeKind::Bytea) => "bytea",
            Ty::Other(TypeKind::Array { .. }) => "array",
            Ty::Other(_) => "text",
        }
    }

    pub(crate) fn is_number(self) -> bool {
        matches!(self, Ty::Int | Ty::Float | Ty::Numeric)
    }

    pub(crate) fn is_time(self) -> bool {
        matches!(self, Ty::Date | Ty::Timestamp | Ty::TimestampTz)
    }

    fn number_rank(self) -> u8 {
        match self {
            Ty::Int => 0,
            Ty::Numeric => 1,
            _ => 2,
        }
    }

    fn time_rank(self) -> u8 {
        match self {
            Ty::Date => 0,
            Ty::Timestamp => 1,
            _ => 2,
        }
    }

    /// The common type two operands are compared (or combined) in, following PostgreSQL's implicit
    /// casts: an unknown literal takes the other side's type; int < numeric < float8;
    /// date < timestamp < timestamptz. None when PostgreSQL has no such operator.
    pub(crate) fn unify(a: Ty, b: Ty) -> Option<Ty> {
        match (a, b) {
            (Ty::Other(_), _) | (_, Ty::Other(_)) => None,
            (Ty::Unknown, Ty::Unknown) => Some(Ty::Text),
            (Ty::Unknown, t) | (t, Ty::Unknown) => Some(t),
            (x, y) if x == y => Some(x),
            (x, y) if x.is_number() && y.is_number() => Some(if x.number_rank() >= y.number_rank() { x } else { y }),
            (x, y) if x.is_time() && y.is_time() => Some(if x.time_rank() >= y.time_rank() { x } else { y }),
            _ => None,
        }
    }
}

/// A cast target: the type plus its modifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    pub ty: Ty,
    /// 16, 32 or 64 for integer targets (range check); 0 when unspecified (64-bit).
    pub int_bits: u8,
    /// numeric(precision, scale).
    pub typmod: Option<(u32, u32)>,
    /// varchar(n): explicit casts truncate to n characters.
    pub len: Option<u32>,
}

impl Target {
    /// The type without modifiers (an integer of unspecified width is computed as bigint and
    /// named "integer" in messages).
    pub(crate) fn plain(ty: Ty) -> Target {
        Target { ty, int_bits: 0, typmod: None, len: None }
    }

    pub(crate) fn name(&self) -> String {
        match (self.ty, self.int_bits, self.typmod, self.len) {
            (Ty::Int, 16, ..) => "smallint".into(),
            (Ty::Int, 64, ..) => "bigint".into(),
            (Ty::Int, ..) => "integer".into(),
            (Ty::Numeric, _, Some((p, s)), _) => format!("numeric({p},{s})"),
            (Ty::Text, _, _, Some(n)) => format!("character varying({n})"),
            (t, ..) => t.name().into(),
        }
    }
}

/// One value during evaluation. Text borrows the row (or the expression's constants) when it can.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Val<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Num(Numeric),
    Text(Cow<'a, [u8]>),
    Date(i32),
    Ts(i64),
    TsTz(i64),
}

impl Val<'_> {
    pub(crate) fn is_null(&self) -> bool {
        matches!(self, Val::Null)
    }

    /// A copy that borrows this value's text instead of cloning it.
    pub(crate) fn borrowed(&self) -> Val<'_> {
        match self {
            Val::Text(t) => Val::Text(Cow::Borrowed(t.as_ref())),
            Val::Null => Val::Null,
            Val::Bool(b) => Val::Bool(*b),
            Val::Int(i) => Val::Int(*i),
            Val::Float(f) => Val::Float(*f),
            Val::Num(n) => Val::Num(*n),
            Val::Date(d) => Val::Date(*d),
            Val::Ts(t) => Val::Ts(*t),
            Val::TsTz(t) => Val::TsTz(*t),
        }
    }

    pub(crate) fn into_static(self) -> Val<'static> {
        match self {
            Val::Text(t) => Val::Text(Cow::Owned(t.into_owned())),
            Val::Null => Val::Null,
            Val::Bool(b) => Val::Bool(b),
            Val::Int(i) => Val::Int(i),
            Val::Float(f) => Val::Float(f),
            Val::Num(n) => Val::Num(n),
            Val::Date(d) => Val::Date(d),
            Val::Ts(t) => Val::Ts(t),
            Val::TsTz(t) => Val::TsTz(t),
        }
    }

    pub(crate) fn into_value(self) -> Value {
        match self {
            Val::Null => Value::Null,
            Val::Bool(b) => Value::Bool(b),
            Val::Int(i) => Value::Int(i),
            Val::Float(f) => Value::Float(f),
            Val::Num(n) => Value::Numeric(n),
            Val::Text(t) => Value::Text(match t {
                Cow::Borrowed(b) => String::from_utf8_lossy(b).into_owned(),
                Cow::Owned(v) => String::from_utf8(v).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into()),
            }),
            Val::Date(d) => Value::Date(d),
            Val::Ts(t) => Value::Timestamp(t),
            Val::TsTz(t) => Value::TimestampTz(t),
        }
    }

    /// PostgreSQL's text output (what `::text` gives). NULL gives nothing.
    pub(crate) fn write_text(&self, out: &mut String) {
        match self {
            Val::Null => {}
            Val::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Val::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Val::Float(f) => num::write_float(out, *f),
            Val::Num(n) => {
                let _ = write!(out, "{n}");
            }
            Val::Text(t) => out.push_str(&String::from_utf8_lossy(t)),
            Val::Date(d) => time::write_date(out, *d),
            Val::Ts(t) => time::write_ts(out, *t, false),
            Val::TsTz(t) => time::write_ts(out, *t, true),
        }
    }

    pub(crate) fn to_text(&self) -> String {
        let mut s = String::new();
        self.write_text(&mut s);
        s
    }
}

/// Orders two non-NULL values of the same type as PostgreSQL does (text byte-wise, as the C
/// collation; NaN last for numeric and float8).
pub(crate) fn cmp_vals(a: &Val<'_>, b: &Val<'_>) -> Ev<Ordering> {
    Ok(match (a, b) {
        (Val::Int(x), Val::Int(y)) => x.cmp(y),
        (Val::Float(x), Val::Float(y)) => float_cmp(*x, *y),
        (Val::Num(x), Val::Num(y)) => x.pg_cmp(y),
        (Val::Text(x), Val::Text(y)) => x.as_ref().cmp(y.as_ref()),
        (Val::Bool(x), Val::Bool(y)) => x.cmp(y),
        (Val::Date(x), Val::Date(y)) => x.cmp(y),
        (Val::Ts(x), Val::Ts(y)) | (Val::TsTz(x), Val::TsTz(y)) => x.cmp(y),
        _ => return fail(ErrorKind::Internal, format!("cannot compare {a:?} with {b:?}")),
    })
}

fn quote(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn num_input_err<T>(e: NumErr, t: &Target, text: &[u8]) -> Ev<T> {
    match e {
        NumErr::Syntax => fail(
            ErrorKind::InvalidTextRepresentation,
            format!("invalid input syntax for type {}: \"{}\"", t.name(), quote(text)),
        ),
        NumErr::Overflow if t.ty == Ty::Numeric => fail(
            ErrorKind::NumericOutOfRange,
            format!(
                "numeric value \"{}\" is out of range: expressions compute numeric with at most 28 digits after \
                 the point and an absolute value below 7.9e28",
                quote(text)
            ),
        ),
        NumErr::Overflow => fail(
            ErrorKind::NumericOutOfRange,
            format!("value \"{}\" is out of range for type {}", quote(text), t.name()),
        ),
    }
}

pub(crate) fn dt_err<T>(e: DtErr, ty: Ty, text: &[u8]) -> Ev<T> {
    match e {
        DtErr::Syntax => fail(
            ErrorKind::InvalidDatetimeFormat,
            format!("invalid input syntax for type {}: \"{}\"", ty.name(), quote(text)),
        ),
        DtErr::Range => {
            fail(ErrorKind::DatetimeFieldOverflow, format!("date/time field value out of range: \"{}\"", quote(text)))
        }
        DtErr::NotImmutable => fail(
            ErrorKind::InvalidObjectDefinition,
            format!(
                "the date/time value \"{}\" depends on when it is read; expressions must be immutable",
                quote(text)
            ),
        ),
    }
}

fn int_range(v: i64, t: &Target) -> Ev<i64> {
    let ok = match t.int_bits {
        16 => i16::try_from(v).is_ok(),
        32 => i32::try_from(v).is_ok(),
        _ => true,
    };
    if ok {
        Ok(v)
    } else {
        fail(ErrorKind::NumericOutOfRange, format!("{} out of range", t.name()))
    }
}

/// PostgreSQL's boolean input: t, true, yes, on, 1 and f, false, no, off, 0 (any case, any unique
/// prefix, blanks around).
pub(crate) fn parse_bool_input(b: &[u8]) -> Option<bool> {
    let t = b.trim_ascii().to_ascii_lowercase();
    let prefix_of = |w: &[u8], min: usize| t.len() >= min && w.starts_with(&t);
    if prefix_of(b"true", 1) || prefix_of(b"yes", 1) || t == b"on" || t == b"1" {
        Some(true)
    } else if prefix_of(b"false", 1) || prefix_of(b"no", 1) || prefix_of(b"off", 2) || t == b"0" {
        Some(false)
    } else {
        None
    }
}

fn apply_typmod(n: Numeric, t: &Target) -> Ev<Numeric> {
    let Some((p, s)) = t.typmod else { return Ok(n) };
    let overflow = |detail: String| -> Ev<Numeric> {
        Err(Box::new(CdcError::new(ErrorKind::NumericOutOfRange, "numeric field overflow").detail(detail)))
    };
    match n {
        Numeric::NaN => Ok(n),
        Numeric::Infinity | Numeric::NegInfinity => {
            overflow(format!("A field with precision {p}, scale {s} cannot hold an infinite value."))
        }
        Numeric::Finite(_) => {
            let r = n
                .round(i64::from(s), RoundingStrategy::MidpointAwayFromZero)
                .map_err(|_| Box::new(CdcError::new(ErrorKind::NumericOutOfRange, "numeric field overflow")))?;
            let Numeric::Finite(d) = r else { return Ok(r) };
            let int_digits = {
                let t = d.abs().trunc().to_string();
                if t == "0" {
                    0
                } else {
                    t.len() as u32
                }
            };
            if int_digits > p.saturating_sub(s) {
                return overflow(format!(
                    "A field with precision {p}, scale {s} must round to an absolute value less than 10^{}.",
                    p.saturating_sub(s)
                ));
            }
            Ok(r)
        }
    }
}

/// Reads text as a value of type `t` (the type's input function): literals, `::type` casts of text.
pub(crate) fn parse_input<'a>(text: Cow<'a, [u8]>, t: &Target) -> Ev<Val<'a>> {
    let b = text.as_ref();
    Ok(match t.ty {
        Ty::Unknown | Ty::Text | Ty::Other(_) => {
            return Ok(truncate(Val::Text(text), t));
        }
        Ty::Bool => match parse_bool_input(b) {
            Some(v) => Val::Bool(v),
            None => {
                return fail(
                    ErrorKind::InvalidTextRepresentation,
                    format!("invalid input syntax for type boolean: \"{}\"", quote(b)),
                )
            }
        },
        Ty::Int => match num::parse_int_input(b) {
            Ok(v) => Val::Int(int_range(v, t).map_err(|_| {
                Box::new(CdcError::new(
                    ErrorKind::NumericOutOfRange,
                    format!("value \"{}\" is out of range for type {}", quote(b), t.name()),
                ))
            })?),
            Err(e) => return num_input_err(e, t, b),
        },
        Ty::Numeric => match num::parse_numeric(b) {
            Ok(n) => Val::Num(apply_typmod(n, t)?),
            Err(e) => return num_input_err(e, t, b),
        },
        Ty::Float => match num::parse_f64(b) {
            Ok(f) => Val::Float(f),
            Err(e) => return num_input_err(e, t, b),
        },
        Ty::Date => match time::parse(b).and_then(time::Dt::to_date) {
            Ok(d) => Val::Date(d),
            Err(e) => return dt_err(e, t.ty, b),
        },
        Ty::Timestamp | Ty::TimestampTz => {
            let tz = t.ty == Ty::TimestampTz;
            match time::parse(b).and_then(|d| d.to_micros(tz)) {
                Ok(v) if tz => Val::TsTz(v),
                Ok(v) => Val::Ts(v),
                Err(e) => return dt_err(e, t.ty, b),
            }
        }
    })
}

/// Reads a column's text output (pgoutput) as its type. Faster than [`parse_input`] for the
/// common forms; anything unexpected falls back to it.
#[inline]
pub(crate) fn parse_column<'a>(b: &'a [u8], ty: Ty) -> Ev<Val<'a>> {
    match ty {
        Ty::Text | Ty::Unknown | Ty::Other(_) => Ok(Val::Text(Cow::Borrowed(b))),
        Ty::Int => match num::parse_i64(b) {
            Some(v) => Ok(Val::Int(v)),
            None => parse_input(Cow::Borrowed(b), &Target::plain(Ty::Int)),
        },
        Ty::Bool => match b {
            b"t" => Ok(Val::Bool(true)),
            b"f" => Ok(Val::Bool(false)),
            _ => parse_input(Cow::Borrowed(b), &Target::plain(Ty::Bool)),
        },
        _ => parse_input(Cow::Borrowed(b), &Target::plain(ty)),
    }
}

fn truncate<'a>(v: Val<'a>, t: &Target) -> Val<'a> {
    match (v, t.len) {
        (Val::Text(s), Some(n)) => {
            let text = String::from_utf8_lossy(&s);
            match text.char_indices().nth(n as usize) {
                Some((cut, _)) => Val::Text(Cow::Owned(text.as_bytes()[..cut].to_vec())),
                None => Val::Text(s),
            }
        }
        (v, _) => v,
    }
}

/// Whether PostgreSQL has a cast (explicit or implicit) from `from` to `to`.
pub(crate) fn can_cast(from: Ty, to: Ty) -> bool {
    match (from, to) {
        (f, t) if f == t => true,
        (_, Ty::Text) => true,
        (Ty::Unknown | Ty::Text, Ty::Other(_)) => false,
        (Ty::Unknown | Ty::Text, _) => true,
        (Ty::Other(_), _) | (_, Ty::Other(_) | Ty::Unknown) => false,
        (f, t) if f.is_number() && t.is_number() => true,
        (Ty::Int, Ty::Bool) | (Ty::Bool, Ty::Int) => true,
        (f, t) if f.is_time() && t.is_time() => true,
        _ => false,
    }
}

/// Converts a non-NULL value to the target type (explicit cast semantics; implicit casts are the
/// widening subset).
pub(crate) fn cast<'a>(v: Val<'a>, t: &Target) -> Ev<Val<'a>> {
    let overflow = |what: &str| fail(ErrorKind::NumericOutOfRange, format!("{what} out of range"));
    Ok(match (v, t.ty) {
        (Val::Null, _) => Val::Null,
        (Val::Text(s), _) => return parse_input(s, t),
        (v, Ty::Text | Ty::Unknown) => truncate(Val::Text(Cow::Owned(v.to_text().into_bytes())), t),
        (Val::Int(i), Ty::Int) => Val::Int(int_range(i, t)?),
        (Val::Int(i), Ty::Numeric) => Val::Num(apply_typmod(Numeric::from_i64(i), t)?),
        (Val::Int(i), Ty::Float) => Val::Float(i as f64),
        (Val::Int(i), Ty::Bool) => Val::Bool(i != 0),
        (Val::Num(n), Ty::Int) => match n.to_i64() {
            Some(i) => Val::Int(int_range(i, t)?),
            None => return overflow(&t.name()),
        },
        (Val::Num(n), Ty::Numeric) => Val::Num(apply_typmod(n, t)?),
        (Val::Num(n), Ty::Float) => Val::Float(n.to_f64()),
        (Val::Float(f), Ty::Int) => {
            let r = f.round_ties_even();
            if !(-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&r) {
                return overflow(&t.name());
            }
            Val::Int(int_range(r as i64, t)?)
        }
        (Val::Float(f), Ty::Numeric) => match Numeric::from_f64(f) {
            Ok(n) => Val::Num(apply_typmod(n, t)?),
            Err(_) => return overflow("numeric"),
        },
        (Val::Float(f), Ty::Float) => Val::Float(f),
        (Val::Bool(b), Ty::Int) => Val::Int(i64::from(b)),
        (Val::Bool(b), Ty::Bool) => Val::Bool(b),
        (Val::Date(d), Ty::Date) => Val::Date(d),
        (Val::Date(d), Ty::Timestamp) => Val::Ts(time::date_to_micros(d)),
        (Val::Date(d), Ty::TimestampTz) => Val::TsTz(time::date_to_micros(d)),
        (Val::Ts(x) | Val::TsTz(x), Ty::Date) => Val::Date(time::micros_to_date(x)),
        (Val::Ts(x) | Val::TsTz(x), Ty::Timestamp) => Val::Ts(x),
        (Val::Ts(x) | Val::TsTz(x), Ty::TimestampTz) => Val::TsTz(x),
        (v, _) => {
            return fail(ErrorKind::CannotCoerce, format!("cannot cast {} to {}", v.to_text(), t.name()));
        }
    })
}

/// Formats straight into the output buffer.
struct VecWriter<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for VecWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// The result of a computed expression, owned.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// `boolean`.
    Bool(bool),
    /// Any integer type, as int8.
    Int(i64),
    /// `float8`.
    Float(f64),
    /// `numeric`.
    Numeric(Numeric),
    /// Text (and text-like types).
    Text(String),
    /// `date`: days since 1970-01-01 (`i32::MAX` / `i32::MIN` are infinity / -infinity).
    Date(i32),
    /// `timestamp`: microseconds since 1970-01-01 00:00 (`i64::MAX` / `i64::MIN` are the infinities).
    Timestamp(i64),
    /// `timestamptz`: microseconds since 1970-01-01 00:00 UTC (`i64::MAX` / `i64::MIN` are the infinities).
    TimestampTz(i64),
}

impl Value {
    /// Whether this is SQL NULL.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    fn as_val(&self) -> Val<'_> {
        match self {
            Value::Null => Val::Null,
            Value::Bool(b) => Val::Bool(*b),
            Value::Int(i) => Val::Int(*i),
            Value::Float(f) => Val::Float(*f),
            Value::Numeric(n) => Val::Num(*n),
            Value::Text(s) => Val::Text(Cow::Borrowed(s.as_bytes())),
            Value::Date(d) => Val::Date(*d),
            Value::Timestamp(t) => Val::Ts(*t),
            Value::TimestampTz(t) => Val::TsTz(*t),
        }
    }

    /// PostgreSQL's text output of the value, as `::text` gives it (`true`, `19.3750`, `1.5e+20`,
    /// `2024-03-15 14:23:45+00`); None for NULL.
    pub fn to_pg_text(&self) -> Option<String> {
        if self.is_null() {
            None
        } else {
            Some(self.as_val().to_text())
        }
    }

    /// Appends the value as JSON, with the same conventions as the event's column values: numbers
    /// are JSON numbers (numeric without needless trailing zeros: `19.375`), `NaN` and the
    /// infinities are strings, dates and timestamps ISO-8601 strings (`2024-03-15T14:23:45.123Z`
    /// for timestamptz), text a JSON string.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let mut s = String::new();
        match self {
            Value::Null => out.extend_from_slice(b"null"),
            Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            Value::Int(i) => {
                let _ = write!(VecWriter(out), "{i}");
            }
            Value::Float(f) => {
                num::write_float(&mut s, *f);
                if f.is_finite() {
                    out.extend_from_slice(s.as_bytes());
                } else {
                    write_str(out, s.as_bytes());
                }
            }
            Value::Numeric(n) => match n {
                Numeric::Finite(d) => {
                    let _ = write!(VecWriter(out), "{}", d.normalize());
                }
                special => {
                    let _ = write!(s, "{special}");
                    write_str(out, s.as_bytes());
                }
            },
            Value::Text(t) => write_str(out, t.as_bytes()),
            Value::Date(d) => {
                time::write_iso_date(&mut s, *d);
                write_str(out, s.as_bytes());
            }
            Value::Timestamp(t) => {
                time::write_iso_ts(&mut s, *t, false);
                write_str(out, s.as_bytes());
            }
            Value::TimestampTz(t) => {
                time::write_iso_ts(&mut s, *t, true);
                write_str(out, s.as_bytes());
            }
        }
    }
}
