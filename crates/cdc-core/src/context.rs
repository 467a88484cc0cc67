//! User context of the transaction that made a change (`include_user_context`,
//! `include_query_text`).
//!
//! The WAL does not record who made a change. For tables that ask for it, a statement trigger
//! emits a transactional logical message (prefix [`PREFIX`]) before each statement's rows, inside
//! the writing transaction, so it reaches the decoder just before the changes it describes. Its
//! content is sealed: `HMAC-SHA256(key, xid || json)` in hex, then the JSON. Anyone may call
//! `pg_logical_emit_message`, but only the server knows the key (a file in the data directory), so
//! a forged or replayed context is dropped instead of being reported as someone else's.

use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

/// Prefix of the context messages.
pub const PREFIX: &str = "pg_cdc.context";

/// Length of the hex MAC that starts a sealed message.
const MAC_HEX: usize = 64;

/// The fields events carry, as the writing session saw them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserContext {
    /// `session_user` (the role that logged in).
    pub user: Option<String>,
    /// The session's id as `log_line_prefix`'s `%c` prints it (start time and PID, in hex).
    pub session_id: Option<String>,
    /// The client's address; `None` over a Unix socket.
    pub client_ip: Option<String>,
    /// `application_name`.
    pub application_name: Option<String>,
    /// The statement text (only when the table's trigger asked for it).
    pub query: Option<String>,
}

fn mac(key: &[u8], xid: u32, json: &[u8]) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(&xid.to_be_bytes());
    m.update(json);
    m
}

/// Seals a context for transaction `xid`: the message content to emit.
pub fn seal(key: &[u8], xid: u32, ctx: &UserContext) -> Vec<u8> {
    let json = to_json(ctx);
    let tag = mac(key, xid, &json).finalize().into_bytes();
    let mut out = Vec::with_capacity(MAC_HEX + json.len());
    for b in tag {
        out.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    out.extend_from_slice(&json);
    out
}

/// Opens a sealed context of transaction `xid`: `None` when it is malformed, forged, or sealed
/// for another transaction.
pub fn open(key: &[u8], xid: u32, content: &[u8]) -> Option<UserContext> {
    if content.len() < MAC_HEX {
        return None;
    }
    let (hex, json) = content.split_at(MAC_HEX);
    let mut tag = [0u8; 32];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        tag[i] = u8::from_str_radix(s, 16).ok()?;
    }
    mac(key, xid, json).verify_slice(&tag).ok()?;
    let v: Value = serde_json::from_slice(json).ok()?;
    let field = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    Some(UserContext {
        user: field("user"),
        session_id: field("session_id"),
        client_ip: field("client_ip"),
        application_name: field("application_name"),
        query: field("query"),
    })
}

fn to_json(ctx: &UserContext) -> Vec<u8> {
    let mut m = serde_json::Map::new();
    for (k, v) in [
        ("user", &ctx.user),
        ("session_id", &ctx.session_id),
        ("client_ip", &ctx.client_ip),
        ("application_name", &ctx.application_name),
        ("query", &ctx.query),
    ] {
        if let Some(v) = v {
            m.insert(k.to_string(), Value::String(v.clone()));
        }
    }
    serde_json::to_vec(&Value::Object(m)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> UserContext {
        UserContext {
            user: Some("teller_system".into()),
            session_id: Some("65f45a11.1f2c".into()),
            client_ip: Some("10.0.1.100".into()),
            application_name: Some("core-banking".into()),
            query: Some("INSERT INTO transactions VALUES ('\"quoted\"')".into()),
        }
    }

    #[test]
    fn seal_then_open() {
        let key = [7u8; 32];
        let sealed = seal(&key, 42, &ctx());
        assert_eq!(open(&key, 42, &sealed), Some(ctx()));
        let partial = UserContext { user: Some("u".into()), ..Default::default() };
        assert_eq!(open(&key, 1, &seal(&key, 1, &partial)), Some(partial));
    }

    #[test]
    fn forged_replayed_or_damaged_contexts_are_dropped() {
        let key = [7u8; 32];
        let sealed = seal(&key, 42, &ctx());
        assert_eq!(open(&key, 43, &sealed), None, "sealed for another transaction");
        assert_eq!(open(&[8u8; 32], 42, &sealed), None, "another key");
        let mut forged = sealed.clone();
        let at = forged.len() - 3;
        forged[at] = b'X';
        assert_eq!(open(&key, 42, &forged), None, "content changed after sealing");
        let fake = [b"0".repeat(64), br#"{"user":"admin"}"#.to_vec()].concat();
        assert_eq!(open(&key, 42, &fake), None, "made up by someone without the key");
        assert_eq!(open(&key, 42, b"short"), None);
        assert_eq!(open(&key, 42, &[b"zz".repeat(32), b"{}".to_vec()].concat()), None, "not hex");
    }
}
