//! The Pulsar sink's config.
use cdc_core::config::sink::{parse_common, sink_object, SinkCommon};
use cdc_core::object::invalid;
use cdc_core::CdcResult;
use serde_json::Value;

use crate::kafka::config::validate_topic_template;

/// A validated Pulsar sink config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulsarSinkConfig {
    /// The keys every sink takes (tables, format, partition key, ...).
    pub common: SinkCommon,
    /// `pulsar://host:6650` (or `pulsar+ssl://`), several hosts separated by commas.
    pub service_url: String,
    /// `persistent://<tenant>/<namespace>/` of the topics (`public/default` for a short name).
    pub namespace: String,
    /// The topic's local name, or a template over `{database}`, `{schema}`, `{table}`.
    pub topic: String,
    /// The producers' name; each worker session names its producers `<producer_name>-<session>`
    /// (see the module's documentation). `None`: `pg_cdc-<sink>`.
    pub producer_name: Option<String>,
    /// A file holding a JWT token for Pulsar's token authentication; never echoed.
    pub auth_token_file: Option<String>,
    /// How long a delivery may wait for the broker's receipts, in milliseconds.
    pub timeout_ms: u64,
}

/// The Pulsar sink's own keys (besides [`COMMON_KEYS`](cdc_core::config::sink::COMMON_KEYS)).
pub const KEYS: &[&str] = &["service_url", "topic", "producer_name", "auth_token_file", "timeout_ms", "exactly_once"];

/// Whether `url` is a Pulsar service URL: `pulsar://` or `pulsar+ssl://`, then hosts with ports.
pub fn is_service_url(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("pulsar://").or_else(|| url.strip_prefix("pulsar+ssl://")) else {
        return false;
    };
    let hosts = rest.trim_end_matches('/');
    !hosts.is_empty()
        && hosts.split(',').all(|h| {
            !h.is_empty() && h.chars().all(|c| c.is_ascii_alphanumeric() || ".-_:[]".contains(c)) && !h.contains('/')
        })
}

/// Splits a topic as the config gives it into its `persistent://tenant/namespace/` and its local name.
fn split_topic(topic: &str) -> CdcResult<(String, String)> {
    let Some((scheme, rest)) = topic.split_once("://") else {
        return Ok(("persistent://public/default/".into(), topic.to_string()));
    };
    if scheme != "persistent" {
        return Err(invalid(format!("config.topic \"{topic}\": only persistent topics are supported"))
            .hint("A non-persistent topic drops messages no consumer is connected for; use persistent://."));
    }
    let parts: Vec<&str> = rest.splitn(3, '/').collect();
    match parts.as_slice() {
        [tenant, namespace, name] if !tenant.is_empty() && !namespace.is_empty() && !name.is_empty() => {
            Ok((format!("persistent://{tenant}/{namespace}/"), name.to_string()))
        }
        _ => Err(invalid(format!("config.topic \"{topic}\" is not persistent://<tenant>/<namespace>/<topic>"))),
    }
}

/// Parses and validates a Pulsar sink config.
pub fn parse(config: &Value) -> CdcResult<PulsarSinkConfig> {
    let o = sink_object(config, KEYS)?;
    let service_url = o
        .string("service_url")?
        .ok_or_else(|| {
            invalid("config.service_url is required for a Pulsar sink")
                .hint("Add \"service_url\": \"pulsar://broker:6650\".")
        })?
        .to_string();
    if !is_service_url(&service_url) {
        return Err(invalid(format!("config.service_url \"{service_url}\" is not a Pulsar service URL"))
            .hint("pulsar://host:6650, or pulsar+ssl://host:6651 for TLS; several hosts separated by commas."));
    }
    let given = o.string("topic")?.ok_or_else(|| {
        invalid("config.topic is required for a Pulsar sink")
            .hint("A topic, or a template: \"cdc.{schema}.{table}\", or persistent://tenant/namespace/topic.")
    })?;
    let (namespace, topic) = split_topic(given)?;
    validate_topic_template("config.topic", &topic)
        .map_err(|e| invalid(e.message.replace("Kafka topic", "Pulsar topic")))?;
    let producer_name = o.string("producer_name")?.map(str::to_string);
    if let Some(p) = &producer_name {
        if p.len() > 200 || !p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(invalid("config.producer_name must be up to 200 letters, digits, '-', '_' or '.'"));
        }
    }
    let auth_token_file = o.string("auth_token_file")?.map(str::to_string);
    if auth_token_file.as_deref().is_some_and(|p| !p.starts_with('/')) {
        return Err(invalid("config.auth_token_file must be an absolute path")
            .hint("A file the server's operating system user can read, holding the JWT token."));
    }
    if o.bool("exactly_once")? == Some(true) {
        return Err(invalid("config.exactly_once: a Pulsar sink is at-least-once").hint(
            "After a failure the messages without a receipt are sent again; the message property \"id\" \
             (<commit_lsn>-<event_index>) identifies an event.",
        ));
    }
    let common = parse_common(&o)?;
    let timeout_ms = o.int("timeout_ms", 100, 600_000)?.unwrap_or(30_000) as u64;
    Ok(PulsarSinkConfig { common, service_url, namespace, topic, producer_name, auth_token_file, timeout_ms })
}
