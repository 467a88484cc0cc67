//! The bound tree and its evaluation over one row of pgoutput text values.
//!
//! Comparisons of a column with a constant are specialised at bind time ([`Node::ColCmp`],
//! [`Node::ColIn`], [`Node::ColIsNull`]): the constant is pre-converted to a [`Key`] and the column's
//! bytes are compared with it directly (text byte-wise, integers parsed in place, numeric digit by
//! digit), so the common filter allocates nothing and parses each column once at most.

use std::borrow::Cow;
use std::cmp::Ordering;

use rust_decimal::RoundingStrategy;

use super::like::LikePat;
use super::num::{check_float, float_cmp, parse_i64, ArithErr, DecKey, Numeric};
use super::parse::{ArOp, CmpOp, Func};
use super::time;
use super::val::{cast, cmp_vals, fail, parse_column, Ev, Target, Ty, Val};
use crate::decode::TupleValue;
use crate::error::ErrorKind;

/// A constant pre-converted for comparison with a column's text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Key {
    /// Text column: byte-wise (C collation).
    Bytes(Box<[u8]>),
    /// Boolean column.
    Bool(bool),
    /// Integer column against an integer: parsed as i64; the decimal key covers text beyond i64.
    Int(i64, DecKey),
    /// Integer or numeric column against a numeric: exact digit comparison.
    Dec(DecKey),
    /// Any number column compared as float8.
    Float(f64),
    /// Date/timestamp column, widened to `uni` (days for date, microseconds otherwise).
    Time { uni: Ty, v: i64 },
}

/// The constants of `column IN (...)`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum KeySet {
    /// Sorted, deduplicated text.
    Bytes(Vec<Box<[u8]>>),
    /// Sorted integers (integer column).
    Ints(Vec<i64>),
    /// Anything else, compared one by one.
    Keys(Vec<Key>),
}

/// A LIKE pattern: compiled once when constant.
#[derive(Debug, Clone)]
pub(crate) enum LikeP {
    Fixed(LikePat),
    Dynamic { pat: Box<Node>, escape: Option<char>, ci: bool },
}

/// One node of a bound expression.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    Const(Val<'static>),
    /// A numeric literal too large for arithmetic; the binder turns it into a comparison key or a
    /// float8, or refuses it.
    BigNum(Box<str>),
    Col {
        idx: usize,
        ty: Ty,
    },
    Not(Box<Node>),
    And(Vec<Node>),
    Or(Vec<Node>),
    IsNull {
        arg: Box<Node>,
        negated: bool,
    },
    ColIsNull {
        idx: usize,
        negated: bool,
    },
    /// `IS [NOT] TRUE/FALSE/UNKNOWN` (None: UNKNOWN).
    IsBool {
        arg: Box<Node>,
        value: Option<bool>,
        negated: bool,
    },
    Cmp {
        op: CmpOp,
        l: Box<Node>,
        r: Box<Node>,
    },
    ColCmp {
        idx: usize,
        col: Ty,
        op: CmpOp,
        key: Key,
    },
    Distinct {
        l: Box<Node>,
        r: Box<Node>,
        negated: bool,
    },
    In {
        arg: Box<Node>,
        list: Vec<Node>,
        negated: bool,
    },
    ColIn {
        idx: usize,
        col: Ty,
        keys: KeySet,
        has_null: bool,
        negated: bool,
    },
    Like {
        arg: Box<Node>,
        pat: LikeP,
        negated: bool,
    },
    Arith {
        op: ArOp,
        l: Box<Node>,
        r: Box<Node>,
    },
    Neg(Box<Node>),
    Concat(Box<Node>, Box<Node>),
    Case {
        whens: Vec<(Node, Node)>,
        else_: Box<Node>,
    },
    /// A cast; `implicit` ones are the widening conversions the binder inserts.
    Cast {
        arg: Box<Node>,
        to: Target,
        implicit: bool,
    },
    /// `nullif(a, b)`: `a_cmp` and `b` are converted to their common type, `a` is returned.
    NullIf {
        a: Box<Node>,
        a_cmp: Box<Node>,
        b: Box<Node>,
    },
    Func {
        f: Func,
        args: Vec<Node>,
    },
}

pub(crate) fn big_message(t: &str) -> String {
    format!(
        "numeric literal {t} is out of range: numeric arithmetic is limited to 28 digits after the point and \
         absolute values below 7.9e28 (comparisons with a column accept it)"
    )
}

