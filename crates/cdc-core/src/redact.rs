//! PII redaction of column values: `tokenize`, `hash`, `redact` and `remove`, the same four words
//! everywhere (compliance `redaction_method` and the `mask` transformation).
//!
//! - `tokenize`: `tok_` + the first 32 hex digits (128 bits) of HMAC-SHA256(key, value text). Keyed and
//!   deterministic: the same value gives the same token under the same key version, in every table,
//!   so consumers can still join and count; without the key nobody can compute or test a token. The key
//!   is read from a file only the server can read ([`TokenKey::parse`]); it is never written to the
//!   stream, the catalog, the logs or an error message.
//! - `hash`: the 64 hex digits of SHA-256(value text), unkeyed. Anyone can recompute it, so it only
//!   hides high-entropy values; for SSNs, phone numbers or account numbers use `tokenize`.
//! - `redact`: the JSON string `"[REDACTED]"`.
//! - `remove`: the field is left out of the image.
//!
//! SQL NULL stays `null` under every method (only values are sensitive). The text a method reads is
//! the column's PostgreSQL text output (`150.00`, `2024-03-15`), so equal values of one type always
//! give equal tokens.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::error::{CdcError, CdcResult, ErrorKind};

/// How a column's values are hidden.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// Keyed HMAC token (`tok_...`).
    Tokenize,
    /// Unkeyed SHA-256, hex.
    Hash,
    /// The fixed string `[REDACTED]`.
    Redact,
    /// Left out of the image.
    Remove,
}

/// The words a config may use, in the order the docs list them.
pub const METHODS: &[&str] = &["tokenize", "hash", "redact", "remove"];

/// The fixed replacement of `redact`.
pub const REDACTED: &str = "[REDACTED]";

impl Method {
    /// Parses a method word (`tokenize`, `hash`, `redact`, `remove`).
    pub fn parse(word: &str) -> Option<Method> {
        match word {
            "tokenize" => Some(Method::Tokenize),
            "hash" => Some(Method::Hash),
            "redact" => Some(Method::Redact),
            "remove" => Some(Method::Remove),
            _ => None,
        }
    }

    /// The config word.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Tokenize => "tokenize",
            Method::Hash => "hash",
            Method::Redact => "redact",
            Method::Remove => "remove",
        }
    }
}

/// The tokenization key with its version. `Debug` and `Display` never show the secret.
#[derive(Clone)]
pub struct TokenKey {
    version: u32,
    mac: Hmac<Sha256>,
}

impl fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TokenKey {{ version: {}, secret: <hidden> }}", self.version)
    }
}

/// Shortest key accepted, in bytes: HMAC-SHA256 wants at least its output size of entropy.
pub const MIN_KEY_BYTES: usize = 32;

impl TokenKey {
    /// Builds a key from the contents of a key file and its version. The file holds the secret as
    /// text (surrounding whitespace, including the final newline, is ignored); it must be at least
    /// [`MIN_KEY_BYTES`] bytes (for example `openssl rand -hex 32`). Errors never quote the contents.
    pub fn parse(contents: &[u8], version: u32) -> CdcResult<TokenKey> {
        let secret = contents.trim_ascii();
        if secret.len() < MIN_KEY_BYTES {
            return Err(CdcError::new(
                ErrorKind::InvalidParameter,
                format!(
                    "the tokenization key is too short: {} bytes, at least {MIN_KEY_BYTES} are needed",
                    secret.len()
                ),
            )
            .hint("Write a random key to the file, e.g. openssl rand -hex 32 > key; chmod 600 key."));
        }
        let mac = Hmac::<Sha256>::new_from_slice(secret)
            .map_err(|_| CdcError::new(ErrorKind::Internal, "the tokenization key cannot be used for HMAC-SHA256"))?;
        Ok(TokenKey { version, mac })
    }

