//! Converts one column value from PostgreSQL text output to JSON, without loss.
//!
//! The rules (also in the README's "Event format" section):
//! - numeric keeps its exact decimal text as a JSON number; `NaN`, `Infinity`, `-Infinity` (numeric and
//!   float) are JSON strings;
//! - json/jsonb are embedded as JSON;
//! - timestamptz becomes ISO-8601 UTC (`2024-03-15T14:23:45.123456Z`), timestamp ISO-8601 without a
//!   zone, date ISO-8601; BC values use astronomical year numbering with a sign (`-0043-03-15`), and
//!   `infinity` / `-infinity` stay strings;
//! - bytea becomes base64;
//! - arrays become JSON arrays (nested for several dimensions, NULL elements as null); a non-default
//!   lower bound (`[0:1]={1,2}`) is dropped, the elements are kept;
//! - everything else (text, uuid, enums, composites, intervals, ranges, ...) is a JSON string of the
//!   text output.

use base64::Engine;

use crate::json::write_str;
use crate::types::{TypeKind, TypeRegistry};

/// Appends the JSON form of one non-NULL value of type `type_oid` whose text output is `text`.
pub fn write_value(out: &mut Vec<u8>, types: &TypeRegistry, type_oid: u32, text: &[u8]) {
    write_kind(out, types, types.kind(type_oid), text)
}

fn write_kind(out: &mut Vec<u8>, types: &TypeRegistry, kind: TypeKind, text: &[u8]) {
    match kind {
        TypeKind::Bool => out.extend_from_slice(if text == b"t" { b"true" } else { b"false" }),
        TypeKind::Integer => write_number_or_string(out, text),
        TypeKind::Float | TypeKind::Numeric => {
            if is_json_number(text) {
                out.extend_from_slice(text)
            } else {
                write_str(out, text) // NaN, Infinity, -Infinity
            }
        }
        TypeKind::Json => {
            if text.is_empty() {
                out.extend_from_slice(b"null")
            } else {
                out.extend_from_slice(text)
            }
        }
        TypeKind::Bytea => write_bytea(out, text),
        TypeKind::TimestampTz => write_timestamp(out, text, true),
        TypeKind::Timestamp => write_timestamp(out, text, false),
        TypeKind::Date => write_date(out, text),
        TypeKind::Text => write_str(out, text),
        TypeKind::Array { element, delimiter } => {
            let mut p = ArrayParser { s: text, pos: 0, types, element: types.kind(element), delimiter };
            let start = out.len();
            if p.write(out).is_err() {
                out.truncate(start);
                // Not an array literal we understand: keep the text rather than lose the value.
                write_str(out, text);
            }
        }
    }
}

fn write_number_or_string(out: &mut Vec<u8>, text: &[u8]) {
    if is_json_number(text) {
        out.extend_from_slice(text)
    } else {
        write_str(out, text)
    }
}

/// Whether `text` is a valid JSON number (PostgreSQL's numeric and float output always is, except
/// for NaN and the infinities).
fn is_json_number(text: &[u8]) -> bool {
    let mut i = 0;
    let n = text.len();
    if i < n && text[i] == b'-' {
        i += 1;
    }
    let int_start = i;
    while i < n && text[i].is_ascii_digit() {
        i += 1;
    }
    let int_len = i - int_start;
    if int_len == 0 || (int_len > 1 && text[int_start] == b'0') {
        return false;
    }
    if i < n && text[i] == b'.' {
        i += 1;
        let s = i;
        while i < n && text[i].is_ascii_digit() {
            i += 1;
        }
        if i == s {
            return false;
        }
    }
    if i < n && (text[i] == b'e' || text[i] == b'E') {
        i += 1;
        if i < n && (text[i] == b'+' || text[i] == b'-') {
            i += 1;
        }
        let s = i;
        while i < n && text[i].is_ascii_digit() {
            i += 1;
        }
        if i == s {
            return false;
        }
    }
    i == n
}

fn write_bytea(out: &mut Vec<u8>, text: &[u8]) {
    // bytea_output=hex: "\x" followed by two hex digits per byte.
    if let Some(hex) = text.strip_prefix(b"\\x") {
        if let Some(bytes) = decode_hex(hex) {
            out.push(b'"');
            out.extend_from_slice(base64::engine::general_purpose::STANDARD.encode(bytes).as_bytes());
            out.push(b'"');
            return;
        }
    }
    write_str(out, text)
}

fn decode_hex(hex: &[u8]) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    fn nib(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    hex.chunks_exact(2).map(|p| Some(nib(p[0])? << 4 | nib(p[1])?)).collect()
}

/// Splits a trailing " BC" off and returns the ISO year text for the year digits at the start of `s`.
/// `0044` BC is astronomical year -43.
fn iso_year(year: &[u8], bc: bool) -> Option<String> {
    if year.is_empty() || !year.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let y: i64 = std::str::from_utf8(year).ok()?.parse().ok()?;
    let astro = if bc { 1 - y } else { y };
    Some(if astro < 0 {
        format!("-{:04}", -astro)
    } else if astro > 9999 {
        format!("+{astro}")
    } else {
        format!("{astro:04}")
    })
}

