//! A client for the part of Confluent's Schema Registry REST API the Avro format uses: register a
//! schema under a subject (or look it up when `auto_register` is off) and set a subject's
//! compatibility level. Ids are cached by the caller.
//!
//! Errors are classified as the sinks' are: a registry that cannot be reached, times out or
//! answers 5xx is transient (the sink retries, nothing is lost); a refusal (an incompatible or
//! invalid schema, bad credentials, a subject without the schema) needs an operator.
use std::time::Duration;

use base64::Engine;
use cdc_core::format::FormatError;
use serde_json::{json, Value};

/// The media type of the registry's requests and answers.
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// One schema registry.
pub struct SchemaRegistry {
    agent: ureq::Agent,
    /// Base URL without credentials or trailing `/`.
    base: String,
    /// `Authorization` header from credentials in the URL.
    auth: Option<String>,
    /// The URL as shown in messages (credentials hidden).
    label: String,
}

/// A subject's compatibility level (the registry's names).
pub fn level(mode: cdc_core::schema::Mode) -> &'static str {
    match mode {
        cdc_core::schema::Mode::Backward => "BACKWARD",
        cdc_core::schema::Mode::Forward => "FORWARD",
        cdc_core::schema::Mode::Full => "FULL",
        cdc_core::schema::Mode::None => "NONE",
    }
}

