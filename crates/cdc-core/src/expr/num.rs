//! Numbers as PostgreSQL has them: `numeric` (exact decimal plus `NaN` and the infinities), `float8`
//! with PostgreSQL's ordering and text output, and `bigint` with overflow checks.
//!
//! `numeric` arithmetic uses [`rust_decimal`]: 96-bit mantissa, at most 28 digits after the point.
//! Comparing a column with a constant never goes through it: [`DecKey`] compares the column's decimal
//! text digit by digit, exact for any size.

use std::cmp::Ordering;
use std::fmt::{self, Write as _};

use rust_decimal::{Decimal, RoundingStrategy};

/// A `numeric` value: an exact decimal, or one of PostgreSQL's special values.
///
/// Finite values have at most 28 digits after the decimal point and an absolute value below
/// 2^96 (about 7.9e28); longer fractions are rounded half away from zero, larger values are an
/// out-of-range error (22003).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Numeric {
    /// A finite value; its scale (digits after the point) is kept as computed.
    Finite(Decimal),
    /// `NaN`: equal to itself and greater than every other value, as in PostgreSQL.
    NaN,
    /// `Infinity`.
    Infinity,
    /// `-Infinity`.
    NegInfinity,
}

/// Why text is not a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NumErr {
    /// Not a number at all.
    Syntax,
    /// A number too large for the type.
    Overflow,
}

/// Why an arithmetic operation has no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArithErr {
    /// Division (or modulo) by zero.
    DivByZero,
    /// The result does not fit the type.
    Overflow,
    /// A float result so small it became zero.
    Underflow,
}

const LIMIT: u128 = 1 << 96;
const MAX_SCALE: u64 = 28;

pub(crate) fn trim(s: &[u8]) -> &[u8] {
    s.trim_ascii()
}

fn special_numeric(s: &[u8]) -> Option<Numeric> {
    let eq = |w: &[u8]| s.eq_ignore_ascii_case(w);
    if eq(b"nan") {
        Some(Numeric::NaN)
    } else if eq(b"infinity") || eq(b"+infinity") || eq(b"inf") || eq(b"+inf") {
        Some(Numeric::Infinity)
    } else if eq(b"-infinity") || eq(b"-inf") {
        Some(Numeric::NegInfinity)
    } else {
        None
    }
}

