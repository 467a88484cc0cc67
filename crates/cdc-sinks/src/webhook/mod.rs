//! The webhook sink: batches of events POSTed as JSON to an HTTP endpoint, at-least-once.
//!
//! ```text
//!  send: events ─▶ records {"id","commit_lsn","event_index","table","key","event"} ─▶ body
//!        body full (batch_max_events / batch_max_bytes) ─▶ POST, wait for 2xx
//!  flush: POST the rest; Ok once every request of the unit got 2xx ─▶ the slot is confirmed
//! ```
//! Requests go one at a time, each after the previous one's 2xx, so events reach the endpoint in
//! commit order. A failed request fails the unit: the worker reads the same changes again and POSTs
//! them again from the unit's first event, so the endpoint may see an event twice (never a later
//! event of a key before an earlier one that has not arrived). Each record carries
//! `id` = `<commit_lsn>-<event_index>` to deduplicate by, and its `event` is byte-identical on every
//! send; batch boundaries may differ. Every body is signed: header `X-PG-CDC-Signature:
//! sha256=<hex HMAC-SHA256 of the body>` under the secret in `secret_file`.
//!
//! Status codes: 2xx delivered; 408, 429 and 5xx are transient (`retrying`), and a `Retry-After`
//! (seconds) holds the next request back at least that long; other 3xx and 4xx need an operator
//! (`error`, retried with the worker's slow backoff). Redirects are not followed.
pub mod config;

use std::time::{Duration, Instant};

use cdc_core::envelope::Event;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use self::config::{endpoint_label, WebhookSinkConfig};
use crate::{Checkpoint, DeliveryMode, ErrorClass, PublishStats, Sink, SinkError};

/// The signature header.
pub const SIGNATURE_HEADER: &str = "X-PG-CDC-Signature";

/// The longest `Retry-After` honoured; a longer one waits this long.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// Appends one event's record to a body being built (after a comma unless it is the first).
pub fn write_record(body: &mut Vec<u8>, ev: &Event) {
    if !body.is_empty() {
        body.push(b',');
    }
    body.extend_from_slice(
        format!(
            "{{\"id\":\"{}-{}\",\"commit_lsn\":{},\"event_index\":{},\"table\":",
            ev.commit_lsn.0, ev.index, ev.commit_lsn.0, ev.index
        )
        .as_bytes(),
    );
    cdc_core::json::write_str(body, format!("{}.{}", ev.schema, ev.table).as_bytes());
    body.extend_from_slice(b",\"key\":");
    body.extend_from_slice(ev.key.as_deref().unwrap_or(b"null"));
    body.extend_from_slice(b",\"event\":");
    body.extend_from_slice(&ev.payload);
    body.push(b'}');
}

/// The request body around the records: `{"events":[...]}`.
pub fn body_of(records: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(records.len() + 13);
    out.extend_from_slice(b"{\"events\":[");
    out.extend_from_slice(records);
    out.extend_from_slice(b"]}");
    out
}

/// The signature header's value for `body`: `sha256=<hex HMAC-SHA256>`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// What a response status means for the unit: `None` delivered, else the error class.
pub fn classify_status(status: u16) -> Option<ErrorClass> {
    match status {
        200..=299 => None,
        408 | 429 | 500..=599 => Some(ErrorClass::Retry),
        _ => Some(ErrorClass::Operator),
    }
}

/// A `Retry-After` header's wait: delay-seconds (an HTTP date is not parsed: the worker's backoff
/// applies then), capped by [`MAX_RETRY_AFTER`].
pub fn retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(|s| Duration::from_secs(s).min(MAX_RETRY_AFTER))
}

/// A webhook sink for one pg_cdc sink.
pub struct WebhookSink {
    agent: ureq::Agent,
    url: String,
    label: String,
    secret: Option<Vec<u8>>,
    headers: Vec<(String, String)>,
    max_events: usize,
    max_bytes: usize,
    /// Records of the request being built.
    records: Vec<u8>,
    count: usize,
    /// No request before this (a `Retry-After`).
    not_before: Option<Instant>,
}

