//! A minimal JSON writer into a byte buffer.
//!
//! Events are written straight into the output buffer instead of building a `serde_json::Value`
//! tree: it is the hot path, the field order is fixed by the event shape, and numeric text must be
//! copied verbatim (no float round trip).

/// Appends `s` as a JSON string literal. Invalid UTF-8 sequences are replaced by U+FFFD
/// (PostgreSQL databases captured by pg_cdc are UTF8, so this only guards against corruption).
pub fn write_str(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    match std::str::from_utf8(s) {
        Ok(valid) => escape_into(out, valid),
        Err(_) => escape_into(out, &String::from_utf8_lossy(s)),
    }
    out.push(b'"');
}

/// Bytes that need escaping in a JSON string: control characters, `"` and `\`.
const NEEDS_ESCAPE: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = true;
        i += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

fn escape_into(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    // Most values need no escaping at all: one scan, one copy.
    let Some(first) = bytes.iter().position(|&b| NEEDS_ESCAPE[b as usize]) else {
        out.extend_from_slice(bytes);
        return;
    };
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate().skip(first) {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => {
                out.extend_from_slice(&bytes[start..i]);
                out.extend_from_slice(format!("\\u{b:04x}").as_bytes());
                start = i + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(esc);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Appends `"key":`.
pub fn write_key(out: &mut Vec<u8>, key: &str) {
    write_str(out, key.as_bytes());
    out.push(b':');
}

/// Appends an unsigned integer.
pub fn write_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_serde() {
        for s in ["plain", "q\"uote", "back\\slash", "nl\n\r\t", "\u{1}\u{1f}", "é漢🙂", ""] {
            let mut out = Vec::new();
            write_str(&mut out, s.as_bytes());
            let back: String = serde_json::from_slice(&out).unwrap();
            assert_eq!(back, s);
        }
        for v in [0, 7, 10, 1_234_567_890, u64::MAX] {
            let mut out = Vec::new();
            write_u64(&mut out, v);
            assert_eq!(out, v.to_string().as_bytes());
        }
        let mut out = Vec::new();
        write_str(&mut out, b"bad\xff");
        assert_eq!(String::from_utf8(out).unwrap(), "\"bad\u{fffd}\"");
    }
}