fn arith_err<T>(e: ArithErr, what: &str) -> Ev<T> {
    match e {
        ArithErr::DivByZero => fail(ErrorKind::DivisionByZero, "division by zero"),
        ArithErr::Overflow => fail(ErrorKind::NumericOutOfRange, format!("{what} out of range")),
        ArithErr::Underflow => fail(ErrorKind::NumericOutOfRange, "value out of range: underflow"),
    }
}

fn bool3(t: Option<bool>) -> Val<'static> {
    match t {
        Some(b) => Val::Bool(b),
        None => Val::Null,
    }
}

#[inline]
fn col<'a>(row: &'a [TupleValue<'a>], idx: usize) -> Option<&'a [u8]> {
    match row.get(idx) {
        Some(TupleValue::Text(b)) => Some(b),
        // NULL, an unchanged TOAST value (its value is not in the WAL) or a short row: NULL.
        _ => None,
    }
}

/// Compares a column's text output with a key: `column <=> key`.
#[inline]
pub(crate) fn key_cmp(b: &[u8], col: Ty, key: &Key) -> Ev<Ordering> {
    match key {
        Key::Bytes(k) => Ok(b.cmp(k)),
        Key::Int(k, dk) => match parse_i64(b) {
            Some(v) => Ok(v.cmp(k)),
            None => dec_cmp(b, col, dk),
        },
        Key::Dec(dk) => dec_cmp(b, col, dk),
        Key::Float(k) => {
            let v = match parse_column(b, Ty::Float)? {
                Val::Float(f) => f,
                _ => return fail(ErrorKind::Internal, "float column did not parse as float"),
            };
            Ok(float_cmp(v, *k))
        }
        Key::Bool(k) => match parse_column(b, Ty::Bool)? {
            Val::Bool(v) => Ok(v.cmp(k)),
            _ => fail(ErrorKind::Internal, "boolean column did not parse as boolean"),
        },
        Key::Time { uni, v } => {
            let t = match (parse_column(b, col)?, uni) {
                (Val::Date(d), Ty::Date) => i64::from(d),
                (Val::Date(d), _) => time::date_to_micros(d),
                (Val::Ts(t) | Val::TsTz(t), _) => t,
                _ => return fail(ErrorKind::Internal, "date/time column did not parse"),
            };
            Ok(t.cmp(v))
        }
    }
}

fn dec_cmp(b: &[u8], col: Ty, dk: &DecKey) -> Ev<Ordering> {
    if let Some(o) = dk.cmp_text(b) {
        return Ok(o);
    }
    // Not plain decimal text (never from pgoutput): compare through the parsed value.
    let n = match parse_column(b, col)? {
        Val::Int(i) => Numeric::from_i64(i),
        Val::Num(n) => n,
        _ => return fail(ErrorKind::Internal, "number column did not parse"),
    };
    match dk.cmp_text(n.to_string().as_bytes()) {
        Some(o) => Ok(o),
        None => fail(ErrorKind::Internal, "number column did not parse"),
    }
}

impl KeySet {
    fn contains(&self, b: &[u8], col: Ty) -> Ev<bool> {
        match self {
            KeySet::Bytes(v) => Ok(if v.len() <= 8 {
                v.iter().any(|k| k.as_ref() == b)
            } else {
                v.binary_search_by(|k| k.as_ref().cmp(b)).is_ok()
            }),
            KeySet::Ints(v) => Ok(match parse_i64(b) {
                Some(x) if v.len() <= 8 => v.contains(&x),
                Some(x) => v.binary_search(&x).is_ok(),
                // Beyond i64 (xid8): equal to no i64 constant.
                None => {
                    parse_column(b, col)?;
                    false
                }
            }),
            KeySet::Keys(v) => {
                for k in v {
                    if key_cmp(b, col, k)? == Ordering::Equal {
                        return Ok(true);
                    }
                }
                Ok(false)
            }
        }
    }
}

impl Node {
    /// Three-valued truth of a boolean node: Some(true), Some(false), or None for NULL.
    pub(crate) fn truth<'a>(&'a self, row: &'a [TupleValue<'a>]) -> Ev<Option<bool>> {
        match self {
            Node::ColCmp { idx, col: cty, op, key } => match col(row, *idx) {
                Some(b) => match (op, key) {
                    // Text equality: no ordering needed.
                    (CmpOp::Eq, Key::Bytes(k)) => Ok(Some(b == &**k)),
                    (CmpOp::Ne, Key::Bytes(k)) => Ok(Some(b != &**k)),
                    _ => Ok(Some(op.test(key_cmp(b, *cty, key)?))),
                },
                None => Ok(None),
            },
            Node::ColIn { idx, col: cty, keys, has_null, negated } => match col(row, *idx) {
                None => Ok(None),
                Some(b) => {
                    if keys.contains(b, *cty)? {
                        Ok(Some(!negated))
                    } else if *has_null {
                        Ok(None)
                    } else {
                        Ok(Some(*negated))
                    }
                }
            },
            Node::ColIsNull { idx, negated } => Ok(Some(col(row, *idx).is_none() != *negated)),
            Node::And(v) => {
                let mut null = false;
                for n in v {
                    match n.truth(row)? {
                        Some(false) => return Ok(Some(false)),
                        None => null = true,
                        Some(true) => {}
                    }
                }
                Ok(if null { None } else { Some(true) })
            }
            Node::Or(v) => {
                let mut null = false;
                for n in v {
                    match n.truth(row)? {
                        Some(true) => return Ok(Some(true)),
                        None => null = true,
                        Some(false) => {}
                    }
                }
                Ok(if null { None } else { Some(false) })
            }
            Node::Not(a) => Ok(a.truth(row)?.map(|b| !b)),
            Node::Const(Val::Bool(b)) => Ok(Some(*b)),
            Node::Const(Val::Null) => Ok(None),
            Node::Col { idx, ty: Ty::Bool } => match col(row, *idx) {
                Some(b"t") => Ok(Some(true)),
                Some(b"f") => Ok(Some(false)),
                None => Ok(None),
                Some(_) => self.eval(row).map(|v| match v {
                    Val::Bool(b) => Some(b),
                    _ => None,
                }),
            },
            _ => match self.eval(row)? {
                Val::Bool(b) => Ok(Some(b)),
                Val::Null => Ok(None),
                other => fail(ErrorKind::DatatypeMismatch, format!("expression is not boolean: {}", other.to_text())),
            },
        }
    }

    /// The value of the node for `row`.
    pub(crate) fn eval<'a>(&'a self, row: &'a [TupleValue<'a>]) -> Ev<Val<'a>> {
        match self {
            Node::Const(v) => Ok(v.borrowed()),
            Node::BigNum(t) => fail(ErrorKind::NumericOutOfRange, big_message(t)),
            Node::Col { idx, ty } => match col(row, *idx) {
                Some(b) => parse_column(b, *ty),
                None => Ok(Val::Null),
            },
            Node::ColCmp { .. }
            | Node::ColIn { .. }
            | Node::ColIsNull { .. }
            | Node::And(_)
            | Node::Or(_)
            | Node::Not(_) => Ok(bool3(self.truth(row)?)),
            Node::IsNull { arg, negated } => Ok(Val::Bool(arg.eval(row)?.is_null() != *negated)),
            Node::IsBool { arg, value, negated } => {
                let t = arg.truth(row)?;
                let r = match value {
                    Some(v) => t == Some(*v),
                    None => t.is_none(),
                };
                Ok(Val::Bool(r != *negated))
            }
            Node::Cmp { op, l, r } => {
                let a = l.eval(row)?;
                if a.is_null() {
                    return Ok(Val::Null);
                }
                let b = r.eval(row)?;
                if b.is_null() {
                    return Ok(Val::Null);
                }
                Ok(Val::Bool(op.test(cmp_vals(&a, &b)?)))
            }
            Node::Distinct { l, r, negated } => {
                let a = l.eval(row)?;
                let b = r.eval(row)?;
                let distinct = match (a.is_null(), b.is_null()) {
                    (true, true) => false,
                    (true, false) | (false, true) => true,
                    (false, false) => cmp_vals(&a, &b)? != Ordering::Equal,
                };
                Ok(Val::Bool(distinct != *negated))
            }
            Node::In { arg, list, negated } => {
                let a = arg.eval(row)?;
                if a.is_null() {
                    return Ok(Val::Null);
                }
                let mut saw_null = false;
                for x in list {
                    let b = x.eval(row)?;
                    if b.is_null() {
                        saw_null = true;
                    } else if cmp_vals(&a, &b)? == Ordering::Equal {
                        return Ok(Val::Bool(!negated));
                    }
                }
                Ok(if saw_null { Val::Null } else { Val::Bool(*negated) })
            }
            Node::Like { arg, pat, negated } => {
                let a = arg.eval(row)?;
                let Val::Text(s) = &a else { return Ok(Val::Null) };
                let m = match pat {
                    LikeP::Fixed(p) => p.matches(s),
                    LikeP::Dynamic { pat, escape, ci } => {
                        let Val::Text(p) = pat.eval(row)? else { return Ok(Val::Null) };
                        match LikePat::compile(&p, *escape, *ci) {
                            Ok(p) => p.matches(s),
                            Err(_) => {
                                return fail(
                                    ErrorKind::InvalidEscapeSequence,
                                    "LIKE pattern must not end with escape character",
                                )
                            }
                        }
                    }
                };
                Ok(Val::Bool(m != *negated))
            }
            Node::Arith { op, l, r } => {
                let a = l.eval(row)?;
                if a.is_null() {
                    return Ok(Val::Null);
                }
                let b = r.eval(row)?;
                if b.is_null() {
                    return Ok(Val::Null);
                }
                arith(*op, a, b)
            }
            Node::Neg(a) => Ok(match a.eval(row)? {
                Val::Int(i) => match i.checked_neg() {
                    Some(v) => Val::Int(v),
                    None => return fail(ErrorKind::NumericOutOfRange, "bigint out of range"),
                },
                Val::Num(n) => Val::Num(n.neg()),
                Val::Float(f) => Val::Float(-f),
                v => v,
            }),
            Node::Concat(l, r) => {
                let a = l.eval(row)?;
                let b = r.eval(row)?;
                match (a, b) {
                    (Val::Text(x), Val::Text(y)) => {
                        let mut v = Vec::with_capacity(x.len() + y.len());
                        v.extend_from_slice(&x);
                        v.extend_from_slice(&y);
                        Ok(Val::Text(Cow::Owned(v)))
                    }
                    _ => Ok(Val::Null),
                }
            }
            Node::Case { whens, else_ } => {
                for (c, r) in whens {
                    if c.truth(row)? == Some(true) {
                        return r.eval(row);
                    }
                }
                else_.eval(row)
            }
            Node::Cast { arg, to, .. } => {
                let v = arg.eval(row)?;
                if v.is_null() {
                    return Ok(Val::Null);
                }
                cast(v, to)
            }
            Node::NullIf { a, a_cmp, b } => {
                let x = a_cmp.eval(row)?;
                let y = b.eval(row)?;
                if !x.is_null() && !y.is_null() && cmp_vals(&x, &y)? == Ordering::Equal {
                    return Ok(Val::Null);
                }
                a.eval(row)
            }
            Node::Func { f, args } => eval_func(*f, args, row),
        }
    }
}