    /// The key version (reported in events next to the tokens it made).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The token of one value's text: `tok_` and 32 lowercase hex digits.
    pub fn token(&self, text: &[u8]) -> String {
        let mut mac = self.mac.clone();
        mac.update(text);
        let digest = mac.finalize().into_bytes();
        let mut out = String::with_capacity(36);
        out.push_str("tok_");
        push_hex(&mut out, &digest[..16]);
        out
    }
}

/// SHA-256 of one value's text, 64 lowercase hex digits.
pub fn hash(text: &[u8]) -> String {
    let digest = Sha256::digest(text);
    let mut out = String::with_capacity(64);
    push_hex(&mut out, &digest);
    out
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
}

/// What a non-NULL value becomes under `method`: `None` for `remove`, else the replacement string.
/// `tokenize` without a key is an error the caller reports (the sink stops rather than leak PII).
pub fn replace(method: Method, key: Option<&TokenKey>, text: &[u8]) -> Result<Option<String>, MissingKey> {
    Ok(match method {
        Method::Tokenize => Some(key.ok_or(MissingKey)?.token(text)),
        Method::Hash => Some(hash(text)),
        Method::Redact => Some(REDACTED.to_string()),
        Method::Remove => None,
    })
}

/// `tokenize` was asked for but no key is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingKey;

impl fmt::Display for MissingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "no tokenization key is configured (cdc.tokenization_key_file, or pg_cdc_token.key in the data directory; \
             SELECT cdc_create_tokenization_key() makes one)",
        )
    }
}

impl std::error::Error for MissingKey {}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef\n";

    #[test]
    fn tokens_are_keyed_deterministic_and_shaped() {
        let k1 = TokenKey::parse(KEY, 1).unwrap();
        let t = k1.token(b"123-45-6789");
        assert_eq!(t, k1.token(b"123-45-6789"), "deterministic");
        assert!(t.starts_with("tok_") && t.len() == 36, "{t}");
        assert!(t[4..].bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(t, k1.token(b"123-45-6780"));
        let k2 = TokenKey::parse(b"another key of at least thirty-two bytes", 2).unwrap();
        assert_ne!(t, k2.token(b"123-45-6789"), "another key, another token");
        // The trailing newline of a key file is not part of the key.
        assert_eq!(t, TokenKey::parse(&KEY[..32], 1).unwrap().token(b"123-45-6789"));
    }

    #[test]
    fn token_is_hmac_sha256_of_the_text() {
        let key = TokenKey::parse(KEY, 1).unwrap();
        let mut mac = Hmac::<Sha256>::new_from_slice(&KEY[..32]).unwrap();
        mac.update(b"x");
        let full = mac.finalize().into_bytes();
        let mut hex = String::new();
        push_hex(&mut hex, &full[..16]);
        assert_eq!(key.token(b"x"), format!("tok_{hex}"));
    }

    #[test]
    fn hash_is_sha256_hex() {
        assert_eq!(hash(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn short_keys_are_refused_without_echoing_them() {
        let e = TokenKey::parse(b"  secret-but-short \n", 1).unwrap_err();
        assert_eq!(e.kind.sqlstate(), "22023");
        assert!(!e.message.contains("secret") && !e.hint.unwrap_or_default().contains("secret-but-short"));
        let k = TokenKey::parse(KEY, 3).unwrap();
        let shown = format!("{k:?}");
        assert!(!shown.contains("0123456789abcdef") && shown.contains("version: 3"), "{shown}");
    }

    #[test]
    fn methods() {
        let k = TokenKey::parse(KEY, 1).unwrap();
        for w in METHODS {
            assert_eq!(Method::parse(w).unwrap().as_str(), *w);
        }
        assert_eq!(Method::parse("mask"), None);
        assert_eq!(replace(Method::Redact, None, b"x").unwrap().as_deref(), Some(REDACTED));
        assert_eq!(replace(Method::Remove, Some(&k), b"x").unwrap(), None);
        assert_eq!(replace(Method::Tokenize, None, b"x"), Err(MissingKey));
        assert_eq!(replace(Method::Tokenize, Some(&k), b"x").unwrap(), Some(k.token(b"x")));
    }
}
