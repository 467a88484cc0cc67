//! A JSON event's value back to the text a PostgreSQL column of the target takes: the inverse of
//! `cdc_core::value` (which turns text output into JSON without loss), driven by the target
//! column's type. The session reads dates as ISO, in UTC (see the connection's setup), so every
//! text here is read back as the value it came from.
use base64::Engine;
use serde_json::value::RawValue;

/// How a target column's values are written, by its type (a domain's base type; an array's
/// element type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueKind {
    /// `bool`: JSON true/false.
    Bool,
    /// `bytea`: base64 in the event, hex (`\x...`) here.
    Bytea,
    /// `json`/`jsonb`: embedded as is, so the text is the event's bytes.
    Json,
    /// `date`, `timestamp`, `timestamptz`: ISO 8601, BC years astronomical with a sign in the
    /// event, `... BC` here.
    DateTime,
    /// An array of the element kind: a JSON array in the event, an array literal here.
    Array(Box<ValueKind>),
    /// Everything else: a JSON number's text, or a JSON string's contents (text output).
    Other,
}

impl ValueKind {
    /// The kind of a type from `pg_type`: the OID of the type (a domain's base type), its
    /// category and, for an array, its element's OID.
    pub fn of(oid: u32, category: &str, element: u32) -> ValueKind {
        if category == "A" && element != 0 {
            return ValueKind::Array(Box::new(ValueKind::of(element, "", 0)));
        }
        match oid {
            16 => ValueKind::Bool,
            17 => ValueKind::Bytea,
            114 | 3802 => ValueKind::Json,
            1082 | 1114 | 1184 => ValueKind::DateTime,
            _ => ValueKind::Other,
        }
    }
}

/// The text of one value for a column of `kind`; `None` for SQL NULL.
pub fn to_text(kind: &ValueKind, raw: &RawValue) -> Result<Option<String>, String> {
    let s = raw.get().trim();
    if s == "null" {
        return Ok(None);
    }
    Ok(Some(match kind {
        ValueKind::Json => s.to_string(),
        ValueKind::Array(element) => {
            let mut out = String::new();
            write_array(&mut out, element, raw)?;
            out
        }
        _ => scalar(kind, s)?,
    }))
}

/// A scalar's text from its JSON text `s` (not null).
fn scalar(kind: &ValueKind, s: &str) -> Result<String, String> {
    match s.as_bytes().first() {
        Some(b'"') => {
            let v: String = serde_json::from_str(s).map_err(|e| format!("bad JSON string: {e}"))?;
            match kind {
                ValueKind::Bytea => {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(v.as_bytes())
                        .map_err(|e| format!("bytea value is not base64: {e}"))?;
                    let mut hex = String::with_capacity(2 + 2 * bytes.len());
                    hex.push_str("\\x");
                    for b in bytes {
                        hex.push_str(&format!("{b:02x}"));
                    }
                    Ok(hex)
                }
                ValueKind::DateTime => Ok(iso_to_pg(&v)),
                _ => Ok(v),
            }
        }
        Some(b't') if s == "true" => Ok("t".into()),
        Some(b'f') if s == "false" => Ok("f".into()),
        Some(b'[') | Some(b'{') => Ok(s.to_string()),
        // A number: its exact text.
        _ => Ok(s.to_string()),
    }
}

/// An ISO 8601 date or timestamp as the event writes it, in a form PostgreSQL reads as the same
/// value: astronomical years up to 0 become BC years (`-0043-03-15` is `0044-03-15 BC`).
pub fn iso_to_pg(v: &str) -> String {
    let negative = v.starts_with('-');
    let body = v.strip_prefix('-').unwrap_or(v);
    let digits = body.bytes().take_while(u8::is_ascii_digit).count();
    let Ok(year) = body[..digits].parse::<i64>() else { return v.to_string() };
    let astro = if negative { -year } else { year };
    if digits == 0 || astro > 0 {
        return v.to_string();
    }
    let rest = body[digits..].replacen('T', " ", 1);
    let rest = match rest.strip_suffix('Z') {
        Some(r) => format!("{r}+00"),
        None => rest,
    };
    format!("{:04}{rest} BC", 1 - astro)
}

/// Appends the array literal of a JSON array (nested arrays for several dimensions).
fn write_array(out: &mut String, element: &ValueKind, raw: &RawValue) -> Result<(), String> {
    let items: Vec<&RawValue> =
        serde_json::from_str(raw.get()).map_err(|_| format!("expected a JSON array, got {}", short(raw.get())))?;
    out.push('{');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let t = item.get().trim();
        if t == "null" {
            out.push_str("NULL");
        } else if t.starts_with('[') && *element != ValueKind::Json {
            write_array(out, element, item)?;
        } else {
            let text = match element {
                ValueKind::Json => t.to_string(),
                k => scalar(k, t)?,
            };
            push_quoted(out, &text);
        }
    }
    out.push('}');
    Ok(())
}

/// Appends `text` as a double-quoted array element.
pub fn push_quoted(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// A text array literal of `items` (`NULL` for `None`), for `unnest($n::text[])`.
pub fn text_array<'a>(items: impl IntoIterator<Item = Option<&'a str>>) -> String {
    let mut out = String::from("{");
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match item {
            Some(t) => push_quoted(&mut out, t),
            None => out.push_str("NULL"),
        }
    }
    out.push('}');
    out
}

fn short(s: &str) -> String {
    s.chars().take(40).collect()
}