fn arith<'a>(op: ArOp, a: Val<'a>, b: Val<'a>) -> Ev<Val<'a>> {
    match (a, b) {
        (Val::Int(x), Val::Int(y)) => {
            let r = match op {
                ArOp::Add => x.checked_add(y),
                ArOp::Sub => x.checked_sub(y),
                ArOp::Mul => x.checked_mul(y),
                ArOp::Div | ArOp::Mod if y == 0 => return arith_err(ArithErr::DivByZero, ""),
                ArOp::Div => x.checked_div(y),
                ArOp::Mod if y == -1 => Some(0),
                ArOp::Mod => x.checked_rem(y),
            };
            match r {
                Some(v) => Ok(Val::Int(v)),
                None => arith_err(ArithErr::Overflow, "bigint"),
            }
        }
        (Val::Num(x), Val::Num(y)) => {
            let r = match op {
                ArOp::Add => x.add(y),
                ArOp::Sub => x.sub(y),
                ArOp::Mul => x.mul(y),
                ArOp::Div => x.div(y),
                ArOp::Mod => x.rem(y),
            };
            match r {
                Ok(n) => Ok(Val::Num(n)),
                Err(e) => arith_err(e, "numeric value"),
            }
        }
        (Val::Float(x), Val::Float(y)) => {
            let r = match op {
                ArOp::Add => check_float(x + y, x, y, false),
                ArOp::Sub => check_float(x - y, x, y, false),
                ArOp::Mul => check_float(x * y, x, y, y != 0.0),
                ArOp::Div if y == 0.0 && !x.is_nan() => Err(ArithErr::DivByZero),
                ArOp::Div => check_float(x / y, x, y, true),
                ArOp::Mod => {
                    return fail(
                        ErrorKind::UndefinedFunction,
                        "operator does not exist: double precision % double precision",
                    )
                }
            };
            match r {
                Ok(v) => Ok(Val::Float(v)),
                Err(ArithErr::Overflow) => fail(ErrorKind::NumericOutOfRange, "value out of range: overflow"),
                Err(e) => arith_err(e, "double precision"),
            }
        }
        (a, b) => fail(ErrorKind::Internal, format!("no arithmetic between {a:?} and {b:?}")),
    }
}