fn write_date(out: &mut Vec<u8>, text: &[u8]) {
    let (body, bc) = match text.strip_suffix(b" BC") {
        Some(b) => (b, true),
        None => (text, false),
    };
    // ISO: YYYY-MM-DD where the year may have more than four digits.
    if let Some(dash) = body.iter().position(|&c| c == b'-') {
        if let Some(year) = iso_year(&body[..dash], bc) {
            let mut s = year.into_bytes();
            s.extend_from_slice(&body[dash..]);
            write_str(out, &s);
            return;
        }
    }
    write_str(out, text) // infinity, -infinity
}

fn write_timestamp(out: &mut Vec<u8>, text: &[u8], with_zone: bool) {
    let (body, bc) = match text.strip_suffix(b" BC") {
        Some(b) => (b, true),
        None => (text, false),
    };
    // ISO: "YYYY-MM-DD HH:MM:SS[.ffffff][+HH[:MM[:SS]]]"
    let Some(space) = body.iter().position(|&c| c == b' ') else {
        write_str(out, text); // infinity, -infinity
        return;
    };
    let (date, time) = (&body[..space], &body[space + 1..]);
    let Some(dash) = date.iter().position(|&c| c == b'-') else {
        write_str(out, text);
        return;
    };
    let Some(year) = iso_year(&date[..dash], bc) else {
        write_str(out, text);
        return;
    };
    let mut s = year.into_bytes();
    s.extend_from_slice(&date[dash..]);
    s.push(b'T');
    if with_zone {
        // The zone starts at the first '+' or '-' in the time part.
        let zpos = time.iter().position(|&c| c == b'+' || c == b'-').unwrap_or(time.len());
        s.extend_from_slice(&time[..zpos]);
        let zone = &time[zpos..];
        match zone {
            b"" | b"+00" | b"+00:00" | b"-00" => s.push(b'Z'),
            z if z.len() == 3 => {
                s.extend_from_slice(z);
                s.extend_from_slice(b":00");
            }
            z => s.extend_from_slice(z),
        }
    } else {
        s.extend_from_slice(time);
    }
    write_str(out, &s);
}

/// Parses PostgreSQL's array text format (`{1,2,NULL}`, `{{"a b",c},{d,e}}`, `[0:1]={1,2}`) and writes
/// it as nested JSON arrays with each element converted by the element type.
struct ArrayParser<'a> {
    s: &'a [u8],
    pos: usize,
    types: &'a TypeRegistry,
    element: TypeKind,
    delimiter: u8,
}

