//! The sink types: each one's config parser, by name. Adding a sink type adds its folder and one
//! line to [`BUILT`] (and its adapter in the worker, which builds the sink from its config).
use cdc_core::config::sink::{Format, SinkCommon};
use cdc_core::error::did_you_mean;
use cdc_core::{CdcError, CdcResult, ErrorKind};
use serde_json::Value;

use crate::eventhub::config::EventHubSinkConfig;
use crate::kafka::config::KafkaSinkConfig;
use crate::kinesis::config::KinesisSinkConfig;
use crate::postgres::config::PostgresSinkConfig;
use crate::pubsub::config::PubSubSinkConfig;
use crate::pulsar::config::PulsarSinkConfig;
use crate::table::config::TableSinkConfig;
use crate::webhook::config::WebhookSinkConfig;
use crate::DeliveryMode;

/// A validated sink config of one of the built sink types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkConfig {
    /// `kafka`: a Kafka topic per table (transactional by default).
    Kafka(KafkaSinkConfig),
    /// `table`: a table in this database, consumed with `cdc_consume`.
    Table(TableSinkConfig),
    /// `webhook`: batches POSTed to an HTTP endpoint.
    Webhook(WebhookSinkConfig),
    /// `eventhub`: Azure Event Hubs, through its Kafka endpoint.
    EventHub(EventHubSinkConfig),
    /// `kinesis`: an Amazon Kinesis data stream.
    Kinesis(KinesisSinkConfig),
    /// `pubsub`: a Google Cloud Pub/Sub topic.
    PubSub(PubSubSinkConfig),
    /// `postgres`: the stream applied to tables of a PostgreSQL database.
    Postgres(PostgresSinkConfig),
    /// `pulsar`: Apache Pulsar topics.
    Pulsar(PulsarSinkConfig),
}

type Parse = fn(&Value) -> CdcResult<SinkConfig>;

/// The sink types built in this version, and their config parsers.
const BUILT: &[(&str, Parse)] = &[
    ("kafka", |v| crate::kafka::config::parse(v).map(SinkConfig::Kafka)),
    ("table", |v| crate::table::config::parse(v).map(SinkConfig::Table)),
    ("webhook", |v| crate::webhook::config::parse(v).map(SinkConfig::Webhook)),
    ("eventhub", |v| crate::eventhub::config::parse(v).map(SinkConfig::EventHub)),
    ("kinesis", |v| crate::kinesis::config::parse(v).map(SinkConfig::Kinesis)),
    ("pubsub", |v| crate::pubsub::config::parse(v).map(SinkConfig::PubSub)),
    ("postgres", |v| crate::postgres::config::parse(v).map(SinkConfig::Postgres)),
    ("pulsar", |v| crate::pulsar::config::parse(v).map(SinkConfig::Pulsar)),
];

/// Every sink type name pg_cdc knows.
pub fn sink_types() -> Vec<&'static str> {
    BUILT.iter().map(|(name, _)| *name).collect()
}

/// Validates a sink type and its config.
pub fn parse_config(sink_type: &str, config: &Value) -> CdcResult<SinkConfig> {
    if let Some((_, parse)) = BUILT.iter().find(|(name, _)| *name == sink_type) {
        let parsed = parse(config)?;
        let format = parsed.common().format;
        if format == Format::Debezium && !matches!(parsed, SinkConfig::Kafka(_)) {
            return Err(CdcError::new(
                ErrorKind::FeatureNotSupported,
                format!("a {sink_type} sink cannot use format \"debezium\" yet"),
            )
            .hint("The debezium format writes Kafka topics (kafka sinks), tombstones included; use \"format\": \"json\" here."));
        }
        if format != Format::Json && !matches!(parsed, SinkConfig::Kafka(_) | SinkConfig::EventHub(_)) {
            return Err(CdcError::new(
                ErrorKind::FeatureNotSupported,
                format!("a {sink_type} sink cannot use format \"{}\" yet", format.as_str()),
            )
            .hint("The avro and protobuf formats write Kafka topics (kafka and eventhub sinks); use \"format\": \"json\" here."));
        }
        return Ok(parsed);
    }
    let all = sink_types();
    let e = CdcError::new(ErrorKind::InvalidParameter, format!("unknown sink type \"{sink_type}\""));
    Err(match did_you_mean(sink_type, all.iter().copied()) {
        Some(s) => e.hint(format!("Did you mean \"{s}\"? Valid sink types: {}.", all.join(", "))),
        None => e.hint(format!("Valid sink types: {}.", all.join(", "))),
    })
}

