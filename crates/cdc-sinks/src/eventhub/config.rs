//! The Event Hubs sink's config, and the Kafka config it becomes.
use std::collections::BTreeMap;

use cdc_core::config::sink::{parse_common, sink_object, SinkCommon};
use cdc_core::object::{invalid, wrong_type};
use cdc_core::CdcResult;
use serde_json::Value;

use crate::kafka::config::{parse_properties, validate_topic_template, KafkaSinkConfig};

/// Where the connection string is.
#[derive(Clone, PartialEq, Eq)]
pub enum Connection {
    /// In the config (`connection_string`).
    Inline(String),
    /// In a file (`connection_string_file`, relative to the data directory).
    File(String),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Connection::Inline(_) => f.write_str("Inline(<secret>)"),
            Connection::File(path) => write!(f, "File({path:?})"),
        }
    }
}

/// A validated Event Hubs sink config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventHubSinkConfig {
    /// The keys every sink takes (tables, format, partition key, ...).
    pub common: SinkCommon,
    /// The Event Hubs namespace (`<namespace>.servicebus.windows.net`).
    pub namespace: Option<String>,
    /// The event hub (the Kafka topic), or a template over `{database}`, `{schema}`, `{table}`.
    pub eventhub: String,
    /// The connection string, or the file that holds it.
    pub connection: Connection,
    /// `host:port` to connect to instead of `<namespace>.servicebus.windows.net:9093` (tests,
    /// private endpoints).
    pub bootstrap_servers: Option<String>,
    /// Kafka transactions (a preview on some Event Hubs tiers); default false.
    pub exactly_once: bool,
    /// librdkafka properties passed through (`ssl.ca.location`, timeouts, ...). Never echoed.
    pub properties: BTreeMap<String, String>,
}

/// The Event Hubs sink's own keys (besides [`COMMON_KEYS`]).
pub const KEYS: &[&str] = &[
    "namespace",
    "eventhub",
    "connection_string",
    "connection_string_file",
    "bootstrap_servers",
    "exactly_once",
    "properties",
];

/// librdkafka settings the Event Hubs sink sets itself.
const RESERVED_PROPERTIES: &[&str] = &[
    "bootstrap.servers",
    "acks",
    "enable.idempotence",
    "transactional.id",
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
];

/// Whether `s` has the parts of an Event Hubs connection string (`Endpoint=sb://...;
/// SharedAccessKeyName=...;SharedAccessKey=...`, or a `SharedAccessSignature`). Checks the shape
/// only; the broker checks the key.
pub fn check_connection_string(s: &str) -> Result<(), &'static str> {
    let parts: Vec<(&str, &str)> = s.trim().split(';').filter_map(|p| p.split_once('=')).collect();
    let has = |k: &str| parts.iter().any(|(key, v)| key.eq_ignore_ascii_case(k) && !v.is_empty());
    if !parts.iter().any(|(k, v)| k.eq_ignore_ascii_case("Endpoint") && v.starts_with("sb://")) {
        return Err("it has no Endpoint=sb://...");
    }
    let key = has("SharedAccessKeyName") && has("SharedAccessKey");
    if !(key || has("SharedAccessSignature")) {
        return Err("it has no SharedAccessKeyName and SharedAccessKey (or SharedAccessSignature)");
    }
    Ok(())
}

/// Parses and validates an Event Hubs sink config.
pub fn parse(config: &Value) -> CdcResult<EventHubSinkConfig> {
    let o = sink_object(config, KEYS)?;
    let eventhub = o
        .string("eventhub")?
        .ok_or_else(|| {
            invalid("config.eventhub is required for an eventhub sink").hint("Add \"eventhub\": \"orders\".")
        })?
        .to_string();
    validate_topic_template("config.eventhub", &eventhub)?;
    let namespace = o.string("namespace")?.map(str::to_string);
    if let Some(ns) = &namespace {
        if !ns.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(invalid("config.namespace must be the namespace's name (letters, digits and '-')")
                .hint("For example \"contoso-events\", from contoso-events.servicebus.windows.net."));
        }
    }
    let bootstrap_servers = o.string("bootstrap_servers")?.map(str::to_string);
    if namespace.is_none() && bootstrap_servers.is_none() {
        return Err(invalid("config.namespace is required for an eventhub sink")
            .hint("Add \"namespace\": \"<name>\" (from <name>.servicebus.windows.net)."));
    }
    let connection =
        match (o.get("connection_string"), o.string("connection_string_file")?) {
            (Some(_), Some(_)) => {
                return Err(invalid("config: give connection_string or connection_string_file, not both"));
            }
            (Some(Value::String(s)), None) => {
                check_connection_string(s).map_err(|why| {
                    invalid(format!("config.connection_string is not an Event Hubs connection string: {why}"))
                        .hint("Copy it from the namespace's Shared access policies in the Azure portal.")
                })?;
                Connection::Inline(s.trim().to_string())
            }
            (Some(v), None) => return Err(wrong_type("config.connection_string", "a string", v)),
            (None, Some(path)) => Connection::File(path.to_string()),
            (None, None) => return Err(invalid(
                "config.connection_string_file (or connection_string) is required for an eventhub sink",
            )
            .hint(
                "Put the namespace's connection string in a file in the data directory (mode 0600) and name it here.",
            )),
        };
    let exactly_once = o.bool("exactly_once")?.unwrap_or(false);
    let common = parse_common(&o)?;
    let properties = parse_properties(
        &o,
        RESERVED_PROPERTIES,
        "Event Hubs' security and SASL settings are pg_cdc's; use connection_string_file and bootstrap_servers.",
    )?;
    Ok(EventHubSinkConfig { common, namespace, eventhub, connection, bootstrap_servers, exactly_once, properties })
}

impl EventHubSinkConfig {
    /// The Kafka sink config it becomes, given the connection string.
    pub fn kafka_config(&self, connection_string: &str) -> KafkaSinkConfig {
        let mut properties = self.properties.clone();
        for (k, v) in [
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "PLAIN"),
            ("sasl.username", "$ConnectionString"),
            ("sasl.password", connection_string.trim()),
        ] {
            properties.insert(k.to_string(), v.to_string());
        }
        let bootstrap = self.bootstrap_servers.clone().unwrap_or_else(|| {
            format!("{}.servicebus.windows.net:9093", self.namespace.as_deref().unwrap_or_default())
        });
        KafkaSinkConfig {
            common: self.common.clone(),
            bootstrap_servers: Some(bootstrap),
            topic: self.eventhub.clone(),
            acks: "all".to_string(),
            compression: None,
            batch_size: None,
            linger_ms: None,
            properties,
            exactly_once: self.exactly_once,
            transactional_id: None,
        }
    }
}