impl ArrayParser<'_> {
    fn write(&mut self, out: &mut Vec<u8>) -> Result<(), ()> {
        // Optional dimension decoration: "[1:3][0:1]=".
        if self.s.first() == Some(&b'[') {
            let eq = self.s.iter().position(|&c| c == b'=').ok_or(())?;
            self.pos = eq + 1;
        }
        self.level(out)?;
        if self.pos != self.s.len() {
            return Err(());
        }
        Ok(())
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn level(&mut self, out: &mut Vec<u8>) -> Result<(), ()> {
        if self.peek() != Some(b'{') {
            return Err(());
        }
        self.pos += 1;
        out.push(b'[');
        if self.peek() == Some(b'}') {
            self.pos += 1;
            out.push(b']');
            return Ok(());
        }
        loop {
            match self.peek() {
                Some(b'{') => self.level(out)?,
                Some(b'"') => {
                    let v = self.quoted()?;
                    write_kind(out, self.types, self.element, &v);
                }
                Some(_) => {
                    let start = self.pos;
                    while let Some(c) = self.peek() {
                        if c == self.delimiter || c == b'}' {
                            break;
                        }
                        self.pos += 1;
                    }
                    let raw = &self.s[start..self.pos];
                    if raw == b"NULL" {
                        out.extend_from_slice(b"null");
                    } else {
                        write_kind(out, self.types, self.element, raw);
                    }
                }
                None => return Err(()),
            }
            match self.peek() {
                Some(c) if c == self.delimiter => {
                    self.pos += 1;
                    out.push(b',');
                }
                Some(b'}') => {
                    self.pos += 1;
                    out.push(b']');
                    return Ok(());
                }
                _ => return Err(()),
            }
        }
    }

    fn quoted(&mut self) -> Result<Vec<u8>, ()> {
        self.pos += 1; // opening quote
        let mut v = Vec::new();
        loop {
            match self.peek().ok_or(())? {
                b'"' => {
                    self.pos += 1;
                    return Ok(v);
                }
                b'\\' => {
                    self.pos += 1;
                    v.push(self.peek().ok_or(())?);
                    self.pos += 1;
                }
                c => {
                    v.push(c);
                    self.pos += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::PgTypeRow;

    fn conv(oid: u32, text: &str) -> String {
        let mut r = TypeRegistry::new();
        for (arr, elem, delim) in [
            (1007, 23, b','),
            (1009, 25, b','),
            (1231, 1700, b','),
            (1020, 603, b';'),
            (1185, 1184, b','),
            (3807, 3802, b','),
        ] {
            r.add(&PgTypeRow {
                oid: arr,
                typtype: b'b',
                typcategory: b'A',
                typelem: elem,
                typbasetype: 0,
                typdelim: delim,
                enum_labels: vec![],
            });
        }
        let mut out = Vec::new();
        write_value(&mut out, &r, oid, text.as_bytes());
        let s = String::from_utf8(out).unwrap();
        serde_json::from_str::<serde_json::Value>(&s).unwrap_or_else(|e| panic!("{s}: {e}"));
        s
    }

    #[test]
    fn numbers_keep_their_text() {
        assert_eq!(conv(1700, "150.00"), "150.00");
        assert_eq!(conv(1700, "-0.000000000000000000000000000001"), "-0.000000000000000000000000000001");
        assert_eq!(conv(1700, "NaN"), "\"NaN\"");
        assert_eq!(conv(1700, "Infinity"), "\"Infinity\"");
        assert_eq!(conv(701, "-Infinity"), "\"-Infinity\"");
        assert_eq!(conv(701, "1.5e+100"), "1.5e+100");
        assert_eq!(conv(20, "-9223372036854775808"), "-9223372036854775808");
        assert_eq!(conv(16, "t"), "true");
        assert_eq!(conv(16, "f"), "false");
    }

    #[test]
    fn times_are_iso8601() {
        assert_eq!(conv(1184, "2024-03-15 14:23:45.123+00"), "\"2024-03-15T14:23:45.123Z\"");
        assert_eq!(conv(1184, "2024-03-15 14:23:45+05:30"), "\"2024-03-15T14:23:45+05:30\"");
        assert_eq!(conv(1184, "0044-03-15 12:00:00+00 BC"), "\"-0043-03-15T12:00:00Z\"");
        assert_eq!(conv(1184, "0001-01-01 00:00:00+00 BC"), "\"0000-01-01T00:00:00Z\"");
        assert_eq!(conv(1184, "infinity"), "\"infinity\"");
        assert_eq!(conv(1114, "2024-03-15 14:23:45.5"), "\"2024-03-15T14:23:45.5\"");
        assert_eq!(conv(1114, "-infinity"), "\"-infinity\"");
        assert_eq!(conv(1082, "2024-02-29"), "\"2024-02-29\"");
        assert_eq!(conv(1082, "4713-01-01 BC"), "\"-4712-01-01\"");
        assert_eq!(conv(1082, "20000-01-01"), "\"+20000-01-01\"");
    }

    #[test]
    fn bytea_is_base64() {
        assert_eq!(conv(17, "\\x"), "\"\"");
        assert_eq!(conv(17, "\\xdeadbeef"), "\"3q2+7w==\"");
    }

    #[test]
    fn json_is_embedded() {
        assert_eq!(conv(3802, "{\"a\": [1, 2.50]}"), "{\"a\": [1, 2.50]}");
    }

    #[test]
    fn arrays() {
        assert_eq!(conv(1007, "{1,2,NULL}"), "[1,2,null]");
        assert_eq!(conv(1007, "{}"), "[]");
        assert_eq!(conv(1007, "{{1,2},{3,4}}"), "[[1,2],[3,4]]");
        assert_eq!(conv(1007, "[0:1]={7,8}"), "[7,8]");
        assert_eq!(
            conv(1009, "{\"a b\",\"NULL\",NULL,\"q\\\"x\",\"\\\\\"}"),
            "[\"a b\",\"NULL\",null,\"q\\\"x\",\"\\\\\"]"
        );
        assert_eq!(conv(1231, "{1.10,NaN}"), "[1.10,\"NaN\"]");
        assert_eq!(conv(1020, "{(1,1),(0,0);(2,2),(1,1)}"), "[\"(1,1),(0,0)\",\"(2,2),(1,1)\"]");
        assert_eq!(conv(1185, "{\"2024-01-01 00:00:00+00\"}"), "[\"2024-01-01T00:00:00Z\"]");
        assert_eq!(conv(3807, "{\"{\\\"a\\\": 1}\"}"), "[{\"a\": 1}]");
        // Not an array literal: kept as text, never lost.
        assert_eq!(conv(1007, "{1,2"), "\"{1,2\"");
    }

    #[test]
    fn number_grammar() {
        for ok in ["0", "-0", "1.5", "1e5", "1E-5", "123.456e+7"] {
            assert!(is_json_number(ok.as_bytes()), "{ok}");
        }
        for bad in ["", "-", "01", "1.", ".5", "1e", "NaN", "1,5", "+1"] {
            assert!(!is_json_number(bad.as_bytes()), "{bad}");
        }
    }
}