impl SchemaRegistry {
    /// A client for the registry at `url` (checked by `cdc_core::config::registry_url`;
    /// `https://user:secret@host` sends HTTP basic authentication). No network I/O here.
    pub fn new(url: &str) -> SchemaRegistry {
        let (scheme, rest) = url.split_once("://").unwrap_or(("http", url));
        let authority_end = rest.find('/').unwrap_or(rest.len());
        let (authority, path) = rest.split_at(authority_end);
        let (auth, host) = match authority.rsplit_once('@') {
            Some((userinfo, host)) => {
                let token = base64::engine::general_purpose::STANDARD.encode(percent_decode(userinfo));
                (Some(format!("Basic {token}")), host)
            }
            None => (None, authority),
        };
        let base = format!("{scheme}://{host}{}", path.trim_end_matches('/'));
        let label = label(url);
        let tls = ureq::tls::TlsConfig::builder().provider(ureq::tls::TlsProvider::NativeTls).build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(10)))
            .http_status_as_error(false)
            .user_agent(concat!("pg_cdc/", env!("CARGO_PKG_VERSION")))
            .tls_config(tls)
            .build()
            .into();
        SchemaRegistry { agent, base, auth, label }
    }

    /// The URL as messages show it.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Registers `schema` (Avro schema JSON) under `subject`; the registry answers with the id it
    /// has for it (the same id again when it is registered already).
    pub fn register(&self, subject: &str, schema: &str) -> Result<u32, FormatError> {
        self.register_as(subject, schema, "AVRO")
    }

    /// Registers `schema` of type `schema_type` (`AVRO`, `PROTOBUF`) under `subject`.
    pub fn register_as(&self, subject: &str, schema: &str, schema_type: &str) -> Result<u32, FormatError> {
        let body = body(schema, schema_type);
        let v = match self.call("POST", &format!("/subjects/{}/versions", encode_segment(subject)), body, subject) {
            Ok(v) => v,
            Err(Missing) => return Err(self.error(false, format!("subject {subject}: not found"))),
            Err(Failed(e)) => return Err(e),
        };
        id_of(&v).ok_or_else(|| self.error(false, format!("subject {subject}: the answer has no schema id: {v}")))
    }

    /// The id of `schema` under `subject`, when it is registered there.
    pub fn lookup(&self, subject: &str, schema: &str) -> Result<Option<u32>, FormatError> {
        self.lookup_as(subject, schema, "AVRO")
    }

    /// The id of `schema` of type `schema_type` under `subject`, when it is registered there.
    pub fn lookup_as(&self, subject: &str, schema: &str, schema_type: &str) -> Result<Option<u32>, FormatError> {
        let body = body(schema, schema_type);
        match self.call("POST", &format!("/subjects/{}", encode_segment(subject)), body, subject) {
            Ok(v) => Ok(id_of(&v)),
            Err(Missing) => Ok(None),
            Err(Failed(e)) => Err(e),
        }
    }

    /// Sets `subject`'s compatibility level (`BACKWARD`, `FORWARD`, `FULL`, `NONE`).
    pub fn set_compatibility(&self, subject: &str, level: &str) -> Result<(), FormatError> {
        let body = json!({ "compatibility": level }).to_string();
        match self.call("PUT", &format!("/config/{}", encode_segment(subject)), body, subject) {
            Ok(_) => Ok(()),
            Err(Missing) => Err(self.error(false, format!("subject {subject}: not found"))),
            Err(Failed(e)) => Err(e),
        }
    }

    /// The text of the schema the registry gave `id` (what a consumer reads a record's writer
    /// schema with).
    pub fn schema_text(&self, id: u32) -> Result<String, FormatError> {
        let path = format!("/schemas/ids/{id}");
        let mut request = self.agent.get(format!("{}{path}", self.base)).header("Accept", CONTENT_TYPE);
        if let Some(a) = &self.auth {
            request = request.header("Authorization", a);
        }
        let mut response = request.call().map_err(|e| self.error(true, format!("GET {path}: {e}")))?;
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        if !(200..300).contains(&status) {
            return Err(self.error(status >= 500, format!("GET {path}: HTTP {status}")));
        }
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        v["schema"].as_str().map(str::to_string).ok_or_else(|| self.error(false, format!("GET {path}: no schema")))
    }

    fn error(&self, retry: bool, what: String) -> FormatError {
        FormatError { retry, message: format!("schema registry {}: {what}", self.label) }
    }

    fn call(&self, method: &str, path: &str, body: String, subject: &str) -> Result<Value, CallError> {
        let url = format!("{}{path}", self.base);
        let request = if method == "PUT" { self.agent.put(&url) } else { self.agent.post(&url) };
        let result = self.with_headers(request).send(body.as_bytes());
        let mut response = result.map_err(|e| Failed(self.error(true, format!("{method} {path}: {e}"))))?;
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            return Ok(v);
        }
        let code = v.get("error_code").and_then(Value::as_i64).unwrap_or(0);
        let message =
            v.get("message").and_then(Value::as_str).unwrap_or(text.trim()).chars().take(300).collect::<String>();
        // 40401 subject not found, 40403 schema not found.
        if status == 404 && (code == 40401 || code == 40403) && method == "POST" && !path.ends_with("/versions") {
            return Err(Missing);
        }
        let retry = status >= 500 || status == 429 || status == 408;
        let why = match status {
            409 => {
                format!("subject {subject} refuses the schema as incompatible with its compatibility level: {message}")
            }
            422 => format!("subject {subject} refuses the schema as invalid: {message}"),
            401 | 403 => format!("not authorized (HTTP {status}): {message}"),
            _ => format!("{method} {path}: HTTP {status}: {message}"),
        };
        Err(Failed(self.error(retry, why)))
    }

    fn with_headers(
        &self,
        r: ureq::RequestBuilder<ureq::typestate::WithBody>,
    ) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
        let mut r = r.header("Content-Type", CONTENT_TYPE).header("Accept", CONTENT_TYPE);
        if let Some(a) = &self.auth {
            r = r.header("Authorization", a);
        }
        r
    }
}

/// A registry URL as messages and the catalog show it: credentials hidden.
pub fn label(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("http", url));
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://***@{host}{}", &rest[authority_end..]),
        None => url.to_string(),
    }
}

enum CallError {
    /// The subject or the schema is not registered.
    Missing,
    Failed(FormatError),
}
use CallError::{Failed, Missing};

fn id_of(v: &Value) -> Option<u32> {
    v.get("id").and_then(Value::as_u64).and_then(|id| u32::try_from(id).ok())
}

/// A subject as one URL path segment.
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Some(v) = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// A registration's body: Avro is the registry's default type, so it is left unnamed.
fn body(schema: &str, schema_type: &str) -> String {
    if schema_type == "AVRO" {
        json!({ "schema": schema }).to_string()
    } else {
        json!({ "schema": schema, "schemaType": schema_type }).to_string()
    }
}