impl SinkConfig {
    /// The keys every sink type takes.
    pub fn common(&self) -> &SinkCommon {
        match self {
            SinkConfig::Kafka(c) => &c.common,
            SinkConfig::Table(c) => &c.common,
            SinkConfig::Webhook(c) => &c.common,
            SinkConfig::EventHub(c) => &c.common,
            SinkConfig::Kinesis(c) => &c.common,
            SinkConfig::PubSub(c) => &c.common,
            SinkConfig::Postgres(c) => &c.common,
            SinkConfig::Pulsar(c) => &c.common,
        }
    }

    /// The sink's event format when it is not JSON: the Avro format of a Kafka or Event Hubs
    /// sink, its subjects named after the sink's topic template (see [`crate::format`]), or the
    /// Debezium format of a Kafka sink.
    /// `server_registry` is the server setting `cdc.schema_registry`; `version` pg_cdc's (the
    /// Debezium format's `source.version`).
    pub fn event_format(
        &self,
        database: &str,
        server_registry: Option<String>,
        version: &str,
    ) -> Option<Box<dyn cdc_core::format::EventFormat>> {
        let topic = match self {
            SinkConfig::Kafka(c) => c.topic.clone(),
            SinkConfig::EventHub(c) => c.eventhub.clone(),
            _ => return None,
        };
        let common = self.common();
        match common.format {
            Format::Json => None,
            Format::Avro => Some(Box::new(crate::format::AvroFormat::new(
                crate::format::Subjects { topic, database: database.to_string() },
                common.schema_registry.clone(),
                server_registry,
            ))),
            Format::Debezium => {
                let format = crate::format::debezium::DebeziumFormat::new(common.debezium.clone(), database, version);
                Some(Box::new(match common.debezium.converter {
                    cdc_core::config::sink::DebeziumConverter::Json => format,
                    cdc_core::config::sink::DebeziumConverter::Avro => format.with_avro(
                        crate::format::Subjects { topic, database: database.to_string() },
                        common.schema_registry.clone(),
                        server_registry,
                    ),
                }))
            }
            Format::Protobuf => Some(Box::new(crate::format::protobuf::ProtobufFormat::new(
                &topic,
                database,
                common.schema_registry.clone(),
                server_registry,
            ))),
        }
    }

    /// The guarantee the sink gives (stored in `_cdc_sinks.delivery_mode`).
    pub fn delivery_mode(&self) -> DeliveryMode {
        match self {
            SinkConfig::Kafka(c) if !c.exactly_once => DeliveryMode::AtLeastOnce,
            SinkConfig::Webhook(_) | SinkConfig::Kinesis(_) | SinkConfig::PubSub(_) | SinkConfig::Pulsar(_) => {
                DeliveryMode::AtLeastOnce
            }
            // Delivered again after a failure, applied once: the row versions make a repeat a no-op.
            SinkConfig::Postgres(_) => DeliveryMode::AtLeastOnce,
            SinkConfig::EventHub(c) if !c.exactly_once => DeliveryMode::AtLeastOnce,
            SinkConfig::Kafka(_) | SinkConfig::Table(_) | SinkConfig::EventHub(_) => DeliveryMode::ExactlyOnce,
        }
    }
}

#[cfg(test)]
mod tests;
