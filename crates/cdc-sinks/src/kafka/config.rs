//! The Kafka sink's config: its keys (the product description's), validated, and its topic
//! templates.
use std::collections::BTreeMap;

use cdc_core::config::sink::{parse_common, sink_object, SinkCommon};
use cdc_core::object::{invalid, wrong_type, Obj};
use cdc_core::{CdcError, CdcResult};
use serde_json::Value;

/// A validated Kafka sink config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSinkConfig {
    /// The keys every sink takes (tables, format, partition key, ...).
    pub common: SinkCommon,
    /// `bootstrap.servers`; `None` means the server setting `cdc.kafka_bootstrap_servers`.
    pub bootstrap_servers: Option<String>,
    /// Topic name or template over `{database}`, `{schema}`, `{table}`.
    pub topic: String,
    /// `acks`: "all" or "1" (0 cannot confirm delivery and is refused).
    pub acks: String,
    /// `compression.type`.
    pub compression: Option<String>,
    /// `batch.size` in bytes.
    pub batch_size: Option<i64>,
    /// `linger.ms`.
    pub linger_ms: Option<i64>,
    /// librdkafka properties passed through (TLS, SASL, ...). Values may be secrets: never echoed.
    pub properties: BTreeMap<String, String>,
    /// Transactional delivery with a progress topic (default true).
    pub exactly_once: bool,
    /// `transactional.id` override; `None` derives one from the system identifier, database and sink.
    pub transactional_id: Option<String>,
}

/// The Kafka sink's own keys (besides [`COMMON_KEYS`]), as in the product description.
pub const KEYS: &[&str] = &[
    "bootstrap_servers",
    "topic",
    "acks",
    "compression",
    "batch_size",
    "linger_ms",
    "exactly_once",
    "transactional_id",
    "properties",
];

/// librdkafka settings pg_cdc sets itself; `properties` may not override them.
const RESERVED_PROPERTIES: &[&str] = &["bootstrap.servers", "acks", "enable.idempotence", "transactional.id"];

/// Parses `properties`: librdkafka settings passed through, each a string, number or boolean;
/// the `reserved` ones (pg_cdc's) are refused with `hint`. Values may be secrets: never echoed.
pub fn parse_properties(o: &Obj<'_>, reserved: &[&str], hint: &str) -> CdcResult<BTreeMap<String, String>> {
    let mut properties = BTreeMap::new();
    if let Some(p) = o.object("properties")? {
        for (k, v) in p.map {
            let path = format!("config.properties.\"{k}\"");
            let value = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                other => return Err(wrong_type(&path, "a string, number or boolean", other)),
            };
            if reserved.contains(&k.as_str()) {
                return Err(invalid(format!("{path} is set by pg_cdc and cannot be overridden")).hint(hint));
            }
            properties.insert(k.clone(), value);
        }
    }
    Ok(properties)
}

/// Parses and validates a Kafka sink config.
pub fn parse(config: &Value) -> CdcResult<KafkaSinkConfig> {
    let o = sink_object(config, KEYS)?;
    let topic = o
        .string("topic")?
        .ok_or_else(|| invalid("config.topic is required for a kafka sink").hint("Add \"topic\": \"orders-cdc\"."))?
        .to_string();
    validate_topic_template("config.topic", &topic)?;
    let common = parse_common(&o)?;
    let bootstrap_servers = o.string("bootstrap_servers")?.map(str::to_string);
    let acks = match o.get("acks") {
        None => "all".to_string(),
        Some(Value::String(s)) if s == "all" || s == "-1" => "all".to_string(),
        Some(Value::String(s)) if s == "1" => "1".to_string(),
        Some(Value::Number(n)) if n.as_i64() == Some(-1) => "all".to_string(),
        Some(Value::Number(n)) if n.as_i64() == Some(1) => "1".to_string(),
        Some(Value::String(s)) if s == "0" => return Err(acks_zero()),
        Some(Value::Number(n)) if n.as_i64() == Some(0) => return Err(acks_zero()),
        Some(v) => return Err(invalid(format!("config.acks must be \"all\" or \"1\", not {v}"))),
    };
    let compression = match o.string("compression")? {
        None => None,
        Some(c @ ("none" | "gzip" | "snappy" | "lz4" | "zstd")) => Some(c.to_string()),
        Some(other) => {
            return Err(invalid(format!("config.compression: unknown codec \"{other}\""))
                .hint("Valid codecs: none, gzip, snappy, lz4, zstd."))
        }
    };
    let batch_size = o.int("batch_size", 1, 2_147_483_647)?;
    let linger_ms = o.int("linger_ms", 0, 900_000)?;
    let exactly_once = o.bool("exactly_once")?.unwrap_or(true);
    let transactional_id = o.string("transactional_id")?.map(str::to_string);
    if transactional_id.is_some() && !exactly_once {
        return Err(invalid("config.transactional_id is only used with \"exactly_once\": true"));
    }
    if exactly_once && acks != "all" {
        return Err(invalid("config.acks must be \"all\" with exactly-once delivery")
            .hint("Kafka transactions need acks=all; set \"exactly_once\": false to use acks=1."));
    }
    let properties =
        parse_properties(&o, RESERVED_PROPERTIES, "Use the sink's own keys (bootstrap_servers, acks) instead.")?;
    Ok(KafkaSinkConfig {
        common,
        exactly_once,
        transactional_id,
        bootstrap_servers,
        topic,
        acks,
        compression,
        batch_size,
        linger_ms,
        properties,
    })
}

fn acks_zero() -> CdcError {
    invalid("config.acks = 0 cannot be used: pg_cdc advances its slot only after the broker acknowledges")
        .hint("Use \"all\" (the default) or \"1\".")
}

/// Validates a topic name or template: Kafka's legal characters plus `{database}`, `{schema}`, `{table}`.
pub fn validate_topic_template(path: &str, topic: &str) -> CdcResult<()> {
    let mut rest = topic;
    let mut literal = String::new();
    while let Some(open) = rest.find('{') {
        literal.push_str(&rest[..open]);
        let close =
            rest[open..].find('}').ok_or_else(|| invalid(format!("{path}: unclosed '{{' in topic template")))?;
        let name = &rest[open + 1..open + close];
        if !["database", "schema", "table"].contains(&name) {
            return Err(invalid(format!("{path}: unknown placeholder {{{name}}}"))
                .hint("Topic templates may use {database}, {schema} and {table}."));
        }
        rest = &rest[open + close + 1..];
    }
    literal.push_str(rest);
    if let Some(bad) = literal.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(invalid(format!("{path}: character {bad:?} is not allowed in a Kafka topic name"))
            .hint("Kafka topic names use letters, digits, '.', '_' and '-' only."));
    }
    if topic == "." || topic == ".." {
        return Err(invalid(format!("{path}: Kafka does not allow the topic names \".\" and \"..\"")));
    }
    if topic.len() > 249 {
        return Err(invalid(format!("{path}: a Kafka topic name has at most 249 characters")));
    }
    Ok(())
}

/// Expands a topic template for one table; characters Kafka does not allow become '_'.
pub fn expand_topic(template: &str, database: &str, schema: &str, table: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect()
    };
    template
        .replace("{database}", &clean(database))
        .replace("{schema}", &clean(schema))
        .replace("{table}", &clean(table))
}