fn text_arg<'v>(v: &'v Val<'_>) -> &'v [u8] {
    match v {
        Val::Text(t) => t,
        _ => b"",
    }
}

fn int_arg(v: &Val<'_>) -> i64 {
    match v {
        Val::Int(i) => *i,
        _ => 0,
    }
}

fn lossy(b: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(b)
}

fn owned_text(s: String) -> Val<'static> {
    Val::Text(Cow::Owned(s.into_bytes()))
}

fn char_count(b: &[u8]) -> i64 {
    b.iter().filter(|&&c| (c & 0xC0) != 0x80).count() as i64
}

/// Keeps the value's text borrowed when a function returns a slice of it.
fn slice_text<'a>(v: Val<'a>, start: usize, end: usize) -> Val<'a> {
    match v {
        Val::Text(Cow::Borrowed(b)) => Val::Text(Cow::Borrowed(&b[start..end])),
        Val::Text(Cow::Owned(b)) => Val::Text(Cow::Owned(b[start..end].to_vec())),
        other => other,
    }
}

/// Byte offsets of the characters of `s` numbered (1-based) `from` (inclusive) to `to`
/// (exclusive, None for the end).
fn char_range(s: &str, from: i64, to: Option<i64>) -> (usize, usize) {
    let from = from.max(1);
    if to.is_some_and(|t| t <= from) {
        return (0, 0);
    }
    let mut start = s.len();
    let mut end = s.len();
    for (n, (i, _)) in s.char_indices().enumerate() {
        let pos = n as i64 + 1;
        if pos == from {
            start = i;
        }
        if Some(pos) == to {
            end = i;
            break;
        }
    }
    if end < start {
        end = start;
    }
    (start, end)
}