/// Parses `numeric` input: optional sign, digits with an optional point, optional exponent, or
/// `NaN` / `Infinity` / `-Infinity`; surrounding blanks are ignored. Allocation-free.
pub(crate) fn parse_numeric(s: &[u8]) -> Result<Numeric, NumErr> {
    let s = trim(s);
    if let Some(sp) = special_numeric(s) {
        return Ok(sp);
    }
    let (neg, mut i) = match s.first() {
        Some(b'-') => (true, 1),
        Some(b'+') => (false, 1),
        _ => (false, 0),
    };
    let mut mant: u128 = 0;
    let mut kept = 0u32;
    let mut dropped: i64 = 0;
    let mut frac: i64 = 0;
    let mut any = false;
    let mut dot = false;
    while let Some(&c) = s.get(i) {
        if c.is_ascii_digit() {
            any = true;
            if dot {
                frac += 1;
            }
            if mant == 0 && c == b'0' {
                // leading zero
            } else if kept < 38 {
                mant = mant * 10 + u128::from(c - b'0');
                kept += 1;
            } else {
                dropped += 1;
            }
        } else if c == b'.' && !dot {
            dot = true;
        } else {
            break;
        }
        i += 1;
    }
    if !any {
        return Err(NumErr::Syntax);
    }
    let mut exp: i64 = 0;
    if matches!(s.get(i), Some(b'e' | b'E')) {
        i += 1;
        let eneg = match s.get(i) {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let start = i;
        while let Some(&c) = s.get(i) {
            if !c.is_ascii_digit() {
                break;
            }
            exp = (exp * 10 + i64::from(c - b'0')).min(1_000_000_000);
            i += 1;
        }
        if i == start {
            return Err(NumErr::Syntax);
        }
        if eneg {
            exp = -exp;
        }
    }
    if i != s.len() {
        return Err(NumErr::Syntax);
    }
    build_decimal(neg, mant, exp - frac + dropped).map(Numeric::Finite)
}

/// `mant * 10^e` as a Decimal, rounding half away from zero past 28 fractional digits.
fn build_decimal(neg: bool, mant: u128, e: i64) -> Result<Decimal, NumErr> {
    let (m, scale) = if e >= 0 {
        let mut m = mant;
        if m != 0 {
            for _ in 0..e {
                m = m.checked_mul(10).filter(|&v| v < LIMIT).ok_or(NumErr::Overflow)?;
            }
        }
        (m, 0u64)
    } else {
        let scale = e.unsigned_abs();
        let mut k = scale.saturating_sub(MAX_SCALE);
        loop {
            let q = div_round(mant, k);
            if q < LIMIT {
                break (q, scale - k);
            }
            k += 1;
            if k > scale {
                return Err(NumErr::Overflow);
            }
        }
    };
    if m >= LIMIT {
        return Err(NumErr::Overflow);
    }
    let signed = if neg { -(m as i128) } else { m as i128 };
    Decimal::try_from_i128_with_scale(signed, scale as u32).map_err(|_| NumErr::Overflow)
}

/// `m / 10^k` rounded half away from zero.
fn div_round(m: u128, k: u64) -> u128 {
    if k == 0 {
        m
    } else if k > 38 {
        0
    } else {
        let p = 10u128.pow(k as u32);
        m / p + u128::from((m % p) * 2 >= p)
    }
}

impl Numeric {
    /// PostgreSQL's order: `-Infinity` < finite values < `Infinity` < `NaN`.
    fn rank(&self) -> u8 {
        match self {
            Numeric::NegInfinity => 0,
            Numeric::Finite(_) => 1,
            Numeric::Infinity => 2,
            Numeric::NaN => 3,
        }
    }

    /// Total order as PostgreSQL sorts `numeric` (NaN equals NaN and sorts last).
    pub fn pg_cmp(&self, other: &Numeric) -> Ordering {
        match (self, other) {
            (Numeric::Finite(a), Numeric::Finite(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }

    pub(crate) fn from_i64(v: i64) -> Numeric {
        Numeric::Finite(Decimal::from(v))
    }

    fn is_zero(&self) -> bool {
        matches!(self, Numeric::Finite(d) if d.is_zero())
    }

    fn sign(&self) -> i8 {
        match self {
            Numeric::Finite(d) if d.is_zero() => 0,
            Numeric::Finite(d) if d.is_sign_negative() => -1,
            Numeric::Finite(_) | Numeric::Infinity => 1,
            Numeric::NegInfinity => -1,
            Numeric::NaN => 0,
        }
    }

    fn inf(sign: i8) -> Numeric {
        if sign < 0 {
            Numeric::NegInfinity
        } else {
            Numeric::Infinity
        }
    }

    pub(crate) fn add(self, b: Numeric) -> Result<Numeric, ArithErr> {
        use Numeric::*;
        Ok(match (self, b) {
            (NaN, _) | (_, NaN) | (Infinity, NegInfinity) | (NegInfinity, Infinity) => NaN,
            (Infinity, _) | (_, Infinity) => Infinity,
            (NegInfinity, _) | (_, NegInfinity) => NegInfinity,
            (Finite(x), Finite(y)) => Finite(x.checked_add(y).ok_or(ArithErr::Overflow)?),
        })
    }

    pub(crate) fn neg(self) -> Numeric {
        match self {
            Numeric::Finite(d) => Numeric::Finite(-d),
            Numeric::Infinity => Numeric::NegInfinity,
            Numeric::NegInfinity => Numeric::Infinity,
            Numeric::NaN => Numeric::NaN,
        }
    }

    pub(crate) fn sub(self, b: Numeric) -> Result<Numeric, ArithErr> {
        self.add(b.neg())
    }

    pub(crate) fn mul(self, b: Numeric) -> Result<Numeric, ArithErr> {
        use Numeric::*;
        Ok(match (self, b) {
            (NaN, _) | (_, NaN) => NaN,
            (Finite(x), Finite(y)) => Finite(x.checked_mul(y).ok_or(ArithErr::Overflow)?),
            (a, b) => {
                let s = a.sign() * b.sign();
                if s == 0 {
                    NaN // infinity * 0
                } else {
                    Numeric::inf(s)
                }
            }
        })
    }

    pub(crate) fn div(self, b: Numeric) -> Result<Numeric, ArithErr> {
        use Numeric::*;
        if matches!(self, NaN) || matches!(b, NaN) {
            return Ok(NaN);
        }
        if b.is_zero() {
            return Err(ArithErr::DivByZero);
        }
        Ok(match (self, b) {
            (Finite(x), Finite(y)) => Finite(x.checked_div(y).ok_or(ArithErr::Overflow)?),
            (Finite(_), _) => Finite(Decimal::ZERO),
            (a, Finite(_)) => Numeric::inf(a.sign() * b.sign()),
            _ => NaN, // infinity / infinity
        })
    }

    pub(crate) fn rem(self, b: Numeric) -> Result<Numeric, ArithErr> {
        use Numeric::*;
        if matches!(self, NaN) || matches!(b, NaN) {
            return Ok(NaN);
        }
        if b.is_zero() {
            return Err(ArithErr::DivByZero);
        }
        Ok(match (self, b) {
            (Finite(x), Finite(y)) => Finite(x.checked_rem(y).ok_or(ArithErr::Overflow)?),
            (Finite(x), _) => Finite(x),
            _ => NaN,
        })
    }

    pub(crate) fn abs(self) -> Numeric {
        match self {
            Numeric::Finite(d) => Numeric::Finite(d.abs()),
            Numeric::NegInfinity => Numeric::Infinity,
            x => x,
        }
    }

    /// `round(x, n)`: half away from zero, as PostgreSQL; `n` may be negative. The result has
    /// scale `n` when `n >= 0`, as PostgreSQL's (`round(19.3, 2)` is `19.30`).
    pub(crate) fn round(self, n: i64, strategy: RoundingStrategy) -> Result<Numeric, ArithErr> {
        let Numeric::Finite(d) = self else { return Ok(self) };
        if n >= 0 {
            let n = n.min(MAX_SCALE as i64) as u32;
            let mut r = d.round_dp_with_strategy(n, strategy);
            r.rescale(n);
            Ok(Numeric::Finite(r))
        } else {
            let k = n.unsigned_abs();
            if k > MAX_SCALE {
                return Ok(Numeric::Finite(Decimal::ZERO));
            }
            let p = Decimal::from_i128_with_scale(10i128.pow(k as u32), 0);
            let q = d.checked_div(p).ok_or(ArithErr::Overflow)?.round_dp_with_strategy(0, strategy);
            Ok(Numeric::Finite(q.checked_mul(p).ok_or(ArithErr::Overflow)?))
        }
    }

    pub(crate) fn floor(self) -> Numeric {
        match self {
            Numeric::Finite(d) => Numeric::Finite(d.floor()),
            x => x,
        }
    }

    pub(crate) fn ceil(self) -> Numeric {
        match self {
            Numeric::Finite(d) => Numeric::Finite(d.ceil()),
            x => x,
        }
    }

    pub(crate) fn signum(self) -> Numeric {
        match self {
            Numeric::NaN => Numeric::NaN,
            x => Numeric::from_i64(i64::from(x.sign())),
        }
    }

    /// `numeric` -> `float8` as PostgreSQL does it (through the decimal text, so correctly rounded).
    pub(crate) fn to_f64(self) -> f64 {
        match self {
            Numeric::Finite(d) => d.to_string().parse().unwrap_or(f64::NAN),
            Numeric::NaN => f64::NAN,
            Numeric::Infinity => f64::INFINITY,
            Numeric::NegInfinity => f64::NEG_INFINITY,
        }
    }

    /// `float8` -> `numeric` as PostgreSQL does it: 15 significant digits.
    pub(crate) fn from_f64(f: f64) -> Result<Numeric, NumErr> {
        if f.is_nan() {
            Ok(Numeric::NaN)
        } else if f.is_infinite() {
            Ok(if f > 0.0 { Numeric::Infinity } else { Numeric::NegInfinity })
        } else {
            match parse_numeric(format!("{f:.14e}").as_bytes())? {
                Numeric::Finite(d) => Ok(Numeric::Finite(d.normalize())),
                x => Ok(x),
            }
        }
    }

    /// `numeric` -> `bigint`: rounds half away from zero; NaN and the infinities are out of range.
    pub(crate) fn to_i64(self) -> Option<i64> {
        let Numeric::Finite(d) = self else { return None };
        let r = d.round_dp_with_strategy(0, RoundingStrategy::MidpointAwayFromZero);
        let m = r.mantissa();
        let scale = r.scale();
        let v = m.checked_div(10i128.checked_pow(scale)?)?;
        i64::try_from(v).ok()
    }

    /// The value without needless trailing zeros (`19.375`, not `19.3750000`).
    pub fn normalized(self) -> Numeric {
        match self {
            Numeric::Finite(d) => Numeric::Finite(d.normalize()),
            x => x,
        }
    }
}

/// PostgreSQL's text output: the decimal with its scale, or `NaN`, `Infinity`, `-Infinity`.
impl fmt::Display for Numeric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Numeric::Finite(d) => write!(f, "{d}"),
            Numeric::NaN => f.write_str("NaN"),
            Numeric::Infinity => f.write_str("Infinity"),
            Numeric::NegInfinity => f.write_str("-Infinity"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Exact comparison of decimal text against a constant.

/// A decimal split into sign and digit strings without leading (integer) or trailing (fraction)
/// zeros; `rank` orders the special values as PostgreSQL does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecKey {
    rank: u8,
    neg: bool,
    int: Box<[u8]>,
    frac: Box<[u8]>,
    /// The key as `mag / 10^scale` when it has at most 18 digits on each side of the point: the
    /// column text is then compared in one pass without memcmp.
    fast: Option<(u128, u32)>,
}

const POW10: [u128; 19] = {
    let mut t = [1u128; 19];
    let mut i = 1;
    while i < 19 {
        t[i] = t[i - 1] * 10;
        i += 1;
    }
    t
};

struct DecRef<'a> {
    rank: u8,
    neg: bool,
    int: &'a [u8],
    frac: &'a [u8],
}

/// Splits integer or numeric text output (`-12.50`, `NaN`, `Infinity`). None for anything else
/// (an exponent, blanks).
fn split_dec(b: &[u8]) -> Option<DecRef<'_>> {
    match b {
        b"NaN" => return Some(DecRef { rank: 3, neg: false, int: b"", frac: b"" }),
        b"Infinity" => return Some(DecRef { rank: 2, neg: false, int: b"", frac: b"" }),
        b"-Infinity" => return Some(DecRef { rank: 0, neg: false, int: b"", frac: b"" }),
        _ => {}
    }
    let (neg, rest) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        _ => (false, b),
    };
    let int_end = rest.iter().position(|c| !c.is_ascii_digit()).unwrap_or(rest.len());
    let (int, tail) = rest.split_at(int_end);
    let frac = match tail {
        [] => &[][..],
        [b'.', f @ ..] if f.iter().all(u8::is_ascii_digit) => f,
        _ => return None,
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let int_start = int.iter().position(|&c| c != b'0').unwrap_or(int.len());
    let int = &int[int_start..];
    let frac_end = frac.iter().rposition(|&c| c != b'0').map_or(0, |p| p + 1);
    let frac = &frac[..frac_end];
    let zero = int.is_empty() && frac.is_empty();
    Some(DecRef { rank: 1, neg: neg && !zero, int, frac })
}

fn cmp_dec(a: &DecRef<'_>, b: &DecRef<'_>) -> Ordering {
    if a.rank != 1 || b.rank != 1 {
        return a.rank.cmp(&b.rank);
    }
    let mag = |x: &DecRef<'_>, y: &DecRef<'_>| {
        x.int.len().cmp(&y.int.len()).then_with(|| x.int.cmp(y.int)).then_with(|| x.frac.cmp(y.frac))
    };
    match (a.neg, b.neg) {
        (false, true) => Ordering::Greater,
        (true, false) => Ordering::Less,
        (false, false) => mag(a, b),
        (true, true) => mag(b, a),
    }
}

impl DecKey {
    fn new(r: DecRef<'_>) -> DecKey {
        let fast = if r.rank == 1 && r.int.len() <= 18 && r.frac.len() <= 18 {
            let digits = r.int.iter().chain(r.frac.iter());
            let mag = digits.fold(0u128, |m, d| m * 10 + u128::from(d - b'0'));
            Some((mag, r.frac.len() as u32))
        } else {
            None
        };
        DecKey { rank: r.rank, neg: r.neg, int: r.int.into(), frac: r.frac.into(), fast }
    }

    /// The key for a numeric constant.
    pub(crate) fn from_numeric(n: &Numeric) -> DecKey {
        let text = n.to_string();
        DecKey::new(split_dec(text.as_bytes()).unwrap_or(DecRef { rank: 3, neg: false, int: b"", frac: b"" }))
    }

    /// One pass over plain decimal text of at most 18 integer digits, for keys that fit
    /// [`DecKey::fast`]. None sends the text to the general comparison.
    #[inline]
    fn fast_cmp(&self, b: &[u8], kmag: u128, scale: u32) -> Option<Ordering> {
        let (neg, digits) = match b.first()? {
            b'-' => (true, &b[1..]),
            _ => (false, b),
        };
        let mut i = 0;
        // Wraps past 18 digits, but such text is sent to the general comparison below.
        let mut int: u64 = 0;
        while let Some(&c) = digits.get(i) {
            let d = c.wrapping_sub(b'0');
            if d > 9 {
                break;
            }
            int = int.wrapping_mul(10).wrapping_add(u64::from(d));
            i += 1;
        }
        if i == 0 || i > 18 {
            return None;
        }
        let mut frac: u64 = 0;
        let mut fd = 0u32;
        let mut extra = false;
        if digits.get(i) == Some(&b'.') {
            i += 1;
            while let Some(&c) = digits.get(i) {
                let d = c.wrapping_sub(b'0');
                if d > 9 {
                    return None;
                }
                if fd < scale {
                    frac = frac * 10 + u64::from(d);
                    fd += 1;
                } else if d != 0 {
                    extra = true;
                }
                i += 1;
            }
        }
        if i != digits.len() {
            return None;
        }
        let mag = u128::from(int) * POW10[scale as usize] + u128::from(frac) * POW10[(scale - fd) as usize];
        // The column is (mag + a positive fraction when `extra`) / 10^scale, with its sign.
        let col_neg = neg && (mag != 0 || extra);
        Some(match (col_neg, self.neg) {
            (false, true) => Ordering::Greater,
            (true, false) => Ordering::Less,
            (false, false) => mag.cmp(&kmag).then(if extra { Ordering::Greater } else { Ordering::Equal }),
            (true, true) => kmag.cmp(&mag).then(if extra { Ordering::Less } else { Ordering::Equal }),
        })
    }

    /// The key for a numeric literal of any size (`1e300`, 40 digits). None for exponents beyond
    /// 100000.
    pub(crate) fn from_literal(text: &str) -> Option<DecKey> {
        let t = text.trim().as_bytes();
        let (neg, t) = match t.first() {
            Some(b'-') => (true, &t[1..]),
            Some(b'+') => (false, &t[1..]),
            _ => (false, t),
        };
        let epos = t.iter().position(|c| *c == b'e' || *c == b'E').unwrap_or(t.len());
        let (mant, exp) = t.split_at(epos);
        let exp: i64 = if exp.is_empty() { 0 } else { std::str::from_utf8(&exp[1..]).ok()?.parse().ok()? };
        if exp.abs() > 100_000 {
            return None;
        }
        let dot = mant.iter().position(|c| *c == b'.').unwrap_or(mant.len());
        let digits: Vec<u8> = mant.iter().copied().filter(u8::is_ascii_digit).collect();
        if digits.len() + usize::from(dot < mant.len()) != mant.len() || digits.is_empty() {
            return None;
        }
        let point = dot as i64 + exp;
        let mut text = Vec::with_capacity(digits.len() + exp.unsigned_abs() as usize + 2);
        if point <= 0 {
            text.extend_from_slice(b"0.");
            text.extend(std::iter::repeat_n(b'0', point.unsigned_abs() as usize));
            text.extend_from_slice(&digits);
        } else if point as usize >= digits.len() {
            text.extend_from_slice(&digits);
            text.extend(std::iter::repeat_n(b'0', point as usize - digits.len()));
        } else {
            text.extend_from_slice(&digits[..point as usize]);
            text.push(b'.');
            text.extend_from_slice(&digits[point as usize..]);
        }
        let r = split_dec(&text)?;
        let zero = r.int.is_empty() && r.frac.is_empty();
        Some(DecKey::new(DecRef { neg: neg && !zero, ..r }))
    }

    /// Compares integer or numeric column text with the key, exactly, whatever the number of
    /// digits. None when the text is not plain decimal text.
    #[inline]
    pub(crate) fn cmp_text(&self, text: &[u8]) -> Option<Ordering> {
        if let Some((kmag, scale)) = self.fast {
            if let Some(o) = self.fast_cmp(text, kmag, scale) {
                return Some(o);
            }
        }
        let a = split_dec(text)?;
        let b = DecRef { rank: self.rank, neg: self.neg, int: &self.int, frac: &self.frac };
        Some(cmp_dec(&a, &b))
    }
}

// ---------------------------------------------------------------------------------------------
// bigint and float8.

/// Parses integer text output (`-42`) without allocating. None on anything else or overflow.
#[inline]
pub(crate) fn parse_i64(b: &[u8]) -> Option<i64> {
    let (neg, digits) = match b.first()? {
        b'-' => (true, &b[1..]),
        b'+' => (false, &b[1..]),
        _ => (false, b),
    };
    if digits.is_empty() {
        return None;
    }
    let mut v: i64 = 0;
    for &c in digits {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        // Accumulate negatively so i64::MIN parses.
        v = v.checked_mul(10)?.checked_sub(i64::from(d))?;
    }
    if neg {
        Some(v)
    } else {
        v.checked_neg()
    }
}

/// Parses `bigint` input (blanks around allowed). Distinguishes bad syntax from overflow.
pub(crate) fn parse_int_input(b: &[u8]) -> Result<i64, NumErr> {
    let t = trim(b);
    match parse_i64(t) {
        Some(v) => Ok(v),
        None => {
            let digits = t.strip_prefix(b"-").or_else(|| t.strip_prefix(b"+")).unwrap_or(t);
            if !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) {
                Err(NumErr::Overflow)
            } else {
                Err(NumErr::Syntax)
            }
        }
    }
}

/// Parses `float8` text (output or input): decimal, exponent, `NaN`, `Infinity`, `-Infinity`,
/// `inf`. A finite literal too large for float8 is an overflow, as in PostgreSQL.
pub(crate) fn parse_f64(b: &[u8]) -> Result<f64, NumErr> {
    let t = trim(b);
    let s = std::str::from_utf8(t).map_err(|_| NumErr::Syntax)?;
    let v: f64 = s.parse().map_err(|_| NumErr::Syntax)?;
    if v.is_infinite() && !t.iter().any(|c| c.eq_ignore_ascii_case(&b'i')) {
        return Err(NumErr::Overflow);
    }
    Ok(v)
}

/// PostgreSQL's float8 order: NaN equals NaN and is greater than everything else; -0 equals 0.
#[inline]
pub(crate) fn float_cmp(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// Checks a float8 result as PostgreSQL does: infinite from finite inputs is an overflow, zero
/// from non-zero inputs (multiplication, division) an underflow.
pub(crate) fn check_float(r: f64, a: f64, b: f64, zero_check: bool) -> Result<f64, ArithErr> {
    if r.is_infinite() && !a.is_infinite() && !b.is_infinite() {
        return Err(ArithErr::Overflow);
    }
    if zero_check && r == 0.0 && a != 0.0 && !b.is_infinite() {
        return Err(ArithErr::Underflow);
    }
    Ok(r)
}

/// float8 text output as PostgreSQL prints it with `extra_float_digits = 1` (shortest exact
/// digits; exponent form below 1e-4 and from 1e15: `1.5e+20`, `1e-05`).
pub(crate) fn write_float(out: &mut String, f: f64) {
    if f.is_nan() {
        out.push_str("NaN");
        return;
    }
    if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
        return;
    }
    if f == 0.0 {
        out.push_str(if f.is_sign_negative() { "-0" } else { "0" });
        return;
    }
    let sci = format!("{:e}", f.abs()); // shortest round-trip digits: "1.5e20", "1e-5"
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mant.chars().filter(char::is_ascii_digit).collect();
    if f < 0.0 {
        out.push('-');
    }
    if !(-4..15).contains(&exp) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.unsigned_abs());
    } else if exp < 0 {
        out.push_str("0.");
        for _ in 0..(-exp - 1) {
            out.push('0');
        }
        out.push_str(&digits);
    } else {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            out.push_str(&digits);
            for _ in digits.len()..int_len {
                out.push('0');
            }
        } else {
            out.push_str(&digits[..int_len]);
            out.push('.');
            out.push_str(&digits[int_len..]);
        }
    }
}
