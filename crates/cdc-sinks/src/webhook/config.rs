//! The webhook sink's config.
use std::collections::BTreeMap;

use cdc_core::config::sink::{parse_common, sink_object, SinkCommon};
use cdc_core::object::{invalid, wrong_type};
use cdc_core::CdcResult;
use serde_json::Value;

/// A validated webhook sink config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookSinkConfig {
    /// The keys every sink takes (tables, format, partition key, ...).
    pub common: SinkCommon,
    /// Where batches are POSTed (`http://` or `https://`). May hold credentials: messages name only
    /// its scheme and host ([`endpoint_label`]).
    pub url: String,
    /// File holding the HMAC-SHA256 secret that signs every body (relative to the data directory).
    pub secret_file: Option<String>,
    /// Extra request headers (`Authorization`, ...). Values may be secrets: never echoed.
    pub headers: BTreeMap<String, String>,
    /// Events per request at most.
    pub batch_max_events: usize,
    /// Body bytes per request at most (one larger event goes alone).
    pub batch_max_bytes: usize,
    /// How long one request may take, in milliseconds.
    pub timeout_ms: u64,
}

/// The webhook sink's own keys (besides [`COMMON_KEYS`]).
pub const KEYS: &[&str] =
    &["url", "secret_file", "headers", "batch_max_events", "batch_max_bytes", "timeout_ms", "exactly_once"];

/// Headers pg_cdc sets itself; `headers` may not override them.
const RESERVED_HEADERS: &[&str] = &["content-type", "content-length", "host", "x-pg-cdc-signature"];

/// Parses and validates a webhook sink config.
pub fn parse(config: &Value) -> CdcResult<WebhookSinkConfig> {
    let o = sink_object(config, KEYS)?;
    let url = o
        .string("url")?
        .ok_or_else(|| {
            invalid("config.url is required for a webhook sink").hint("Add \"url\": \"https://example.com/cdc\".")
        })?
        .to_string();
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    if rest.is_none_or(|r| r.is_empty() || r.starts_with('/')) || url.chars().any(char::is_whitespace) {
        return Err(invalid("config.url must be an http:// or https:// URL with a host")
            .hint("For example \"https://example.com/cdc\"."));
    }
    if o.bool("exactly_once")? == Some(true) {
        return Err(invalid("config.exactly_once: a webhook sink is at-least-once")
            .hint("HTTP has no transactions: a batch may be POSTed again after a failure; every event carries an id to deduplicate by."));
    }
    let common = parse_common(&o)?;
    let secret_file = o.string("secret_file")?.map(str::to_string);
    let mut headers = BTreeMap::new();
    if let Some(h) = o.object("headers")? {
        for (k, v) in h.map {
            let path = format!("config.headers.\"{k}\"");
            let Value::String(value) = v else {
                return Err(wrong_type(&path, "a string", v));
            };
            let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
            if k.is_empty() || !k.chars().all(token) {
                return Err(invalid(format!("{path} is not a valid HTTP header name")));
            }
            if value.chars().any(|c| c == '\r' || c == '\n') {
                return Err(invalid(format!("{path} must be one line")));
            }
            if RESERVED_HEADERS.contains(&k.to_ascii_lowercase().as_str()) {
                return Err(invalid(format!("{path} is set by pg_cdc and cannot be overridden")));
            }
            headers.insert(k.clone(), value.clone());
        }
    }
    let batch_max_events = o.int("batch_max_events", 1, 100_000)?.unwrap_or(500) as usize;
    let batch_max_bytes = o.int("batch_max_bytes", 1024, 256 << 20)?.unwrap_or(1 << 20) as usize;
    let timeout_ms = o.int("timeout_ms", 100, 600_000)?.unwrap_or(10_000) as u64;
    Ok(WebhookSinkConfig { common, url, secret_file, headers, batch_max_events, batch_max_bytes, timeout_ms })
}

/// The URL's scheme and host (and port), for messages: its path, query and any credentials are left
/// out, since they may be secrets.
pub fn endpoint_label(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    format!("{scheme}://{host}")
}