fn trim<'a>(v: Val<'a>, chars: Option<&[u8]>, left: bool, right: bool) -> Val<'a> {
    let Val::Text(t) = &v else { return v };
    let set: Vec<char> = match chars {
        Some(c) => lossy(c).chars().collect(),
        None => vec![' '],
    };
    let Ok(s) = std::str::from_utf8(t) else {
        let s = lossy(t).into_owned();
        let r = match (left, right) {
            (true, true) => s.trim_matches(set.as_slice()),
            (true, false) => s.trim_start_matches(set.as_slice()),
            _ => s.trim_end_matches(set.as_slice()),
        };
        return owned_text(r.to_string());
    };
    let start = if left { s.len() - s.trim_start_matches(set.as_slice()).len() } else { 0 };
    let end = if right { s.trim_end_matches(set.as_slice()).len() } else { s.len() };
    let end = end.max(start);
    slice_text(v, start, end)
}

fn eval_func<'a>(f: Func, args: &'a [Node], row: &'a [TupleValue<'a>]) -> Ev<Val<'a>> {
    match f {
        Func::Coalesce => {
            for a in args {
                let v = a.eval(row)?;
                if !v.is_null() {
                    return Ok(v);
                }
            }
            return Ok(Val::Null);
        }
        Func::Greatest | Func::Least => {
            let mut best: Option<Val<'a>> = None;
            for a in args {
                let v = a.eval(row)?;
                if v.is_null() {
                    continue;
                }
                let better = match &best {
                    None => true,
                    Some(b) => {
                        let o = cmp_vals(&v, b)?;
                        if f == Func::Greatest {
                            o == Ordering::Greater
                        } else {
                            o == Ordering::Less
                        }
                    }
                };
                if better {
                    best = Some(v);
                }
            }
            return Ok(best.unwrap_or(Val::Null));
        }
        _ => {}
    }
    // Every other function is strict: NULL in, NULL out.
    let mut vals: [Val<'a>; 3] = [Val::Null, Val::Null, Val::Null];
    for (i, a) in args.iter().enumerate().take(3) {
        let v = a.eval(row)?;
        if v.is_null() {
            return Ok(Val::Null);
        }
        vals[i] = v;
    }
    let [x, y, z] = vals;
    let n_args = args.len();
    Ok(match f {
        Func::Abs => match x {
            Val::Int(i) => match i.checked_abs() {
                Some(v) => Val::Int(v),
                None => return fail(ErrorKind::NumericOutOfRange, "bigint out of range"),
            },
            Val::Num(n) => Val::Num(n.abs()),
            Val::Float(v) => Val::Float(v.abs()),
            v => v,
        },
        Func::Round | Func::Trunc => {
            let strategy =
                if f == Func::Round { RoundingStrategy::MidpointAwayFromZero } else { RoundingStrategy::ToZero };
            match x {
                Val::Float(v) if f == Func::Round => Val::Float(v.round_ties_even()),
                Val::Float(v) => Val::Float(v.trunc()),
                Val::Num(n) => {
                    let digits = if n_args > 1 { int_arg(&y) } else { 0 };
                    match n.round(digits, strategy) {
                        Ok(r) => Val::Num(r),
                        Err(e) => return arith_err(e, "numeric value"),
                    }
                }
                v => v,
            }
        }
        Func::Floor => match x {
            Val::Float(v) => Val::Float(v.floor()),
            Val::Num(n) => Val::Num(n.floor()),
            v => v,
        },
        Func::Ceil => match x {
            Val::Float(v) => Val::Float(v.ceil()),
            Val::Num(n) => Val::Num(n.ceil()),
            v => v,
        },
        Func::Sign => match x {
            Val::Float(v) if v == 0.0 || v.is_nan() => Val::Float(if v.is_nan() { v } else { 0.0 }),
            Val::Float(v) => Val::Float(v.signum()),
            Val::Num(n) => Val::Num(n.signum()),
            v => v,
        },
        Func::Mod => return fail(ErrorKind::Internal, "mod is bound as %"),
        Func::Lower | Func::Upper => {
            let t = text_arg(&x);
            let upper = f == Func::Upper;
            if t.is_ascii() {
                let mut v = t.to_vec();
                if upper {
                    v.make_ascii_uppercase()
                } else {
                    v.make_ascii_lowercase()
                }
                Val::Text(Cow::Owned(v))
            } else if upper {
                owned_text(lossy(t).to_uppercase())
            } else {
                owned_text(lossy(t).to_lowercase())
            }
        }
        Func::Length => Val::Int(char_count(text_arg(&x))),
        Func::OctetLength => Val::Int(text_arg(&x).len() as i64),
        Func::Btrim | Func::Ltrim | Func::Rtrim => {
            let chars = if n_args > 1 { Some(text_arg(&y)) } else { None };
            trim(x.clone(), chars, f != Func::Rtrim, f != Func::Ltrim)
        }
        Func::Substr => {
            let start = int_arg(&y);
            let end = if n_args > 2 {
                let len = int_arg(&z);
                if len < 0 {
                    return fail(ErrorKind::SubstringError, "negative substring length not allowed");
                }
                Some(start.saturating_add(len))
            } else {
                None
            };
            let t = text_arg(&x);
            match std::str::from_utf8(t) {
                Ok(s) => {
                    let (a, b) = char_range(s, start, end);
                    slice_text(x.clone(), a, b)
                }
                Err(_) => {
                    let s = lossy(t).into_owned();
                    let (a, b) = char_range(&s, start, end);
                    owned_text(s[a..b].to_string())
                }
            }
        }
        Func::StartsWith => Val::Bool(text_arg(&x).starts_with(text_arg(&y))),
        Func::Strpos => {
            let (hay, needle) = (text_arg(&x), text_arg(&y));
            if needle.is_empty() {
                Val::Int(1)
            } else {
                match hay.windows(needle.len()).position(|w| w == needle) {
                    Some(p) => Val::Int(char_count(&hay[..p]) + 1),
                    None => Val::Int(0),
                }
            }
        }
        Func::Replace => {
            let (s, from, to) = (text_arg(&x), text_arg(&y), text_arg(&z));
            if from.is_empty() {
                x.clone()
            } else {
                owned_text(lossy(s).replace(lossy(from).as_ref(), lossy(to).as_ref()))
            }
        }
        Func::Left | Func::Right => {
            let n = int_arg(&y);
            let t = text_arg(&x);
            let s = lossy(t).into_owned();
            let total = s.chars().count() as i64;
            let keep = if n >= 0 { n.min(total) } else { (total + n).max(0) };
            let (a, b) = if f == Func::Left {
                char_range(&s, 1, Some(keep + 1))
            } else {
                char_range(&s, total - keep + 1, None)
            };
            owned_text(s[a..b].to_string())
        }
        Func::Coalesce | Func::Greatest | Func::Least | Func::Nullif => {
            return fail(ErrorKind::Internal, "function evaluated out of place")
        }
    })
}