impl WebhookSink {
    /// Builds the sink; `secret` is the content of `secret_file`. No network I/O here.
    pub fn new(cfg: &WebhookSinkConfig, secret: Option<Vec<u8>>) -> Self {
        let tls = ureq::tls::TlsConfig::builder().provider(ureq::tls::TlsProvider::NativeTls).build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_millis(cfg.timeout_ms)))
            .http_status_as_error(false)
            .max_redirects(0)
            .user_agent(concat!("pg_cdc/", env!("CARGO_PKG_VERSION")))
            .tls_config(tls)
            .build()
            .into();
        WebhookSink {
            agent,
            url: cfg.url.clone(),
            label: endpoint_label(&cfg.url),
            secret,
            headers: cfg.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            max_events: cfg.batch_max_events,
            max_bytes: cfg.batch_max_bytes,
            records: Vec::new(),
            count: 0,
            not_before: None,
        }
    }

    fn error(&self, class: ErrorClass, what: impl std::fmt::Display) -> SinkError {
        SinkError { class, message: format!("webhook {}: {what}", self.label) }
    }

    /// POSTs the records gathered so far and waits for the answer.
    fn post(&mut self) -> Result<(), SinkError> {
        if self.count == 0 {
            return Ok(());
        }
        if let Some(t) = self.not_before.filter(|t| Instant::now() < *t) {
            let wait = t.saturating_duration_since(Instant::now()).as_secs_f64();
            return Err(self.error(ErrorClass::Retry, format!("waiting {wait:.1} s more, as Retry-After asked")));
        }
        let body = body_of(&self.records);
        let mut request = self.agent.post(&self.url).header("Content-Type", "application/json");
        if let Some(secret) = &self.secret {
            request = request.header(SIGNATURE_HEADER, signature(secret, &body));
        }
        for (k, v) in &self.headers {
            request = request.header(k, v);
        }
        let response = request.send(&body[..]).map_err(|e| self.error(ErrorClass::Retry, e))?;
        let status = response.status().as_u16();
        if let Some(wait) = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(retry_after) {
            self.not_before = Some(Instant::now() + wait);
        }
        match classify_status(status) {
            None => {
                self.records.clear();
                self.count = 0;
                Ok(())
            }
            Some(class) => {
                // The answer's first line of text, without control characters (a reason for the DBA).
                let mut text = String::new();
                let _ = std::io::Read::read_to_string(
                    &mut std::io::Read::take(response.into_body().into_reader(), 200),
                    &mut text,
                );
                let text: String = text.chars().take_while(|c| *c != '\n').filter(|c| !c.is_control()).collect();
                let reason = if text.trim().is_empty() { String::new() } else { format!(": {}", text.trim()) };
                Err(self.error(class, format!("HTTP {status}{reason}")))
            }
        }
    }
}

impl Sink for WebhookSink {
    fn send(&mut self, events: &[Event]) -> Result<PublishStats, SinkError> {
        let mut stats = PublishStats::default();
        for ev in events {
            if self.count > 0 && self.records.len() + ev.payload.len() > self.max_bytes {
                self.post()?;
            }
            write_record(&mut self.records, ev);
            self.count += 1;
            stats.events += 1;
            stats.bytes += (ev.payload.len() + ev.key.as_ref().map_or(0, Vec::len)) as u64;
            if self.count >= self.max_events || self.records.len() >= self.max_bytes {
                self.post()?;
            }
        }
        Ok(stats)
    }

    fn flush(&mut self, _checkpoint: Checkpoint) -> Result<(), SinkError> {
        self.post()
    }

    fn abort(&mut self) {
        self.records.clear();
        self.count = 0;
    }

    fn delivery_mode(&self) -> DeliveryMode {
        DeliveryMode::AtLeastOnce
    }

    fn hold_until(&self) -> Option<Instant> {
        self.not_before
    }
}

#[cfg(test)]
mod tests;
